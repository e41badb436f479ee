"""The start-up storm: many ranks opening one dataset at once through a store that throttles, against the floor.

Every simulated rank does what a real rank does at a job's start: it builds
``StreamingLoader(url, seq_len=..., local_batch_size=..., rank=r,
world_size=W, pipeline="threads", node_cache=NODE)`` (reads the manifest,
plans its first step, reads the index pages of that step's blocks) and takes
its first batch (fetches and decodes those blocks). Nodes are processes
(``--ranks-per-node`` ranks each, on threads, sharing a node-cache folder of
their own under a temporary folder); all ranks start together once every node
process has its imports done.

The store: SeaweedFS on loopback (tools/seaweedfs.py, a real S3 server) behind
tools/fault_proxy.py's request-rate limit (a token bucket per prefix answered
with S3's 503 SlowDown; the whole dataset is one prefix). The limit is S3's
about 5,500 GET/s per prefix scaled to the ranks simulated, ``5500 * ranks /
job_ranks`` (``--job-ranks``, default 2048; or ``--rate``), so that these
ranks' requests meet it as a job of ``job_ranks`` ranks meets S3: the same
requests per second of limit, and the same operations contending for each
token, so the backoff's dynamics (its windows are in seconds) are those of the
real job. The bucket holds a tenth of a second's tokens, at least 8
(``--burst``), and starts full: the floor is ``(served - burst) / rate``, the
least time in which the bucket can serve the storm's requests. The
dataset: the stdlib sources' bytes as token ids (the ``bytes``
tokenizer), repeated to ``--tokens-m`` million tokens, written by
``write_dataset`` to the bucket in format 1.1 (header + index objects), in
blocks of ``--block-tokens`` so that the ranks' first steps touch different
blocks. Each rank's loader stops after one step (``max_steps=1``), so that it
requests only what its first batch needs.

After ``--warmup`` storms without limit that are not counted (the first storm
after the dataset's writing is slower), each trial runs the storm three times,
the order rotating: throttled with the
policy under test (``--policy``; the defaults: the node's request-rate limiter,
storage/limiter.py), throttled with the baseline policy (``--baseline``;
default ``throttle_limiter=0``: each operation's own full-jitter backoff, the
policy before the limiter), and with no limit (what the same ranks take on
this machine when the store answers everything). It prints GETs and bytes per rank and in all, the proxy's
throttled (503) and served requests, the time until the last rank has its
first batch, the floor and the ratio, failed ranks, whether every throttled
request was counted by the ranks' stats, whether every rank's first batch was
the same in both runs, and the model that scales the figures to 2,048 and
16,384 ranks (``model``: what is measured, what computed).
``--policy FIELD=VALUE`` runs every rank's store with another ``RetryPolicy``
default (e.g. ``throttle_max_backoff_s=5``), to measure a change before making
it; ``--baseline FIELD=VALUE`` sets the baseline's (``--baseline none``: no
baseline storm). The last printed line is one JSON object.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.storm_figures import S3_GET_PER_S, report  # noqa: E402

EOS_ID = 256  # The bytes tokenizer: ids 0-255 are bytes, 256 ends a document


def corpus_tokens(num_tokens: int) -> np.ndarray:
    """The stdlib sources' bytes as uint16 ids, each file ended by EOS, repeated to ``num_tokens``."""
    root = Path(sysconfig.get_paths()["stdlib"])
    pieces, total = [], 0
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts)
    while total < num_tokens:
        for path in files:
            doc = np.frombuffer(path.read_bytes(), dtype=np.uint8).astype(np.uint16)
            pieces.append(np.append(doc, np.uint16(EOS_ID)))
            total += len(doc) + 1
            if total >= num_tokens:
                break
    return np.concatenate(pieces)[:num_tokens]


