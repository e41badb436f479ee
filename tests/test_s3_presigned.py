"""S3 block reads over presigned URLs (storage/s3_presigned.py), against SeaweedFS
through the fault proxy: the reads are plain GETs on signed URLs, a refused URL
is signed again, and a store that takes no presigned URLs is read through s3fs
with the same bytes."""

from __future__ import annotations

import asyncio
import logging

import pytest

from tests.fixtures_stores import new_bucket
from tools.fault_proxy import FaultProxy
from zephon_stream.errors import ObjectMissingError
from zephon_stream.storage import open_store

OBJECT = bytes(range(251)) * 4001
RANGES = [(i * 37_000, i * 37_000 + 20_000) for i in range(16)]


@pytest.fixture
def seaweedfs(seaweedfs_server):
    return new_bucket("seaweedfs", seaweedfs_server)


def written(env) -> str:
    url = env.url("presigned")
    with open_store(url, env.storage_options) as store:
        store.write_atomic("obj", OBJECT)
    return url


def read_all(store) -> list[bytes]:
    return [store.read_range("obj", start, end) for start, end in RANGES]


def expected() -> list[bytes]:
    return [OBJECT[start:end] for start, end in RANGES]


def test_ranged_reads_are_gets_on_a_presigned_url(seaweedfs, caplog):
    url = written(seaweedfs)
    with FaultProxy(upstream=seaweedfs.server.endpoint_url) as proxy, \
            open_store(url, seaweedfs.options_via(proxy.endpoint_url)) as store, \
            caplog.at_level(logging.WARNING, logger="zephon_stream.storage"):  # fmt: skip
        got = read_all(store)
        loop = store.event_loop()
        got_async = asyncio.run_coroutine_threadsafe(store.read_range_async("obj", 5, 70_005), loop).result(30)
        counts = proxy.counts()
    assert got == expected()
    assert got_async == OBJECT[5:70_005]
    assert counts["presigned"] == len(RANGES) + 1
    assert not caplog.records


def test_a_refused_url_is_signed_again_and_presigned_reads_go_on(seaweedfs, caplog):
    url = written(seaweedfs)
    with FaultProxy(upstream=seaweedfs.server.endpoint_url, refuse_presigned=1) as proxy, \
            open_store(url, seaweedfs.options_via(proxy.endpoint_url)) as store, \
            caplog.at_level(logging.WARNING, logger="zephon_stream.storage"):  # fmt: skip
        got = read_all(store)
        counts, stats = proxy.counts(), store.stats()
    assert got == expected()
    assert counts["presigned_refused"] == 1
    assert counts["presigned"] == len(RANGES) + 1  # NOTE: every read presigned, the first twice
    assert stats["retries"] == 0 and stats["errors"] == 0
    assert not caplog.records


def test_a_store_that_refuses_presigned_urls_is_read_through_s3fs(seaweedfs, caplog):
    url = written(seaweedfs)
    secret = seaweedfs.storage_options["secret"]
    with FaultProxy(upstream=seaweedfs.server.endpoint_url, refuse_presigned=10**9) as proxy, \
            open_store(url, seaweedfs.options_via(proxy.endpoint_url)) as store, \
            caplog.at_level(logging.WARNING, logger="zephon_stream.storage"):  # fmt: skip
        got = read_all(store)
        counts = proxy.counts()
    assert got == expected()
    # NOTE: the first read tried a URL and a fresh one, then s3fs; the rest went to s3fs only.
    assert counts["presigned"] == 2
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "reading through s3fs" in warnings[0], warnings
    assert secret not in warnings[0] and "Signature" not in warnings[0]


def test_a_missing_object_is_named_without_the_signed_url(seaweedfs):
    url = written(seaweedfs)
    with open_store(url, seaweedfs.storage_options) as store:
        with pytest.raises(ObjectMissingError) as info:
            store.read_range("absent", 0, 10)
    text = str(info.value)
    assert f"{url}/absent" in text
    assert "Signature" not in text and "X-Amz" not in text and seaweedfs.storage_options["key"] not in text


def test_presigned_reads_can_be_turned_off(seaweedfs):
    url = written(seaweedfs)
    options = {**seaweedfs.storage_options, "zephon_presigned_reads": False}
    with FaultProxy(upstream=seaweedfs.server.endpoint_url) as proxy, \
            open_store(url, {**options, "endpoint_url": proxy.endpoint_url}) as store:  # fmt: skip
        got = read_all(store)
        counts = proxy.counts()
    assert got == expected()
    assert counts["presigned"] == 0
