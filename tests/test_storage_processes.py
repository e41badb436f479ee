"""Stores crossing process boundaries: a forked child rebuilds its own S3
connection instead of sharing the parent's event loop; a spawned child gets a
pickled store that reconnects."""

from __future__ import annotations

import multiprocessing as mp

import pytest

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
