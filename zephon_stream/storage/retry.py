"""Retries with exponential backoff and jitter: the one retry layer that counts.

Transient failures (timeouts, 5xx, 408 and 429 answers, throttling codes,
connection resets and refusals, bodies cut short in transit) are retried within
a bounded number of attempts and a bounded total time. They are recognised in
the errors of each client: botocore (S3), gcsfs (GCS), azure-core (Azure Blob),
aiohttp and requests. A missing object is reported at once. Any other failure
(access denied, bad credentials, a bad request) is not retried. The clients are
configured (``fsspec_store``, ``cloud_clients``) to make a single attempt each,
so a dead endpoint fails within ``RetryPolicy`` bounds instead of hanging for
minutes, and every retry is counted here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import functools
import logging
import random
import socket
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from zephon_stream.errors import ConfigError, ObjectMissingError, StorageError, ZephonError
from zephon_stream.storage.hints import credentials_hint, error_chain

logger = logging.getLogger("zephon_stream.storage")

T = TypeVar("T")

# NOTE: how often an async backoff sleep looks whether its store was closed.
_STOP_POLL_S = 0.05

_TRANSIENT_CODES = frozenset(
    {
        "InternalError",
        "ServiceUnavailable",
        "SlowDown",
        "RequestTimeout",
        "RequestTimeoutException",
        "Throttling",
        "ThrottlingException",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "BadGateway",
        "GatewayTimeout",
        "ServerBusy",
        "OperationTimedOut",
    }
)
_TRANSIENT_ERRNOS = frozenset(
    {
        errno.ECONNRESET,
        errno.ECONNREFUSED,
        errno.ECONNABORTED,
        errno.EPIPE,
        errno.ETIMEDOUT,
        errno.EHOSTUNREACH,
        errno.ENETUNREACH,
        errno.ENETDOWN,
    }
)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class RetryPolicy:
    """How hard a store tries before a storage operation fails.

    Attributes:
        max_attempts: attempts per operation, the first one included.
        initial_backoff_s: sleep before the first retry; doubles each retry.
        max_backoff_s: cap on one sleep.
        timeout_s: cap on the whole operation, sleeps included; no retry
            starts once it would end past this.
        connect_timeout_s: per-attempt connect timeout (network backends).
        read_timeout_s: per-attempt timeout waiting for response bytes.
    """

    max_attempts: int = 10
    initial_backoff_s: float = 0.1
    max_backoff_s: float = 4.0
    timeout_s: float = 120.0
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigError(f"RetryPolicy.max_attempts must be >= 1 (got {self.max_attempts})")
        for name in ("initial_backoff_s", "max_backoff_s", "timeout_s", "connect_timeout_s", "read_timeout_s"):
            value = getattr(self, name)
            if not value >= 0:
                raise ConfigError(f"RetryPolicy.{name} must be >= 0 (got {value})")

    def backoff_s(self, retry_index: int) -> float:
        """Sleep before retry number ``retry_index`` (0-based), with jitter in [50%, 100%]."""
        base = min(self.max_backoff_s, self.initial_backoff_s * (2.0**retry_index))
        return base * random.uniform(0.5, 1.0)


class ShortReadError(ConnectionError):
    """A body that ended before the requested range did, on an object long enough.

    It subclasses ``ConnectionError`` because it is the same failure as a reset
    mid-body: the bytes exist, the transfer lost them.
    """


class HttpStatusError(Exception):
    """An HTTP answer other than the data, from a client of this package's own (no library's error to carry it)."""

    def __init__(self, status: int, code: str | None, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


@functools.cache
def _transient_types() -> tuple[type[BaseException], ...]:
    types: list[type[BaseException]] = [TimeoutError, asyncio.TimeoutError, socket.timeout, ConnectionError]
    try:
        from botocore import exceptions as bexc
        from botocore.parsers import ResponseParserError

        names = (
            "ConnectionError",
            "HTTPClientError",
            "ReadTimeoutError",
            "ConnectTimeoutError",
            "IncompleteReadError",
            "ResponseStreamingError",
        )
        types += [getattr(bexc, name) for name in names if hasattr(bexc, name)]
        types.append(ResponseParserError)
    except ImportError:
        pass
    try:
        import aiohttp

        types += [aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, aiohttp.ServerTimeoutError]
    except ImportError:
        pass
    try:
        from fsspec.exceptions import FSTimeoutError

        types.append(FSTimeoutError)
    except ImportError:
        pass
    return tuple(types)


# NOTE: looked up in sys.modules rather than imported: a library that was never
# imported raised nothing, and importing gcsfs or azure here would cost every
# process that only reads local files.
_LIBRARY_TRANSIENT_NAMES = {
    "requests.exceptions": ("ConnectionError", "ChunkedEncodingError", "Timeout", "ContentDecodingError"),
    "azure.core.exceptions": (
        "ServiceRequestError",
        "ServiceResponseError",
        "IncompleteReadError",
    ),
}


def _library_transient_types() -> tuple[type[BaseException], ...]:
    types: list[type[BaseException]] = []
    for module_name, names in _LIBRARY_TRANSIENT_NAMES.items():
        module = sys.modules.get(module_name)
        if module is not None:
            types += [getattr(module, name) for name in names if hasattr(module, name)]
    return tuple(types)


def _from_library(exc: BaseException, prefix: str) -> bool:
    return any(cls.__module__.startswith(prefix) for cls in type(exc).__mro__)


def http_status(exc: BaseException) -> tuple[int | None, str | None]:
    """The HTTP status and error code an exception carries, if its client says.

    botocore puts them in ``response``, azure-core in ``status_code`` and
    ``error_code``, gcsfs's ``HttpError`` in ``code``, aiohttp in ``status``.
    """
    if isinstance(exc, HttpStatusError):
        return exc.status, exc.code
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return (int(status) if status else None), response.get("Error", {}).get("Code")
    if _from_library(exc, "azure."):
        status = getattr(exc, "status_code", None)
        return (status if isinstance(status, int) else None), getattr(exc, "error_code", None)
    if _from_library(exc, "gcsfs"):
        code = getattr(exc, "code", None)
        if isinstance(code, int) or (isinstance(code, str) and code.isdigit()):
            return int(code), None
        return None, None
    if _from_library(exc, "aiohttp"):
        status = getattr(exc, "status", None)
        return (status if isinstance(status, int) and status else None), None
    return None, None


def _is_transient_status(status: int | None, code: str | None) -> bool:
    if code in _TRANSIENT_CODES:
        return True
    return status is not None and (status >= 500 or status in (408, 429))


def is_missing(exc: BaseException) -> bool:
    """Whether ``exc`` says the object does not exist."""
    return isinstance(exc, FileNotFoundError)


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it was raised from) is worth retrying."""
    transient_types = _transient_types() + _library_transient_types()
    for item in error_chain(exc):
        if isinstance(item, FileNotFoundError):
            return False
        if isinstance(item, transient_types):
            return True
        if _is_transient_status(*http_status(item)):
            return True
        if isinstance(item, OSError) and item.errno in _TRANSIENT_ERRNOS:
            return True
    return False


