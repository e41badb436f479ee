"""A store that throttles: waited out (the store's request-rate limiter, or full-jitter backoff without it), counted
apart, said once, given up on after a deadline.

Real servers on loopback (SeaweedFS, fake-gcs-server, Azurite) behind
tools/fault_proxy.py's request-rate limit, which answers beyond its token
bucket as each store does (S3's 503 ``SlowDown``, GCS's 429
``rateLimitExceeded``, Azure's 503 ``ServerBusy``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import statistics
import time

import pytest

from fixtures_stores import new_bucket
from tools.fault_proxy import FaultProxy
from tools.reliability.common import step_hashes
from zephon_stream import StreamingLoader
from zephon_stream.errors import StorageError
from zephon_stream.storage import RetryPolicy, copy_dataset, open_store
from zephon_stream.storage.throttle import StoreThrottle

STYLE = {"seaweedfs": "s3", "gcs": "gcs", "azure": "azure"}
OBJECT = bytes(range(256)) * 512
NUM_READS = 30
# A short throttle base so that the tests wait seconds, not minutes; the
# per-attempt timeouts far above any wait, so that no retry but throttling's happens.
RETRY = RetryPolicy(
    max_attempts=30,
    timeout_s=120,
    connect_timeout_s=60,
    read_timeout_s=60,
    throttle_initial_backoff_s=0.05,
    throttle_max_backoff_s=2.0,
    throttle_timeout_s=120,
)
SETTINGS = {"seq_len": 256, "local_batch_size": 12, "seed": 2}


def ranges() -> list[tuple[int, int]]:
    step = len(OBJECT) // NUM_READS
    return [(i * step, i * step + 1000) for i in range(NUM_READS)]


async def read_concurrently(store) -> list[bytes]:
    return list(await asyncio.gather(*(store.read_range_async("obj", start, end) for start, end in ranges())))


def test_throttle_backoff_is_full_jitter_over_a_window_that_grows_and_is_capped():
    policy = RetryPolicy(throttle_initial_backoff_s=0.1, throttle_max_backoff_s=5.0)
    # After the 3rd throttling answer with 2 others waiting: window 0.1 * 2**2 * 3 = 1.2 s.
    draws = [policy.throttle_backoff_s(2, waiting=2) for _ in range(4000)]
    assert 0.0 <= min(draws) < 0.05 and 1.15 < max(draws) <= 1.2
    assert statistics.mean(draws) == pytest.approx(0.6, rel=0.05)
    capped = [policy.throttle_backoff_s(40, waiting=100) for _ in range(2000)]
    assert max(capped) <= 5.0 and statistics.mean(capped) == pytest.approx(2.5, rel=0.06)


def test_store_throttle_counts_who_waits_and_says_when_throttling_starts_again():
    now = [100.0]
    throttle = StoreThrottle(quiet_s=30.0, clock=lambda: now[0])
    assert throttle.throttled() == (0, True)
    assert throttle.throttled() == (1, False)
    throttle.woke()
    throttle.woke()
    assert throttle.waiting == 0
    now[0] += 29.0
    assert throttle.throttled() == (0, False)
    throttle.woke()
    now[0] += 31.0
    assert throttle.throttled() == (0, True), "throttling after a quiet spell is a new episode, warned about again"


@pytest.fixture
def stored(object_store):
    url = object_store.url("throttle")
    with open_store(url, object_store.storage_options) as store:
        store.write_atomic("obj", OBJECT)
    return object_store, url


def test_throttled_reads_are_waited_out_counted_apart_and_said_once_naming_the_store(stored, caplog):
    object_store, url = stored
    style = STYLE[object_store.backend]
    with (
        FaultProxy(upstream=object_store.server.endpoint_url, rate_limit=20, burst=4, throttle_style=style) as proxy,
        open_store(url, object_store.options_via(proxy.endpoint_url), retry=RETRY) as store,
    ):
        with caplog.at_level(logging.INFO, logger="zephon_stream.storage"):
            got = asyncio.run_coroutine_threadsafe(read_concurrently(store), store.event_loop()).result(timeout=300)
        stats = store.stats()
        counts = proxy.counts()
    assert got == [OBJECT[start:end] for start, end in ranges()]
    assert counts["throttled"] > 0, "the rate limit throttled nothing; the test proves nothing"
    assert stats["throttled"] == counts["throttled"], (stats, counts)
    assert stats["retries"] == 0 and stats["errors"] == 0 and stats["reads"] == NUM_READS, stats
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings
    assert url in warnings[0] and "throttling" in warnings[0], warnings[0]
    secrets = [str(v) for k, v in object_store.storage_options.items() if "secret" in k or "key" in k.lower()]
    assert not [s for s in secrets if len(s) > 6 and s in warnings[0]], "a secret reached the log"


@pytest.mark.parametrize("limiter", [True, False], ids=["limiter", "backoff"])
def test_many_readers_throttled_at_once_retry_at_a_rate_near_the_limit(seaweedfs_server, limiter):
    """No retry storm: 60 readers against 20 requests/s, waiting their turns from the store's limiter (or, without
    it, each retry's window grown with the readers waiting)."""
    env = new_bucket("seaweedfs", seaweedfs_server)
    url = env.url("storm")
    with open_store(url, env.storage_options) as store:
        store.write_atomic("obj", OBJECT)
    rate, readers = 20.0, 60
    policy = dataclasses.replace(RETRY, throttle_limiter=limiter)
    with (
        FaultProxy(upstream=seaweedfs_server.endpoint_url, rate_limit=rate, burst=1) as proxy,
        open_store(url, env.options_via(proxy.endpoint_url), retry=policy) as store,
    ):

        async def read_all():
            return await asyncio.gather(*(store.read_range_async("obj", i, i + 100) for i in range(readers)))

        started = time.monotonic()
        got = asyncio.run_coroutine_threadsafe(read_all(), store.event_loop()).result(timeout=300)
        elapsed = time.monotonic() - started
        stats, counts = store.stats(), proxy.counts()
    assert got == [OBJECT[i : i + 100] for i in range(readers)]
    served = counts["requests"] - counts["throttled"]
    assert served == readers and stats["throttled"] == counts["throttled"] > 0, (stats, counts)
    attempts_per_s = counts["requests"] / elapsed
    if limiter:
        # The floor is readers / rate = 3 s. The first burst (all 60 at
        # once, 59 throttled) is sent before anything is known; after it the
        # readers wait their turns, and the rate is cut from 70/s to the limit
        # in a few answers. Measured here: 129 requests in 3.8 s, 69 throttled,
        # 10 of them after the first burst: 18 requests/s after it.
        assert (counts["requests"] - readers) / elapsed < 1.2 * rate, (counts, elapsed)
        after_first_burst = counts["throttled"] - (readers - 1)
        assert 0 <= after_first_burst < served / 3 and stats["throttle_waits"] >= readers - 10, (stats, counts)
    else:
        # Measured here: each reader backing off on its own count alone
        # (windows 0.05, 0.1, 0.2 s, ...) sent 68 requests/s, 6.3 throttled for
        # each one served; with the window grown by the readers waiting, 34-38
        # requests/s, 2.5-2.8 throttled for each served, in 5.7-6.6 s.
        assert attempts_per_s < 3 * rate, (attempts_per_s, counts, elapsed)
        assert counts["throttled"] < 4 * served and stats["throttle_waits"] == 0, counts


