"""Subprocess probe: peak RSS growth of a loader run against its memory bound.

Prints one JSON object: ``growth_bytes`` (peak RSS during the run minus RSS
before the first batch, plus the helper process's peak RSS when the pipeline
runs in one), ``helper_peak_bytes``, ``bound_bytes``, ``cache_peak_bytes`` and
``cache_capacity_bytes``, ``forced_reservations`` and ``blocks_fetched``.
"""

from __future__ import annotations

import argparse
import json
import time


def rss_bytes(field: str, pid: int | str = "self") -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--seq-len", type=int, required=True)
    parser.add_argument("--local-batch", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--prefetch", type=int, default=4)
    parser.add_argument("--pipeline", default="process")
    args = parser.parse_args()

    from zephon_stream import StreamingLoader

    loader = StreamingLoader(
        args.data,
        seq_len=args.seq_len,
        local_batch_size=args.local_batch,
        prefetch_steps=args.prefetch,
        num_fetch_threads=2,
        num_decode_threads=2,
        pipeline=args.pipeline,
    )
    baseline = rss_bytes("VmRSS")
    # Writing 5 to clear_refs resets the peak (VmHWM) to the current RSS.
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")
    for _ in zip(range(args.steps), loader):
        pass
    # A run's first steps come from threads of this process while the
    # helper starts; both sides' peaks count, so read on until it serves.
    while args.pipeline == "process" and loader.helper_pid is None:
        next(loader)
        time.sleep(0.002)
    for _ in zip(range(args.steps), loader):
        pass
    peak = rss_bytes("VmHWM")
    # The helper's whole footprint counts: the bound holds its
    # interpreter as well as the cache it fills.
    helper_peak = rss_bytes("VmHWM", loader.helper_pid) if loader.helper_pid else 0
    stats = loader.stats()
    print(
        json.dumps(
            {
                "growth_bytes": peak - baseline + helper_peak,
                "helper_peak_bytes": helper_peak,
                "bound_bytes": loader.memory_bound_bytes,
                "cache_peak_bytes": stats["cache_peak_bytes"],
                "cache_capacity_bytes": stats["cache_capacity_bytes"],
                "forced_reservations": stats["cache_forced_reservations"],
                "blocks_fetched": stats["blocks_fetched"],
            }
        )
    )
    loader.close()


if __name__ == "__main__":
    main()
