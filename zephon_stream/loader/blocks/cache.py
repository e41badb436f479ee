"""Block cache: decoded blocks shared by the assembler, bounded in bytes.

An entry is reserved (its decoded size counted) when its fetch is issued, so
the bound covers blocks in flight as well as resident ones. The planner, not
the cache, decides when a block is dropped: when no position in its look-ahead
still needs it. The cache only refuses reservations past its capacity.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable

import numpy as np

_PENDING = 0
_READY = 1
_FAILED = 2


class _Entry:
    __slots__ = ("nbytes", "state", "value", "error")

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self.state = _PENDING
        self.value: np.ndarray | None = None
        self.error: BaseException | None = None


class CacheClosedError(RuntimeError):
    """Raised to a waiter when the cache is closed under it (loader shutdown)."""


class BlockCache:
    """Decoded blocks by key, with byte accounting and blocking lookups.

    Args:
        capacity_bytes: the most decoded bytes reserved at once, unless a
            reservation is forced (the block the very next step needs).
    """

    def __init__(self, *, capacity_bytes: int) -> None:
        if capacity_bytes <= 0:
            raise ValueError(f"capacity_bytes must be > 0 (got {capacity_bytes})")
        self.capacity_bytes = capacity_bytes
        self._entries: dict[Hashable, _Entry] = {}
        self._cond = threading.Condition()
        self._reserved_bytes = 0
        self._peak_bytes = 0
        self._forced = 0
        self._closed = False

    def __contains__(self, key: Hashable) -> bool:
        with self._cond:
            return key in self._entries

    def __len__(self) -> int:
        with self._cond:
            return len(self._entries)

    @property
    def reserved_bytes(self) -> int:
        """Decoded bytes of every entry, resident or in flight."""
        with self._cond:
            return self._reserved_bytes

    @property
    def peak_bytes(self) -> int:
        """The largest ``reserved_bytes`` seen."""
        with self._cond:
            return self._peak_bytes

    def counters(self) -> tuple[int, int, int]:
        """``(reserved_bytes, peak_bytes, forced_reservations)``, read together."""
        with self._cond:
            return self._reserved_bytes, self._peak_bytes, self._forced

    @property
    def forced_reservations(self) -> int:
        """Reservations admitted past the capacity (0 when the bound holds)."""
        with self._cond:
            return self._forced

    def try_reserve(self, key: Hashable, nbytes: int, *, force: bool = False) -> bool:
        """Add a pending entry for ``key`` if its bytes fit (or ``force``).

        Returns:
            True if the entry was added, False if it would exceed the capacity.
        """
        with self._cond:
            assert key not in self._entries, f"block {key} reserved twice"
            over = self._reserved_bytes + nbytes > self.capacity_bytes
            if over and not force:
                return False
            if over:
                self._forced += 1
            self._entries[key] = _Entry(nbytes)
            self._reserved_bytes += nbytes
            self._peak_bytes = max(self._peak_bytes, self._reserved_bytes)
            return True

    def fill(self, key: Hashable, tokens: np.ndarray) -> None:
        """Store the decoded tokens of a reserved entry and wake its waiters."""
        with self._cond:
            entry = self._entries.get(key)
            if entry is None:  # dropped while in flight
                return
            entry.value = tokens
            entry.state = _READY
            self._cond.notify_all()

    def fail(self, key: Hashable, error: BaseException) -> None:
        """Record why a reserved entry could not be produced; waiters raise it."""
        with self._cond:
            entry = self._entries.get(key)
            if entry is None:
                return
            entry.error = error
            entry.state = _FAILED
            self._cond.notify_all()

    def is_ready(self, key: Hashable) -> bool:
        """Whether ``key`` is decoded and resident."""
        with self._cond:
            entry = self._entries.get(key)
            return entry is not None and entry.state == _READY

    def get(self, key: Hashable, *, timeout_s: float | None = None) -> np.ndarray:
        """The decoded tokens of ``key``, waiting while its fetch is in flight.

        Raises:
            KeyError: ``key`` was never reserved (or already dropped).
            TimeoutError: still pending after ``timeout_s``.
            CacheClosedError: the cache was closed while waiting.
            Exception: whatever the fetch or decode of the block raised.
        """
        with self._cond:
            if self._closed:
                raise CacheClosedError("block cache closed while waiting for a block")
            entry = self._entries[key]
            if not self._cond.wait_for(lambda: entry.state != _PENDING or self._closed, timeout_s):
                raise TimeoutError(f"block {key} still in flight after {timeout_s} s")
            if entry.state == _READY:
                assert entry.value is not None
                return entry.value
            if entry.state == _FAILED:
                assert entry.error is not None
                raise entry.error
            raise CacheClosedError("block cache closed while waiting for a block")

    def drop(self, key: Hashable) -> None:
        """Forget ``key`` (resident or in flight) and release its bytes."""
        with self._cond:
            entry = self._entries.pop(key, None)
            if entry is not None:
                self._reserved_bytes -= entry.nbytes

    def clear(self) -> None:
        """Drop every entry."""
        with self._cond:
            self._entries.clear()
            self._reserved_bytes = 0

    def close(self) -> None:
        """Drop everything and wake every waiter with CacheClosedError."""
        with self._cond:
            self._closed = True
            self._entries.clear()
            self._reserved_bytes = 0
            self._cond.notify_all()
