"""The store interface every backend implements, with the behaviour they share.

A store is rooted at a URL; every path given to it is relative to that root and
``/``-separated. The public methods here validate paths, run the backend's
primitive through the retry layer, count what happened, and word errors so they
name the object and range without secrets. Backends implement only the
underscore primitives.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from zephon_stream.errors import TruncatedObjectError
from zephon_stream.storage.classify import http_status
from zephon_stream.storage.hints import error_chain, is_unreachable
from zephon_stream.storage.limiter import Limiter, LocalRecord, SharedRecord, limiter_file_name
from zephon_stream.storage.paths import check_relative_path
from zephon_stream.storage.redact import redact_text
from zephon_stream.storage.retry import (
    RetryOptions,
    RetryPolicy,
    ShortReadError,
    call_with_retry,
    call_with_retry_async,
)
from zephon_stream.storage.throttle import StoreThrottle

__all__ = ["STAT_KEYS", "Store", "StoreStats", "check_relative_path"]

T = TypeVar("T")
logger = logging.getLogger("zephon_stream.storage")

STAT_KEYS = (
    "reads",
    "bytes_read",
    "writes",
    "bytes_written",
    "retries",
    "throttled",
    "throttle_waits",
    "throttle_wait_ms",
    "errors",
)


class StoreStats:
    """Thread-safe operation counters of one store."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(STAT_KEYS, 0)

    def add(self, **deltas: int) -> None:
        with self._lock:
            for key, delta in deltas.items():
                self._counts[key] += delta

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


