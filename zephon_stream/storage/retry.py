"""Retries with exponential backoff and jitter: the one retry layer that counts.

Transient failures (``classify.py``: timeouts, 5xx, 408 and 429 answers,
throttling codes, connection resets and refusals, bodies cut short in transit)
are retried within a bounded number of attempts and a bounded total time. A
missing object is reported at once. Any other failure (access denied, bad
credentials, a bad request) is not retried. The clients are configured
(``fsspec_store``, ``cloud_clients``) to make a single attempt each, so a dead
endpoint fails within ``RetryPolicy`` bounds instead of hanging for minutes,
and every retry is counted here.

Throttling (the store asking for fewer requests) is retried apart, without a
bound on attempts, until a deadline of its own that is long enough for a large
job's start. By default a throttled operation waits for its turn from the
store's request-rate limiter (``limiter.py``, its rate ``request_rate.py``;
shared by the ranks of a node through the node cache), which every attempt of the
store's operations waits on while it is on; with
``RetryPolicy(throttle_limiter=False)`` it sleeps a full-jitter exponential
backoff whose window also grows with the store's operations throttled at once
(``throttle.py``) instead.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypedDict, TypeVar

from zephon_stream.errors import ObjectMissingError, StorageError, ZephonError
from zephon_stream.storage.classify import (
    HttpStatusError,
    ShortReadError,
    describe_error,
    http_status,
    is_missing,
    is_throttled,
    is_transient,
)
from zephon_stream.storage.hints import credentials_hint
from zephon_stream.storage.limiter import Limiter
from zephon_stream.storage.request_rate import Ticket
from zephon_stream.storage.retry_policy import RetryPolicy
from zephon_stream.storage.throttle import StoreThrottle

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = [
    "HttpStatusError",
    "RetryOptions",
    "RetryPolicy",
    "ShortReadError",
    "call_with_retry",
    "call_with_retry_async",
    "describe_error",
    "http_status",
    "is_missing",
    "is_throttled",
    "is_transient",
]

logger = logging.getLogger("zephon_stream.storage")

T = TypeVar("T")

# A waiting operation looks again at least this often: whether a rate
# that grew meanwhile (another process's cut or probe) serves it at its new
# turn, and (on the event loop) whether its store was closed.
POLL_S = 0.05


_ADVICE = (
    "The store limits its request rate (S3 per key prefix, GCS per bucket, Azure per account): start fewer ranks "
    "at once, ask the provider for a higher limit, let the ranks of a node share one read of the dataset's "
    "metadata (node-local metadata sharing), or allow longer with RetryPolicy(throttle_timeout_s=...)"
)


class _Needed(TypedDict):
    policy: RetryPolicy
    what: str
    scrub: Callable[[str], str]


class RetryOptions(_Needed, total=False):
    """What an operation hands the retry layer besides its attempt (:func:`call_with_retry` says what each is)."""

    on_retry: Callable[[Exception], None]
    on_throttled: Callable[[Exception, bool], None]
    on_waited: Callable[[float], None]
    throttle: StoreThrottle | None
    limiter: Limiter | None
    stop: threading.Event | None


class _Attempts:
    """One operation's attempts: decides every step of the loop that the two drivers run.

    A driver asks :meth:`wait_s` how long to sleep before its next attempt (0:
    make it now), sleeps that long or until ``stop`` is set, and asks again;
    it hands each failure to :meth:`failed`, which raises when the failure
    ends the operation. A ``with`` block holds the loop.

    Every time reading comes from one clock: the limiter's
    (``Limiter(clock=...)``), or ``time.monotonic`` where the operation waits
    on none. ``stop`` is looked at after every sleep and before every attempt
    that follows a sleep or a failure: an attempt that needs no wait goes.
    """

    def __init__(
        self,
        *,
        policy: RetryPolicy,
        what: str,
        scrub: Callable[[str], str],
        on_retry: Callable[[Exception], None] = lambda exc: None,
        on_throttled: Callable[[Exception, bool], None] = lambda exc, starts: None,
        on_waited: Callable[[float], None] = lambda seconds: None,
        throttle: StoreThrottle | None = None,
        limiter: Limiter | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        self._policy = policy
        self._what = what
        self._scrub = scrub
        self._on_retry = on_retry
        self._on_throttled = on_throttled
        self._on_waited = on_waited
        # Without a store's, an operation is the only one it counts.
        self._throttle = throttle if throttle is not None else StoreThrottle()
        self._limiter = limiter if policy.throttle_limiter else None
        self._stop = stop
        self._clock = self._limiter.now if self._limiter is not None else time.monotonic
        self._started = self._clock()
        self._count = 0
        self._failures = 0
        self._throttled_count = 0
        self._detail = ""
        self._throttled_since: float | None = None
        # The backoff in progress ends at this time (None: none).
        self._retry_at: float | None = None
        self._waiting_out = False
        # The next attempt's ticket is taken once the backoff is over.
        self._needs_ticket = True
        self._ticket: Ticket | None = None
        self._wait_started: float | None = None
        # When the attempt in flight got its turn; -inf: it went without
        # a ticket (the limiter was off), so its throttling answer cuts nothing.
        self._sent_at = float("-inf")
        self._looks_at_stop = False

    def wait_s(self) -> float:
        """Seconds to sleep before asking again; 0: make the next attempt now (it is counted here).

        Raises:
            StorageError: ``stop`` is set after a sleep or a failure (the store
                was closed), or a wait for a turn would end past the throttle
                deadline.
        """
        self._look_at_stop()
        if self._retry_at is not None:
            left_s = self._retry_at - self._clock()
            if left_s > 0.0:
                self._looks_at_stop = True
                return left_s
            self._retry_at = None
            self._woke()
        if self._needs_ticket:
            self._needs_ticket = False
            self._ticket = self._limiter.ticket() if self._limiter is not None else None
            self._sent_at = float("-inf")
        if self._ticket is not None:
            sleep_s = self._turn_wait_s(self._ticket)
            if sleep_s > 0.0:
                self._looks_at_stop = True
                return sleep_s
        self._look_at_stop()
        self._looks_at_stop, self._needs_ticket, self._ticket = False, True, None
        self._count += 1
        return 0.0

    def failed(self, exc: Exception) -> None:
        """Take the failure of the attempt just made: a backoff before the next, or raise when it ends the operation.

        A ``ZephonError`` is the attempt's own verdict (a truncated object, say): it passes through unchanged.
        """
        if isinstance(exc, ZephonError):
            raise exc
        what = self._what
        detail = self._detail = self._scrub(describe_error(exc))
        if is_missing(exc):
            raise ObjectMissingError(f"{what}: object not found ({detail})") from None
        if not is_transient(exc):
            raise StorageError(f"{what}: failed, not retryable ({detail}){credentials_hint(exc)}") from None
        now = self._clock()
        elapsed = now - self._started
        sleep_s = self._throttled(exc, now, elapsed) if is_throttled(exc) else self._retried(exc, elapsed)
        self._retry_at = now + sleep_s
        self._looks_at_stop = True

    def __enter__(self) -> _Attempts:
        return self

    def __exit__(self, *exc_info: object) -> None:
        # However the loop ends (an answer, an error, a cancelled task),
        # a backoff still counted among the store's throttled operations is let go.
        self._woke()

    def _retried(self, exc: Exception, elapsed: float) -> float:
        self._failures += 1
        sleep_s = self._policy.backoff_s(self._failures - 1)
        limit_s = self._policy.timeout_s
        if self._throttled_count:
            limit_s = max(limit_s, self._policy.throttle_timeout_s)
        if self._failures >= self._policy.max_attempts or elapsed + sleep_s > limit_s:
            # No log line here: the error says the same, and a caller
            # that prints it would show the failure twice.
            raise StorageError(
                f"{self._what}: failed after {self._count} attempts in {elapsed:.1f}s (last error: {self._detail})"
            ) from None
        logger.info("%s: attempt %d failed (%s); retrying in %.2fs", self._what, self._count, self._detail, sleep_s)
        # After the attempt's own line, so that a warning it leads to
        # (the endpoint cannot be reached) reads as its consequence.
        self._on_retry(exc)
        return sleep_s

    def _throttled(self, exc: Exception, now: float, elapsed: float) -> float:
        self._throttled_count += 1
        if self._throttled_since is None:
            self._throttled_since = now
        waiting, starts = self._throttle.throttled()
        self._waiting_out = True
        # Counted before the deadline is looked at: every throttling
        # answer is one, the last one before giving up included.
        self._on_throttled(exc, starts)
        if self._limiter is not None:
            # No sleep of its own: the next attempt waits for its turn
            # from the limiter, which this answer has switched on or cut.
            self._limiter.throttled(self._sent_at)
            sleep_s = 0.0
        else:
            sleep_s = self._policy.throttle_backoff_s(self._throttled_count - 1, waiting)
        if elapsed + sleep_s > self._policy.throttle_timeout_s:
            raise self._gave_up(now, elapsed)
        logger.debug("%s: throttled (%s); retrying in %.2fs", self._what, self._detail, sleep_s)
        return sleep_s

    def _turn_wait_s(self, ticket: Ticket) -> float:
        """How long to sleep before looking again (at most ``POLL_S``); 0: the attempt goes now."""
        limiter = self._limiter
        assert limiter is not None
        wait_s = limiter.wait_s(ticket)
        now = self._clock()
        if wait_s <= 0.0:
            self._sent_at = now
            if self._wait_started is not None:
                self._on_waited(now - self._wait_started)
                self._wait_started = None
            return 0.0
        if self._wait_started is None:
            self._wait_started = now
        elapsed, sleep_s = now - self._started, min(wait_s, POLL_S)
        # The next look, not the whole estimated wait: the rate may grow meanwhile.
        if elapsed + sleep_s > self._policy.throttle_timeout_s:
            raise self._gave_up(now, elapsed)
        return sleep_s

    def _look_at_stop(self) -> None:
        if self._looks_at_stop and self._stop is not None and self._stop.is_set():
            raise StorageError(
                f"{self._what}: abandoned after {self._count} attempts, the store was closed "
                f"(last error: {self._detail})"
            )

    def _woke(self) -> None:
        """The backoff after a throttling answer is over (slept, cut short, or given up)."""
        if self._waiting_out:
            self._waiting_out = False
            self._throttle.woke()

    def _gave_up(self, now: float, elapsed: float) -> StorageError:
        since = now - (self._throttled_since if self._throttled_since is not None else self._started)
        return StorageError(
            f"{self._what}: throttled by the store for {since:.1f}s "
            f"({self._throttled_count} answers asking for fewer requests, {self._count} attempts in {elapsed:.1f}s; "
            f"last: {self._detail or 'none yet: waiting for a turn'}); gave up at RetryPolicy.throttle_timeout_s = "
            f"{self._policy.throttle_timeout_s:g}s. {_ADVICE}"
        )


def call_with_retry(attempt: Callable[[], T], **options: Unpack[RetryOptions]) -> T:
    """Run ``attempt`` until it succeeds, retrying transient failures.

    Args:
        attempt: one try of the operation.
        policy: attempt, backoff and time bounds.
        what: the operation and object, e.g. ``"read_range s3://b/x bytes [0, 10)"``,
            already free of secrets; it starts every error message.
        scrub: removes secrets from an error text before it is logged or raised.
        on_retry: called with the failure, once per retry of a transient
            failure other than throttling (stats, a warning).
        on_throttled: called with each throttling answer, retried or not, and
            whether throttling starts with it (``StoreThrottle.throttled``).
        on_waited: called with the seconds an attempt waited for its turn
            from ``limiter``, once per attempt that waited.
        throttle: what the store's operations share while throttled (None:
            this operation counts only itself).
        limiter: the store's request-rate limiter (None, or a policy with
            ``throttle_limiter=False``: each operation backs off on its own);
            its clock is the operation's.
        stop: when set, a backoff sleep or a wait for a turn ends at once and
            the operation fails (the store was closed while retrying); an
            attempt that needs no wait goes.

    Raises:
        ObjectMissingError: the object does not exist (never retried).
        StorageError: a non-transient failure, or transient ones past the bounds.
        ZephonError: raised by ``attempt`` itself, passed through unchanged.
    """
    stop = options.get("stop")
    with _Attempts(**options) as attempts:
        while True:
            while (wait_s := attempts.wait_s()) > 0.0:
                if stop is None:
                    time.sleep(wait_s)
                else:
                    stop.wait(wait_s)
            try:
                return attempt()
            except Exception as exc:  # noqa: BLE001 - classified by attempts.failed
                attempts.failed(exc)


async def call_with_retry_async(attempt: Callable[[], Awaitable[T]], **options: Unpack[RetryOptions]) -> T:
    """:func:`call_with_retry` for a coroutine: the same steps, bounds, errors and counting.

    Backoff sleeps and waits for a turn are on the event loop, so other
    requests on it go on meanwhile; ``stop`` is looked at every ``POLL_S`` of
    a sleep.
    """
    with _Attempts(**options) as attempts:
        while True:
            while (wait_s := attempts.wait_s()) > 0.0:
                await asyncio.sleep(min(wait_s, POLL_S))
            try:
                return await attempt()
            except Exception as exc:  # noqa: BLE001 - classified by attempts.failed
                attempts.failed(exc)
