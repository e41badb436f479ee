"""Start-up at scale: a loader over a 1.1 T-token manifest, from local disk and from SeaweedFS.

The manifest is synthetic (no shard exists): ``--shards`` shards of
``--blocks-per-shard`` blocks of 2**20 + 1 tokens (default 16384 x 64 =
1,048,576 blocks, 1.1 T tokens) and ``--sources`` input sources, built with
``Manifest.create`` as the writer would. It is written to a local folder and
to a bucket of a SeaweedFS server on loopback (tools/seaweedfs.py).

Measured in paired trials (local, then SeaweedFS, ``--trials`` times), in one
process after one untimed warm-up of each (so the S3 client's one-off set-up
is printed apart, as ``cold``):

1. reading and validating the manifest (``Manifest.read``);
2. constructing a ``StreamingLoader`` on it at W = 2048 and 16384 (rank 0,
   local batch 4, seq_len 2048, ``pipeline="threads"``: the helper process's
   start is another figure) and planning its first step (the loader's own
   planner, as its producer does before fetching): the time to the first
   planned step. Target: < 1 s from SeaweedFS.

Printed beside them: the manifest pickled and unpickled, the way it reaches
the helper process (``pipeline="process"``) at the first step.

The last printed line is one JSON object.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pickle
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools.seaweedfs import SeaweedFS  # noqa: E402
from zephon_stream import Manifest, StreamingLoader  # noqa: E402
from zephon_stream.format.manifest import ShardInfo, SourceInfo, TokenizerInfo  # noqa: E402
from zephon_stream.format.spec import DEFAULT_BLOCK_TOKENS, MANIFEST_NAME  # noqa: E402
from zephon_stream.storage import open_store  # noqa: E402

WORLDS = (2048, 16384)


def synthetic_manifest(*, shards: int, blocks_per_shard: int, sources: int) -> Manifest:
    """A manifest of full shards with plausible offsets and digests (no shard exists)."""
    block_tokens = DEFAULT_BLOCK_TOKENS
    frame_bytes = 600_000
    tokenizer = TokenizerInfo(kind="bytes", name="bytes", vocab_size=257, eos_id=256, bos_id=None,
                              fingerprint=hashlib.sha256(b"bytes").hexdigest())
    infos = []
    for i in range(shards):
        offsets = tuple(range(0, (blocks_per_shard + 1) * frame_bytes, frame_bytes))
        digest = hashlib.sha256(i.to_bytes(8, "little")).hexdigest()
        infos.append(ShardInfo(path=f"shards/{i:08d}.zst", num_tokens=blocks_per_shard * block_tokens,
                               num_bytes=offsets[-1], sha256=digest, block_offsets=offsets,
                               index_path=f"shards/{i:08d}.idx", index_sha256=digest, num_documents=1000))
    docs_per_source = shards * 1000 // sources
    source_infos = [SourceInfo(path=f"s3://corpus/part-{i:06d}.jsonl.zst", num_records=docs_per_source,
                               num_documents=docs_per_source, num_rejected=0) for i in range(sources)]
    source_infos[-1] = SourceInfo(path=source_infos[-1].path, num_records=shards * 1000 - docs_per_source * (sources - 1),
                                  num_documents=shards * 1000 - docs_per_source * (sources - 1), num_rejected=0)
    return Manifest.create(tokenizer=tokenizer, block_tokens=block_tokens, blocks_per_shard=blocks_per_shard,
                           shards=infos, sources=source_infos)


def read_manifest_s(url: str, options: dict | None) -> float:
    started = time.perf_counter()
    with open_store(url, options) as store:
        Manifest.read(store)
    return time.perf_counter() - started


def first_planned_step_s(url: str, options: dict | None, world_size: int) -> float:
    """Seconds from ``StreamingLoader(...)`` to the plan of rank 0's first step."""
    started = time.perf_counter()
    with StreamingLoader(url, seq_len=2048, local_batch_size=4, rank=0, world_size=world_size,
                         storage_options=options, pipeline="threads") as loader:
        # NOTE: what the producer does first, before any block is fetched
        # (the shards of this manifest do not exist).
        plan = loader._layout.planner(start=loader.state_dict()["position"], num_steps=None).next_step()
        elapsed = time.perf_counter() - started
        assert len(plan.positions) == 4
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=16384)
    parser.add_argument("--blocks-per-shard", type=int, default=64)
    parser.add_argument("--sources", type=int, default=32768)
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()

    started = time.perf_counter()
    manifest = synthetic_manifest(shards=args.shards, blocks_per_shard=args.blocks_per_shard, sources=args.sources)
    data = manifest.to_bytes()
    print(f"synthetic manifest: {manifest.num_tokens / 1e12:.2f} T tokens, {manifest.num_blocks} blocks, "
          f"{manifest.num_shards} shards, {len(manifest.sources)} sources, {len(data) / 1e6:.1f} MB "
          f"(built in {time.perf_counter() - started:.1f} s)")
    pickled = []
    for _ in range(args.trials):
        started = time.perf_counter()
        blob = pickle.dumps(manifest, protocol=pickle.HIGHEST_PROTOCOL)
        pickle.loads(blob)
        pickled.append(time.perf_counter() - started)
    print(f"manifest pickled and unpickled (it travels so to the helper process at the first step): "
          f"{min(pickled):.2f}-{max(pickled):.2f} s, {len(blob) / 1e6:.1f} MB")
    del manifest, blob
    figures: dict = {"manifest_bytes": len(data), "blocks": args.shards * args.blocks_per_shard,
                     "shards": args.shards, "sources": args.sources, "pickle_round_trip_s": pickled}
    with tempfile.TemporaryDirectory() as tmp, SeaweedFS(buckets=["startup"]) as server:
        local = str(Path(tmp) / "synthetic")
        with open_store(local) as store:
            store.write_atomic(MANIFEST_NAME, data)
        remote, options = "s3://startup/synthetic", server.storage_options()
        with open_store(remote, options) as store:
            store.write_atomic(MANIFEST_NAME, data)
        where = {"local": (local, None), "seaweedfs": (remote, options)}
        cold = {name: read_manifest_s(url, opts) for name, (url, opts) in where.items()}
        for name, (url, opts) in where.items():
            first_planned_step_s(url, opts, WORLDS[0])  # NOTE: warm-up: imports, the S3 client's session
        print("cold first read (imports, S3 client set-up): "
              + ", ".join(f"{name} {seconds:.2f} s" for name, seconds in cold.items()))
        results: dict = {name: {"read_s": [], **{f"loader_w{w}_s": [] for w in WORLDS}} for name in where}
        for _ in range(args.trials):
            for name, (url, opts) in where.items():
                results[name]["read_s"].append(read_manifest_s(url, opts))
                for world in WORLDS:
                    results[name][f"loader_w{world}_s"].append(first_planned_step_s(url, opts, world))
    for name, series in results.items():
        print(f"{name}: " + "; ".join(
            f"{key.removesuffix('_s').replace('_', ' ')} {min(v):.2f}-{max(v):.2f} s (median {statistics.median(v):.2f})"
            for key, v in series.items()))
    worst = max(max(v) for key, v in results["seaweedfs"].items() if key.startswith("loader"))
    ratio = [statistics.median(results["seaweedfs"][k]) / statistics.median(results["local"][k]) for k in results["local"]]
    print(f"SeaweedFS / local, medians: " + ", ".join(f"{r:.2f}" for r in ratio)
          + f"; slowest first planned step from SeaweedFS {worst:.2f} s (target < 1 s)")
    figures.update(cold_read_s=cold, trials=args.trials, results=results, seaweedfs_worst_first_step_s=worst,
                   load_average_1min=os.getloadavg()[0])
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
