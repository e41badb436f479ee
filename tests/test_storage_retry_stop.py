"""The retry layer's two drivers (blocking and on an event loop) take the same steps: a store closed while an
operation waits ends it at the same points in both, and one clock times all of an operation's waits."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import pytest

from zephon_stream.errors import StorageError
from zephon_stream.storage.classify import HttpStatusError
from zephon_stream.storage.limiter import Limiter, LocalRecord
from zephon_stream.storage.retry import RetryPolicy, call_with_retry, call_with_retry_async

# Backoffs of 2.5-5 s: a stop that did not cut one short shows as seconds.
SLOW_BACKOFF = RetryPolicy(max_attempts=5, initial_backoff_s=5.0, max_backoff_s=5.0, throttle_timeout_s=120)
READ_X = {"policy": SLOW_BACKOFF, "what": "read x", "scrub": str}


def run_blocking(attempt: Callable[[], str], **options) -> str:
    return call_with_retry(attempt, **options)


def run_on_a_loop(attempt: Callable[[], str], **options) -> str:
    async def attempt_async() -> str:
        return attempt()

    return asyncio.run(call_with_retry_async(attempt_async, **options))


DRIVERS = {"blocking": run_blocking, "event loop": run_on_a_loop}


def failing(made: list[int]) -> Callable[[], str]:
    def attempt() -> str:
        made.append(1)
        raise HttpStatusError(500, "InternalError", "injected")

    return attempt


def switched_on(limiter: Limiter, queued: int = 0) -> Limiter:
    """``limiter`` after a throttling answer, with ``queued`` requests ahead of the next one."""
    limiter.throttled(float("-inf"))
    for _ in range(queued):
        limiter.ticket()
    return limiter


def abandoned(driver, stop: threading.Event, **options) -> tuple[int, str]:
    """The attempts an operation that always fails made, and its error, when ``stop`` ends it."""
    made: list[int] = []
    with pytest.raises(StorageError) as caught:
        driver(failing(made), **READ_X, stop=stop, **options)
    return len(made), str(caught.value)


def stopped_during_a_backoff(driver) -> tuple[int, str]:
    stop = threading.Event()

    def on_retry(exc: Exception) -> None:
        threading.Timer(0.2, stop.set).start()

    return abandoned(driver, stop, on_retry=on_retry)


def stopped_before_a_backoff(driver) -> tuple[int, str]:
    stop = threading.Event()
    return abandoned(driver, stop, on_retry=lambda exc: stop.set())


def stopped_during_a_wait_for_a_turn(driver) -> tuple[int, str]:
    stop = threading.Event()
    # 700 requests ahead at 70 a second: a turn 10 s away.
    limiter = switched_on(Limiter(LocalRecord()), queued=700)
    threading.Timer(0.2, stop.set).start()
    return abandoned(driver, stop, limiter=limiter)


def stopped_as_the_turn_comes(driver) -> tuple[int, str]:
    stop = threading.Event()
    limiter = switched_on(Limiter(LocalRecord()), queued=1)
    return abandoned(driver, stop, limiter=limiter, on_waited=lambda seconds: stop.set())


def stopped_before_the_first_attempt(driver) -> tuple[int, str]:
    stop = threading.Event()
    stop.set()
    return abandoned(driver, stop)


@pytest.mark.parametrize(
    ("case", "attempts_made", "message"),
    [
        (stopped_during_a_backoff, 1, "read x: abandoned after 1 attempts, the store was closed (last error: "),
        (stopped_before_a_backoff, 1, "read x: abandoned after 1 attempts, the store was closed (last error: "),
        (stopped_during_a_wait_for_a_turn, 0, "read x: abandoned after 0 attempts, the store was closed"),
        (stopped_as_the_turn_comes, 0, "read x: abandoned after 0 attempts, the store was closed"),
        # An attempt that needs no wait goes; the stop ends the wait its failure leads to.
        (stopped_before_the_first_attempt, 1, "read x: abandoned after 1 attempts, the store was closed (last error: "),
    ],
    ids=lambda value: getattr(value, "__name__", None),
)
def test_a_closed_store_ends_an_operation_at_the_same_point_in_both_drivers(case, attempts_made, message):
    outcomes = {}
    for name, driver in DRIVERS.items():
        started = time.monotonic()
        made, text = case(driver)
        elapsed_s = time.monotonic() - started
        assert made == attempts_made and text.startswith(message), (name, made, text)
        # The waits cut short are 2.5 s and more; a stop is seen within a poll of the event loop.
        assert elapsed_s < 2.0, (name, elapsed_s)
        outcomes[name] = (made, text)
    assert outcomes["blocking"] == outcomes["event loop"]


class SteppingClock:
    """A clock of the test's own that moves one second at each reading."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


@pytest.mark.parametrize("driver", DRIVERS.values(), ids=DRIVERS.keys())
def test_the_limiters_clock_times_the_whole_operation(driver):
    limiter = switched_on(Limiter(LocalRecord(), clock=SteppingClock()))
    # A thousand attempts a millisecond apart fit in 5 s of this machine's clock, and only a few in 5 s of
    # the limiter's, which moves a second at each reading.
    policy = RetryPolicy(max_attempts=1000, initial_backoff_s=0.001, max_backoff_s=0.001, timeout_s=5.0)
    made: list[int] = []
    with pytest.raises(StorageError, match=r"read x: failed after \d+ attempts in \d+\.0s") as caught:
        driver(failing(made), policy=policy, what="read x", scrub=str, limiter=limiter)
    assert 1 <= len(made) < 5 and f"failed after {len(made)} attempts" in str(caught.value)
