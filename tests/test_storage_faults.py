"""Retries against a real S3 server behind a fault-injecting proxy: transient
faults cost retries, never bytes; only exhaustion is an error, and it names
what failed."""

from __future__ import annotations

import hashlib
import os
import socket
import threading
import time

import pytest

from zephon_stream.errors import ObjectMissingError, StorageError
from zephon_stream.storage import RetryPolicy, expand_inputs, open_input, open_store

# Per-attempt timeouts far above any delay the proxy injects (0.2 s):
# a client timeout fired by a busy machine rather than by a fault is a retry
# the proxy never caused, and the counts below are compared exactly.
FAST_RETRY = RetryPolicy(
    max_attempts=30, initial_backoff_s=0.005, max_backoff_s=0.05, timeout_s=120, connect_timeout_s=60, read_timeout_s=60
)
MIXED_20 = {"error_500": 0.05, "error_503": 0.05, "reset": 0.04, "truncate": 0.04, "stall": 0.01, "slow_body": 0.01}
# The kinds a client sees fail; stalls and slow bodies only delay.
FAILING = ("error_500", "error_503", "reset", "truncate")


def test_reads_survive_20_percent_faults_with_identical_bytes_and_count_each_retry(s3_bucket, fault_proxy, blob):
    proxy = fault_proxy(rates=MIXED_20, seed=3, stall_s=0.2, slow_body_s=0.05)
    with open_store(s3_bucket.url("data"), s3_bucket.options_via(proxy.endpoint_url), retry=FAST_RETRY) as store:
        chunk = 32768
        got = b"".join(store.read_range("blob.bin", i, i + chunk) for i in range(0, len(blob), chunk))
        stats = store.stats()
    assert hashlib.sha256(got).digest() == hashlib.sha256(blob).digest()
    failed = proxy.failed(FAILING)
    assert failed > 0
    # Each 5xx, reset or cut body costs exactly one counted retry.
    assert stats["retries"] == failed
    assert proxy.counts()["requests"] == len(blob) // chunk + failed
    assert stats["errors"] == 0 and stats["reads"] == len(blob) // chunk


def test_writes_survive_20_percent_faults(s3_bucket, fault_proxy):
    proxy = fault_proxy(rates=MIXED_20, seed=11, stall_s=0.2, slow_body_s=0.05)
    payloads = {f"shards/{i:08d}.zst": os.urandom(50_000 + i) for i in range(12)}
    with open_store(s3_bucket.url("out"), s3_bucket.options_via(proxy.endpoint_url), retry=FAST_RETRY) as store:
        for name, data in payloads.items():
            store.write_atomic(name, data)
        assert store.list("shards/") == sorted(payloads)
    with open_store(s3_bucket.url("out"), s3_bucket.storage_options) as clean:
        assert {name: clean.read(name) for name in payloads} == payloads
    assert sum(v for k, v in proxy.counts().items() if k != "requests") > 0


def test_streaming_input_survives_faults(s3_bucket, fault_proxy, blob):
    proxy = fault_proxy(rates={"reset": 0.1, "truncate": 0.1, "error_503": 0.1}, seed=5)
    with open_input(s3_bucket.url("data/blob.bin"), s3_bucket.options_via(proxy.endpoint_url), retry=FAST_RETRY) as f:
        parts = []
        while piece := f.read(300_001):
            parts.append(piece)
    assert b"".join(parts) == blob


def test_exhaustion_names_object_range_and_last_error(s3_bucket, fault_proxy, blob):
    proxy = fault_proxy(rates={"error_503": 1.0}, seed=0)
    policy = RetryPolicy(max_attempts=3, initial_backoff_s=0.01, max_backoff_s=0.02)
    with open_store(s3_bucket.url("data"), s3_bucket.options_via(proxy.endpoint_url), retry=policy) as store:
        with pytest.raises(StorageError) as info:
            store.read_range("blob.bin", 1000, 2000)
        stats = store.stats()
    message = str(info.value)
    assert "blob.bin" in message and "bytes [1000, 2000)" in message
    assert "3 attempts" in message and "ServiceUnavailable" in message
    assert stats["retries"] == 2 and stats["errors"] == 1


def test_total_time_bound_stops_retrying(s3_bucket, fault_proxy, blob):
    proxy = fault_proxy(rates={"error_500": 1.0}, seed=0)
    policy = RetryPolicy(max_attempts=1000, initial_backoff_s=0.1, max_backoff_s=0.2, timeout_s=1.0)
    with open_store(s3_bucket.url("data"), s3_bucket.options_via(proxy.endpoint_url), retry=policy) as store:
        started = time.monotonic()
        with pytest.raises(StorageError, match="blob.bin"):
            store.read("blob.bin")
        # 1000 attempts would take minutes; the bound leaves a busy machine room.
        assert time.monotonic() - started < 30.0


