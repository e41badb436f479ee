"""Reliability report: storage faults, crashes, hostile inputs, secrets and
long runs, at a chosen scale; prints the table of docs/BENCHMARKS.md, then one JSON line.

    python benchmarks/reliability.py              # the figures of docs/BENCHMARKS.md (~10 min on 2 cores)
    python benchmarks/reliability.py --quick      # a small pass (~3 min)

Every scenario is a function in tools/reliability/ (the CI tests run the same
functions small). A scenario that finds a problem is reported as FAILED with
its message and the command exits 1. The baseline of every comparison is
measured in the same run: the clean loader run, the clean write, the
uninterrupted single-process order.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools.reliability import chaos, crash, hostile, secrets, soak  # noqa: E402
from tools.reliability.common import stdlib_corpus, write_local_dataset  # noqa: E402

FULL = {
    "corpus_files": 200,
    "chaos_rates": (0.01, 0.05, 0.2),
    "chaos_epochs": 1,
    "writer_chaos_files": 40,
    "writer_kill_runs": 10,
    "writer_kill_files": 80,
    "loader_kill_runs": 10,
    "loader_kill_steps": 16,
    "mutations": 200,
    "bit_flips": 150,
    "frames_past": 20,
    "truncations": 20,
    "soak_epochs": 100,
    "soak_s3_epochs": 4,
    "churn_cycles": 20,
}
QUICK = {
    "corpus_files": 60,
    "chaos_rates": (0.01, 0.05, 0.2),
    "chaos_epochs": 1,
    "writer_chaos_files": 10,
    "writer_kill_runs": 2,
    "writer_kill_files": 40,
    "loader_kill_runs": 2,
    "loader_kill_steps": 16,
    "mutations": 50,
    "bit_flips": 20,
    "frames_past": 4,
    "truncations": 5,
    "soak_epochs": 30,
    "soak_s3_epochs": 2,
    "churn_cycles": 5,
}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def section(results: dict[str, Any], name: str, fn: Callable[[], Any]) -> None:
    log(f"[reliability] {name} ...")
    started = time.perf_counter()
    try:
        results[name] = {"ok": True, **fn()}
    except Exception as exc:  # noqa: BLE001 - a failed scenario is a row of the report
        results[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000]}
        log(traceback.format_exc())
    results[name]["seconds"] = round(time.perf_counter() - started, 1)
    log(f"[reliability] {name}: {'ok' if results[name]['ok'] else 'FAILED'} in {results[name]['seconds']} s")


def run(scale: dict[str, Any], work: Path, seed: int) -> dict[str, Any]:
    from zephon_stream.storage import copy_dataset, open_store
    from zephon_stream.storage.embedded_s3 import EmbeddedS3

    results: dict[str, Any] = {}
    files = stdlib_corpus(work / "corpus", num_files=scale["corpus_files"])
    dataset = work / "dataset"
    summary = write_local_dataset(files, dataset)
    results["dataset"] = {
        "files": len(files),
        "tokens": summary.num_tokens,
        "blocks": summary.num_blocks,
        "shards": summary.num_shards,
    }
    with EmbeddedS3() as s3:
        bucket = "zs-reliability"
        s3.create_bucket(bucket)
        options = s3.storage_options()
        url = f"s3://{bucket}/dataset"
        copy_dataset(dataset, url, dst_options=options)
        steps = summary.num_blocks * (4096 // 256) // 8 * scale["chaos_epochs"]
        section(
            results,
            "loader_faults",
            lambda: chaos.loader_under_faults(
                url=url, endpoint_url=s3.endpoint_url, storage_options=options, rates=scale["chaos_rates"], steps=steps
            ),
        )
        with open_store(f"s3://{bucket}/inputs", options) as store:
            for path in files[: scale["writer_chaos_files"]]:
                store.write_atomic(path.name, path.read_bytes())
        glob = f"s3://{bucket}/inputs/*.py"
        section(
            results,
            "writer_faults",
            lambda: chaos.writer_under_faults(
                inputs_url=glob,
                out_url=f"s3://{bucket}/written",
                endpoint_url=s3.endpoint_url,
                storage_options=options,
                rates=scale["chaos_rates"],
            ),
        )
        section(
            results,
            "secrets",
            lambda: secrets.secrets_run(
                endpoint_url=s3.endpoint_url, bucket=bucket, inputs=files[:20], work=work / "secrets"
            ),
        )
        section(
            results, "churn_s3", lambda: soak.churn(url=url, cycles=scale["churn_cycles"] // 2, storage_options=options)
        )
        section(
            results,
            "soak_s3",
            lambda: soak.long_run(
                url=url, epochs=scale["soak_s3_epochs"], storage_options=options, growth_bound_bytes=32 << 20
            ),
        )
    kill_inputs = work / "kill_inputs"
    kill_inputs.mkdir()
    for path in files[: scale["writer_kill_files"]]:
        (kill_inputs / path.name).write_bytes(path.read_bytes())
    section(
        results,
        "writer_kills",
        lambda: crash.writer_kills(
            inputs=str(kill_inputs / "*.py"), out_root=work / "writer_kills", runs=scale["writer_kill_runs"], seed=seed
        ),
    )
    section(
        results,
        "loader_kills",
        lambda: crash.loader_kill_resume(
            data=str(dataset),
            work=work / "loader_kills",
            runs=scale["loader_kill_runs"],
            seed=seed,
            total_steps=scale["loader_kill_steps"],
            resume_steps=6,
        ),
    )
    tries = {
        "manifest_mutations": scale["mutations"],
        "manifest_fields": 1,
        "huge_block_range": 1,
        "bit_flips": scale["bit_flips"],
        "frame_header_flips": 1,
        "frame_past_declared_size": scale["frames_past"],
        "truncated_objects": scale["truncations"],
        "tiny_datasets": 1,
        "writer_text": 1,
        "hostile_state": 1,
    }
    # Hostile cases read a whole epoch per try; a smaller dataset keeps
    # hundreds of tries inside the time budget.
    small = work / "small_dataset"
    write_local_dataset(files[:60], small)
    section(
        results,
        "hostile",
        lambda: {
            "cases": hostile.run_cases(dataset=small, work=work / "hostile", tries=tries, seed=seed, timeout_s=600)
        },
    )
    hostile_cases = results["hostile"].get("cases", {})
    if any(c.get("status") != "ok" for c in hostile_cases.values()):
        results["hostile"]["ok"] = False
    section(
        results,
        "soak_local",
        lambda: soak.long_run(url=str(dataset), epochs=scale["soak_epochs"], growth_bound_bytes=16 << 20),
    )
    section(results, "churn_local", lambda: soak.churn(url=str(dataset), cycles=scale["churn_cycles"]))
    return results


def _status(result: dict[str, Any]) -> str:
    return "yes" if result.get("ok") else f"**FAILED**: {result.get('error', '')[:200]}"


def table(results: dict[str, Any]) -> str:
    rows = ["| check | tried | survived / detected | data lost | passed |", "|---|---|---|---:|---|"]
    lf = results.get("loader_faults", {})
    for run in lf.get("runs", []):
        faults = run["faults"]
        kinds = ", ".join(f"{k} {v}" for k, v in faults.items() if v)
        rows.append(
            f"| loader through S3 faults at {run['rate']:.0%} | {lf['steps']} steps, {run['requests']} requests, "
            f"{sum(faults.values())} faults ({kinds or 'none drawn'}) | all {lf['steps']} steps "
            "identical to the clean run; "
            f"{run['retries']} retries, {run['stall_s']} s stalled | {run['steps_differing']} steps | {_status(lf)} |"
        )
    if not lf.get("ok", False) and "error" in lf:
        rows.append(f"| loader through S3 faults | | | | {_status(lf)} |")
    wf = results.get("writer_faults", {})
    for run in wf.get("runs", []):
        faults = run["faults"]
        kinds = ", ".join(f"{k} {v}" for k, v in faults.items() if v)
        rows.append(
            f"| writer S3 -> S3 through faults at {run['rate']:.0%} | {run['requests']} requests, "
            f"{sum(faults.values())} faults ({kinds or 'none drawn'}) | {wf['objects']} objects "
            "byte-identical to the clean write "
            f"| {run['objects_differing']} objects | {_status(wf)} |"
        )
    if not wf.get("ok", False) and "error" in wf:
        rows.append(f"| writer through S3 faults | | | | {_status(wf)} |")
    wk = results.get("writer_kills", {})
    rows.append(
        f"| writer SIGKILL at random points, rerun | {wk.get('runs', 0)} runs, {wk.get('kills', 0)} kills "
        f"(shards committed at the kill: {wk.get('partial_shards', [])}) | every rerun byte-identical "
        f"({wk.get('objects', 0)} objects); "
        f"{wk.get('orphans', '?')} worker processes outlived the kill | 0 | {_status(wk)} |"
    )
    lk = results.get("loader_kills", {})
    moves = ", ".join(f"{r['from_world']}->{r['to_world']}@{r['resumed_at']}" for r in lk.get("resumed", []))
    rows.append(
        f"| torchrun loader SIGKILL at a random step, resume at a random new world size | {lk.get('runs', 0)} runs "
        f"(W->W'@step: {moves}) | every step before the kill and after the resume identical to the reference "
        f"({lk.get('steps_checked', 0)} steps) | 0 | {_status(lk)} |"
    )
    for name, case in results.get("hostile", {}).get("cases", {}).items():
        ok = case.get("status") == "ok"
        detail = (
            (
                f"{case['refused']} clear errors, {case['accepted']} accepted with correct output"
                + (f", {case['detected']} corruptions detected by the loader" if case.get("detected") else "")
                + (f", {case['verify_detected']} by verify" if case.get("verify_detected") else "")
            )
            if ok
            else ""
        )
        rows.append(
            f"| hostile: {name.replace('_', ' ')} | {case.get('tries', 0)} | {detail} | "
            f"{'0' if ok else '?'} | {'yes' if ok else '**' + case.get('status', '?') + '**'} |"
        )
    sec = results.get("secrets", {})
    rows.append(
        f"| secrets in options, URL, env, CLI through a write + load + fault run | "
        f"{sec.get('outputs_searched', 0)} outputs, {sec.get('chars_searched', 0)} chars, "
        f"{sec.get('errors_seen', 0)} errors | {len(sec.get('leaks', [])) if sec.get('ok') else '?'} "
        f"leaks | 0 | {_status(sec)} |"
    )
    for key, where in (("soak_local", "local"), ("soak_s3", "S3")):
        so = results.get(key, {})
        rows.append(
            f"| long run, {where} | {so.get('epochs', 0)} epochs, {so.get('steps', 0)} steps | RSS "
            f"{so.get('rss_warm_mib', '?')} MiB after epoch 1, max {so.get('rss_max_mib', '?')} MiB: "
            f"+{so.get('growth_after_warmup_mib', '?')} MiB "
            f"(bound {so.get('growth_bound_mib', '?')}) | 0 | {_status(so)} |"
        )
    for key, where in (("churn_local", "local"), ("churn_s3", "S3")):
        ch = results.get(key, {})
        rows.append(
            f"| open/read/close cycles, {where} | {ch.get('cycles', 0)} cycles (up to "
            f"{ch.get('max_threads_open', '?')} threads, {ch.get('max_sockets_open', '?')} sockets open) | "
            f"threads {ch.get('threads_before', '?')} -> {ch.get('threads_after', '?')}, fds "
            f"{sum(ch.get('fds_before', {}).values())} -> {sum(ch.get('fds_after', {}).values())} | 0 | {_status(ch)} |"
        )
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small pass instead of the full scale")
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--workdir", default=None, help="scratch folder (default: a temporary one)")
    args = parser.parse_args()
    scale = QUICK if args.quick else FULL
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="zs-reliability-", dir=args.workdir) as tmp:
        results = run(scale, Path(tmp), args.seed)
    results["seconds"] = round(time.perf_counter() - started, 1)
    ok = all(v.get("ok", True) for v in results.values() if isinstance(v, dict))
    print(table(results))
    figures = {
        "ok": ok,
        "seconds": results["seconds"],
        "faults_injected": sum(
            sum(r["faults"].values())
            for k in ("loader_faults", "writer_faults")
            for r in results.get(k, {}).get("runs", [])
        ),
        "loader_retries": sum(r["retries"] for r in results.get("loader_faults", {}).get("runs", [])),
        "stall_s": round(sum(r["stall_s"] for r in results.get("loader_faults", {}).get("runs", [])), 2),
        "writer_kills": results.get("writer_kills", {}).get("kills", 0),
        "loader_crash_resumes": len(results.get("loader_kills", {}).get("resumed", [])),
        "hostile_inputs_tried": sum(c.get("tries", 0) for c in results.get("hostile", {}).get("cases", {}).values()),
        "corruptions_detected_by_loader": sum(
            c.get("detected", 0) for c in results.get("hostile", {}).get("cases", {}).values()
        ),
        "data_lost_steps": sum(r["steps_differing"] for r in results.get("loader_faults", {}).get("runs", [])),
        "secret_leaks": len(results.get("secrets", {}).get("leaks", [])),
        "rss_growth_mib": results.get("soak_local", {}).get("growth_after_warmup_mib"),
        "results": results,
    }
    print(json.dumps(figures, default=str))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
