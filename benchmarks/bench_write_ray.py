"""The Ray engine's throughput against the process pool, and the commit's cost at 10,000 and 100,000 parts.

Throughput, on one corpus (stdlib ``.py`` sources, ``--max-mb``), one BPE
tokenizer (vocab 8000, trained here) and one local Ray instance of 2 CPUs
(started once, its start-up reported apart), each run ``--repeat`` times,
alternating, best kept and each pair's ratio shown (the machine may be shared):

- baseline: the tokenizer alone, texts in memory, on 1 and on 2 processes;
- pool: ``write_dataset(workers=2)`` (the process pool);
- ray: ``write_dataset(engine="ray")`` at 1 and 2 workers (units of ``--unit-mb``).

Target: ray at 2 workers >= 0.8x the pool's tokens/s.

Commit: N synthetic unit records (one shard each, every 100th with rejects)
written to a local folder, then in a fresh process each: the records read
alone (the baseline) and the full commit (records checked, manifest and index
objects built and written); wall time and peak RSS. Target: < 60 s and
< 2 GB at 100,000 parts. The last line printed is one JSON object.

Usage: python benchmarks/bench_write_ray.py [--max-mb 20] [--repeat 2] [--parts 10000,100000]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_write import baseline, corpus_files, train_bpe

TARGET_RATIO = 0.8
TARGET_COMMIT_S = 60.0
TARGET_COMMIT_BYTES = 2 * 2**30
BLOCK_TOKENS = 2**20 + 1
RAY_CPUS = 2


def tree_cpu_seconds() -> float:
    """CPU seconds of this process, its reaped children and every live descendant (Ray's daemons and workers).

    NOTE: on a machine shared under the kernel's autogroup scheduling, this
    process tree gets one group's share of the cores however many processes
    it runs, so tokens/s there measures CPU efficiency more than parallelism:
    CPU seconds per token say it directly.
    """
    tick = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry)] = int(fields[1])
        times[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    tree, frontier = set(), {os.getpid()}
    while frontier:
        tree |= frontier
        frontier = {pid for pid, parent in parents.items() if parent in frontier and pid not in tree}
    own = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    live = sum(times.get(pid, 0.0) for pid in tree if pid != os.getpid())
    return own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime + live


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
            path="shards/00000000.zst", num_tokens=2 * BLOCK_TOKENS + 1000 + index % 997, num_bytes=3_000_000,
            sha256=digest, block_offsets=(0, 1_000_000, 2_000_000, 3_000_000), index_path="shards/00000000.idx",
            index_sha256=digest, num_documents=500,
        )  # fmt: skip
        rejected = {"empty": 1} if index % 100 == 0 else {}
        record = UnitRecord(
            name=name, key=digest, shards=(shard,),
            sources=(SourceCount(path=f"s3://corpus/train/file-{index:07d}.jsonl", num_records=500 + len(rejected),
                                 num_documents=500, num_rejected=len(rejected)),),
            rejected=rejected, num_tokens=shard.num_tokens, input_bytes=9_000_000,
        )  # fmt: skip
        (root / name).mkdir()
        # NOTE: plain writes, no fsync: building the fixture is not what is measured.
        (root / name / UNIT_RECORD_NAME).write_bytes(record.to_bytes())
        if rejected:
            line = json.dumps({"source": f"s3://corpus/train/file-{index:07d}.jsonl", "record": 500, "reason": "empty", "detail": "empty text"})
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
        tokenizer = TokenizerInfo(kind="hf", name="bench", vocab_size=50_000, eos_id=0, bos_id=None, fingerprint="0" * 64)
        manifest, totals = commit_units(store, names, tokenizer=tokenizer, block_tokens=BLOCK_TOKENS, blocks_per_shard=4)
        assert manifest.num_shards == num_parts and totals.num_units == num_parts
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds, "peak_rss_bytes": peak_rss_bytes()}))


def peak_rss_bytes() -> int:
    """This process's peak RSS since its exec.

    NOTE: not ``getrusage``: Linux carries a parent's high-water mark across
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
            capture_output=True, text=True, check=True, env=dict(os.environ, PYTHONPATH=_pythonpath()),
        )  # fmt: skip
        result = json.loads(done.stdout.strip().splitlines()[-1])
        out[f"{mode}_s"] = round(result["seconds"], 2)
        out[f"{mode}_peak_rss_mib"] = round(result["peak_rss_bytes"] / 2**20, 1)
    manifest_bytes = sum(p.stat().st_size for p in [root / "manifest", *(root / "index").glob("*")])
    out["manifest_and_index_bytes"] = manifest_bytes
    out["meets_target"] = out["commit_s"] < TARGET_COMMIT_S and out["commit_peak_rss_mib"] * 2**20 < TARGET_COMMIT_BYTES
    print(f"commit of {num_parts:,} parts: {out['commit_s']:.2f} s, peak RSS {out['commit_peak_rss_mib']:.0f} MiB "
          f"(records read alone: {out['read_s']:.2f} s, {out['read_peak_rss_mib']:.0f} MiB; "
          f"manifest + index objects {manifest_bytes / 2**20:.1f} MiB)")  # fmt: skip
    shutil.rmtree(root, ignore_errors=True)
    return out


