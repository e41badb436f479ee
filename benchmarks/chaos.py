"""Chaos run: the writer and the loader through a fault-injecting proxy.

On a moto S3 server (a subprocess) on loopback, with real text (Python stdlib
sources) and the built-in ``bytes`` tokenizer:

1. Writer: the corpus is uploaded, then converted S3 -> S3 once straight to the
   server (the baseline) and once per fault rate through the proxy (inputs
   read and shards written through it). Every object must be byte-identical.
2. Loader: the baseline dataset is streamed for N steps straight from the
   server (the baseline per-step hashes), then through the proxy at each
   fault rate. Every step's hash must equal the baseline's.

Faults at rate r are split over 500s, 503s, connection resets, truncated
bodies (20% each), stalls and slow bodies (10% each). Printed per run: faults
injected, retries counted by the stores, stall time, and data lost (steps or
objects that differ: must be 0). The last printed line is one JSON object.

    python benchmarks/chaos.py [--rates 0.01 0.05 0.2] [--steps 300] [--files 60]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools.fault_proxy import FaultProxy  # noqa: E402
from zephon_stream import StreamingLoader, write_dataset  # noqa: E402
from zephon_stream.storage import open_store  # noqa: E402
from zephon_stream.storage.embedded_s3 import EmbeddedS3  # noqa: E402

SPLIT = {"error_500": 0.2, "error_503": 0.2, "reset": 0.2, "truncate": 0.2, "stall": 0.1, "slow_body": 0.1}
BUCKET = "chaos"


def fault_rates(total: float) -> dict[str, float]:
    return {kind: total * share for kind, share in SPLIT.items()}


def corpus_files(count: int) -> list[Path]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.glob("*.py") if p.stat().st_size > 2000)
    return files[:count]


def objects(url: str, options: dict) -> dict[str, str]:
    with open_store(url, options) as store:
        return {name: hashlib.sha256(store.read(name)).hexdigest() for name in store.list()}


def step_hashes(url: str, options: dict, *, steps: int, seq_len: int, batch: int) -> tuple[list[str], dict]:
    hashes = []
    with StreamingLoader(url, seq_len=seq_len, local_batch_size=batch, storage_options=options,
                         max_steps=steps) as loader:
        for step in loader:
            digest = hashlib.sha256(step["input"].numpy().tobytes())
            digest.update(step["labels"].numpy().tobytes())
            hashes.append(digest.hexdigest())
        stats = loader.stats()
    return hashes, stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", type=float, nargs="+", default=[0.01, 0.05, 0.20])
    parser.add_argument("--files", type=int, default=60, help="stdlib .py files in the corpus")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--block-tokens", type=int, default=8193)
    parser.add_argument("--blocks-per-shard", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    files = corpus_files(args.files)
    results: dict = {"rates": args.rates, "writer": [], "loader": []}
    with EmbeddedS3(subprocess=True) as server, tempfile.TemporaryDirectory() as tmp:
        server.create_bucket(BUCKET)
        clean = server.storage_options()
        with open_store(f"s3://{BUCKET}/raw", clean) as raw:
            for path in files:
                raw.write_atomic(path.name, path.read_bytes())
        corpus_bytes = sum(p.stat().st_size for p in files)
        print(f"corpus: {len(files)} files, {corpus_bytes / 1e6:.1f} MB; server {server.endpoint_url}")
        write_kwargs = dict(tokenizer="bytes", block_tokens=args.block_tokens,
                            blocks_per_shard=args.blocks_per_shard, progress=False)

        started = time.perf_counter()
        write_dataset([f"s3://{BUCKET}/raw/*.py"], f"s3://{BUCKET}/clean", storage_options=clean, **write_kwargs)
        clean_write_s = time.perf_counter() - started
        baseline_objects = objects(f"s3://{BUCKET}/clean", clean)
        print(f"writer baseline: {len(baseline_objects)} objects in {clean_write_s:.1f}s")

        for index, rate in enumerate(args.rates):
            with FaultProxy(upstream=server.endpoint_url, rates=fault_rates(rate), seed=args.seed + index,
                            stall_s=0.5, slow_body_s=0.2) as proxy:
                faulty = {**clean, "endpoint_url": proxy.endpoint_url}
                out = f"s3://{BUCKET}/faulty-{index}"
                started = time.perf_counter()
                write_dataset([f"s3://{BUCKET}/raw/*.py"], out, storage_options=faulty, **write_kwargs)
                elapsed = time.perf_counter() - started
                counts = proxy.counts()
            got = objects(out, clean)
            lost = sorted(set(baseline_objects) ^ set(got)) + sorted(
                n for n in set(baseline_objects) & set(got) if baseline_objects[n] != got[n])
            faults = sum(v for k, v in counts.items() if k != "requests")
            print(f"writer at {rate:.0%}: {counts['requests']} requests, {faults} faults injected {counts}, "
                  f"{elapsed:.1f}s (baseline {clean_write_s:.1f}s), objects differing: {len(lost)}")
            results["writer"].append({"rate": rate, "requests": counts["requests"], "faults": faults,
                                      "seconds": round(elapsed, 2), "objects_lost_or_different": len(lost)})

        base_url = f"s3://{BUCKET}/clean"
        started = time.perf_counter()
        baseline, base_stats = step_hashes(base_url, clean, steps=args.steps, seq_len=args.seq_len, batch=args.batch)
        clean_read_s = time.perf_counter() - started
        print(f"loader baseline: {len(baseline)} steps in {clean_read_s:.1f}s, stall {base_stats['stall_s']:.2f}s")
        for index, rate in enumerate(args.rates):
            with FaultProxy(upstream=server.endpoint_url, rates=fault_rates(rate), seed=100 + args.seed + index,
                            stall_s=0.5, slow_body_s=0.2) as proxy:
                faulty = {**clean, "endpoint_url": proxy.endpoint_url}
                started = time.perf_counter()
                hashes, stats = step_hashes(base_url, faulty, steps=args.steps, seq_len=args.seq_len,
                                            batch=args.batch)
                elapsed = time.perf_counter() - started
                counts = proxy.counts()
            lost = sum(1 for a, b in zip(hashes, baseline) if a != b) + abs(len(hashes) - len(baseline))
            faults = sum(v for k, v in counts.items() if k != "requests")
            print(f"loader at {rate:.0%}: {counts['requests']} requests, {faults} faults injected, "
                  f"{stats['retries']} retries, stall {stats['stall_s']:.2f}s, {elapsed:.1f}s "
                  f"(baseline {clean_read_s:.1f}s), steps differing: {lost}")
            results["loader"].append({"rate": rate, "requests": counts["requests"], "faults": faults,
                                      "retries": stats["retries"], "stall_s": round(stats["stall_s"], 3),
                                      "seconds": round(elapsed, 2), "steps": len(hashes), "steps_lost_or_different": lost})

    results["data_lost"] = sum(r["objects_lost_or_different"] for r in results["writer"]) + sum(
        r["steps_lost_or_different"] for r in results["loader"])
    results["baseline_write_s"] = round(clean_write_s, 2)
    results["baseline_read_s"] = round(clean_read_s, 2)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