def test_a_store_that_keeps_throttling_fails_after_its_deadline_naming_the_store_and_the_way_out(stored):
    object_store, url = stored
    policy = RetryPolicy(
        throttle_initial_backoff_s=0.05,
        throttle_max_backoff_s=0.3,
        throttle_timeout_s=2.0,
        connect_timeout_s=60,
        read_timeout_s=60,
    )
    # A burst under one token serves nothing: every request is throttled.
    with (
        FaultProxy(
            upstream=object_store.server.endpoint_url,
            rate_limit=0.0,
            burst=0.0,
            throttle_style=STYLE[object_store.backend],
        ) as proxy,
        open_store(url, object_store.options_via(proxy.endpoint_url), retry=policy) as store,
    ):
        started = time.monotonic()
        with pytest.raises(StorageError) as caught:
            store.read_range("obj", 0, 10)
        elapsed = time.monotonic() - started
        stats, counts = store.stats(), proxy.counts()
    message = str(caught.value)
    assert "obj" in message and "throttled by the store" in message and "throttle_timeout_s" in message, message
    assert 1.0 < elapsed < 2.0 + 30.0, elapsed
    assert stats["throttled"] == counts["throttled"] == counts["requests"] > 1, (stats, counts)
    assert stats["retries"] == 0


def test_a_loader_starting_against_a_throttling_store_is_exact_and_counts_every_throttled_answer(
    seaweedfs_server, small_dataset
):
    env = new_bucket("seaweedfs", seaweedfs_server)
    url = env.url("ds")
    copy_dataset(small_dataset.url, url, dst_options=env.storage_options)
    with StreamingLoader(small_dataset.url, **SETTINGS) as local:
        expected = step_hashes(local, 12)
    with FaultProxy(upstream=seaweedfs_server.endpoint_url, rate_limit=15, burst=2) as proxy:
        options = env.options_via(proxy.endpoint_url)
        with StreamingLoader(url, storage_options=options, pipeline="threads", **SETTINGS) as loader:
            got = step_hashes(loader, 12)
            proxy.set_rate_limit(None)
            # An answer the proxy sent may not have reached its reader
            # (a prefetch) yet: step on, unthrottled, until the counts settle.
            deadline = time.monotonic() + 60
            while (stats := loader.stats())["throttled"] < proxy.counts()["throttled"]:
                assert time.monotonic() < deadline, (stats, proxy.counts())
                next(loader)
        counts = proxy.counts()
    assert got == expected
    assert counts["throttled"] > 0, "the rate limit throttled nothing; the test proves nothing"
    assert stats["throttled"] == counts["throttled"] and stats["retries"] == 0, (stats, counts)
