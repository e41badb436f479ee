"""Which storage failures are worth retrying, and which of them are throttling.

Transient failures (timeouts, 5xx, 408 and 429 answers, throttling codes,
connection resets and refusals, bodies cut short in transit) are recognised in
the errors of each client: botocore (S3), gcsfs (GCS), azure-core (Azure Blob),
aiohttp and requests. Throttling is the store saying it gets more requests than
it takes (S3 503 ``SlowDown``, any 429, GCS ``rateLimitExceeded``, Azure 503
``ServerBusy``, botocore's throttling codes): a transient failure that the
retry layer meets with a backoff of its own (``retry.py``).
"""

from __future__ import annotations

import asyncio
import errno
import functools
import socket
import sys

from zephon_stream.storage.hints import error_chain

# The throttling codes (THROTTLE_CODES, below) are transient too.
_TRANSIENT_CODES = frozenset(
    {
        "InternalError",
        "ServiceUnavailable",
        "RequestTimeout",
        "RequestTimeoutException",
        "BadGateway",
        "GatewayTimeout",
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


# Looked up in sys.modules rather than imported: a library that was never
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
    if code in _TRANSIENT_CODES or code in THROTTLE_CODES:
        return True
    return status is not None and (status >= 500 or status in (408, 429))


def is_missing(exc: BaseException) -> bool:
    """Whether ``exc`` says the object does not exist."""
    return isinstance(exc, FileNotFoundError)


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it was raised from) is worth retrying."""
    if is_throttled(exc):
        return True
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


# botocore's own throttling codes (its standard retry mode), S3's, and
# Azure's ``ServerBusy`` ("Ingress/Egress is over the account limit"); a bare
# 503 without a code stays an ordinary transient failure, as botocore has it.
THROTTLE_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottledException",
        "RequestThrottled",
        "TooManyRequestsException",
        "ProvisionedThroughputExceededException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
        "LimitExceededException",
        "TooManyRequests",
        "ServerBusy",
    }
)
# GCS's JSON API names its throttling in ``error.errors[].reason``.
_GCS_THROTTLE_REASONS = frozenset({"rateLimitExceeded", "userRateLimitExceeded"})


def _gcs_reasons(exc: BaseException) -> set[str]:
    response = getattr(exc, "_error_response", None)
    if not (_from_library(exc, "gcsfs") and isinstance(response, dict)):
        return set()
    errors = response.get("errors")
    return {e.get("reason") for e in errors if isinstance(e, dict)} if isinstance(errors, list) else set()


def is_throttled(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it was raised from) is the store asking for fewer requests."""
    for item in error_chain(exc):
        if isinstance(item, FileNotFoundError):
            return False
        status, code = http_status(item)
        if status == 429 or code in THROTTLE_CODES:
            return True
        if _gcs_reasons(item) & _GCS_THROTTLE_REASONS:
            return True
    return False