def describe_error(exc: BaseException) -> str:
    """``Type: message``, plus the HTTP status and error code when the client reports them."""
    text = f"{type(exc).__name__}: {exc}"
    for item in error_chain(exc):
        status, code = http_status(item)
        if status or code:
            return f"{text} [HTTP {status} {code}]" if code else f"{text} [HTTP {status}]"
    return text


class _Attempts:
    """One operation's attempts: decides, after each failure, to raise or how long to wait."""

    def __init__(self, *, policy: RetryPolicy, what: str, scrub: Callable[[str], str]) -> None:
        self._policy = policy
        self._what = what
        self._scrub = scrub
        self._started = time.monotonic()
        self.count = 0
        self.detail = ""

    def failed(self, exc: Exception) -> float:
        """The sleep before the next attempt; raises when ``exc`` ends the operation."""
        what = self._what
        detail = self.detail = self._scrub(describe_error(exc))
        if is_missing(exc):
            raise ObjectMissingError(f"{what}: object not found ({detail})") from None
        if not is_transient(exc):
            raise StorageError(f"{what}: failed, not retryable ({detail}){credentials_hint(exc)}") from None
        elapsed = time.monotonic() - self._started
        sleep_s = self._policy.backoff_s(self.count - 1)
        if self.count >= self._policy.max_attempts or elapsed + sleep_s > self._policy.timeout_s:
            # NOTE: no log line here: the error says the same, and a caller
            # that prints it would show the failure twice.
            raise StorageError(
                f"{what}: failed after {self.count} attempts in {elapsed:.1f}s (last error: {detail})"
            ) from None
        logger.info("%s: attempt %d failed (%s); retrying in %.2fs", what, self.count, detail, sleep_s)
        return sleep_s

    def abandoned(self) -> StorageError:
        return StorageError(
            f"{self._what}: abandoned after {self.count} attempts, the store was closed (last error: {self.detail})"
        )


