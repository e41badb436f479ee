"""``stats()["retries"]`` counts each request a store answered with a transient
failure and tried again, exactly once: compared with what tools/fault_proxy.py
says it answered, on every real backend (SeaweedFS, fake-gcs-server, Azurite),
in the thread and the event-loop read paths, and through the loader while it
opens a dataset (its manifest) and while it streams, in both pipelines."""

from __future__ import annotations

import asyncio
import time

import pytest

from tools.fault_proxy import FaultProxy
from tools.reliability.common import step_hashes
from zephon_stream import StreamingLoader
from zephon_stream.storage import RetryPolicy, copy_dataset, open_store

# NOTE: per-attempt timeouts far above any delay here: on a busy machine a
# client timeout is a retry the proxy did not cause, and counts are compared exactly.
RETRY = RetryPolicy(max_attempts=30, initial_backoff_s=0.005, max_backoff_s=0.05, timeout_s=120,
                    connect_timeout_s=60, read_timeout_s=60, throttle_initial_backoff_s=0.005,
                    throttle_max_backoff_s=0.05)
OBJECT = bytes(range(256)) * 2048
RANGE_BYTES = 20_000
NUM_READS = 24
# NOTE: the failures a store's retry layer sees once each, per backend. A reset
# on a request s3fs or adlfs makes itself (outside range reads) may be sent
# again once inside aiohttp, unseen and so uncounted (docs/STORAGE.md); range
# reads on S3 and Azure go over this package's own HTTP session, and gcsfs's
# session is set up, so that it does not.
RANGE_FAULTS = {
    "seaweedfs": {"error_503": 0.06, "error_500": 0.06, "error_429": 0.06, "reset": 0.06, "truncate": 0.06},
    "gcs": {"error_503": 0.06, "error_500": 0.06, "error_429": 0.06, "reset": 0.06, "truncate": 0.06},
    "azure": {"error_503": 0.06, "error_500": 0.06, "error_429": 0.06, "reset": 0.06, "truncate": 0.06},
}
MANIFEST_FAULTS = {"error_503": 0.4, "error_500": 0.3}
SETTINGS = {"seq_len": 256, "local_batch_size": 12, "seed": 2}


def ranges() -> list[tuple[int, int]]:
    step = (len(OBJECT) - RANGE_BYTES) // NUM_READS
    return [(i * step, i * step + RANGE_BYTES) for i in range(NUM_READS)]


async def read_concurrently(store) -> list[bytes]:
    return list(await asyncio.gather(*(store.read_range_async("obj", start, end) for start, end in ranges())))


@pytest.mark.parametrize("path", ["thread", "event loop"])
def test_each_failed_range_read_is_one_counted_retry(object_store, path):
    url = object_store.url("counts")
    with open_store(url, object_store.storage_options) as store:
        store.write_atomic("obj", OBJECT)
    rates = RANGE_FAULTS[object_store.backend]
    with FaultProxy(upstream=object_store.server.endpoint_url, rates=rates, seed=7) as proxy, \
            open_store(url, object_store.options_via(proxy.endpoint_url), retry=RETRY) as store:  # fmt: skip
        if path == "thread":
            got = [store.read_range("obj", start, end) for start, end in ranges()]
        else:
            got = asyncio.run_coroutine_threadsafe(read_concurrently(store), store.event_loop()).result(timeout=300)
        stats = store.stats()
        failed = proxy.failed(tuple(rates))
    assert got == [OBJECT[start:end] for start, end in ranges()]
    assert failed > 0, "no fault was injected; the test proves nothing"
    # NOTE: the 429s are the store throttling, counted apart from the other retries.
    assert stats["throttled"] == proxy.counts()["error_429"], (stats, proxy.counts())
    assert stats["retries"] + stats["throttled"] == failed, (stats, proxy.counts())
    assert stats["errors"] == 0 and stats["reads"] == NUM_READS


@pytest.fixture
def remote_dataset(object_store, small_dataset):
    url = object_store.url("ds")
    copy_dataset(small_dataset.url, url, dst_options=object_store.storage_options)
    with StreamingLoader(small_dataset.url, **SETTINGS) as local:
        expected = step_hashes(local, 20)
    return url, expected