class Store(abc.ABC):
    """A key-value view of a folder or object-store prefix.

    Subclasses pass their root URL (scrubbed here) and secrets to ``__init__``
    and implement the primitives; callers use only the public methods.
    """

    def __init__(self, *, url: str, retry: RetryPolicy | None, secrets: Sequence[str] = ()) -> None:
        self._retry = retry or RetryPolicy()
        self._secrets = tuple(sorted({s for s in secrets if s}, key=len, reverse=True))
        self._stats = StoreStats()
        self._closing = threading.Event()
        self._url = self.scrub(url.rstrip("/"))
        # set once "cannot reach" is said, cleared by the next success:
        # one warning per outage, however many reads wait it out.
        self._unreachable_said = False
        # Shared by every operation of the store, threads and event loop
        # alike: see storage/throttle.py for why not one per operation.
        self._throttle = StoreThrottle()
        # This store's own until share_limiter() gives it the node's.
        self._limiter = Limiter(LocalRecord()) if self._retry.throttle_limiter else None

    # -- primitives -------------------------------------------------------
    @abc.abstractmethod
    def _read(self, path: str) -> bytes: ...

    @abc.abstractmethod
    def _read_range(self, path: str, start: int, end: int) -> bytes: ...

    @abc.abstractmethod
    def _write(self, path: str, data: bytes) -> None: ...

    @abc.abstractmethod
    def _exists(self, path: str) -> bool: ...

    @abc.abstractmethod
    def _size(self, path: str) -> int: ...

    @abc.abstractmethod
    def _list(self, prefix: str) -> list[str]: ...

    @abc.abstractmethod
    def _delete(self, path: str) -> None: ...

    # -- public API -------------------------------------------------------
    @property
    def url(self) -> str:
        """The root URL, free of secrets."""
        return self._url

    @property
    def retry_policy(self) -> RetryPolicy:
        return self._retry

    def scrub(self, text: str) -> str:
        """``text`` with this store's secrets removed."""
        return redact_text(text, self._secrets)

    def read(self, path: str) -> bytes:
        """The whole object at ``path``."""
        rel = self._check(path)
        data = self._run("read", rel, "", lambda: self._read(rel))
        self._stats.add(reads=1, bytes_read=len(data))
        return data

    def read_range(self, path: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of the object at ``path``, exactly ``end - start`` of them.

        Raises:
            TruncatedObjectError: the object ends before ``end``.
            ObjectMissingError: no object at ``path``.
            StorageError: transient failures outlasted the retry policy.
        """
        rel, want = self._check_range(path, start, end)
        if not want:
            return b""

        def attempt() -> bytes:
            data = self._read_range(rel, start, end)
            if len(data) == want:
                return data
            raise self._short_read_error(rel, start, end, len(data), self._size(rel))

        data = self._run("read_range", rel, f" bytes [{start}, {end})", attempt)
        self._stats.add(reads=1, bytes_read=len(data))
        return data

    def endpoint(self) -> str | None:
        """Where requests go (``http://host:port``), free of secrets; None where there is no network."""
        return None

    def limiter_key(self) -> str | None:
        """What one request-rate limit covers (service, endpoint, bucket), or None where nothing throttles."""
        return None

    def share_limiter(self, node_cache: Any) -> bool:
        """Wait on the node's request-rate limiter for this store, through ``node_cache`` (``storage/node_cache.py``).

        The processes of a node that open the same bucket on the same endpoint
        share one limiter (``limiter.py``); until ``close()`` this store's
        attempts wait for their turns from it once any of them met throttling.

        Returns:
            Whether the store now shares the node's limiter (False: the policy
            has no limiter, or the store does not throttle).
        """
        key = self.limiter_key()
        if self._limiter is None or key is None:
            return False
        shared = Limiter(SharedRecord(node_cache.limiter_path(limiter_file_name(key))))
        own, self._limiter = self._limiter, shared
        own.close()
        return True

    @property
    def limiter(self) -> Limiter | None:
        """The request-rate limiter this store's attempts wait on (None: the policy backs off per operation)."""
        return self._limiter

    def event_loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop :meth:`read_range_async` runs on, or None where reads are blocking calls only.

        A network store whose client is asynchronous (s3fs, gcsfs, adlfs) answers
        its client's loop: many reads then wait there at once, with no thread each.
        """
        return None

    async def read_range_async(self, path: str, start: int, end: int) -> bytes:
        """:meth:`read_range` as a coroutine on :meth:`event_loop`: the same checks, retries and counters."""
        rel, want = self._check_range(path, start, end)
        if not want:
            return b""

        async def attempt() -> bytes:
            data = await self._read_range_async(rel, start, end)
            if len(data) == want:
                return data
            raise self._short_read_error(rel, start, end, len(data), await self._size_async(rel))

        try:
            options = self._retry_options("read_range", rel, f" bytes [{start}, {end})")
            data = await call_with_retry_async(attempt, **options)
        except Exception:
            self._stats.add(errors=1)
            raise
        self._unreachable_said = False
        self._stats.add(reads=1, bytes_read=len(data))
        return data

    def _short_read_error(self, rel: str, start: int, end: int, got: int, size: int) -> Exception:
        """What a body of ``got`` bytes means where ``end - start`` were asked of an object of ``size``."""
        if size < end:
            return TruncatedObjectError(
                f"{self._name(rel)} bytes [{start}, {end}): object is truncated "
                f"(expected at least {end} bytes, got {size})"
            )
        return ShortReadError(f"body ended after {got} of {end - start} bytes")

    def _read_range_async(self, path: str, start: int, end: int) -> Awaitable[bytes]:
        raise NotImplementedError(f"{type(self).__name__} has no event loop")

    def _size_async(self, path: str) -> Awaitable[int]:
        raise NotImplementedError(f"{type(self).__name__} has no event loop")

    def write_atomic(self, path: str, data: bytes) -> None:
        """Store ``data`` at ``path``: readers see the old object or the whole new one."""
        rel = self._check(path)
        payload = bytes(data)
        self._run("write_atomic", rel, f" ({len(payload)} bytes)", lambda: self._write(rel, payload))
        self._stats.add(writes=1, bytes_written=len(payload))

    def exists(self, path: str) -> bool:
        rel = self._check(path)
        return self._run("exists", rel, "", lambda: self._exists(rel))

    def size(self, path: str) -> int:
        """Byte size of the object at ``path`` (ObjectMissingError if absent)."""
        rel = self._check(path)
        return self._run("size", rel, "", lambda: self._size(rel))

    def list(self, prefix: str = "") -> list[str]:
        """Sorted relative paths of every object whose path starts with ``prefix``."""
        if prefix:
            check_relative_path(prefix.rstrip("/") or ".", root=self._url)
        return sorted(self._run("list", prefix, "", lambda: self._list(prefix)))

    def root_kind(self) -> str:
        """What the store's root is, for messages: ``"file"`` (a file or object of its own, not a folder),
        ``"folder"`` (a folder, or a prefix with objects under it) or ``"missing"`` (nothing there)."""
        return "folder" if self.list() else "missing"

    def delete(self, path: str) -> None:
        """Remove the object at ``path``; removing an absent object is not an error."""
        rel = self._check(path)
        self._run("delete", rel, "", lambda: self._delete(rel))

    def stats(self) -> dict[str, int]:
        """Counters since the store was opened.

        ``reads``/``bytes_read`` and ``writes``/``bytes_written`` count completed
        operations; ``retries`` counts attempts repeated after a transient
        failure other than throttling; ``throttled`` counts the answers that
        were the store throttling (503 SlowDown, 429, ServerBusy, ...), each
        waited out and tried again unless the policy's throttle deadline had
        come, apart from ``retries``; ``throttle_waits`` counts the attempts that
        waited for their turn from the store's request-rate limiter and
        ``throttle_wait_ms`` how long they waited in all (milliseconds);
        ``errors`` counts operations that raised (missing objects,
        truncation and exhaustion included; refused paths excluded).
        """
        return self._stats.snapshot()

    def close(self) -> None:
        """Release connections and cut short operations waiting to retry.

        An operation sleeping between retries fails at once with StorageError,
        so a consumer shutting down during an outage does not wait out the
        retry policy. Operations started after ``close()`` run normally.
        """
        closing, self._closing = self._closing, threading.Event()
        closing.set()
        limiter = self._limiter
        if limiter is not None and limiter.shared:
            # The node's file is let go with the store; used again, the
            # store waits on a limiter of its own.
            self._limiter = Limiter(LocalRecord())
            limiter.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._url!r})"

    # -- shared plumbing --------------------------------------------------
    def _check(self, path: str) -> str:
        return check_relative_path(path, root=self._url)

    def _check_range(self, path: str, start: int, end: int) -> tuple[str, int]:
        """``(relative path, bytes wanted)`` of a range read, or ValueError naming the object."""
        rel = self._check(path)
        if not (isinstance(start, int) and isinstance(end, int)) or start < 0 or end < start:
            raise ValueError(f"{self._name(rel)}: invalid byte range [{start}, {end})")
        return rel, end - start

    def _name(self, rel: str) -> str:
        return f"{self._url}/{rel}" if rel else self._url

    def _run(self, op: str, rel: str, detail: str, attempt: Callable[[], T]) -> T:
        try:
            result = call_with_retry(attempt, **self._retry_options(op, rel, detail))
            self._unreachable_said = False
            return result
        except Exception:
            self._stats.add(errors=1)
            raise

    def _retry_options(self, op: str, rel: str, detail: str) -> RetryOptions:
        """What an operation of this store hands the retry layer: its counters, shared throttling, ``close()``."""
        return RetryOptions(
            policy=self._retry,
            what=f"{op} {self._name(rel)}{detail}",
            scrub=self.scrub,
            on_retry=self._retrying,
            on_throttled=self._throttled,
            on_waited=self._waited,
            throttle=self._throttle,
            limiter=self._limiter,
            stop=self._closing,
        )

    def _retrying(self, exc: Exception) -> None:
        """Count one retry; say once per outage, at its first retry, that the endpoint cannot be reached."""
        self._stats.add(retries=1)
        if self._unreachable_said or not is_unreachable(exc):
            return
        self._unreachable_said = True
        where = self.endpoint()
        policy = self._retry
        logger.warning(
            "%s: cannot reach %s; retrying, for up to %d attempts or %.0f s per operation",
            self._url,
            self.scrub(where) if where else "the store's endpoint",
            policy.max_attempts,
            policy.timeout_s,
        )

    def _waited(self, seconds: float) -> None:
        self._stats.add(throttle_waits=1, throttle_wait_ms=round(seconds * 1000.0))

    def _throttled(self, exc: Exception, starts: bool) -> None:
        """Count one throttling answer; say once, when throttling starts, that the store throttles."""
        self._stats.add(throttled=1)
        if not starts:
            return
        policy = self._retry
        if self._limiter is None:
            pacing = f"backing off with full jitter (up to {policy.throttle_max_backoff_s:.0f} s a sleep, "
        else:
            whose = "this node's" if self._limiter.shared else "this store's"
            pacing = f"pacing {whose} requests to it (the rate cut at each throttling answer, up to "
        # The store's URL only (scrubbed at construction), never the
        # request's: a presigned URL would carry a signature.
        logger.warning(
            "%s: the store is throttling requests (%s); %s%.0f s per operation). Fewer ranks starting at once, "
            "a higher request-rate limit or node-local metadata sharing lower the request rate",
            self._url,
            self.scrub(_answer(exc)),
            pacing,
            policy.throttle_timeout_s,
        )


def _answer(exc: BaseException) -> str:
    """``HTTP 503 SlowDown``: the status and code a throttling answer carried, as its client reports them."""
    for item in error_chain(exc):
        status, code = http_status(item)
        if status or code:
            return " ".join(str(part) for part in ("HTTP", status, code) if part)
    return type(exc).__name__
