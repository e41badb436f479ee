"""The start-up storm across nodes: many nodes, as network namespaces of a cluster in a box, open one dataset at
once through a store that limits its request rate, each node keeping to it on its own.

Each node of the box (tools/cluster_box.py: its own address, /tmp and /dev/shm) runs one process whose
threads are that node's ranks, started together, exactly as benchmarks/bench_startup_storm.py's node
processes (they build ``StreamingLoader(...)`` and take their first batch); the process carries the variables
its launcher would set (``--launcher``: srun's by default, so that the node is recognised as torchrun's
would be; storage/node_ranks.py), and the loader finds its node cache in the node's own /dev/shm. The store is
SeaweedFS on the bridge's address behind tools/fault_proxy.py's token bucket (``--rate`` requests per second
per prefix, the whole dataset one prefix, ``--burst`` tokens, 503 SlowDown beyond), reached by every node over
the bridge. Each configuration (``--nodes 4 --nodes 16``, the same ``--ranks`` split over them) runs, per
trial and in rotating order, three storms:

- ``node``: today's limiter, one per store a node, shared by its ranks through the node cache;
- ``rank``: a limiter of every rank's own (no node cache: what ranks that a launcher started without being
  recognised as a node had, e.g. srun's before storage/node_ranks.py);
- ``no limit``: the same ranks, the store answering everything (first batches to compare, and the time a rank
  takes by itself).

It prints, per storm: the last first batch against the floor (``(served - burst) / rate``, the least time
the bucket needs for the requests served), 503s per request served, 503s a second over the storm against the
limit, failed ranks; whether every rank's first batch is bit-identical to the unthrottled storm's; and what
the node caches left on the nodes. Its last printed line is one JSON object.

    python benchmarks/bench_storm_nodes.py --nodes 4 --nodes 16 --ranks 48 --rate 10   # needs root
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_startup_storm import storm, write_corpus  # noqa: E402
from benchmarks.storm_figures import print_runs, throttled_figures  # noqa: E402

KINDS = ("node", "rank", "no limit")
LAUNCHERS = ("srun", "torchrun", "mpirun")


def launcher_env(launcher: str, node: int, num_nodes: int, ranks_per_node: int) -> dict[str, str]:
    """What ``launcher`` sets in the environment of a rank on ``node`` (its local rank 0)."""
    if launcher == "torchrun":
        return {"LOCAL_WORLD_SIZE": str(ranks_per_node), "LOCAL_RANK": "0"}
    if launcher == "mpirun":
        return {"OMPI_COMM_WORLD_LOCAL_SIZE": str(ranks_per_node), "OMPI_COMM_WORLD_LOCAL_RANK": "0"}
    return {
        "SLURM_JOB_ID": "1",
        "SLURM_STEP_ID": "0",
        "SLURM_NODEID": str(node),
        "SLURM_LOCALID": "0",
        "SLURM_STEP_TASKS_PER_NODE": f"{ranks_per_node}(x{num_nodes})",
    }


def storms_on(num_nodes: int, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """Every storm of one configuration, in a box of ``num_nodes`` nodes: the runs and their figures."""
    from tools.cluster_box import Box

    run_args = argparse.Namespace(**vars(args))
    run_args.ranks_per_node = args.ranks // num_nodes
    with Box(num_nodes, buckets=("storm",)) as box:
        url, options = "s3://storm/ds", box.store.direct_options()
        started = time.perf_counter()
        dataset = write_corpus(url, options, run_args, tmp)
        print(
            f"\n{num_nodes} nodes of {run_args.ranks_per_node} ranks; dataset {dataset['tokens'] / 1e6:.1f} M "
            f"tokens, "
            f"{dataset['blocks']} blocks, {dataset['shards']} shards, metadata {dataset['metadata_objects']} "
            f"(written in {time.perf_counter() - started:.1f} s)",
            flush=True,
        )

        def spawn(node: int, argv: list[str], **popen: Any) -> Any:
            env = launcher_env(args.launcher, node, num_nodes, run_args.ranks_per_node)
            return box.run(node, argv, env=env, **popen)

        def leftovers() -> list[str]:
            return [f"{box.nodes[n].hostname}:{p}" for n in range(num_nodes) for p in box.leftovers(n)]

        common = {
            "upstream": box.store.server.endpoint_url,
            "tmp": tmp,
            "spawn": spawn,
            "host": box.bridge_address,
            "leftovers": leftovers,
            "policy": {},
        }
        for _ in range(args.warmup):
            run = storm(url, options, run_args, rate=None, node_cache="default", **common)
            print(f"warm-up (no limit, not counted): last first batch {run['last_first_batch_s']:.2f} s", flush=True)
        kinds = [
            k
            for k in (("node", args.rate, "default"), ("rank", args.rate, "none"), ("no limit", None, "default"))
            if k[0] in args.kinds
        ]
        runs = []
        for trial in range(args.trials):
            # Paired, the order rotating, so drift on a shared machine hits every kind alike.
            for kind, rate, cache in kinds[trial % len(kinds) :] + kinds[: trial % len(kinds)]:
                run = storm(url, options, run_args, rate=rate, node_cache=cache, **common)
                run.update(kind=kind, trial=trial, load_1min=os.getloadavg()[0])
                runs.append(run)
                print(
                    f"trial {trial} {kind}: last first batch {run['last_first_batch_s']:.2f} s, served "
                    f"{run['served']}, 503s {run['throttled']}, failed {run['ranks_failed']}, "
                    f"load {run['load_1min']:.1f}",
                    flush=True,
                )
    run_args.policy, run_args.baseline = {}, None
    print_runs(runs, run_args)
    unlimited = {r["trial"]: r for r in runs if r["kind"] == "no limit"}
    figures: dict[str, Any] = {"nodes": num_nodes, "ranks_per_node": run_args.ranks_per_node, "dataset": dataset}
    for kind in [k for k in ("node", "rank") if k in args.kinds]:
        throttled = [r for r in runs if r["kind"] == kind]
        fig = throttled_figures(throttled, run_args)
        fig["ranks_failed"] = sum(r["ranks_failed"] for r in throttled)
        fig["first_batches_identical"] = all(
            r["sha256"] == unlimited[r["trial"]]["sha256"] and None not in r["sha256"].values() for r in throttled
        )
        fig["every_throttle_counted"] = all(r["ranks_throttled"] == r["throttled"] for r in throttled)
        fig["served"] = [r["served"] for r in throttled]
        fig["gets"] = [r["gets"] for r in throttled]
        fig["limiters_shared"] = [r["limiter_shared"] for r in throttled]
        figures[kind] = fig
        print(
            f"{num_nodes} nodes, {kind} limiter: last first batch / floor {fig['time_over_floor_median']:.2f} "
            f"({', '.join(f'{x:.2f}' for x in fig['time_over_floor'])}); 503s per request served "
            f"{fig['throttled_per_served']:.2f}; 503s a second / the limit {fig['throttled_per_s_over_limit']:.2f} "
            f"(peak second {fig['peak_throttled_per_s_over_limit']:.2f}); ranks failed {fig['ranks_failed']}; "
            f"first batches as unthrottled: {fig['first_batches_identical']}",
            flush=True,
        )
    figures["no_limit_last_first_batch_s"] = [r["last_first_batch_s"] for r in unlimited.values()]
    figures["node_cache_leftovers"] = sum(r["node_cache_leftovers"] for r in runs)
    figures["runs"] = [{k: v for k, v in r.items() if k != "sha256"} for r in runs]
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1].split("\n\n    python")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--nodes",
        type=int,
        action="append",
        default=None,
        help="nodes of a configuration (repeatable; default 4 and 16)",
    )
    parser.add_argument("--ranks", type=int, default=48, help="ranks of the job, split evenly over the nodes")
    parser.add_argument("--rate", type=float, default=10.0, help="the store's GET/s per prefix")
    parser.add_argument("--burst", type=float, default=None, help="its token bucket (default: max(8, rate / 10))")
    parser.add_argument("--launcher", choices=LAUNCHERS, default="srun", help="whose variables each node carries")
    parser.add_argument("--trials", type=int, default=1, help="paired trials of the three storms")
    parser.add_argument(
        "--kinds",
        default=",".join(KINDS),
        help=f"the storms of a trial, of {', '.join(KINDS)} (default all; 'no limit' is needed)",
    )
    parser.add_argument("--warmup", type=int, default=1, help="storms without limit run first, not counted")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--local-batch", type=int, default=4)
    parser.add_argument("--tokens-m", type=float, default=8.0, help="dataset size, millions of tokens")
    parser.add_argument("--block-tokens", type=int, default=2**16 + 1)
    parser.add_argument("--blocks-per-shard", type=int, default=16)
    args = parser.parse_args(argv)
    args.nodes = args.nodes or [4, 16]
    args.kinds = [k.strip() for k in args.kinds.split(",")]
    bad = [n for n in args.nodes if n < 1 or args.ranks % n]
    if bad or args.trials < 1 or args.rate <= 0:
        parser.error(
            f"--ranks {args.ranks} must split evenly over every --nodes (not {bad}); --trials >= 1, --rate > 0"
        )
    if not set(args.kinds) <= set(KINDS) or "no limit" not in args.kinds:
        parser.error(f"--kinds {','.join(args.kinds)}: of {', '.join(KINDS)}, 'no limit' among them")
    from tools.box_network import unavailable

    reason = unavailable()
    if reason is not None:
        print(reason, file=sys.stderr)
        return 1
    args.burst = args.burst if args.burst is not None else max(8.0, args.rate / 10)
    args.job_ranks = None
    configurations = {}
    with tempfile.TemporaryDirectory(prefix="zs-storm-nodes-") as tmp:
        for num_nodes in args.nodes:
            configurations[str(num_nodes)] = storms_on(num_nodes, args, Path(tmp))
    summary = {
        "ranks": args.ranks,
        "rate": args.rate,
        "burst": args.burst,
        "launcher": args.launcher,
        "seq_len": args.seq_len,
        "local_batch": args.local_batch,
        "trials": args.trials,
        "configurations": configurations,
        "load_average_1min": os.getloadavg()[0],
    }
    print(
        "\n"
        + " | ".join(
            f"{n} nodes, {kind} limiter: {c[kind]['time_over_floor_median']:.2f}x floor, "
            f"{c[kind]['throttled_per_served']:.2f} 503s per served"
            for n, c in configurations.items()
            for kind in ("node", "rank")
            if kind in c
        )
    )
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
