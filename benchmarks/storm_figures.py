"""The figures of ``bench_startup_storm.py``: its table, its checks and the model that scales them to large jobs."""

from __future__ import annotations

import argparse
import os
import statistics

S3_GET_PER_S = 5500.0  # S3's documented GET/HEAD rate per partitioned prefix
SCALES = (2048, 16384)
TARGET_RATIO = 1.5


def per_node(values: list, ranks_per_node: int) -> list:
    return [sum(v or 0 for v in values[i : i + ranks_per_node]) for i in range(0, len(values), ranks_per_node)]


def model(throttled: dict, overhead: float, rank_s: float, args: argparse.Namespace) -> dict:
    """The figures scaled to 2,048 and 16,384 ranks: which are measured, which computed.

    Measured here: GETs per rank of the data (its first step's blocks), GETs
    per node of the metadata (manifest and index pages, one read a node through
    the node cache), the throttling's overhead (the storm's time over the
    larger of its floor and the same ranks' time without a limit: what this
    run's contention adds), and a rank's own time to its first batch without a
    limit. Computed: the requests at W ranks, ``W * data GETs a rank + W /
    ranks_per_node * metadata GETs a node``, with the metadata as measured
    here and at its upper bound on a large dataset (every block of a node's
    first step on index pages of its own: 1 + 4 reads a block, a frame page and
    a path page with their digest pages; without the node cache each rank
    reads its own), the floor (requests / 5,500 GET/s) and the time
    ``max(floor * overhead, a rank's own time)``. The overhead holds at W when
    the run played W's contention (``--job-ranks W``).
    """
    blocks = [b for b in throttled["blocks_per_rank"] if b is not None]
    data = statistics.mean(blocks)
    num_nodes = len(per_node(throttled["gets_per_rank"], args.ranks_per_node))
    meta = (throttled["gets"] - sum(blocks)) / num_nodes
    worst = 1 + 4 * data * args.ranks_per_node
    out = {
        "measured": {
            "data_gets_per_rank": data,
            "metadata_gets_per_node": meta,
            "throttle_overhead": overhead,
            "rank_first_batch_s_no_limit": rank_s,
            "job_ranks_played": args.job_ranks,
        },
        "computed": {},
    }
    for world in SCALES:
        nodes = world / args.ranks_per_node
        for name, requests in (
            ("metadata as measured", world * data + nodes * meta),
            ("metadata upper bound", world * data + nodes * worst),
            ("upper bound, no node cache", world * (data + 1 + 4 * data)),
        ):
            floor = requests / S3_GET_PER_S
            out["computed"][f"{world} ranks, {name}"] = {
                "requests": requests,
                "floor_s": floor,
                "time_s": max(floor * overhead, rank_s),
            }
    return out


def print_runs(runs: list[dict], args: argparse.Namespace) -> None:
    limit = f"limit {args.rate:.2f} GET/s per prefix (burst {args.burst:g})"
    if args.job_ranks:
        limit += f" = {S3_GET_PER_S:g} x {args.ranks} / {args.job_ranks}: a job of {args.job_ranks} ranks on S3"
    print(
        f"\n{args.ranks} ranks, {args.ranks_per_node} a node, seq_len {args.seq_len} x {args.local_batch}; {limit}; "
        f"RetryPolicy {args.policy or 'defaults'}, baseline {args.baseline}"
    )
    print(
        f"{'run':<9} {'last 1st batch':>14} {'floor':>7} {'ratio':>5} {'served':>6} {'503s':>5} {'503/s/lim':>9} "
        f"{'peak 503/s':>10} {'ranks 503s':>10} {'waits':>6} {'failed':>6} {'GETs a rank':>14} "
        f"{'1st batch p50/p90':>17} {'load':>5}"
    )
    for run in runs:
        gets = [g for g in run["gets_per_rank"] if g is not None] or [0]
        firsts = sorted(t for t in run["first_s_per_rank"] if t is not None) or [0.0]
        ratio = f"{run['last_first_batch_s'] / run['floor_s']:.2f}" if run["floor_s"] else "-"
        over = f"{run['throttled_per_s_over_limit']:.2f}" if run["throttled_per_s_over_limit"] is not None else "-"
        print(
            f"{run['kind']:<9} {run['last_first_batch_s']:>12.2f} s "
            f"{run['floor_s'] or 0:>5.2f} s {ratio:>5} {run['served']:>6} {run['throttled']:>5} {over:>9} "
            f"{run['throttled_per_s_peak']:>10} {run['ranks_throttled']:>10} {run['throttle_waits']:>6} "
            f"{run['ranks_failed']:>6} {statistics.mean(gets):>5.2f} ({min(gets)}-{max(gets)}) "
            f"{firsts[len(firsts) // 2]:>7.2f}/{firsts[int(0.9 * (len(firsts) - 1))]:.2f} s {run['load_1min']:>5.1f}"
        )
        for error in run["errors"]:
            print(f"    failed: {error}")
    for run in runs:
        if run["rate"]:
            print(f"{run['kind']} served/503 each second: " + " ".join(f"{a}/{b}" for _, a, b in run["timeline"]))


