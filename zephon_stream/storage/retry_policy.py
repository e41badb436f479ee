"""How hard a store tries before a storage operation fails: the bounds ``retry.py`` applies."""

from __future__ import annotations

import dataclasses
import random

from zephon_stream.errors import ConfigError


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class RetryPolicy:
    """How hard a store tries before a storage operation fails.

    Attributes:
        max_attempts: attempts per operation, the first one included; throttled
            attempts are not among them (they have ``throttle_timeout_s``).
        initial_backoff_s: sleep before the first retry; doubles each retry.
        max_backoff_s: cap on one sleep.
        timeout_s: cap on the whole operation, sleeps included; no retry
            starts once it would end past this (``throttle_timeout_s`` instead,
            when it is longer, for an operation that met throttling).
        connect_timeout_s: per-attempt connect timeout (network backends).
        read_timeout_s: per-attempt timeout waiting for response bytes.
        throttle_initial_backoff_s: without the limiter, the base of a
            throttled operation's sleep after its ``n``-th throttling answer
            (0-based), with ``waiting`` of the store's operations already
            waiting out throttling:
            ``uniform(0, min(throttle_max_backoff_s, base * 2**n * (1 + waiting)))``.
        throttle_max_backoff_s: cap on one such sleep's range.
        throttle_timeout_s: an operation the store keeps throttling fails once
            a retry (or its wait for a turn) would end past this, from the
            operation's start.
        throttle_limiter: meet throttling with the store's request-rate
            limiter (``limiter.py``: every attempt waits for its turn while it
            is on, a rate cut at throttling answers and grown back; shared by
            the ranks of a node through the node cache); False: with the
            backoff above, each operation on its own.
    """

    max_attempts: int = 10
    initial_backoff_s: float = 0.1
    max_backoff_s: float = 4.0
    timeout_s: float = 120.0
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 30.0
    throttle_initial_backoff_s: float = 0.2
    # 5 s, not 20: in benchmarks/bench_startup_storm.py at 16,384 ranks'
    # contention the last rank's first batch came at 1.52-2.10 x the floor with
    # 20 s (requests still owed sleeping in grown windows while the store sat
    # idle) and at 1.22-1.29 x with 5 s, for as many throttling answers.
    throttle_max_backoff_s: float = 5.0
    throttle_timeout_s: float = 300.0
    throttle_limiter: bool = True

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigError(f"RetryPolicy.max_attempts must be >= 1 (got {self.max_attempts})")
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name.endswith("_s") and not value >= 0:
                raise ConfigError(f"RetryPolicy.{field.name} must be >= 0 (got {value})")

    def backoff_s(self, retry_index: int) -> float:
        """Sleep before retry number ``retry_index`` (0-based), with jitter in [50%, 100%]."""
        base = min(self.max_backoff_s, self.initial_backoff_s * (2.0**retry_index))
        return base * random.uniform(0.5, 1.0)

    def throttle_backoff_s(self, throttled_index: int, waiting: int = 0) -> float:
        """Sleep after throttling answer number ``throttled_index`` (0-based) of an operation.

        Full jitter: ``uniform(0, min(cap, base * 2**throttled_index * (1 + waiting)))``,
        with ``waiting`` the number of other operations waiting.
        """
        # Full jitter (from zero, not from half) spreads the retries of
        # many readers throttled at once over the whole window, so they do not
        # come back together; the mean sleep is half the window.
        window_s = self.throttle_initial_backoff_s * 2.0 ** min(throttled_index, 64) * (1 + waiting)
        return random.uniform(0.0, min(self.throttle_max_backoff_s, window_s))


__all__ = ["RetryPolicy"]
