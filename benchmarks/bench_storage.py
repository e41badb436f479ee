"""Storage layer figures on a moto S3 server (in a subprocess) on loopback.

1. Overhead: ``Store.read_range`` (path checks, retry layer, counters) against
   plain s3fs ``cat_file`` of the same ranges, one thread. Target >= 0.9.
2. Concurrency: 8 threads sharing one store against one thread, with 50 ms of
   latency injected per request by the fault proxy (a remote object store's
   round trip). Target speedup >= 4.

moto reads the whole object for every ranged GET (about 3 ms per MiB
of object here), so the objects are kept small to measure this layer and not
moto's copy; a real object store serves a range in time independent of the
object's size.

The last printed line is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools.fault_proxy import FaultProxy  # noqa: E402
from zephon_stream.storage import open_store  # noqa: E402
from zephon_stream.storage.embedded_s3 import EmbeddedS3  # noqa: E402
from zephon_stream.storage.fsspec_store import s3_filesystem_options  # noqa: E402
from zephon_stream.storage.retry import RetryPolicy  # noqa: E402


def _ranges(size: int, chunk: int) -> list[tuple[int, int]]:
    return [(start, min(size, start + chunk)) for start in range(0, size, chunk)]


def _timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def _threaded(read, ranges, threads: int) -> None:
    def work(index: int) -> None:
        for start, end in ranges[index::threads]:
            read(start, end)

    pool = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--object-mib", type=int, default=4)
    parser.add_argument("--chunk-kib", type=int, default=256)
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    with EmbeddedS3(subprocess=True) as server:
        server.create_bucket("bench")
        options = server.storage_options()
        payload = os.urandom(args.object_mib << 20)
        store = open_store("s3://bench/data", options)
        store.write_atomic("blob.bin", payload)
        ranges = _ranges(len(payload), args.chunk_kib << 10)

        import fsspec

        fs, _ = fsspec.core.url_to_fs("s3://bench", **s3_filesystem_options(options, RetryPolicy()))
        # The two readers alternate range by range so that drift in the
        # server's speed (a busy machine) hits both alike.
        raw_s = store_s = 0.0
        for _ in range(args.repeats):
            for a, b in ranges:
                raw_s += _timed(partial(fs.cat_file, "bench/data/blob.bin", start=a, end=b))
                store_s += _timed(partial(store.read_range, "blob.bin", a, b))
        mib = args.repeats * len(payload) / 2**20
        raw_mib_s, store_mib_s = mib / raw_s, mib / store_s
        overhead_ratio = store_mib_s / raw_mib_s
        print(
            f"one thread, {args.chunk_kib} KiB ranges: s3fs {raw_mib_s:.0f} MiB/s, store {store_mib_s:.0f} MiB/s, "
            f"ratio {overhead_ratio:.2f} (target >= 0.9)"
        )

        store.write_atomic("small.bin", payload[: 1 << 20])
        small = _ranges(1 << 20, 16 << 10)
        with FaultProxy(upstream=server.endpoint_url, latency_s=args.latency_ms / 1000) as proxy:
            slow = open_store("s3://bench/data", {**options, "endpoint_url": proxy.endpoint_url})
            read = lambda a, b: slow.read_range("small.bin", a, b)  # noqa: E731
            one_s = _timed(lambda: _threaded(read, small, 1))
            many_s = _timed(lambda: _threaded(read, small, args.threads))
            slow.close()
        speedup = one_s / many_s
        print(
            f"{len(small)} reads of 16 KiB at {args.latency_ms:.0f} ms latency: 1 thread {one_s:.2f}s, "
            f"{args.threads} threads {many_s:.2f}s, speedup {speedup:.1f}x (target >= 4)"
        )
        store.close()
    print(
        json.dumps(
            {
                "s3fs_mib_s": round(raw_mib_s, 1),
                "store_mib_s": round(store_mib_s, 1),
                "store_vs_s3fs": round(overhead_ratio, 3),
                "latency_ms": args.latency_ms,
                "threads": args.threads,
                "one_thread_s": round(one_s, 3),
                "threaded_s": round(many_s, 3),
                "concurrency_speedup": round(speedup, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
