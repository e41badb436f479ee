"""The Ray engine's throughput and CPU per token against the process pool, and the
commit's cost at 10,000 and 100,000 parts.

Throughput, on one corpus (stdlib ``.py`` sources, ``--max-mb``), one BPE
tokenizer (vocab 8000, trained here) and one local Ray instance of 2 CPUs
(started once, its start-up reported apart). A first Ray run and a first pool
run are reported apart (a Ray worker's first unit imports the writer), then
Ray's daemons are measured idle (``--idle-s``). Then ``--repeat`` rounds,
each a pair run back to back in alternating order (the machine may be shared):

- pool: ``write_dataset(workers=2)`` (the process pool), the baseline;
- ray: ``write_dataset(engine="ray", ray_workers=2)`` (units of ``--unit-mb``);
- unless ``--pairs-only``: the tokenizer alone on texts in memory on 1 and 2
  processes, and ray at 1 worker.

CPU by process (``ray_cpu.py``): the pool's is its driver and workers; Ray's
tasks' is its worker processes' whole; Ray's daemons' (raylet, GCS, agents,
monitors) is reported as their share of Ray's CPU in the run, idle, and in a
model of a 64-core node (computed, marked so). Targets, medians of the pairs:
ray tokens/s >= 0.8x the pool's, the tasks' CPU per token <= 1.15x the pool's.

Commit: N synthetic unit records (one shard each, every 100th with rejects)
written to a local folder, then in a fresh process each: the records read
alone (the baseline) and the full commit (records checked, manifest and index
objects built and written); wall time and peak RSS. Target: < 60 s and
< 2 GB at 100,000 parts. The last line printed is one JSON object.

Usage: python benchmarks/bench_write_ray.py [--max-mb 20] [--repeat 2] [--pairs-only] [--parts 10000,100000]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import ray_cpu
from bench_write import baseline, corpus_files, train_bpe

TARGET_RATIO = 0.8
TARGET_CPU_RATIO = 1.15
TARGET_COMMIT_S = 60.0
TARGET_COMMIT_BYTES = 2 * 2**30
BLOCK_TOKENS = 2**20 + 1
RAY_CPUS = 2


def synthesize_parts(root: Path, num_parts: int) -> None:
    """``num_parts`` unit records below ``root``, each naming one shard of 3 blocks (the shards are not written)."""
    from zephon_stream.format.manifest import ShardInfo
    from zephon_stream.writer.distributed import part_name
    from zephon_stream.writer.unit_part import UNIT_RECORD_NAME, SourceCount, UnitRecord

    root.mkdir(parents=True)
    for index in range(num_parts):
        name = part_name(index, num_parts)
        digest = hashlib.sha256(name.encode()).hexdigest()
        shard = ShardInfo(
            path="shards/00000000.zst",
            num_tokens=2 * BLOCK_TOKENS + 1000 + index % 997,
            num_bytes=3_000_000,
            sha256=digest,
            block_offsets=(0, 1_000_000, 2_000_000, 3_000_000),
            index_path="shards/00000000.idx",
            index_sha256=digest,
            num_documents=500,
        )
        rejected = {"empty": 1} if index % 100 == 0 else {}
        record = UnitRecord(
            name=name,
            key=digest,
            shards=(shard,),
            sources=(
                SourceCount(
                    path=f"s3://corpus/train/file-{index:07d}.jsonl",
                    num_records=500 + len(rejected),
                    num_documents=500,
                    num_rejected=len(rejected),
                ),
            ),
            rejected=rejected,
            num_tokens=shard.num_tokens,
            input_bytes=9_000_000,
        )
        (root / name).mkdir()
        # Plain writes, no fsync: building the fixture is not what is measured.
        (root / name / UNIT_RECORD_NAME).write_bytes(record.to_bytes())
        if rejected:
            line = json.dumps(
                {
                    "source": f"s3://corpus/train/file-{index:07d}.jsonl",
                    "record": 500,
                    "reason": "empty",
                    "detail": "empty text",
                }
            )
            (root / name / "rejects.jsonl").write_bytes(line.encode() + b"\n")


def commit_child(root: str, num_parts: int, mode: str) -> None:
    """In this fresh process: read the records (``read``) or commit them (``commit``); print time and peak RSS."""
    from zephon_stream.format.entries import TokenizerInfo
    from zephon_stream.storage import open_store
    from zephon_stream.writer.distributed import part_name
    from zephon_stream.writer.ray_commit import commit_units, iter_records

    names = [part_name(i, num_parts) for i in range(num_parts)]
    store = open_store(root)
    start = time.perf_counter()
    if mode == "read":
        shards = sum(len(r.shards) for r in iter_records(store, names))
        assert shards == num_parts
    else:
        tokenizer = TokenizerInfo(
            kind="hf", name="bench", vocab_size=50_000, eos_id=0, bos_id=None, fingerprint="0" * 64
        )
        manifest, totals = commit_units(
            store, names, tokenizer=tokenizer, block_tokens=BLOCK_TOKENS, blocks_per_shard=4
        )
        assert manifest.num_shards == num_parts and totals.num_units == num_parts
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds, "peak_rss_bytes": peak_rss_bytes()}))


def peak_rss_bytes() -> int:
    """This process's peak RSS since its exec.

    Not ``getrusage``: Linux carries a parent's high-water mark across
    fork and exec into ``ru_maxrss``, so a child of a large benchmark would
    report its parent's size.
    """
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def measure_commit(num_parts: int, work: Path) -> dict:
    root = work / f"parts-{num_parts}"
    start = time.perf_counter()
    synthesize_parts(root, num_parts)
    build_s = time.perf_counter() - start
    out = {"parts": num_parts, "synthesize_s": round(build_s, 2)}
    for mode in ("read", "commit"):
        done = subprocess.run(
            [sys.executable, __file__, "--commit-child", str(root), str(num_parts), mode],
            capture_output=True,
            text=True,
            check=True,
            env=dict(os.environ, PYTHONPATH=_pythonpath()),
        )
        result = json.loads(done.stdout.strip().splitlines()[-1])
        out[f"{mode}_s"] = round(result["seconds"], 2)
        out[f"{mode}_peak_rss_mib"] = round(result["peak_rss_bytes"] / 2**20, 1)
    manifest_bytes = sum(p.stat().st_size for p in [root / "manifest", *(root / "index").glob("*")])
    out["manifest_and_index_bytes"] = manifest_bytes
    out["meets_target"] = out["commit_s"] < TARGET_COMMIT_S and out["commit_peak_rss_mib"] * 2**20 < TARGET_COMMIT_BYTES
    print(
        f"commit of {num_parts:,} parts: {out['commit_s']:.2f} s, peak RSS {out['commit_peak_rss_mib']:.0f} MiB "
        f"(records read alone: {out['read_s']:.2f} s, {out['read_peak_rss_mib']:.0f} MiB; "
        f"manifest + index objects {manifest_bytes / 2**20:.1f} MiB)"
    )
    shutil.rmtree(root, ignore_errors=True)
    return out


def _pythonpath() -> str:
    repo = str(Path(__file__).resolve().parent.parent)
    return os.pathsep.join([repo, str(Path(__file__).resolve().parent), os.environ.get("PYTHONPATH", "")])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-mb", type=float, default=20.0, help="corpus size cap (MB)")
    parser.add_argument("--unit-mb", type=float, default=1.0, help="input MB a Ray work unit aims at")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--parts", default="10000,100000", help="commit sizes, comma-separated ('' skips)")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--pairs-only", action="store_true", help="each round: the pool and Ray at 2 workers only")
    parser.add_argument("--idle-s", type=float, default=10.0, help="seconds Ray's idle daemons are measured")
    parser.add_argument("--commit-child", nargs=3, metavar=("ROOT", "N", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.commit_child:
        commit_child(args.commit_child[0], int(args.commit_child[1]), args.commit_child[2])
        return
    # A short folder: Ray's session lives in it, and its socket paths may not exceed 107 bytes.
    work = Path(tempfile.mkdtemp(prefix="zs-bwr-", dir="/tmp" if os.path.isdir("/tmp") else None))
    result: dict = {
        "benchmark": "bench_write_ray",
        "load_average": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
    }
    try:
        if not args.skip_throughput:
            result.update(throughput(args, work))
        result["commit"] = [measure_commit(int(n), work) for n in args.parts.split(",") if n]
        result["commit_meets_target"] = all(c["meets_target"] for c in result["commit"])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result))


def throughput(args: argparse.Namespace, work: Path) -> dict:
    from zephon_stream.writer.ray_engine import ray_session
    from zephon_stream.writer.tokenizers import load_tokenizer

    files = corpus_files(int(args.max_mb * 1e6))
    texts = [t for _, t in files]
    corpus = work / "corpus"
    corpus.mkdir()
    for i, (path, _) in enumerate(files):
        shutil.copyfile(path, corpus / f"{i:05d}_{path.name}")
    tok_path = work / "tokenizer.json"
    train_bpe(texts[:300], tok_path)
    spec = f"hf:{tok_path}"
    tokenizer = load_tokenizer(spec)
    corpus_bytes = sum(len(t.encode("utf-8")) for t in texts)
    print(f"corpus: {len(files)} files, {corpus_bytes / 1e6:.1f} MB; BPE vocab {tokenizer.vocab_size}")
    start = time.perf_counter()
    # The engine's own local instance, started once and shared by every Ray run below.
    session = ray_session(None, num_cpus=RAY_CPUS)
    session.__enter__()
    ray_start_s = time.perf_counter() - start
    print(f"local Ray instance of {RAY_CPUS} CPUs: {ray_start_s:.1f} s to start (not counted below)")
    runner = WriteRuns(corpus=corpus, spec=spec, work=work, unit_bytes=int(args.unit_mb * 2**20))
    rounds: list[dict] = []
    try:
        workers_code = ray_cpu.check_workers_code()
        # A Ray worker's first unit imports the writer and fetches the tokenizer: paid once, reported apart.
        first = {label: runner.run(label) for label in ("ray2", "pool2")}
        print(
            f"first runs (not counted): ray2 {first['ray2']['tokens_per_s']:,.0f} tokens/s, task CPU "
            f"{first['ray2']['task_cpu_s_per_mtok']:.2f} s/M tokens; pool2 {first['pool2']['tokens_per_s']:,.0f}"
        )
        pool_start_s = runner.pool_start_cpu_s()
        print(f"the pool's start (2 worker processes; a run on one small file): {pool_start_s:.2f} CPU s")
        idle = ray_cpu.idle_cpu(args.idle_s)
        print(
            f"idle for {args.idle_s:.0f} s: Ray's daemons {idle['daemon_cores']:.4f} cores "
            f"({', '.join(f'{k} {v:.4f}' for k, v in idle['daemon_cores_by_name'].items())}), "
            f"its {idle['workers']} idle workers {idle['worker_cores']:.4f} cores"
        )
        for rep in range(args.repeat):
            row: dict = {"load_average": round(os.getloadavg()[0], 2)}
            if not args.pairs_only:
                for label, workers in (("base1", 1), ("base2", 2)):
                    row[label] = tokenizer_alone(tokenizer, texts, workers)
            # The pair's order alternates, so a load that rises or falls through a round favours neither.
            labels = ("pool2", "ray2") if rep % 2 == 0 else ("ray2", "pool2")
            for label in labels + (() if args.pairs_only else ("ray1",)):
                row[label] = runner.run(label)
            pool = row["pool2"]
            pool["net_cpu_s_per_mtok"] = (pool["cpu_s"] - pool_start_s) / pool["num_tokens"] * 1e6
            rounds.append(row)
            print(round_line(rep, row))
    finally:
        session.__exit__(None, None, None)
    return summarize(
        rounds,
        idle=idle,
        first=first,
        corpus_bytes=corpus_bytes,
        files=len(files),
        args=args,
        ray_start_s=ray_start_s,
        pool_start_s=pool_start_s,
        workers_code=workers_code,
    )


class WriteRuns:
    """``write_dataset`` runs by label, each with its tokens/s and CPU by role (``ray_cpu``)."""

    def __init__(self, *, corpus: Path, spec: str, work: Path, unit_bytes: int) -> None:
        self.corpus, self.spec, self.work = corpus, spec, work
        self.kwargs = {
            "pool2": {"workers": 2, "pool_min_input_bytes": 0},
            "ray1": {"engine": "ray", "ray_workers": 1, "unit_bytes": unit_bytes},
            "ray2": {"engine": "ray", "ray_workers": 2, "unit_bytes": unit_bytes},
        }

    def run(self, label: str, inputs: str | None = None) -> dict:
        from zephon_stream import write_dataset

        out = self.work / label
        shutil.rmtree(out, ignore_errors=True)
        before, start = ray_cpu.snapshot(), time.perf_counter()
        summary = write_dataset(
            inputs or str(self.corpus / "*.py"), str(out), tokenizer=self.spec, progress=False, **self.kwargs[label]
        )
        seconds = time.perf_counter() - start
        after = ray_cpu.snapshot()
        spent, daemons = ray_cpu.cpu_by_role(before, after), ray_cpu.daemon_cpu_by_name(before, after)
        mtok = summary.num_tokens / 1e6
        result = {
            "tokens_per_s": summary.num_tokens / seconds,
            "seconds": seconds,
            "num_tokens": summary.num_tokens,
            "cpu_s": {k: round(v, 3) for k, v in spent.items()},
        }
        if label.startswith("ray"):
            # The tasks' CPU is their worker processes' whole (Ray's own threads there included).
            task_s = spent["task"] + spent["worker_ray"]
            ray_total_s = task_s + spent["daemon"] + spent["driver"]
            result.update(
                units=summary.num_units,
                task_cpu_s_per_mtok=task_s / mtok,
                cpu_s_per_mtok=ray_total_s / mtok,
                daemon_cpu_s=spent["daemon"],
                daemons_share=spent["daemon"] / ray_total_s if ray_total_s else 0.0,
                daemon_cpu_s_by_name={k: round(v, 3) for k, v in daemons.items()},
            )
        else:
            # Ray's processes idle beside the pool; their CPU is not the pool's.
            result["cpu_s"] = spent["driver"] + spent["reaped"] + spent["other"]
            result["cpu_s_per_mtok"] = result["cpu_s"] / mtok
        return result

    def pool_start_cpu_s(self, tries: int = 3) -> float:
        """The CPU of a pool run on one small file: starting its 2 worker processes, mostly (median of ``tries``)."""
        small = min(self.corpus.glob("*.py"), key=lambda p: (p.stat().st_size < 1000, p.stat().st_size))
        return statistics.median(self.run("pool2", inputs=str(small))["cpu_s"] for _ in range(tries))


def tokenizer_alone(tokenizer, texts: list[str], workers: int) -> dict:
    before = ray_cpu.snapshot()
    tokens, seconds = baseline(tokenizer, texts, workers)
    spent = ray_cpu.cpu_by_role(before, ray_cpu.snapshot())
    tokens += len(texts)  # The writer adds one EOS a document
    return {
        "tokens_per_s": tokens / seconds,
        "cpu_s_per_mtok": (spent["driver"] + spent["reaped"] + spent["other"]) / tokens * 1e6,
    }


def round_line(rep: int, row: dict) -> str:
    pool, ray = row["pool2"], row["ray2"]
    return (
        f"[{rep}] load {row['load_average']:.1f}: pool2 {pool['tokens_per_s']:,.0f} tokens/s, "
        f"{pool['cpu_s_per_mtok']:.2f} CPU s/M tokens ({pool['net_cpu_s_per_mtok']:.2f} less its start); "
        f"ray2 {ray['tokens_per_s']:,.0f} tokens/s "
        f"({ray['tokens_per_s'] / pool['tokens_per_s']:.3f}x), tasks {ray['task_cpu_s_per_mtok']:.2f} CPU s/M tokens "
        f"({ray['task_cpu_s_per_mtok'] / pool['net_cpu_s_per_mtok']:.3f}x), daemons {ray['daemons_share'] * 100:.1f}% "
        f"of Ray's CPU"
        + "".join(f"; {k} {row[k]['tokens_per_s']:,.0f}" for k in ("base1", "base2", "ray1") if k in row)
    )


def summarize(
    rounds: list[dict],
    *,
    idle: dict,
    first: dict,
    corpus_bytes: int,
    files: int,
    args,
    ray_start_s: float,
    pool_start_s: float,
    workers_code: str,
) -> dict:
    throughput_pairs = [r["ray2"]["tokens_per_s"] / r["pool2"]["tokens_per_s"] for r in rounds]
    # Against the pool's CPU less its workers' start, as Ray's is measured after its workers' first unit.
    cpu_pairs = [r["ray2"]["task_cpu_s_per_mtok"] / r["pool2"]["net_cpu_s_per_mtok"] for r in rounds]
    whole_pairs = [r["ray2"]["task_cpu_s_per_mtok"] / r["pool2"]["cpu_s_per_mtok"] for r in rounds]
    shares = [r["ray2"]["daemons_share"] for r in rounds]
    model = ray_cpu.model_cores(rounds, idle, corpus_bytes, measured_cpus=RAY_CPUS)
    labels = [k for k in ("base1", "base2", "pool2", "ray1", "ray2") if k in rounds[0]]
    best = {k: max(r[k]["tokens_per_s"] for r in rounds) for k in labels}
    med = {
        "throughput": statistics.median(throughput_pairs),
        "cpu": statistics.median(cpu_pairs),
        "share": statistics.median(shares),
    }
    print(
        "\n| round | load | pool, 2 workers: tokens/s, CPU s/M tokens (less its start) | Ray, 2 workers: tokens/s, "
        "tasks' CPU s/M tokens | Ray / pool: tokens/s, tasks' CPU per token (vs the pool's whole) "
        "| daemons' share of Ray's CPU |\n|---|---|---|---|---|---|"
    )
    for i, r in enumerate(rounds):
        pool, ray = r["pool2"], r["ray2"]
        print(
            f"| {i} | {r['load_average']:.1f} | {pool['tokens_per_s'] / 1e3:,.0f}k, {pool['cpu_s_per_mtok']:.2f} "
            f"({pool['net_cpu_s_per_mtok']:.2f}) | {ray['tokens_per_s'] / 1e3:,.0f}k, {ray['task_cpu_s_per_mtok']:.2f} "
            f"| {throughput_pairs[i]:.2f}, {cpu_pairs[i]:.2f} ({whole_pairs[i]:.2f}) | {shares[i] * 100:.1f}% |"
        )
    print(
        f"\nRay / pool at 2 workers, median of {len(rounds)} pairs: tokens/s {med['throughput']:.3f} "
        f"({min(throughput_pairs):.2f}-{max(throughput_pairs):.2f}; target >= {TARGET_RATIO}), tasks' CPU per token "
        f"{med['cpu']:.3f} ({min(cpu_pairs):.2f}-{max(cpu_pairs):.2f}; target <= {TARGET_CPU_RATIO}; against the "
        f"pool's whole, its start's {pool_start_s:.2f} CPU s included: {statistics.median(whole_pairs):.3f}); daemons "
        f"{med['share'] * 100:.1f}% of Ray's CPU; load average {os.getloadavg()[0]:.1f} now, "
        f"{min(r['load_average'] for r in rounds):.1f}-"
        f"{max(r['load_average'] for r in rounds):.1f} at the rounds' starts"
    )
    print(
        f"model (computed), a {model['cores']}-core node converting {model['unit_mib']:.0f} MiB units: Ray's daemons "
        f"{model['daemon_cores'][0]:.3f}-{model['daemon_cores'][1]:.3f} cores, "
        f"{model['daemons_share_of_node'][0] * 100:.2f}-"
        f"{model['daemons_share_of_node'][1] * 100:.2f}% of the node"
    )
    return {
        "corpus_files": files,
        "corpus_bytes": corpus_bytes,
        "num_tokens": rounds[0]["ray2"]["num_tokens"],
        "unit_mb": args.unit_mb,
        "ray_start_s": round(ray_start_s, 2),
        "rounds": len(rounds),
        "load_averages": [r["load_average"] for r in rounds],
        "throughput_vs_pool": round(med["throughput"], 4),
        "throughput_vs_pool_pairs": [round(x, 4) for x in throughput_pairs],
        "ray_task_cpu_per_token_vs_pool": round(med["cpu"], 4),
        "ray_task_cpu_per_token_vs_pool_pairs": [round(x, 4) for x in cpu_pairs],
        "ray_task_cpu_per_token_vs_pool_whole": round(statistics.median(whole_pairs), 4),
        "pool_start_cpu_s": round(pool_start_s, 3),
        "ray_daemons_cpu_share": round(med["share"], 5),
        "ray_daemons_cpu_share_runs": [round(x, 5) for x in shares],
        "daemons_idle": {k: (round(v, 5) if isinstance(v, float) else v) for k, v in idle.items()},
        "daemons_model_64_cores": model,
        "first_runs": {
            k: {"tokens_per_s": round(v["tokens_per_s"]), "cpu_s_per_mtok": round(v["cpu_s_per_mtok"], 3)}
            for k, v in first.items()
        },
        "tokens_per_s": {k: round(v) for k, v in best.items()},
        "cpu_s_per_mtok": {k: round(min(r[k]["cpu_s_per_mtok"] for r in rounds), 3) for k in labels},
        "ray_task_cpu_s_per_mtok": [round(r["ray2"]["task_cpu_s_per_mtok"], 3) for r in rounds],
        "runs": rounds,
        "workers_code": workers_code,
        "ray2_over_pool2": round(best["ray2"] / best["pool2"], 4),
        "target_ratio": TARGET_RATIO,
        "target_cpu_ratio": TARGET_CPU_RATIO,
        "meets_target": med["throughput"] >= TARGET_RATIO and med["cpu"] <= TARGET_CPU_RATIO,
    }


if __name__ == "__main__":
    main()