def write_corpus(url: str, options: dict, args: argparse.Namespace, tmp: Path) -> dict:
    from zephon_stream import Manifest, write_dataset

    tokens = corpus_tokens(int(args.tokens_m * 1e6))
    tokens[-1] = EOS_ID
    npy = tmp / "corpus.npy"
    np.save(npy, tokens)
    write_dataset(
        [str(npy)],
        url,
        tokenizer="bytes",
        input_format="tokens",
        block_tokens=args.block_tokens,
        blocks_per_shard=args.blocks_per_shard,
        storage_options=options,
        progress=False,
    )
    npy.unlink()
    from zephon_stream.storage import open_store

    with open_store(url, options) as store:
        objects = {path: store.size(path) for path in store.list() if not path.startswith("shards/")}
    m = Manifest.load(url, options)
    return {
        "tokens": m.num_tokens,
        "blocks": m.num_blocks,
        "shards": m.num_shards,
        "version": list(m.version),
        "shard_bytes": sum(s.num_bytes for s in m.shards),
        "metadata_objects": objects,
    }


# -- one node: a process whose threads are ranks ------------------------------


def run_rank(rank: int, job: dict, go: threading.Event, out: dict) -> None:
    from zephon_stream import StreamingLoader

    go.wait()
    started = time.time()
    # max_steps=1: the loader plans and fetches its first step alone, so
    # every request a rank makes is one its first batch needs, and none is cut
    # off in flight when it closes (a 503 the proxy sent that no rank received
    # would look like a throttle the stats missed).
    try:
        with StreamingLoader(
            job["url"],
            seq_len=job["seq_len"],
            local_batch_size=job["local_batch"],
            rank=rank,
            world_size=job["world_size"],
            storage_options=job["options"],
            pipeline="threads",
            node_cache=job["node_cache"],
            max_steps=1,
        ) as loader:
            built = time.time()
            batch = next(loader)
            first = time.time()
            stats = loader.stats()
            # The store's own counters: GETs completed and bytes, which loader.stats() does not break out.
            store = loader._sources[0].store.stats()
            shared = loader._sources[0].store.limiter is not None and loader._sources[0].store.limiter.shared
        digest = hashlib.sha256(batch["input"].numpy().tobytes()).hexdigest()
        out[rank] = {
            "ok": True,
            "started": started,
            "built_s": built - started,
            "first": first,
            "first_s": first - started,
            "gets": store["reads"],
            "bytes": store["bytes_read"],
            "throttled": stats["throttled"],
            "retries": stats["retries"],
            "throttle_waits": stats["throttle_waits"],
            "throttle_wait_s": stats["throttle_wait_s"],
            "limiter_shared": shared,
            "blocks": stats["blocks_fetched"],
            "sha256": digest,
        }
    except Exception as exc:  # noqa: BLE001 - a failed rank is a figure, reported with its error
        out[rank] = {"ok": False, "started": started, "error": f"{type(exc).__name__}: {exc}"[:500]}


def node_main(job: dict) -> None:
    """Import what a rank has imported before it starts, say ready, start every rank on 'go', print their results."""
    import torch  # noqa: F401 - a trainer has torch imported before its loader starts

    import zephon_stream.loader  # noqa: F401
    import zephon_stream.storage.fsspec_store  # noqa: F401
    from zephon_stream.storage.retry import RetryPolicy

    # --policy: the defaults every store of this node builds its RetryPolicy from (an experiment's knob).
    RetryPolicy.__init__.__kwdefaults__.update(job["policy"])
    go, out = threading.Event(), {}
    threads = [threading.Thread(target=run_rank, args=(r, job, go, out)) for r in job["ranks"]]
    for thread in threads:
        thread.start()
    print("ready", flush=True)
    sys.stdin.readline()
    go.set()
    for thread in threads:
        thread.join()
    print(json.dumps(out), flush=True)


# -- one storm: every node started together -----------------------------------


