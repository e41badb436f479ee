"""Long runs and churn: RSS stays flat over many epochs, and loaders opened and
closed over and over leave no thread, socket or file descriptor behind."""

from __future__ import annotations

import gc
import os
import threading
import time
from typing import Any

from tools.reliability.common import check, open_fds, process_table, rss_bytes


def long_run(
    *,
    url: str,
    epochs: int,
    storage_options: dict[str, Any] | None = None,
    seq_len: int = 256,
    local_batch_size: int = 8,
    samples: int = 40,
    growth_bound_bytes: int = 32 << 20,
) -> dict[str, Any]:
    """Stream ``epochs`` epochs, sampling RSS ``samples`` times; after the first
    epoch (warm-up) RSS may grow by at most ``growth_bound_bytes``.

    Returns:
        ``{"epochs", "steps", "rss_start_mib", "rss_warm_mib", "rss_max_mib",
        "growth_after_warmup_mib", "memory_bound_mib", "seconds", "rss_mib": [...]}``.
    """
    from zephon_stream import StreamingLoader

    started = time.perf_counter()
    rss_start = rss_bytes()
    with StreamingLoader(
        url, seq_len=seq_len, local_batch_size=local_batch_size, storage_options=storage_options, num_fetch_threads=2
    ) as loader:
        epoch_steps = loader.order.streams[0].lane_length * loader.lanes // loader.global_batch_size
        steps = epoch_steps * epochs
        every = max(1, steps // samples)
        trace = []
        rss_warm = None
        for step in range(1, steps + 1):
            next(loader)
            if step == epoch_steps:
                gc.collect()
                rss_warm = rss_bytes()
            if step % every == 0:
                trace.append(rss_bytes())
        memory_bound = loader.memory_bound_bytes
    assert rss_warm is not None
    after = [r for i, r in enumerate(trace) if (i + 1) * every > epoch_steps]
    growth = max(after, default=rss_warm) - rss_warm
    result = {
        "epochs": epochs,
        "steps": steps,
        "rss_start_mib": round(rss_start / 2**20, 1),
        "rss_warm_mib": round(rss_warm / 2**20, 1),
        "rss_max_mib": round(max(trace) / 2**20, 1),
        "growth_after_warmup_mib": round(growth / 2**20, 2),
        "growth_bound_mib": growth_bound_bytes / 2**20,
        "memory_bound_mib": round(memory_bound / 2**20, 1),
        "seconds": round(time.perf_counter() - started, 2),
        "rss_mib": [round(r / 2**20, 1) for r in trace],
    }
    check(
        growth <= growth_bound_bytes,
        f"RSS grew {growth / 2**20:.1f} MiB after warm-up over {epochs} epochs "
        f"(bound {growth_bound_bytes / 2**20} MiB)",
    )
    return result


def _own_threads() -> set[threading.Thread]:
    """Live threads, less an in-process S3 server's per-request threads
    (socketserver names them ``process_request_thread``): they serve the
    server, come and go with its connections, and are not the loader's."""
    return {t for t in threading.enumerate() if "process_request_thread" not in t.name}


def live_children() -> set[int]:
    """Pids of this process's children that are alive (zombies excluded)."""
    me = os.getpid()
    return {pid for pid, (state, parent) in process_table().items() if parent == me and state != "Z"}


def settled_fds(baseline: dict[str, int], *, timeout_s: float = 2.0) -> dict[str, int]:
    """This process's descriptors once none is above ``baseline``, or at ``timeout_s``.

    With the S3 server in this process, the server's end of a connection
    the client just closed stays open until its handler thread reads the EOF;
    that lag is not a leak, and a leaked descriptor never comes back.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        fds = open_fds()
        if all(fds[kind] <= baseline[kind] for kind in fds) or time.monotonic() >= deadline:
            return fds
        time.sleep(0.05)


def churn(
    *,
    url: str,
    cycles: int,
    steps: int = 20,
    storage_options: dict[str, Any] | None = None,
    seq_len: int = 256,
    local_batch_size: int = 8,
    pipeline: str = "process",
) -> dict[str, Any]:
    """Open a loader, read ``steps`` steps, close it, ``cycles`` times; threads
    and descriptors must be back at their baseline after every close.

    Returns:
        ``{"cycles", "threads_before", "threads_after", "fds_before",
        "fds_after", "max_threads_open", "max_sockets_open", "max_children_open",
        "children_after", "rss_growth_mib"}``; children are this process's
        live child processes (the loader's helper).
    """
    from zephon_stream import StreamingLoader
    from zephon_stream.storage import open_store

    # fsspec keeps one event-loop thread per process, shared by every
    # filesystem; start it before the baseline, it is not the loader's.
    if storage_options is not None:
        with open_store(url, storage_options) as store:
            store.read("manifest")
    gc.collect()
    baseline = _own_threads()
    threads_before, fds_before = len(baseline), open_fds()
    rss_after_first = None
    children_before = live_children()
    max_threads = max_sockets = max_children = 0
    for cycle in range(cycles):
        loader = StreamingLoader(
            url, seq_len=seq_len, local_batch_size=local_batch_size, storage_options=storage_options, pipeline=pipeline
        )
        for _ in range(steps):
            next(loader)
        max_threads = max(max_threads, threading.active_count())
        max_sockets = max(max_sockets, open_fds()["socket"])
        max_children = max(max_children, len(live_children() - children_before))
        loader.close()
        del loader
        gc.collect()
        fds = settled_fds(fds_before)
        # A leak is a thread that was not there before; an unrelated
        # thread of the process may end meanwhile, which is not one.
        leaked = sorted(t.name for t in _own_threads() - baseline)
        check(not leaked, f"cycle {cycle}: threads outlived close(): {leaked}")
        # Counts may drop (idle keep-alive connections of other S3
        # clients in the process time out); a leak is a count that grows.
        grown = {kind: fds[kind] - fds_before[kind] for kind in fds if fds[kind] > fds_before[kind]}
        check(
            not grown, f"cycle {cycle}: descriptors left open after close(): {grown} (before {fds_before}, after {fds})"
        )
        left = sorted(live_children() - children_before)
        check(not left, f"cycle {cycle}: child processes outlived close(): {left}")
        if cycle == 0:
            rss_after_first = rss_bytes()
    assert rss_after_first is not None
    return {
        "cycles": cycles,
        "threads_before": threads_before,
        "threads_after": len(_own_threads()),
        "fds_before": fds_before,
        "fds_after": open_fds(),
        "max_threads_open": max_threads,
        "max_sockets_open": max_sockets,
        "max_children_open": max_children,
        "children_after": len(live_children() - children_before),
        "rss_growth_mib": round((rss_bytes() - rss_after_first) / 2**20, 2),
    }
