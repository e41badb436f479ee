"""Stores crossing process boundaries: a forked child rebuilds its own S3
connection instead of sharing the parent's event loop; a spawned child gets a
pickled store that reconnects."""

from __future__ import annotations

import multiprocessing as mp
import time

import pytest

from tools.reliability.common import open_fds
from zephon_stream.storage import open_store


def _read_in_child(store, queue) -> None:
    try:
        queue.put(store.read_range("obj", 2, 9))
        queue.put(store.stats()["reads"])
    except BaseException as exc:  # noqa: BLE001 - sent back to the parent
        queue.put(repr(exc))


@pytest.mark.slow
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_store_used_in_a_child_process_reconnects(s3_bucket, method):
    store = open_store(s3_bucket.url("proc"), s3_bucket.storage_options)
    store.write_atomic("obj", b"0123456789")
    assert store.read("obj") == b"0123456789"  # the parent's connection exists before the fork
    ctx = mp.get_context(method)
    queue = ctx.Queue()
    child = ctx.Process(target=_read_in_child, args=(store, queue))
    child.start()
    try:
        assert queue.get(timeout=120) == b"2345678"
        reads_in_child = queue.get(timeout=10)
    finally:
        child.join(timeout=60)
    assert child.exitcode == 0
    assert reads_in_child >= 1
    assert store.read_range("obj", 0, 3) == b"012"  # the parent's store still works
    store.close()


@pytest.mark.skipif(not __import__("os").path.isdir("/proc/self/fd"), reason="needs /proc")
def test_closing_stores_releases_their_connections(s3_bucket):
    import threading

    with open_store(s3_bucket.url("sock"), s3_bucket.storage_options) as warm:
        warm.write_atomic("obj", b"x" * 1000)  # starts fsspec's event loop, which lives on
    before = open_fds()["socket"]
    peak = [0]
    reading = threading.Event()

    def watch() -> None:
        # The in-process server may close each connection right after its
        # response, so connections are counted while the reads run, not after.
        while reading.is_set():
            peak[0] = max(peak[0], open_fds()["socket"])
            time.sleep(0.001)

    def read_ten_times(store) -> None:
        for _ in range(10):
            store.read("obj")

    for _ in range(3):
        store = open_store(s3_bucket.url("sock"), s3_bucket.storage_options)
        readers = [threading.Thread(target=read_ten_times, args=(store,)) for _ in range(6)]
        reading.set()
        watcher = threading.Thread(target=watch)
        watcher.start()
        for thread in readers:
            thread.start()
        for thread in readers:
            thread.join()
        reading.clear()
        watcher.join()
        store.close()
    in_use = peak[0]
    assert in_use > before, "no connection was ever open; the check below proves nothing"
    # moto runs in this process; its side of each connection closes a moment later.
    deadline = time.monotonic() + 30
    while open_fds()["socket"] > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert open_fds()["socket"] <= before


def test_concurrent_first_use_builds_one_s3_client(s3_bucket, caplog):
    import logging
    import threading

    with open_store(s3_bucket.url("cold"), s3_bucket.storage_options) as writer:
        writer.write_atomic("obj", b"cold start")
    caplog.set_level(logging.DEBUG, logger="s3fs")
    store = open_store(s3_bucket.url("cold"), s3_bucket.storage_options)
    results: list[bytes] = []
    threads = [threading.Thread(target=lambda: results.append(store.read("obj"))) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    store.close()
    assert results == [b"cold start"] * 8
    setups = [r for r in caplog.records if r.name == "s3fs" and "Setting up s3fs instance" in r.getMessage()]
    assert len(setups) == 1