def throttled_figures(runs: list[dict], args: argparse.Namespace) -> dict:
    """The figures of one policy's throttled storms: time over the floor, 503s a second over the limit, per served."""
    ratios = [r["last_first_batch_s"] / r["floor_s"] for r in runs]
    return {
        "time_over_floor": ratios,
        "time_over_floor_median": statistics.median(ratios),
        "throttled_per_s_over_limit": sum(r["throttled"] for r in runs)
        / sum(r["last_first_batch_s"] for r in runs)
        / args.rate,
        "throttled_per_s_over_limit_each": [r["throttled_per_s_over_limit"] for r in runs],
        "throttled_per_served": sum(r["throttled"] for r in runs) / sum(r["served"] for r in runs),
        "peak_throttled_per_s_over_limit": max(r["throttled_per_s_peak"] for r in runs) / args.rate,
    }


def report(runs: list[dict], args: argparse.Namespace, dataset: dict) -> dict:
    print_runs(runs, args)
    throttled = [r for r in runs if r["kind"] == "policy"]
    baseline = [r for r in runs if r["kind"] == "baseline"]
    unlimited = {r["trial"]: r for r in runs if r["kind"] == "no limit"}
    figures = throttled_figures(throttled, args)
    # paired: a trial's throttled storm against its own storm without a limit, and against its baseline storm.
    over_bound = [
        t["last_first_batch_s"] / max(t["floor_s"], unlimited[t["trial"]]["last_first_batch_s"]) for t in throttled
    ]
    base = throttled_figures(baseline, args) if baseline else None
    over_baseline = [t["last_first_batch_s"] / b["last_first_batch_s"] for t, b in zip(throttled, baseline)]
    first = throttled[0]
    nodes = per_node(first["gets_per_rank"], args.ranks_per_node)
    print(
        f"GETs in all: {first['gets']} ({first['bytes'] / 1e6:.2f} MB), per node {min(nodes)}-{max(nodes)}; "
        f"the proxy served {first['served']}"
    )
    counted = all(r["ranks_throttled"] == r["throttled"] for r in runs if r["rate"])
    exact = all(r["sha256"] == runs[0]["sha256"] and None not in r["sha256"].values() for r in runs)
    failed = sum(r["ranks_failed"] for r in runs)
    print(
        f"ranks failed: {failed}; every 503 counted in the ranks' stats: {counted}; first batches the same "
        f"throttled and not: {exact}; node caches left: {sum(r['node_cache_leftovers'] for r in runs)}; "
        f"throttling warnings {[r['throttle_warnings'] for r in throttled]}, stores throttled "
        f"{[sum(1 for t in r['throttled_per_rank'] if t) for r in throttled]}"
    )
    for name, fig in (("policy", figures), ("baseline", base)):
        if fig is None:
            continue
        print(
            f"{name}: last first batch / floor: median {fig['time_over_floor_median']:.2f} "
            f"({', '.join(f'{x:.2f}' for x in fig['time_over_floor'])}; target <= {TARGET_RATIO}); "
            f"503s a second / the limit: {fig['throttled_per_s_over_limit']:.2f} (peak second "
            f"{fig['peak_throttled_per_s_over_limit']:.2f}); 503s per request served "
            f"{fig['throttled_per_served']:.2f}"
        )
    print(
        f"policy / max(floor, the same ranks without a limit): median {statistics.median(over_bound):.2f} "
        f"({', '.join(f'{x:.2f}' for x in over_bound)})"
        + (f"; policy / baseline, paired: {', '.join(f'{x:.2f}' for x in over_baseline)}" if over_baseline else "")
    )
    rank_s = statistics.median(r["first_batch_s_median"] for r in unlimited.values())
    scaled = model(first, statistics.median(over_bound), rank_s, args)
    m = scaled["measured"]
    print(
        f"model; measured: {m['data_gets_per_rank']:.2f} data GETs a rank, {m['metadata_gets_per_node']:.2f} "
        f"metadata GETs a node, throttling overhead {m['throttle_overhead']:.2f} (contention of "
        f"{args.job_ranks or '?'} ranks), a rank's first batch without a limit {rank_s:.2f} s (median); "
        f"computed at {S3_GET_PER_S:g} GET/s:"
    )
    for key, row in scaled["computed"].items():
        print(
            f"  {key:<38} {row['requests']:>9,.0f} requests, floor {row['floor_s']:>6.2f} s, "
            f"time ~ {row['time_s']:>6.2f} s"
        )
    return {
        "ranks": args.ranks,
        "ranks_per_node": args.ranks_per_node,
        "rate": args.rate,
        "burst": args.burst,
        "job_ranks": args.job_ranks,
        "policy": args.policy,
        "baseline_policy": args.baseline,
        "seq_len": args.seq_len,
        "local_batch": args.local_batch,
        "dataset": dataset,
        **figures,
        "time_over_bound": over_bound,
        "time_over_baseline": over_baseline,
        "baseline": base,
        "target": TARGET_RATIO,
        "ranks_failed": failed,
        "every_throttle_counted": counted,
        "first_batches_identical": exact,
        "model": scaled,
        "runs": [{k: v for k, v in r.items() if k != "sha256"} for r in runs],
        "load_average_1min": os.getloadavg()[0],
    }
