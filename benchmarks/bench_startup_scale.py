"""Start-up at scale: a fresh rank of W = 2048 over a 1.1 T- or 15 T-token dataset,
format 1.0 and 1.1, local and SeaweedFS.

The datasets are synthetic (no shard exists): full shards of 64 blocks of
2**20 + 1 tokens, enough of them for ``--tokens`` (1.1e12: 16,384 shards;
15e12: 229,376), two sources a shard, built with ``Manifest.create`` as the
writer would and written in both forms: ``v10`` (format 1.0, every entry in
the manifest) and ``v11`` (format 1.1, a header and index objects), to a
local folder (``--output DIR`` keeps them there) and to a bucket of a
SeaweedFS server on loopback (tools/seaweedfs.py).

For each form and store, a fresh process (``--probe``) imports the package
and torch, then the store's client library (s3fs with aiobotocore and aiohttp
for SeaweedFS: timed apart, as ``client import``, since a process pays it once
whatever reads first), then constructs ``StreamingLoader(url, seq_len=2048, local_batch_size=4,
rank=1000, world_size=2048, pipeline="threads")``, takes its
``state_dict()``, plans its first step and locates that step's blocks (what
its producer does before fetching them; the shards do not exist). It prints
the seconds that took, the bytes and reads its store made, and the peak RSS
it added: format 1.0 in the same run is the baseline.

The last printed line is one JSON object.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools.seaweedfs import SeaweedFS  # noqa: E402
from zephon_stream import Manifest, StreamingLoader  # noqa: E402
from zephon_stream.format.manifest import ShardInfo, SourceInfo, TokenizerInfo  # noqa: E402
from zephon_stream.format.spec import DEFAULT_BLOCK_TOKENS  # noqa: E402
from zephon_stream.storage import open_store  # noqa: E402


def synthetic_manifest(*, shards: int, blocks_per_shard: int, sources: int) -> Manifest:
    """A manifest of full shards with plausible offsets and digests (no shard exists)."""
    block_tokens = DEFAULT_BLOCK_TOKENS
    frame_bytes = 600_000
    tokenizer = TokenizerInfo(
        kind="bytes",
        name="bytes",
        vocab_size=257,
        eos_id=256,
        bos_id=None,
        fingerprint=hashlib.sha256(b"bytes").hexdigest(),
    )
    infos = []
    for i in range(shards):
        offsets = tuple(range(0, (blocks_per_shard + 1) * frame_bytes, frame_bytes))
        digest = hashlib.sha256(i.to_bytes(8, "little")).hexdigest()
        infos.append(
            ShardInfo(
                path=f"shards/{i:08d}.zst",
                num_tokens=blocks_per_shard * block_tokens,
                num_bytes=offsets[-1],
                sha256=digest,
                block_offsets=offsets,
                index_path=f"shards/{i:08d}.idx",
                index_sha256=digest,
                num_documents=1000,
            )
        )
    docs_per_source = shards * 1000 // sources
    source_infos = [
        SourceInfo(
            path=f"s3://corpus/part-{i:06d}.jsonl.zst",
            num_records=docs_per_source,
            num_documents=docs_per_source,
            num_rejected=0,
        )
        for i in range(sources)
    ]
    source_infos[-1] = SourceInfo(
        path=source_infos[-1].path,
        num_records=shards * 1000 - docs_per_source * (sources - 1),
        num_documents=shards * 1000 - docs_per_source * (sources - 1),
        num_rejected=0,
    )
    return Manifest.create(
        tokenizer=tokenizer,
        block_tokens=block_tokens,
        blocks_per_shard=blocks_per_shard,
        shards=infos,
        sources=source_infos,
    )


WORLD_SIZE, RANK = 2048, 1000
SHARD_TOKENS = 64 * DEFAULT_BLOCK_TOKENS


def probe(url: str, options: dict | None) -> dict:
    """In a fresh process: a rank's start, measured after the imports."""
    import fsspec
    import torch  # noqa: F401 - imported before the clock starts, as a trainer has

    # The store's client library (s3fs, aiobotocore, aiohttp: 0.8 s
    # here) is imported once per process by whatever reads from that store
    # first; timed apart, so that the figure is the rank's own start.
    import_started = time.perf_counter()
    if "://" in url:
        fsspec.get_filesystem_class(url.split("://", 1)[0])
    client_import_s = time.perf_counter() - import_started
    # The imports' own peak is forgotten (Linux: 5 to clear_refs resets VmHWM).
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    rss_before = _status_kb("VmRSS")
    started = time.perf_counter()
    with StreamingLoader(
        url,
        seq_len=2048,
        local_batch_size=4,
        rank=RANK,
        world_size=WORLD_SIZE,
        storage_options=options,
        pipeline="threads",
        node_cache=False,
    ) as loader:
        state = loader.state_dict()
        plan = loader._layout.planner(start=state["position"], num_steps=None).next_step()
        source = loader._sources[0]
        source.locate([key[1] for key in plan.unique_keys])
        elapsed = time.perf_counter() - started
        counts = source.store.stats()
    return {
        "first_planned_step_s": elapsed,
        "client_import_s": client_import_s,
        "bytes_read": counts["bytes_read"],
        "reads": counts["reads"],
        "rss_added_mb": (_status_kb("VmHWM") - rss_before) / 1024,
    }


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def fresh_probe(url: str, options: dict | None) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--probe", url, "--options", json.dumps(options)],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=float, default=1.1e12, help="dataset size (1.1e12, 15e12, ...)")
    parser.add_argument("--output", help="leave the synthetic datasets here (DIR/v10, DIR/v11)")
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--probe", help=argparse.SUPPRESS)
    parser.add_argument("--options", default="null", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        print(json.dumps(probe(args.probe, json.loads(args.options))))
        return
    shards = max(1, round(args.tokens / SHARD_TOKENS))
    started = time.perf_counter()
    manifest = synthetic_manifest(shards=shards, blocks_per_shard=64, sources=2 * shards)
    forms = {"v10": dataclasses.replace(manifest, version=(1, 0)), "v11": manifest}
    sizes = {name: {p: len(d) for p, d in m.objects().items()} for name, m in forms.items()}
    print(
        f"synthetic dataset: {manifest.num_tokens / 1e12:.2f} T tokens, {manifest.num_blocks:,} blocks, "
        f"{manifest.num_shards:,} shards, {len(manifest.sources):,} sources "
        f"(built in {time.perf_counter() - started:.1f} s)"
    )
    for name, objects in sizes.items():
        print(f"  {name}: " + ", ".join(f"{p} {n / 1e6:.2f} MB" for p, n in objects.items()))
    with tempfile.TemporaryDirectory() as tmp, SeaweedFS(buckets=["startup"]) as server:
        local_root = Path(args.output or tmp)
        where = {}
        for name, m in forms.items():
            local = str(local_root / name)
            remote, options = f"s3://startup/{name}", server.storage_options()
            for url, opts in ((local, None), (remote, options)):
                with open_store(url, opts) as store:
                    m.write(store)
            where[f"{name} local"] = (local, None)
            where[f"{name} seaweedfs"] = (remote, options)
        del forms, manifest
        results: dict = {name: [] for name in where}
        for _ in range(args.trials):
            for name, (url, opts) in where.items():
                results[name].append(fresh_probe(url, opts))
    print(f"a fresh rank {RANK} of W = {WORLD_SIZE}, after the imports (median of {args.trials}):")
    print(
        f"{'form and store':<16} {'first planned step':>19} {'(client import)':>16} {'read':>12} {'reads':>6} "
        f"{'RSS added':>10}"
    )
    summary = {}
    for name, runs in results.items():
        row = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        summary[name] = row
        print(
            f"{name:<16} {row['first_planned_step_s']:>17.3f} s {row['client_import_s']:>14.3f} s "
            f"{row['bytes_read'] / 1e6:>9.3f} MB "
            f"{row['reads']:>6.0f} {row['rss_added_mb']:>7.1f} MB"
        )
    for store in ("local", "seaweedfs"):
        old, new = summary[f"v10 {store}"], summary[f"v11 {store}"]
        print(
            f"{store}: 1.1 / 1.0 time {new['first_planned_step_s'] / old['first_planned_step_s']:.3f}, "
            f"bytes {new['bytes_read'] / old['bytes_read']:.5f}"
        )
    print(
        json.dumps(
            {
                "tokens": int(shards * SHARD_TOKENS),
                "shards": shards,
                "blocks": shards * 64,
                "object_bytes": sizes,
                "trials": args.trials,
                "results": results,
                "medians": summary,
                "load_average_1min": os.getloadavg()[0],
            }
        )
    )


if __name__ == "__main__":
    main()