def test_dead_endpoint_fails_fast_instead_of_hanging(s3_bucket):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    policy = RetryPolicy(max_attempts=3, initial_backoff_s=0.05, max_backoff_s=0.1, connect_timeout_s=1.0)
    with open_store(s3_bucket.url("data"), s3_bucket.options_via(dead), retry=policy) as store:
        started = time.monotonic()
        with pytest.raises(StorageError, match="3 attempts"):
            store.read_range("blob.bin", 0, 10)
        # botocore's own retries and timeouts would take minutes here.
        assert time.monotonic() - started < 30.0


def test_read_timeout_turns_a_stall_into_a_retry(s3_bucket, fault_proxy, blob):
    proxy = fault_proxy(rates={"stall": 0.5}, seed=2, stall_s=3.0)
    # Attempts to spare: on a busy machine an unstalled answer may also take over 0.5 s.
    policy = RetryPolicy(max_attempts=40, initial_backoff_s=0.01, max_backoff_s=0.02, read_timeout_s=0.5)
    with open_store(s3_bucket.url("data"), s3_bucket.options_via(proxy.endpoint_url), retry=policy) as store:
        for i in range(4):
            assert store.read_range("blob.bin", i * 100, i * 100 + 100) == blob[i * 100 : i * 100 + 100]
        assert store.stats()["retries"] >= 1
    assert proxy.counts()["stall"] >= 1


def test_endpoint_dropping_out_for_two_seconds_is_survived(s3_bucket, fault_proxy, blob):
    proxy = fault_proxy()
    policy = RetryPolicy(max_attempts=20, initial_backoff_s=0.05, max_backoff_s=0.5, timeout_s=30)
    with open_store(s3_bucket.url("data"), s3_bucket.options_via(proxy.endpoint_url), retry=policy) as store:
        assert store.read_range("blob.bin", 0, 10) == blob[:10]
        port = proxy.port
        outage = threading.Thread(target=proxy.outage, args=(2.0,))
        outage.start()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # wait until the endpoint really refuses
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                time.sleep(0.02)
            except ConnectionError:  # refused, or reset while the listener closed
                break
        started = time.monotonic()
        chunk = 65536
        got = b"".join(store.read_range("blob.bin", i, i + chunk) for i in range(0, 8 * chunk, chunk))
        outage.join()
        assert got == blob[: 8 * chunk]
        assert time.monotonic() - started >= 1.0  # the first read really waited for the endpoint
        assert store.stats()["retries"] >= 1 and store.stats()["errors"] == 0
    assert proxy.port == port


def test_missing_object_is_not_retried(s3_bucket, fault_proxy):
    proxy = fault_proxy()
    with open_store(s3_bucket.url("data"), s3_bucket.options_via(proxy.endpoint_url), retry=FAST_RETRY) as store:
        with pytest.raises(ObjectMissingError, match="nothing-here"):
            store.read_range("nothing-here", 0, 10)
        assert store.stats()["retries"] == 0
    assert proxy.counts()["requests"] == 1


def test_access_errors_are_not_retried(s3_bucket):
    with open_store("s3://no-such-bucket-zs/x", s3_bucket.storage_options, retry=FAST_RETRY) as store:
        with pytest.raises(FileNotFoundError):
            store.read("a")
        assert store.stats()["retries"] == 0


def test_expanding_s3_inputs_survives_faults(s3_bucket, fault_proxy):
    with open_store(s3_bucket.url("raw"), s3_bucket.storage_options) as store:
        for i in range(5):
            store.write_atomic(f"part-{i}.jsonl", b"{}")
    url = s3_bucket.url("raw")
    expected = [f"{url}/part-{i}.jsonl" for i in range(5)]
    proxy = fault_proxy(rates={"error_500": 0.1, "error_503": 0.1}, seed=9)
    options = s3_bucket.options_via(proxy.endpoint_url)
    for _ in range(4):
        assert expand_inputs([f"{url}/*.jsonl"], options, retry=FAST_RETRY) == expected
        got = expand_inputs([f"{url}/part-3.jsonl", url], options, retry=FAST_RETRY)
        assert got == [expected[3], *expected[:3], expected[4]]  # listed once, where first matched
    assert proxy.counts()["error_500"] + proxy.counts()["error_503"] > 0
