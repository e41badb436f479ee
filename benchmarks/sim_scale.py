"""Simulated 2048- and 16384-rank jobs: what the global order makes each rank fetch.

Setup: one stream of full blocks of 2**20 + 1 tokens (uint16; a block's bytes
are taken as proportional to its tokens, so ratios are exact), seq_len 2048
(512 samples a block), local batch 4, C = first global batch = 4 W lanes.
A rank fetches a block once when it first needs it and drops it after its
last use (the loader's policy without prefetch lookahead).

What is simulated, sample by sample through ``rank_positions`` and
``GlobalOrder.sample_at`` (the loader's own calls):

- steady state: ``--ranks`` ranks spread over the job for ``2 * 512`` steps
  from mid-epoch: blocks fetched per step (scaled to the cluster) and the peak
  number of blocks a rank holds at once;
- one whole epoch for a group of 4 consecutive ranks: the blocks each reads,
  checked against the cluster-wide count derived from the lane geometry
  (each lane reads a contiguous run of the epoch's block slots), which gives
  the download amplification of the whole cluster: bytes fetched (a block
  counted once per rank that needs it) / bytes of the distinct blocks read;
- a resize 2048 -> 1536 ranks at a mid-epoch, mid-block step, on 256
  consecutive lanes for 512 steps after it: the blocks fetched again after
  the resize that a rank had already been reading before it, per lane (a
  fetch by each new reader; a lane cut between two new ranks has two). Two
  choices of the new global micro-batch: 16 a rank (24576, a multiple of C:
  lanes keep fixed readers) and 4 a rank (6144, not a multiple of C: lanes
  rotate among ranks every step).

The baseline is the uninterrupted 2048-rank run over the same positions. The
tables go in docs/BENCHMARKS.md; the last printed line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import bench_plan  # noqa: E402
from benchmarks.bench_plan import BLOCK_TOKENS  # noqa: E402
from zephon_stream.plan import GlobalOrder, rank_positions  # noqa: E402
from zephon_stream.plan.slicing import step_positions  # noqa: E402

LOCAL_BATCH = 4
BLOCK_MIB = BLOCK_TOKENS * 2 / 2**20


def make_order(num_blocks: int, lanes: int) -> GlobalOrder:
    return bench_plan.make_order(num_blocks, lanes, seed=7)


def rank_blocks(order, start, batch, world, rank, steps):
    """(step index, block) of every sample rank ``rank`` reads over ``steps`` steps."""
    positions = [rank_positions(start + t * batch, batch, world, rank, order.lanes) for t in range(steps)]
    step = np.repeat(np.arange(steps), [p.size for p in positions])
    _, block, _ = order.sample_at(np.concatenate(positions))
    return step, block


def steady_state(order, world, ranks, steps):
    batch = LOCAL_BATCH * world
    start = order.streams[0].lane_length // 2 * batch
    warm = steps // 2
    fetch_rates, peaks = [], []
    for rank in ranks:
        step, block = rank_blocks(order, start, batch, world, rank, steps)
        uniq, first = np.unique(block, return_index=True)
        last = np.zeros(uniq.size, dtype=np.int64)
        np.maximum.at(last, np.searchsorted(uniq, block), step)
        first_step = step[first]
        fetch_rates.append(np.count_nonzero(first_step >= warm) / (steps - warm))
        held = np.zeros(steps + 1, dtype=np.int64)
        np.add.at(held, first_step, 1)
        np.add.at(held, last + 1, -1)
        peaks.append(int(np.cumsum(held)[warm:steps].max()))
    return float(np.mean(fetch_rates)) * world, max(peaks)


def lane_slot_ranges(order):
    plan = order.streams[0]
    lanes = np.arange(order.lanes, dtype=np.int64)
    lo = lanes * plan.lane_length // plan.samples_per_block
    hi = ((lanes + 1) * plan.lane_length - 1) // plan.samples_per_block
    return lo, hi


def epoch_amplification(order, world):
    """Cluster-wide fetched / distinct blocks in one epoch, from the lane geometry."""
    lo, hi = lane_slot_ranges(order)
    batch, lanes = LOCAL_BATCH * world, order.lanes
    assert batch % lanes == 0, "the lane geometry count assumes C divides B"
    per_lane = batch // lanes
    first_rank = np.arange(lanes) * per_lane // LOCAL_BATCH
    last_rank = ((np.arange(lanes) + 1) * per_lane - 1) // LOCAL_BATCH
    per_rank = {}
    for lane in range(lanes):
        for rank in range(first_rank[lane], last_rank[lane] + 1):
            a, b = per_rank.get(rank, (lo[lane], hi[lane]))
            per_rank[rank] = (min(a, lo[lane]), max(b, hi[lane]))
    fetched = sum(b - a + 1 for a, b in per_rank.values())
    distinct = int(hi[-1] - lo[0] + 1)
    return fetched / distinct, per_rank


def check_epoch_by_samples(order, world, group, per_rank):
    """Whole epoch, sample by sample, for ``group`` consecutive ranks."""
    batch = LOCAL_BATCH * world
    steps = order.streams[0].lane_length
    for rank in group:
        _, block = rank_blocks(order, 0, batch, world, rank, steps)
        a, b = per_rank[rank]
        assert np.unique(block).size == b - a + 1, (rank, np.unique(block).size, b - a + 1)


def resize(order, old_world, new_world, new_local, lanes_sampled, steps):
    lanes = order.lanes
    old_batch = LOCAL_BATCH * old_world
    plan = order.streams[0]
    cursor = (plan.lane_length // 2 + 200) * old_batch
    chosen = np.arange(lanes // 3, lanes // 3 + lanes_sampled)
    q = cursor // lanes
    _, before, _ = order.sample_at(q * lanes - lanes + chosen)
    _, after, _ = order.sample_at(q * lanes + chosen)
    in_use = dict(zip(chosen.tolist(), np.where(before == after, before, -1).tolist()))

    def fetches(world, local):
        batch = world * local
        events = set()
        for t in range(steps):
            positions = step_positions(cursor + t * batch, batch, lanes)
            keep = np.isin(positions % lanes, chosen)
            ranks = np.flatnonzero(keep) // local
            _, block, _ = order.sample_at(positions[keep])
            events.update(zip((positions[keep] % lanes).tolist(), ranks.tolist(), block.tolist()))
        return events

    new = fetches(new_world, new_local)
    refetched = np.zeros(lanes_sampled, dtype=np.int64)
    refetched_blocks = {}
    for lane, _, block in new:
        if in_use[lane] == block:
            refetched[lane - chosen[0]] += 1
            refetched_blocks.setdefault(lane, set()).add(block)
    old = fetches(old_world, LOCAL_BATCH)
    distinct = len({(lane, block) for lane, _, block in new})
    return {
        "new_world": new_world,
        "new_local_batch": new_local,
        "new_global_batch": new_world * new_local,
        "lanes_with_block_in_use": int(sum(b >= 0 for b in in_use.values())),
        "refetched_per_lane_mean": float(refetched.mean()),
        "refetched_per_lane_max": int(refetched.max()),
        "distinct_refetched_blocks_per_lane_max": max(map(len, refetched_blocks.values())),
        "fetches_per_block_after": len(new) / distinct,
        "fetches_per_block_uninterrupted": len(old) / len({(lane, block) for lane, _, block in old}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=1_000_000)
    parser.add_argument("--ranks", type=int, default=16, help="ranks sampled for steady state")
    args = parser.parse_args()
    started = time.process_time()

    jobs = []
    for world, blocks in ((2048, args.blocks), (16384, args.blocks), (16384, 10 * args.blocks)):
        order = make_order(blocks, LOCAL_BATCH * world)
        ranks = np.linspace(0, world - 1, args.ranks).astype(int).tolist()
        per_step, peak = steady_state(order, world, ranks, 2 * 512)
        amplification, per_rank = epoch_amplification(order, world)
        group = list(range(world // 2, world // 2 + 4))
        check_epoch_by_samples(order, world, group, per_rank)
        plan = order.streams[0]
        jobs.append(
            {
                "world_size": world,
                "lanes": order.lanes,
                "blocks": blocks,
                "blocks_per_lane": plan.lane_length / plan.samples_per_block,
                "blocks_fetched_per_step": per_step,
                "mib_fetched_per_step": per_step * BLOCK_MIB,
                "amplification": amplification,
                "peak_resident_blocks_per_rank": peak,
            }
        )
    order = make_order(args.blocks, LOCAL_BATCH * 2048)
    resizes = [resize(order, 2048, 1536, local, 256, 512) for local in (16, 4)]

    print(
        "| ranks | lanes C | dataset blocks | blocks/lane/epoch | blocks fetched per step "
        "(cluster) | MiB per step | download amplification | peak resident blocks/rank |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for job in jobs:
        print(
            f"| {job['world_size']} | {job['lanes']} | {job['blocks']:,} | "
            f"{job['blocks_per_lane']:.1f} | {job['blocks_fetched_per_step']:.1f} | "
            f"{job['mib_fetched_per_step']:.0f} | {job['amplification']:.4f} | "
            f"{job['peak_resident_blocks_per_rank']} |"
        )
    print()
    print(
        "| resize 2048 -> 1536 | global batch | re-fetches per lane (mean / max) | distinct "
        "blocks re-fetched per lane (max) | fetches per block after | uninterrupted |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for row in resizes:
        print(
            f"| local batch {row['new_local_batch']} | {row['new_global_batch']} | "
            f"{row['refetched_per_lane_mean']:.2f} / {row['refetched_per_lane_max']} | "
            f"{row['distinct_refetched_blocks_per_lane_max']} | "
            f"{row['fetches_per_block_after']:.3f} | "
            f"{row['fetches_per_block_uninterrupted']:.3f} |"
        )
    cpu_s = time.process_time() - started
    print(
        f"simulated in {cpu_s:.0f} s of CPU; {args.ranks} sampled ranks x 1024 steps each, "
        "4 ranks x 1 epoch, 256 lanes x 512 steps per resize"
    )
    print(json.dumps({"jobs": jobs, "resize": resizes, "cpu_s": cpu_s}, sort_keys=True))


if __name__ == "__main__":
    main()
