"""bench_read on an object-store server: ``--backend moto|seaweedfs|gcs|azure``.

Each server runs on loopback (tools/seaweedfs.py, tools/fake_gcs.py,
tools/azurite.py, moto's ``EmbeddedS3``) with the dataset copied to it. Every
figure has its baseline measured in the same run:

1. The loader's tokens/s on the server, first pass and steady (passes 2 to
   ``--epochs``), against the same loader on the same dataset from local disk,
   in paired trials (``--trials``, local and server alternating); the ratio of
   each trial is printed, and their range.
2. Raw parallel range reads of the same blocks on the same server, at the
   loader's concurrency (``num_fetch_threads``, as coroutines on the store's
   event loop, as the loader issues them): whether the server is the limit.
3. Where the loader's time goes per fetched block: its mean latency per GET
   (``stats()["fetch_s"] / blocks_fetched``) and the CPU (trainer + helper
   process) the server run spends beyond the local run, per block fetched.
   Then the whole run's CPU: the trainer and its helper (reaped children),
   and the server process, against wall time; from those, the best ratio to
   local disk this machine's cores allow with the server on them (the work
   of the server run spread perfectly over every core).
4. The first batch, cold and after ``load_state_dict`` at 90% of the epoch
   (a seek), median of ``--repeats``.
5. The loader through the fault proxy adding ``--latency-ms`` to every
   request: its tokens/s and ratio to local disk.

moto answers every ranged GET by reading the whole object (and serves
requests from one Python process), so its figure measures moto's copying
more than the loader: a block costs a read of its whole shard.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import os
import statistics
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks.read_measurements import first_batch_s, loader_tokens_per_s
from tools.fault_proxy import FaultProxy
from zephon_stream import Manifest
from zephon_stream.storage import copy_dataset, open_store

BACKENDS = ("moto", "seaweedfs", "gcs", "azure")
BUCKET = "bench-read"


@contextlib.contextmanager
def backend_server(name: str) -> Iterator[tuple[str, dict[str, Any], Callable[[str], dict[str, Any]], str, int | None]]:
    """``(dataset URL, storage options, options via an endpoint, server endpoint, server pid)`` of a started server."""
    if name in ("moto", "seaweedfs"):
        if name == "moto":
            from zephon_stream.storage.embedded_s3 import EmbeddedS3

            server: Any = EmbeddedS3(subprocess=True)
        else:
            from tools.seaweedfs import SeaweedFS

            server = SeaweedFS()
        with server:
            server.create_bucket(BUCKET)
            options = server.storage_options()
            yield (
                f"s3://{BUCKET}/ds",
                options,
                lambda endpoint: {**options, "endpoint_url": endpoint},
                server.endpoint_url,
                getattr(server, "pid", None),
            )
    elif name == "gcs":
        from tools.fake_gcs import FakeGcs

        with FakeGcs(buckets=[BUCKET]) as server:
            options = server.storage_options()
            yield (
                f"gs://{BUCKET}/ds",
                options,
                lambda endpoint: {**options, "endpoint_url": endpoint},
                server.endpoint_url,
                server.pid,
            )
    elif name == "azure":
        from tools.azurite import Azurite

        with Azurite(containers=[BUCKET]) as server:
            yield (
                f"az://{BUCKET}/ds",
                server.storage_options(),
                lambda endpoint: {"connection_string": server.connection_string(endpoint)},
                server.endpoint_url,
                server.pid,
            )
    else:
        raise ValueError(f"unknown backend {name!r} (choose from {', '.join(BACKENDS)})")


def raw_range_reads(url: str, options: dict[str, Any], manifest: Manifest, concurrency: int, passes: int) -> dict:
    """Every block's bytes read ``passes`` times, ``concurrency`` at a time, as the loader's fetches do."""
    ranges = [manifest.block_byte_range(b) for b in range(manifest.num_blocks)] * passes
    with open_store(url, options) as store:
        store.read_range(*ranges[0])  # Connect before timing
        loop = store.event_loop()
        started, cpu = time.perf_counter(), time.process_time()
        if loop is None:
            with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
                nbytes = sum(map(len, pool.map(lambda r: store.read_range(*r), ranges)))
        else:

            async def read_all() -> int:
                slots = asyncio.Semaphore(concurrency)

                async def one(path: str, start: int, end: int) -> int:
                    async with slots:
                        return len(await store.read_range_async(path, start, end))

                return sum(await asyncio.gather(*(one(*r) for r in ranges)))

            nbytes = asyncio.run_coroutine_threadsafe(read_all(), loop).result()
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    return {
        "tokens_per_s": manifest.num_tokens * passes / elapsed,
        "gets_per_s": len(ranges) / elapsed,
        "mb_per_s": nbytes / elapsed / 1e6,
        "client_cpu_ms_per_get": cpu / len(ranges) * 1e3,
        "concurrency": concurrency,
        "async": loop is not None,
    }


def _own_cpu_s() -> float:
    # Reaped children count: the loader's helper is reaped when it closes.
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def _process_cpu_s(pid: int | None) -> float:
    if pid is None:
        return 0.0
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_with_cpu(run: Callable[[], dict], server_pid: int | None) -> dict:
    """``run()``'s figures plus its wall time, its CPU in this process and its reaped children, and the server's."""
    started, own, server = time.perf_counter(), _own_cpu_s(), _process_cpu_s(server_pid)
    figures = run()
    figures["run_wall_s"] = time.perf_counter() - started
    figures["run_loader_cpu_s"] = _own_cpu_s() - own
    figures["run_server_cpu_s"] = _process_cpu_s(server_pid) - server
    return figures


def spread(values: list[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}" if len(values) > 1 else f"{values[0]:.2f}"


def remote_figures(manifest: Manifest, root: Path, args: argparse.Namespace, epoch_steps: int) -> dict:
    """Every figure of one backend (module docstring); prints them as it goes."""
    cores = os.cpu_count() or 1
    with backend_server(args.backend) as (url, options, options_via, endpoint, server_pid):
        started = time.perf_counter()
        copy_dataset(root, url, dst_options=options)
        print(f"{args.backend}: dataset copied to {url} in {time.perf_counter() - started:.1f} s")
        trials = []
        for trial in range(args.trials):
            order = (("local", str(root), None, None), ("remote", url, options, server_pid))
            runs = {}
            for name, where, opts, pid in order if trial % 2 == 0 else order[::-1]:
                run = partial(loader_tokens_per_s, where, opts, args, epoch_steps, passes=args.epochs)
                runs[name] = run_with_cpu(run, pid)
            local, remote = runs["local"], runs["remote"]
            extra_cpu_s = (remote["cpu_s"] - local["cpu_s"]) / max(1, remote["first_pass_blocks"])
            remote_floor_s = (remote["run_loader_cpu_s"] + remote["run_server_cpu_s"]) / cores
            trial_figures = {
                "local": local,
                "remote": remote,
                "ratio_first": remote["tokens_per_s"] / local["tokens_per_s"],
                "ratio_steady": remote.get("steady_tokens_per_s", 0) / local.get("steady_tokens_per_s", 1),
                "extra_cpu_ms_per_block": extra_cpu_s * 1e3,
                "ratio_cpu_bound": local["run_wall_s"] / remote_floor_s if remote_floor_s else None,
            }
            trials.append(trial_figures)
            print(
                f"trial {trial + 1}: loader {args.backend} first pass {remote['tokens_per_s'] / 1e6:.1f} M tok/s, "
                f"steady {remote.get('steady_tokens_per_s', 0) / 1e6:.1f} M; local disk first "
                f"{local['tokens_per_s'] / 1e6:.1f} M, steady {local.get('steady_tokens_per_s', 0) / 1e6:.1f} M; "
                f"ratio first {trial_figures['ratio_first']:.2f}, steady {trial_figures['ratio_steady']:.2f} "
                f"(target >= 0.8); {remote['fetch_ms_per_block']:.1f} ms a GET in the loader, "
                f"{trial_figures['extra_cpu_ms_per_block']:.1f} ms CPU a block beyond local, "
                f"{remote['retries']} retries"
            )
            if server_pid is not None:
                print(
                    f"  whole runs: local {local['run_loader_cpu_s']:.2f} s CPU in {local['run_wall_s']:.2f} s; "
                    f"{args.backend}: loader {remote['run_loader_cpu_s']:.2f} s + server "
                    f"{remote['run_server_cpu_s']:.2f} s CPU in {remote['run_wall_s']:.2f} s; on {cores} cores "
                    f"the {args.backend} run takes at least {remote_floor_s:.2f} s: at best "
                    f"{trial_figures['ratio_cpu_bound']:.2f} x local"
                )
        raw = raw_range_reads(url, options, manifest, args.fetch_concurrency, passes=args.raw_passes)
        best_local = max(t["local"].get("steady_tokens_per_s", t["local"]["tokens_per_s"]) for t in trials)
        print(
            f"raw range reads of the same blocks, {raw['concurrency']} at once: "
            f"{raw['tokens_per_s'] / 1e6:.1f} M tok/s "
            f"({raw['gets_per_s']:.0f} GET/s, {raw['mb_per_s']:.0f} MB/s, "
            f"client CPU {raw['client_cpu_ms_per_get']:.2f} "
            f"ms/GET) = {raw['tokens_per_s'] / best_local:.2f} x the loader's best local rate"
            + (": the server (with its client) is the limit" if raw["tokens_per_s"] < 0.8 * best_local else "")
        )

        resume_at = int(0.9 * epoch_steps) * args.local_batch
        first_batch = {}
        for name, where, opts in (("local", str(root), None), (args.backend, url, options)):
            cold = statistics.median(first_batch_s(where, opts, args, 0) for _ in range(args.repeats))
            seek = statistics.median(first_batch_s(where, opts, args, resume_at) for _ in range(args.repeats))
            first_batch[name] = {"cold_s": cold, "seek_90pct_s": seek, "ratio": seek / cold}
            print(
                f"first batch {name}: cold {cold * 1e3:.0f} ms, after a seek to 90% {seek * 1e3:.0f} ms, "
                f"ratio {seek / cold:.2f} (target <= 1.2)"
            )

        with FaultProxy(upstream=endpoint, latency_s=args.latency_ms / 1000) as proxy:
            slow = loader_tokens_per_s(url, options_via(proxy.endpoint_url), args, epoch_steps, passes=args.epochs)
        slow_rate = slow.get("steady_tokens_per_s", slow["tokens_per_s"])
        print(
            f"loader {args.backend} + {args.latency_ms:.0f} ms a request (fault proxy): first pass "
            f"{slow['tokens_per_s'] / 1e6:.1f} M tok/s, steady {slow_rate / 1e6:.1f} M = "
            f"{slow_rate / best_local:.2f} x the best local steady rate"
        )

    bounds = [t["ratio_cpu_bound"] for t in trials if t["ratio_cpu_bound"] is not None]
    if bounds and server_pid is not None:
        print(f"best ratio these {cores} cores allow with the server on them (whole runs): {spread(bounds)}")
    ratios_first = [t["ratio_first"] for t in trials]
    ratios_steady = [t["ratio_steady"] for t in trials]
    print(
        f"ratio {args.backend} / local disk over {len(trials)} paired trials: first pass {spread(ratios_first)}, "
        f"steady {spread(ratios_steady)} (target >= 0.8)"
    )
    if args.backend == "moto":
        print("NOTE: moto reads the whole object for every ranged GET: this figure is moto's copying, not the loader's")
    return {
        "backend": args.backend,
        "trials": trials,
        "ratio_first_range": [min(ratios_first), max(ratios_first)],
        "ratio_steady_range": [min(ratios_steady), max(ratios_steady)],
        "raw_range_reads": raw,
        "raw_vs_best_local": raw["tokens_per_s"] / best_local,
        "first_batch": first_batch,
        "latency": {"latency_ms": args.latency_ms, "loader": slow, "ratio_vs_best_local": slow_rate / best_local},
    }
