"""Block reads over presigned URLs (storage/presigned.py) on S3 (SeaweedFS) and
Azure Blob (Azurite), through the fault proxy: the reads are plain GETs on
signed URLs, a refused URL is signed again, and a store that takes no
presigned URLs is read through its client library with the same bytes."""

from __future__ import annotations

import asyncio
import logging
import re

import pytest

from tools.fault_proxy import FaultProxy
from zephon_stream.errors import ObjectMissingError
from zephon_stream.storage import open_store

OBJECT = bytes(range(251)) * 4001
RANGES = [(i * 37_000, i * 37_000 + 20_000) for i in range(16)]
LIBRARY = {"seaweedfs": "s3fs", "azure": "adlfs"}
pytestmark = pytest.mark.parametrize("object_store", ["seaweedfs", "azure"], indirect=True)


def written(env) -> str:
    url = env.url("presigned")
    with open_store(url, env.storage_options) as store:
        store.write_atomic("obj", OBJECT)
    return url


def secrets_of(env) -> list[str]:
    options = env.storage_options
    if env.backend == "azure":
        return re.findall(r"AccountKey=([^;]+)", options["connection_string"])
    return [options["key"], options["secret"]]


def read_all(store) -> list[bytes]:
    return [store.read_range("obj", start, end) for start, end in RANGES]


def expected() -> list[bytes]:
    return [OBJECT[start:end] for start, end in RANGES]


def test_ranged_reads_are_gets_on_a_presigned_url(object_store, caplog):
    url = written(object_store)
    with (
        FaultProxy(upstream=object_store.server.endpoint_url) as proxy,
        open_store(url, object_store.options_via(proxy.endpoint_url)) as store,
        caplog.at_level(logging.WARNING, logger="zephon_stream.storage"),
    ):
        got = read_all(store)
        loop = store.event_loop()
        got_async = asyncio.run_coroutine_threadsafe(store.read_range_async("obj", 5, 70_005), loop).result(30)
        counts = proxy.counts()
    assert got == expected()
    assert got_async == OBJECT[5:70_005]
    assert counts["presigned"] == len(RANGES) + 1
    assert not caplog.records


def test_a_refused_url_is_signed_again_and_presigned_reads_go_on(object_store, caplog):
    url = written(object_store)
    with (
        FaultProxy(upstream=object_store.server.endpoint_url, refuse_presigned=1) as proxy,
        open_store(url, object_store.options_via(proxy.endpoint_url)) as store,
        caplog.at_level(logging.WARNING, logger="zephon_stream.storage"),
    ):
        got = read_all(store)
        counts, stats = proxy.counts(), store.stats()
    assert got == expected()
    assert counts["presigned_refused"] == 1
    assert counts["presigned"] == len(RANGES) + 1  # Every read presigned, the first twice
    assert stats["retries"] == 0 and stats["errors"] == 0
    assert not caplog.records


def test_a_store_that_refuses_presigned_urls_is_read_through_its_client_library(object_store, caplog):
    url = written(object_store)
    with (
        FaultProxy(upstream=object_store.server.endpoint_url, refuse_presigned=10**9) as proxy,
        open_store(url, object_store.options_via(proxy.endpoint_url)) as store,
        caplog.at_level(logging.WARNING, logger="zephon_stream.storage"),
    ):
        got = read_all(store)
        counts = proxy.counts()
    assert got == expected()
    # The first read tried a URL and a fresh one, then the library; the rest went to the library only.
    assert counts["presigned"] == 2
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and f"reading through {LIBRARY[object_store.backend]}" in warnings[0], warnings
    assert not any(secret in warnings[0] for secret in secrets_of(object_store))
    assert "Signature" not in warnings[0] and "sig=" not in warnings[0]


def test_a_missing_object_is_named_without_the_signed_url(object_store):
    url = written(object_store)
    with open_store(url, object_store.storage_options) as store:
        with pytest.raises(ObjectMissingError) as info:
            store.read_range("absent", 0, 10)
    text = str(info.value)
    assert f"{url}/absent" in text
    assert "Signature" not in text and "X-Amz" not in text and "sig=" not in text
    assert not any(secret in text for secret in secrets_of(object_store))


def test_presigned_reads_can_be_turned_off(object_store):
    url = written(object_store)
    with FaultProxy(upstream=object_store.server.endpoint_url) as proxy:
        options = {**object_store.options_via(proxy.endpoint_url), "zephon_presigned_reads": False}
        with open_store(url, options) as store:
            got = read_all(store)
        counts = proxy.counts()
    assert got == expected()
    assert counts["presigned"] == 0
