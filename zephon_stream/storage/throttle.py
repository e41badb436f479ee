"""What a store's operations share while the store throttles them.

A throttling answer says the store gets more requests than its limit (S3 about
5,500 GET/s per prefix, GCS about 5,000 reads/s per bucket at first). If each
operation backed off on its own count alone, many reads in flight at once
(threads, coroutines on the event loop) would keep the rate up: a reader that
got its bytes sends its next request at once, starting its backoff from the
bottom. So the backoff window of a throttled operation grows in two ways:
doubling with each throttling answer it got (exponential backoff), and in
proportion to how many of the store's operations are waiting out throttling
at that moment (the contention): N readers throttled together spread their
retries over N times the window, and their rate stays near what the store
serves. A retry sleeps ``uniform(0, min(cap, base * 2**n * (1 + waiting)))``
(full jitter; ``RetryPolicy.throttle_backoff_s``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from zephon_stream.storage.request_rate import QUIET_S


class StoreThrottle:
    """The throttling one store meets: who is waiting it out, and whether it has just started. Thread-safe.

    Args:
        quiet_s: seconds without a throttling answer after which throttling
            counts as stopped.
        clock: monotonic seconds (a test may pass its own).
    """

    def __init__(self, *, quiet_s: float = QUIET_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.Lock()
        self._quiet_s = quiet_s
        self._clock = clock
        self._waiting = 0
        self._last: float | None = None

    @property
    def waiting(self) -> int:
        """Operations of the store sleeping after a throttling answer now."""
        return self._waiting

    def throttled(self) -> tuple[int, bool]:
        """Record one throttling answer, whose operation is about to wait.

        Returns:
            ``(operations already waiting, whether throttling starts here)``;
            call :meth:`woke` when the wait is over.
        """
        with self._lock:
            now = self._clock()
            starts = self._last is None or now - self._last > self._quiet_s
            self._last = now
            waiting = self._waiting
            self._waiting += 1
            return waiting, starts

    def woke(self) -> None:
        """One operation's wait after a throttling answer is over (slept, or given up)."""
        with self._lock:
            self._waiting -= 1