@pytest.mark.parametrize("pipeline", ["threads", "process"])
def test_retries_while_a_loader_opens_a_dataset_are_counted_once_each(object_store, remote_dataset, pipeline):
    url, expected = remote_dataset
    with FaultProxy(upstream=object_store.server.endpoint_url, rates=MANIFEST_FAULTS, seed=9,
                    fault_paths=("manifest",)) as proxy:  # fmt: skip
        options = object_store.options_via(proxy.endpoint_url)
        with StreamingLoader(url, storage_options=options, pipeline=pipeline, **SETTINGS) as loader:
            opened = loader.stats()["retries"]
            failed = proxy.failed(tuple(MANIFEST_FAULTS))
            got = step_hashes(loader, 20)
            streamed = loader.stats()["retries"]
        after = proxy.failed(tuple(MANIFEST_FAULTS))
    assert failed > 0, "no fault was injected on the manifest; the test proves nothing"
    assert opened == failed, (opened, proxy.counts())
    # NOTE: nothing reads the manifest again while streaming, and the blocks came without a fault.
    assert streamed == after == failed
    assert got == expected


def counted_when_settled(loader, proxy, kinds, *, deadline_s=120.0) -> tuple[int, int]:
    """``(retries + throttled, failed)`` once the loader has counted every failure the proxy answered.

    A failure the proxy has answered may not have reached its reader yet, and a
    helper process publishes its counters with its steps: the loader keeps
    stepping (faults off) until both agree or the deadline passes. It never
    counts more than the proxy answered.
    """
    proxy.set_rates({})
    deadline = time.monotonic() + deadline_s
    while True:
        stats = loader.stats()
        retries, failed = stats["retries"] + stats["throttled"], proxy.failed(kinds)
        assert retries <= failed, (retries, proxy.counts())
        if retries == failed or time.monotonic() > deadline:
            return retries, failed
        next(loader)


@pytest.mark.parametrize("pipeline", ["threads", "process"])
def test_retries_while_a_loader_streams_are_counted_once_each(object_store, remote_dataset, pipeline):
    url, expected = remote_dataset
    rates = RANGE_FAULTS[object_store.backend]
    with FaultProxy(upstream=object_store.server.endpoint_url, rates=rates, seed=4,
                    fault_paths=("shards/",)) as proxy:  # fmt: skip
        options = object_store.options_via(proxy.endpoint_url)
        with StreamingLoader(url, storage_options=options, pipeline=pipeline, **SETTINGS) as loader:
            got = step_hashes(loader, 20)
            retries, failed = counted_when_settled(loader, proxy, tuple(rates))
    assert got == expected
    assert failed > 0, "no fault was injected on a block; the test proves nothing"
    assert retries == failed, (retries, proxy.counts())


@pytest.mark.parametrize("operation", ["read", "read_range", "size", "read_range_async"])
def test_a_manifest_that_keeps_failing_reaches_the_store_once_per_counted_attempt(object_store, operation):
    """No client library retries on its own: with every manifest request answered 503, the
    server sees exactly ``max_attempts`` requests, ``max_attempts - 1`` counted retries and one
    error (gcsfs alone would make 6 attempts of each, the Azure SDK 10, botocore 5)."""
    import dataclasses

    from zephon_stream.errors import StorageError

    url = object_store.url("keeps-failing")
    with open_store(url, object_store.storage_options) as store:
        store.write_atomic("manifest", OBJECT)
    policy = dataclasses.replace(RETRY, max_attempts=4)
    with FaultProxy(upstream=object_store.server.endpoint_url, rates={"error_503": 1.0}, seed=3,
                    fault_paths=("manifest",)) as proxy, \
            open_store(url, object_store.options_via(proxy.endpoint_url), retry=policy) as store:  # fmt: skip
        calls = {
            "read": lambda: store.read("manifest"),
            "read_range": lambda: store.read_range("manifest", 10, 1000),
            "size": lambda: store.size("manifest"),
            "read_range_async": lambda: asyncio.run_coroutine_threadsafe(
                store.read_range_async("manifest", 10, 1000), store.event_loop()
            ).result(timeout=300),
        }
        with pytest.raises(StorageError, match="failed after 4 attempts"):
            calls[operation]()
        stats = store.stats()
        counts = proxy.counts()
    assert counts["error_503"] == counts["requests"] == 4, counts
    assert (stats["retries"], stats["throttled"], stats["errors"]) == (3, 0, 1), stats
