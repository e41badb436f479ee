"""Planning cost of the global order: one step for one rank, and memory vs dataset size.

For W = 8, 256, 2048, 16384 ranks with C = 4 W lanes and a local batch of 4
(global micro-batch B = 4 W), on a dataset of 1,000,000 full blocks of
2**20 + 1 tokens at seq_len 2048 (512 samples a block), it times
``GlobalOrder.rank_slice(P, B, W, r)``:

- steady: consecutive steps of one rank, as the loader plans them (the small
  caches of window and block permutations are warm);
- cold: each step at a far-away cursor (every cache misses), the cost of the
  first step after a resume.

Baselines measured in the same run: ``np.arange`` of the rank's positions (the
least any planner does) and ``numpy.random.permutation`` of the C lanes (what a
planner that shuffles lanes per step would pay). Memory: tracemalloc peak of
building the order and planning 50 steps at 1e4, 1e6 and 1e8 blocks, against
materializing a block permutation array (``np.random.permutation(N)``; 1e8 is
computed at 8 bytes a block rather than allocated).

Schedules: a 6-phase schedule (three streams; weights, global batch, lanes and
seq_len changing) at W = 2048 ranks and a local batch of 4 to 8; per phase it
times ``ScheduleOrder.rank_slice(step, W, r)`` steady and cold, against
``GlobalOrder.rank_slice`` of the first phase's config in the same run (the
one-phase baseline, ratio printed); cold is the first ``rank_slice`` of a
freshly built schedule at a step spread over the phase (build not timed). Seek:
the same cold first step at steps spread over the whole schedule, for
schedules of 1, 6, 24 and 96 phases, with the one-time cost of building each.

Times are CPU seconds of this process (``time.process_time``), so that other
work on a shared machine does not inflate them; the load average is printed.
The last printed line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import tracemalloc

import numpy as np

from zephon_stream.plan import GlobalOrder, OrderConfig, ScheduleOrder, SchedulePhase, StreamShape

BLOCK_TOKENS = 2**20 + 1
SEQ_LEN = 2048


def make_order(num_blocks: int, lanes: int, *, seed: int = 1234) -> GlobalOrder:
    """The order of one synthetic stream of ``num_blocks`` full blocks."""
    shape = StreamShape(
        fingerprint=f"synthetic-{num_blocks}",
        block_tokens=BLOCK_TOKENS,
        num_blocks=num_blocks,
        short_ids=[],
        short_counts=[],
    )
    return GlobalOrder([shape], OrderConfig(seed=seed, seq_len=SEQ_LEN, lanes=lanes))


def per_call_us(fn, calls: int, repeats: int) -> float:
    """Best of ``repeats`` of the mean time of ``calls`` calls, in microseconds."""
    best = float("inf")
    for rep in range(repeats):
        start = time.process_time()
        for i in range(calls):
            fn(rep * calls + i)
        best = min(best, (time.process_time() - start) / calls)
    return best * 1e6


def time_world(world: int, num_blocks: int, steps: int, repeats: int) -> dict:
    lanes = global_batch = 4 * world
    order = make_order(num_blocks, lanes)
    rank = world // 3
    base = 10_000 * global_batch  # mid-epoch, mid-block
    order.rank_slice(base, global_batch, world, rank)
    steady = per_call_us(
        lambda i: order.rank_slice(base + i * global_batch, global_batch, world, rank),
        steps,
        repeats,
    )
    # 7919 steps apart (more than a block's 512 samples per lane): new
    # windows and blocks every call, so every cache misses.
    cold = per_call_us(
        lambda i: order.rank_slice(base + (i + 1) * 7919 * global_batch, global_batch, world, rank),
        max(20, steps // 10),
        repeats,
    )
    arange = per_call_us(lambda i: np.arange(base + 4 * rank, base + 4 * rank + 4), steps, repeats)
    rng = np.random.default_rng(0)
    shuffle = per_call_us(lambda i: rng.permutation(lanes), max(20, steps // 10), repeats)
    return {
        "world_size": world,
        "lanes": lanes,
        "steady_us": steady,
        "cold_us": cold,
        "baseline_arange_us": arange,
        "baseline_lane_permutation_us": shuffle,
        "steady_vs_arange": steady / arange,
        "steady_vs_lane_permutation": steady / shuffle,
    }


def plan_peak_bytes(num_blocks: int) -> int:
    tracemalloc.start()
    order = make_order(num_blocks, 8192)
    for step in range(50):
        order.rank_slice(step * 8192, 8192, 2048, 5)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


def permutation_peak_bytes(num_blocks: int) -> int:
    if num_blocks > 10**7:
        return 8 * num_blocks
    tracemalloc.start()
    np.random.default_rng(0).permutation(num_blocks)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


def synthetic_shape(name: str, num_blocks: int) -> StreamShape:
    return StreamShape(
        fingerprint=name, block_tokens=BLOCK_TOKENS, num_blocks=num_blocks, short_ids=[], short_counts=[]
    )


# (start step, local batch, seq_len, weights) of the six phases: warm-up on
# one stream, a second stream added, seq_len doubled, a third stream and a
# smaller batch, seq_len doubled again, an annealing mixture.
SIX_PHASES = (
    (0, 4, 2048, (1, 0, 0)),
    (10_000, 8, 2048, (3, 1, 0)),
    (30_000, 8, 4096, (3, 1, 0)),
    (50_000, 6, 4096, (2, 1, 1)),
    (70_000, 8, 8192, (1, 1, 1)),
    (90_000, 4, 8192, (1, 2, 3)),
)


def make_schedule(world: int, num_phases: int = 6) -> ScheduleOrder:
    """A schedule over three synthetic streams; more than six phases repeat the pattern."""
    shapes = [synthetic_shape(f"s{i}", n) for i, n in enumerate((1_000_000, 300_000, 50_000))]
    phases = []
    for k in range(num_phases):
        start, local, seq_len, weights = SIX_PHASES[k % 6]
        start += (k // 6) * 100_000
        batch = local * world
        phases.append(
            SchedulePhase(start_step=start, global_batch=batch, seq_len=seq_len, lanes=batch, weights=weights)
        )
    return ScheduleOrder(shapes, phases, seed=1234)


def first_step_us(world: int, num_phases: int, steps: list[int], rank: int) -> float:
    """Mean time of the first ``rank_slice`` on a freshly built schedule (every cache cold).

    The build itself is not timed; each trial builds a new schedule.
    """
    total = 0.0
    for step in steps:
        order = make_schedule(world, num_phases)
        start = time.process_time()
        order.rank_slice(step, world, rank)
        total += time.process_time() - start
    return total / len(steps) * 1e6


def time_schedule(world: int, steps: int, repeats: int) -> dict:
    rank = world // 3
    order = make_schedule(world)
    baseline_order = GlobalOrder(
        [synthetic_shape(f"s{i}", n) for i, n in enumerate((1_000_000, 300_000, 50_000))],
        OrderConfig(seed=1234, seq_len=2048, lanes=4 * world, weights=(1, 0, 0)),
    )
    batch = 4 * world
    base = 10_000 * batch
    baseline_order.rank_slice(base, batch, world, rank)
    baseline = per_call_us(lambda i: baseline_order.rank_slice(base + i * batch, batch, world, rank), steps, repeats)
    phases = []
    for phase in order.phases:
        first = phase.start_step + 5
        order.rank_slice(first, world, rank)
        steady = per_call_us(lambda i, first=first: order.rank_slice(first + i, world, rank), steps, repeats)
        length = (order.phase_end_step(phase.index) or phase.start_step + 10**6) - phase.start_step
        trials = [phase.start_step + (t * 7919) % length for t in range(1, 9)]
        cold = first_step_us(world, 6, trials, rank)
        phases.append(
            {"phase": phase.index, "steady_us": steady, "cold_us": cold, "steady_vs_one_phase": steady / baseline}
        )
    seek = []
    for num_phases in (1, 6, 24, 96):
        start = time.process_time()
        scheduled = make_schedule(world, num_phases)
        build_s = time.process_time() - start
        last = scheduled.phases[-1].start_step + 50_000
        trials = [(t * 104_729) % last for t in range(1, 9 if num_phases < 96 else 4)]
        seek.append(
            {"phases": num_phases, "seek_us": first_step_us(world, num_phases, trials, rank), "build_s": build_s}
        )
    return {"world_size": world, "one_phase_us": baseline, "phases": phases, "seek": seek}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=1_000_000)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--schedule-only", action="store_true", help="time the schedule part alone")
    args = parser.parse_args()

    schedule = time_schedule(2048, args.steps, args.repeats)
    print(f"6-phase schedule at W = 2048 (one-phase GlobalOrder: {schedule['one_phase_us']:.1f} us/step):")
    print("| phase | steady us/step | cold us/step | steady vs one phase |")
    print("|---:|---:|---:|---:|")
    for row in schedule["phases"]:
        print(f"| {row['phase']} | {row['steady_us']:.1f} | {row['cold_us']:.1f} | {row['steady_vs_one_phase']:.2f}x |")
    print("seek (first step of a fresh schedule, caches cold, build not timed) vs phases:")
    for row in schedule["seek"]:
        print(f"  {row['phases']:3d} phases: seek {row['seek_us']:.1f} us, build {row['build_s'] * 1e3:.1f} ms")
    worst = max(r["steady_us"] for r in schedule["phases"])
    print(f"W=2048 6 phases: worst steady {worst:.1f} us/step (target < 100)")
    if args.schedule_only:
        print(
            json.dumps(
                {"schedule": schedule, "schedule_worst_steady_us": worst, "load_average": os.getloadavg()[0]},
                sort_keys=True,
            )
        )
        return

    worlds = [time_world(w, args.blocks, args.steps, args.repeats) for w in (8, 256, 2048, 16384)]
    print(f"plan one step for one rank ({args.blocks:,} blocks, local batch 4, C = 4 W):")
    print("| W | C | steady us/step | cold us/step | np.arange us (ratio) | lane permutation us (ratio) |")
    print("|---:|---:|---:|---:|---:|---:|")
    for row in worlds:
        print(
            f"| {row['world_size']} | {row['lanes']} | {row['steady_us']:.1f} | {row['cold_us']:.1f}"
            f" | {row['baseline_arange_us']:.2f} ({row['steady_vs_arange']:.0f}x) | "
            f"{row['baseline_lane_permutation_us']:.1f} ({row['steady_vs_lane_permutation']:.2f}x) |"
        )

    order = make_order(args.blocks, 8192)
    positions = np.arange(10**6, dtype=np.int64) * 7 + 123_456_789
    start = time.process_time()
    order.sample_at(positions)
    vector_s = time.process_time() - start
    start = time.process_time()
    np.random.default_rng(0).permutation(10**6)
    shuffle_s = time.process_time() - start
    print(
        f"vectorized sample_at: {positions.size / vector_s / 1e6:.2f} M positions/s "
        f"(np.random.permutation of 1e6: {10**6 / shuffle_s / 1e6:.1f} M/s)"
    )

    memory = {n: plan_peak_bytes(n) for n in (10**4, 10**6, 10**8)}
    baseline = {n: permutation_peak_bytes(n) for n in (10**4, 10**6, 10**8)}
    for n in memory:
        print(
            f"blocks {n:>11,}: plan peak {memory[n] / 1024:8.1f} KiB; "
            f"materialized permutation {baseline[n] / 1024:12.1f} KiB"
        )
    at_2048 = next(r for r in worlds if r["world_size"] == 2048)
    print(
        f"W=2048 steady {at_2048['steady_us']:.1f} us/step (target < 100); "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cpus"
    )
    result = {
        "blocks": args.blocks,
        "worlds": worlds,
        "steady_us_w2048": at_2048["steady_us"],
        "cold_us_w2048": at_2048["cold_us"],
        "vectorized_positions_per_s": positions.size / vector_s,
        "baseline_permutation_per_s": 10**6 / shuffle_s,
        "plan_peak_bytes": {str(n): v for n, v in memory.items()},
        "materialized_permutation_bytes": {str(n): v for n, v in baseline.items()},
        "load_average": os.getloadavg()[0],
        "schedule": schedule,
        "schedule_worst_steady_us": worst,
    }
    print(json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()