def _pythonpath() -> str:
    repo = str(Path(__file__).resolve().parent.parent)
    return os.pathsep.join([repo, str(Path(__file__).resolve().parent), os.environ.get("PYTHONPATH", "")])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-mb", type=float, default=20.0, help="corpus size cap (MB)")
    parser.add_argument("--unit-mb", type=float, default=1.0, help="input MB a Ray work unit aims at")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--parts", default="10000,100000", help="commit sizes, comma-separated ('' skips)")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--commit-child", nargs=3, metavar=("ROOT", "N", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.commit_child:
        commit_child(args.commit_child[0], int(args.commit_child[1]), args.commit_child[2])
        return
    # NOTE: a short folder: Ray's session lives in it, and its socket paths may not exceed 107 bytes.
    work = Path(tempfile.mkdtemp(prefix="zs-bwr-", dir="/tmp" if os.path.isdir("/tmp") else None))
    result: dict = {"benchmark": "bench_write_ray", "load_average": round(os.getloadavg()[0], 2), "cpus": os.cpu_count()}
    try:
        if not args.skip_throughput:
            result.update(throughput(args, work))
        result["commit"] = [measure_commit(int(n), work) for n in args.parts.split(",") if n]
        result["commit_meets_target"] = all(c["meets_target"] for c in result["commit"])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result))


def throughput(args: argparse.Namespace, work: Path) -> dict:
    from zephon_stream import write_dataset
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
    # NOTE: the engine's own local instance, started once and shared by every Ray run below.
    session = ray_session(None, num_cpus=RAY_CPUS)
    session.__enter__()
    ray_start_s = time.perf_counter() - start
    print(f"local Ray instance of {RAY_CPUS} CPUs: {ray_start_s:.1f} s to start (not counted below)")
    runs: dict[str, list[float]] = {k: [] for k in ("base1", "base2", "pool2", "ray1", "ray2")}
    cpu_per_mtok: dict[str, list[float]] = {k: [] for k in runs}
    num_tokens = 0
    try:
        for rep in range(args.repeat):
            for label, workers in (("base1", 1), ("base2", 2)):
                cpu = tree_cpu_seconds()
                tokens, seconds = baseline(tokenizer, texts, workers)
                cpu_per_mtok[label].append((tree_cpu_seconds() - cpu) / (tokens + len(texts)) * 1e6)
                runs[label].append((tokens + len(texts)) / seconds)  # NOTE: the writer adds one EOS a document
            for label, kwargs in (
                ("pool2", {"workers": 2, "pool_min_input_bytes": 0}),
                ("ray1", {"engine": "ray", "ray_workers": 1, "unit_bytes": int(args.unit_mb * 2**20)}),
                ("ray2", {"engine": "ray", "ray_workers": 2, "unit_bytes": int(args.unit_mb * 2**20)}),
            ):
                out = work / label
                shutil.rmtree(out, ignore_errors=True)
                cpu, start = tree_cpu_seconds(), time.perf_counter()
                summary = write_dataset(str(corpus / "*.py"), str(out), tokenizer=spec, progress=False, **kwargs)
                runs[label].append(summary.num_tokens / (time.perf_counter() - start))
                cpu_per_mtok[label].append((tree_cpu_seconds() - cpu) / summary.num_tokens * 1e6)
                num_tokens = summary.num_tokens
            print(f"[{rep}] tokens/s: " + ", ".join(f"{k} {v[-1]:,.0f}" for k, v in runs.items()))
            print(f"[{rep}] CPU s per M tokens (process tree): " + ", ".join(f"{k} {v[-1]:.2f}" for k, v in cpu_per_mtok.items()))
    finally:
        session.__exit__(None, None, None)
    best = {k: max(v) for k, v in runs.items()}
    ratio = best["ray2"] / best["pool2"]
    pairs = [r / p for r, p in zip(runs["ray2"], runs["pool2"])]
    print(f"tokenizer alone: 1 process {best['base1']:,.0f}, 2 processes {best['base2']:,.0f} tokens/s")
    print(f"pool (2 workers): {best['pool2']:,.0f} tokens/s ({best['pool2'] / best['base2']:.3f}x the tokenizer alone)")
    print(f"ray: 1 worker {best['ray1']:,.0f} ({best['ray1'] / best['base1']:.3f}x one process alone), "
          f"2 workers {best['ray2']:,.0f} tokens/s ({best['ray2'] / best['base2']:.3f}x two alone)")  # fmt: skip
    print(f"ray/pool at 2 workers: {ratio:.3f} (target >= {TARGET_RATIO}) {'OK' if ratio >= TARGET_RATIO else 'BELOW TARGET'}; "
          f"each pair {', '.join(f'{r:.3f}' for r in pairs)}")  # fmt: skip
    cpu_best = {k: min(v) for k, v in cpu_per_mtok.items()}
    print("CPU s per M tokens (best): " + ", ".join(f"{k} {v:.2f}" for k, v in cpu_best.items())
          + f"; ray2/pool2 CPU {cpu_best['ray2'] / cpu_best['pool2']:.3f}; load average {os.getloadavg()[0]:.1f}")
    return {
        "cpu_s_per_mtok": {k: round(v, 3) for k, v in cpu_best.items()},
        "runs_cpu_s_per_mtok": {k: [round(x, 3) for x in v] for k, v in cpu_per_mtok.items()},
        "corpus_files": len(files), "corpus_bytes": corpus_bytes, "num_tokens": num_tokens,
        "unit_mb": args.unit_mb, "ray_start_s": round(ray_start_s, 2),
        "tokens_per_s": {k: round(v) for k, v in best.items()},
        "runs_tokens_per_s": {k: [round(x) for x in v] for k, v in runs.items()},
        "ray2_over_pool2": round(ratio, 4), "pair_ratios": [round(r, 4) for r in pairs],
        "target_ratio": TARGET_RATIO, "meets_target": ratio >= TARGET_RATIO,
    }  # fmt: skip


if __name__ == "__main__":
    main()
