"""Reads as coroutines on the store's event loop (what the loader's fetches
use on S3): the same bytes, checks, retry bounds and counters as the blocking
``read_range``, against a real S3 server behind the fault proxy."""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time

import pytest

from zephon_stream.errors import ObjectMissingError, StorageError, TruncatedObjectError
from zephon_stream.storage import RetryPolicy, open_store

# Per-attempt timeouts far above any delay the proxy injects (0.2 s):
# a client timeout fired by a busy machine rather than by a fault is a retry
# the proxy never caused, and the counts below are compared exactly.
FAST_RETRY = RetryPolicy(
    max_attempts=30, initial_backoff_s=0.005, max_backoff_s=0.05, timeout_s=120, connect_timeout_s=60, read_timeout_s=60
)
MIXED_20 = {"error_500": 0.05, "error_503": 0.05, "reset": 0.04, "truncate": 0.04, "stall": 0.01, "slow_body": 0.01}
# The kinds a client sees fail; stalls and slow bodies only delay.
FAILING = ("error_500", "error_503", "reset", "truncate")


def run_on_loop(store, coroutine, timeout_s=60):
    return asyncio.run_coroutine_threadsafe(coroutine, store.event_loop()).result(timeout=timeout_s)


async def read_all(store, path, size, chunk):
    parts = await asyncio.gather(
        *(store.read_range_async(path, i, min(i + chunk, size)) for i in range(0, size, chunk))
    )
    return b"".join(parts)


def test_local_store_has_no_event_loop(tmp_path):
    with open_store(str(tmp_path)) as store:
        assert store.event_loop() is None


def test_concurrent_async_reads_survive_20_percent_faults_with_identical_bytes_and_count_each_retry(
    s3_bucket, fault_proxy, blob
):
    proxy = fault_proxy(rates=MIXED_20, seed=3, stall_s=0.2, slow_body_s=0.05)
    with open_store(s3_bucket.url("data"), s3_bucket.options_via(proxy.endpoint_url), retry=FAST_RETRY) as store:
        assert store.event_loop() is not None
        got = run_on_loop(store, read_all(store, "blob.bin", len(blob), 32768))
        stats = store.stats()
    assert hashlib.sha256(got).digest() == hashlib.sha256(blob).digest()
    failed = proxy.failed(FAILING)
    assert failed > 0
    # Every failed request is tried again once and counted once, however
    # many reads wait on the loop at once; and every request beyond the reads
    # is one of those retries.
    assert stats["retries"] == failed
    assert proxy.counts()["requests"] == len(blob) // 32768 + failed
    assert stats["errors"] == 0 and stats["reads"] == len(blob) // 32768


def test_async_exhaustion_names_object_range_and_last_error(s3_bucket, fault_proxy, blob):
    proxy = fault_proxy(rates={"error_503": 1.0}, seed=0)
    policy = RetryPolicy(max_attempts=3, initial_backoff_s=0.01, max_backoff_s=0.02)
    with open_store(s3_bucket.url("data"), s3_bucket.options_via(proxy.endpoint_url), retry=policy) as store:
        with pytest.raises(StorageError) as info:
            run_on_loop(store, store.read_range_async("blob.bin", 1000, 2000))
        stats = store.stats()
    message = str(info.value)
    assert "blob.bin" in message and "bytes [1000, 2000)" in message
    assert "3 attempts" in message and "ServiceUnavailable" in message
    assert stats["retries"] == 2 and stats["errors"] == 1


def test_async_missing_object_is_not_retried(s3_bucket, fault_proxy):
    proxy = fault_proxy()
    with open_store(s3_bucket.url("data"), s3_bucket.options_via(proxy.endpoint_url), retry=FAST_RETRY) as store:
        with pytest.raises(ObjectMissingError, match="nothing-here"):
            run_on_loop(store, store.read_range_async("nothing-here", 0, 10))
        assert store.stats()["retries"] == 0
    assert proxy.counts()["requests"] == 1


def test_async_range_past_the_end_is_a_truncation_naming_the_object(s3_bucket, blob):
    with open_store(s3_bucket.url("data"), s3_bucket.storage_options, retry=FAST_RETRY) as store:
        with pytest.raises(TruncatedObjectError, match=r"blob\.bin bytes \[2097142, 2097162\).*got 2097152"):
            run_on_loop(store, store.read_range_async("blob.bin", len(blob) - 10, len(blob) + 10))
        assert store.stats()["retries"] == 0


@pytest.mark.parametrize("path", ["thread", "event loop"])
def test_close_cuts_short_a_read_waiting_to_retry(s3_bucket, fault_proxy, blob, path):
    proxy = fault_proxy()
    policy = RetryPolicy(max_attempts=50, initial_backoff_s=0.5, max_backoff_s=2.0, timeout_s=120)
    store = open_store(s3_bucket.url("data"), s3_bucket.options_via(proxy.endpoint_url), retry=policy)

    def read() -> bytes:
        if path == "thread":
            return store.read_range("blob.bin", 0, 4)
        return run_on_loop(store, store.read_range_async("blob.bin", 0, 4))

    assert read() == blob[:4]
    proxy.stop()  # the endpoint is gone for good
    outcome: list[BaseException] = []

    def reader() -> None:
        try:
            read()
        except BaseException as exc:  # noqa: BLE001 - checked below
            outcome.append(exc)

    thread = threading.Thread(target=reader)
    thread.start()
    time.sleep(1.0)
    closed_at = time.monotonic()
    store.close()
    thread.join(timeout=30)
    # Uncut, the read would go on retrying for the policy's 120 s; the
    # bound is loose enough for a busy machine and still far below that.
    assert not thread.is_alive() and time.monotonic() - closed_at < 20.0
    assert isinstance(outcome[0], StorageError) and "closed" in str(outcome[0]) and "blob.bin" in str(outcome[0])
    proxy.start()
    assert read() == blob[:4]  # a closed store can still be used again
    store.close()


@pytest.mark.parametrize(
    "value",
    [
        "Tue, 01 Dec 2026 10:00:00 GMT",
        "2026-12-01T10:00:00.000Z",
        "2026-12-01T10:00:00Z",
        "2026-12-01T10:00:00",
        "1700000000",
        1700000000,
        "2026-12-01T10:00:00+02:00",
    ],
)
def test_s3_timestamps_parse_as_botocore_parses_them(value) -> None:
    from botocore.utils import parse_timestamp as botocore_parse_timestamp

    from zephon_stream.storage.aio_session import parse_timestamp

    assert parse_timestamp(value) == botocore_parse_timestamp(value)
    assert (parse_timestamp(value).tzinfo is None) == (botocore_parse_timestamp(value).tzinfo is None)