def call_with_retry(
    attempt: Callable[[], T],
    *,
    policy: RetryPolicy,
    what: str,
    scrub: Callable[[str], str],
    on_retry: Callable[[Exception], None] = lambda exc: None,
    stop: threading.Event | None = None,
) -> T:
    """Run ``attempt`` until it succeeds, retrying transient failures.

    Args:
        attempt: one try of the operation.
        policy: attempt, backoff and time bounds.
        what: the operation and object, e.g. ``"read_range s3://b/x bytes [0, 10)"``,
            already free of secrets; it starts every error message.
        scrub: removes secrets from an error text before it is logged or raised.
        on_retry: called with the failure, once per retry (stats, a warning).
        stop: when set, a backoff sleep ends at once and the operation fails
            (the store was closed while retrying).

    Raises:
        ObjectMissingError: the object does not exist (never retried).
        StorageError: a non-transient failure, or transient ones past the bounds.
        ZephonError: raised by ``attempt`` itself, passed through unchanged.
    """
    attempts = _Attempts(policy=policy, what=what, scrub=scrub)
    while True:
        attempts.count += 1
        try:
            return attempt()
        except ZephonError:
            raise
        except Exception as exc:  # noqa: BLE001 - classified by attempts.failed
            sleep_s = attempts.failed(exc)
            on_retry(exc)
            if stop is None:
                time.sleep(sleep_s)
            elif stop.wait(sleep_s):
                raise attempts.abandoned() from None


async def call_with_retry_async(
    attempt: Callable[[], Awaitable[T]],
    *,
    policy: RetryPolicy,
    what: str,
    scrub: Callable[[str], str],
    on_retry: Callable[[Exception], None] = lambda exc: None,
    stop: threading.Event | None = None,
) -> T:
    """:func:`call_with_retry` for a coroutine: the same bounds, errors and counting.

    Backoff sleeps on the event loop, so other requests on it go on meanwhile;
    ``stop`` is looked at every ``_STOP_POLL_S`` of a sleep.
    """
    attempts = _Attempts(policy=policy, what=what, scrub=scrub)
    while True:
        attempts.count += 1
        try:
            return await attempt()
        except ZephonError:
            raise
        except Exception as exc:  # noqa: BLE001 - classified by attempts.failed
            sleep_s = attempts.failed(exc)
            on_retry(exc)
            deadline = time.monotonic() + sleep_s
            while (left_s := deadline - time.monotonic()) > 0:
                if stop is not None and stop.is_set():
                    raise attempts.abandoned() from None
                await asyncio.sleep(min(left_s, _STOP_POLL_S))
            if stop is not None and stop.is_set():
                raise attempts.abandoned() from None