def start_nodes(
    url: str,
    opts: dict,
    args: argparse.Namespace,
    policy: dict,
    nodes_dir: Path,
    nodes: list,
    spawn: Any = None,
    node_cache: str = "folder",
) -> None:
    """Start every node process, appending it and its log file to ``nodes`` as it starts; wait until all are ready.

    ``spawn(node, argv, **popen)`` starts node ``node``'s process (default: here, ``subprocess.Popen``);
    ``node_cache``: ``"folder"`` (one under ``nodes_dir`` a node), ``"default"`` (the loader's own choice from
    the node's launcher variables) or ``"none"`` (no node cache: a limiter for every rank).
    """
    for node in range(-(-args.ranks // args.ranks_per_node)):
        ranks = list(range(node * args.ranks_per_node, min(args.ranks, (node + 1) * args.ranks_per_node)))
        cache = {"folder": str(nodes_dir / f"node{node}"), "default": None, "none": False}[node_cache]
        job = {
            "url": url,
            "options": opts,
            "seq_len": args.seq_len,
            "local_batch": args.local_batch,
            "world_size": args.ranks,
            "ranks": ranks,
            "node_cache": cache,
            "policy": policy,
        }
        log = open(nodes_dir / f"node{node}.log", "w+")
        argv = [sys.executable, __file__, "--node", json.dumps(job)]
        popen = {"text": True, "stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": log}
        nodes.append((subprocess.Popen(argv, **popen) if spawn is None else spawn(node, argv, **popen), log))
    for proc, _ in nodes:
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"node process {proc.pid} did not start (exit {proc.wait()})")


def storm(
    url: str,
    options: dict,
    args: argparse.Namespace,
    *,
    rate: float | None,
    policy: dict,
    upstream: str,
    tmp: Path,
    spawn: Any = None,
    host: str = "127.0.0.1",
    node_cache: str = "folder",
    leftovers: Any = None,
) -> dict:
    """One storm: every rank of every node started at once through a fresh proxy on ``host`` (``rate`` None: no
    limit), each rank's store with the RetryPolicy defaults ``policy``; ``spawn`` and ``node_cache`` as
    ``start_nodes`` takes them, ``leftovers()`` what the node caches left (default: what is in their folders)."""
    from tools.fault_proxy import FaultProxy

    burst = args.burst if rate else None
    proxy = FaultProxy(upstream=upstream, rate_limit=rate, burst=burst, throttle_style="s3", prefix_depth=1, host=host)
    made = time.time()
    nodes: list[tuple[Any, Any]] = []
    with proxy, tempfile.TemporaryDirectory(dir=tmp, prefix="nodes-") as nodes_dir:
        try:
            # Each node is in ``nodes`` as soon as it starts, so that an interrupt kills it below.
            start_nodes(
                url,
                {**options, "endpoint_url": proxy.endpoint_url},
                args,
                policy,
                Path(nodes_dir),
                nodes,
                spawn=spawn,
                node_cache=node_cache,
            )
            time.sleep(0.2)  # Let the node processes reach their stdin read before the clock starts
            before = proxy.counts()
            started = time.time()
            for proc, _ in nodes:
                proc.stdin.write("go\n")
                proc.stdin.flush()
            ranks: dict[int, dict] = {}
            for proc, log in nodes:
                line = proc.stdout.readline()
                if proc.wait() != 0 or not line:
                    log.seek(0)
                    raise RuntimeError(f"node process {proc.pid} exited {proc.returncode}:\n{log.read()[-2000:]}")
                ranks.update({int(r): v for r, v in json.loads(line).items()})
            counts, timeline = proxy.counts(), proxy.timeline()
            warnings = 0
            for _, log in nodes:
                log.seek(0)
                warnings += sum("is throttling requests" in line for line in log)
        finally:
            for proc, log in nodes:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                log.close()
        leftover = (
            leftovers() if leftovers is not None else [p for p in Path(nodes_dir).iterdir() if p.suffix != ".log"]
        )
    ok = [v for v in ranks.values() if v["ok"]]
    throttled = counts["throttled"] - before["throttled"]
    served = counts["requests"] - before["requests"] - throttled
    last_s = max(v["first"] for v in ok) - started if ok else float("nan")
    storm_timeline = timeline[int(started - made) :] if rate else []

    def per_rank(key: str) -> list:
        return [ranks[r][key] if ranks[r]["ok"] else None for r in sorted(ranks)]

    return {
        "policy": policy,
        "rate": rate,
        "burst": burst if rate else None,
        "last_first_batch_s": last_s,
        "first_batch_s_median": statistics.median(v["first_s"] for v in ok) if ok else None,
        "construct_s_median": statistics.median(v["built_s"] for v in ok) if ok else None,
        "ranks_failed": len(ranks) - len(ok),
        "errors": sorted({v["error"] for v in ranks.values() if not v["ok"]})[:3],
        "served": served,
        "throttled": throttled,
        "ranks_throttled": sum(v["throttled"] for v in ok),
        "ranks_retries": sum(v["retries"] for v in ok),
        "gets": sum(v["gets"] for v in ok),
        "throttle_waits": sum(v["throttle_waits"] for v in ok),
        "throttle_wait_s": sum(v["throttle_wait_s"] for v in ok),
        "limiter_shared": sum(v["limiter_shared"] for v in ok),
        "bytes": sum(v["bytes"] for v in ok),
        "gets_per_rank": per_rank("gets"),
        "bytes_per_rank": per_rank("bytes"),
        "blocks_per_rank": per_rank("blocks"),
        "throttled_per_rank": per_rank("throttled"),
        "first_s_per_rank": [None if t is None else round(t - started, 3) for t in per_rank("first")],
        "sha256": {r: v.get("sha256") for r, v in sorted(ranks.items())},
        "floor_s": max(0.0, served - burst) / rate if rate else None,
        "timeline": storm_timeline,
        "throttled_per_s_over_limit": throttled / last_s / rate if rate and ok else None,
        "throttled_per_s_peak": max((t for _, _, t in storm_timeline), default=0),
        "node_cache_leftovers": len(leftover),
        "throttle_warnings": warnings,
    }


def parse_policy(items: list[str]) -> dict[str, float]:
    from zephon_stream.storage.retry import RetryPolicy

    fields = RetryPolicy.__init__.__kwdefaults__
    policy = {}
    for item in items:
        name, _, value = item.partition("=")
        if name not in fields or not value:
            raise ValueError(f"--policy {item!r}: expected FIELD=VALUE, FIELD one of {sorted(fields)}")
        # bool(float("0")) is False: throttle_limiter=0 turns the limiter off.
        policy[name] = type(fields[name])(float(value))
    RetryPolicy(**policy)  # Refused here, with its own message, rather than in every node
    return policy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=32, help="simulated ranks (the world size)")
    parser.add_argument("--ranks-per-node", type=int, default=8, help="ranks a node process holds, on threads")
    parser.add_argument(
        "--rate", type=float, default=None, help=f"GET/s per prefix (default {S3_GET_PER_S:g} * ranks / --job-ranks)"
    )
    parser.add_argument(
        "--job-ranks",
        type=int,
        default=2048,
        help="the job whose start is played: the limit is S3's scaled by ranks / job ranks",
    )
    parser.add_argument(
        "--burst", type=float, default=None, help="the token bucket (default: a tenth of a second's tokens, at least 8)"
    )
    parser.add_argument(
        "--trials",
        type=int,
        default=1,
        help="paired trials: the policy's throttled storm, the baseline's and one without limit",
    )
    parser.add_argument("--warmup", type=int, default=1, help="storms without limit run first and not counted")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--local-batch", type=int, default=4)
    parser.add_argument("--tokens-m", type=float, default=40.0, help="dataset size, millions of tokens")
    parser.add_argument("--block-tokens", type=int, default=2**16 + 1)
    parser.add_argument("--blocks-per-shard", type=int, default=16)
    parser.add_argument(
        "--policy",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="a RetryPolicy default for every rank's store, e.g. throttle_max_backoff_s=2 (repeatable)",
    )
    parser.add_argument(
        "--baseline",
        action="append",
        default=None,
        metavar="FIELD=VALUE",
        help="the RetryPolicy defaults of the baseline storm (default throttle_limiter=0: today's "
        "backoff before the limiter; 'none': no baseline storm)",
    )
    parser.add_argument("--node", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.node:
        node_main(json.loads(args.node))
        return
    if args.ranks < 1 or args.ranks_per_node < 1 or args.trials < 1:
        raise ValueError(
            f"--ranks, --ranks-per-node and --trials must be >= 1 (got {args.ranks}, "
            f"{args.ranks_per_node}, {args.trials})"
        )
    args.policy = parse_policy(args.policy)
    baseline_items = ["throttle_limiter=0"] if args.baseline is None else args.baseline
    args.baseline = None if baseline_items == ["none"] else parse_policy(baseline_items)
    if args.rate is None:
        args.rate = S3_GET_PER_S * args.ranks / args.job_ranks
    else:
        args.job_ranks = None
    # A bucket of one token wastes every token that comes while it is full: at 5 GET/s, a quarter of
    # them with 503s coming at 14/s. At 5,500 GET/s a tenth of a second is 550 tokens; 8 waste almost none.
    args.burst = args.burst if args.burst is not None else max(8.0, args.rate / 10)
    from tools.seaweedfs import SeaweedFS

    with tempfile.TemporaryDirectory(prefix="zs-storm-") as tmp, SeaweedFS(buckets=["storm"]) as server:
        url, options = "s3://storm/ds", server.storage_options()
        started = time.perf_counter()
        dataset = write_corpus(url, options, args, Path(tmp))
        print(
            f"dataset {url}: format {dataset['version']}, {dataset['tokens'] / 1e6:.1f} M tokens, "
            f"{dataset['blocks']} blocks of {args.block_tokens}, {dataset['shards']} shards "
            f"({dataset['shard_bytes'] / 1e6:.1f} MB), metadata {dataset['metadata_objects']} "
            f"(written in {time.perf_counter() - started:.1f} s)"
        )
        for _ in range(args.warmup):
            # The first storm after the dataset's writing pays the server's and the page cache's warm-up
            # (its ranks built their loaders in 1.5 s, the later storms' in 0.5 s); with the order rotating it
            # always fell on the policy under test.
            run = storm(url, options, args, rate=None, policy=args.policy, upstream=server.endpoint_url, tmp=Path(tmp))
            print(f"warm-up (no limit, not counted): last first batch {run['last_first_batch_s']:.2f} s", flush=True)
        runs = []
        kinds = [("policy", args.rate, args.policy), ("no limit", None, args.policy)]
        if args.baseline is not None:
            kinds.insert(1, ("baseline", args.rate, args.baseline))
        for trial in range(args.trials):
            # Paired, the order rotating, so drift on a shared machine hits every kind alike.
            for kind, rate, policy in kinds[trial % len(kinds) :] + kinds[: trial % len(kinds)]:
                run = storm(url, options, args, rate=rate, policy=policy, upstream=server.endpoint_url, tmp=Path(tmp))
                run.update(kind=kind, trial=trial, load_1min=os.getloadavg()[0])
                runs.append(run)
                print(
                    f"trial {trial} {kind}{' (throttled)' if rate else ''}: last first batch "
                    f"{run['last_first_batch_s']:.2f} s, served {run['served']}, 503s {run['throttled']}, "
                    f"failed {run['ranks_failed']}, load {os.getloadavg()[0]:.1f}",
                    flush=True,
                )
    print(json.dumps(report(runs, args, dataset)))


if __name__ == "__main__":
    main()
