"""The request rate a node keeps to one store once the store throttles: the algorithm, on a small record.

A store answers past its request-rate limit by throttling (S3 503 ``SlowDown``,
GCS 429, Azure 503 ``ServerBusy``). Left to each operation's own backoff, a
job's ranks keep the store saturated with retries while the requests still owed
sleep in grown windows (docs/BENCHMARKS.md, the start-up storm). Here the ranks
of a node share one rate per store instead (``limiter.py`` says where the
record lives), and a request waits for its turn rather than being sent to fail.

The record is a queue of tickets served at ``rate`` a second: ticket ``n`` may go
once ``credit``, the tokens the rate has granted so far, reaches ``n + 1``.
Tickets keep their order whatever the rate does, so a change of rate moves every
waiter at once, and a waiter that dies leaves one slot unused, nothing held.

The rate, in the manner of the AWS SDKs' adaptive retry mode (botocore
``retries/adaptive.py``, CUBIC as in RFC 9438), with what a shared, short storm
needs changed:

- **Off** until the first throttling answer any process of the node gets: until
  then the request path reads one byte, no record (``limiter.py``). It
  switches on as if cut from ``INITIAL_RATE``: at ``BETA * INITIAL_RATE``. From
  above, because a rate too high is found out in one round trip, while a rate
  too low grows back only in seconds (docs/BENCHMARKS.md, the node's
  request-rate limiter); the requests already sent when it switched on (a
  node's first burst) cut nothing.
- **Cut** to ``BETA`` times the rate at a throttling answer, once per congestion
  event: an answer to a request sent before the last cut says nothing about the
  rate since, so it cuts nothing (TCP's one reduction per window; the SDK cuts
  on every such answer, and a burst of them collapses its rate).
- **Grow** by CUBIC's curve while requests wait (never when the node asks for
  less than its rate, so an idle node does not bank a rate it never tried):
  ``W(t) = C (t - K)**3 + W_max``, ``K = cbrt(W_max (1 - BETA) / C)``, with ``t``
  the seconds spent waiting since the cut. The constants are the SDK's
  (``C = 0.4``, ``BETA = 0.7``): the rate returns to ``W_max``, where it met the
  limit, in ``K`` seconds and stays near it, and nodes that cut by the same
  factor and grow by the same absolute curve converge to equal shares.
- **Probe** once ``PROBE_AFTER_S`` (or ``PROBE_AFTER_REQUESTS`` at ``W_max``,
  whichever is longer) have passed without a cut: the rate is at least ``BETA *
  W_max`` doubled every ``PROBE_DOUBLING_S`` (or ``PROBE_DOUBLING_REQUESTS`` at
  ``W_max``, whichever is longer: at a small share, what a probe costs is
  counted in requests, one throttling answer per overshoot). CUBIC alone, at
  a node's share of a large job (2-22 requests/s), takes 1.3-2.5 s to get
  back to ``W_max`` and seconds more past it: a node left alone when the
  others finish would use a fraction of the store for the rest of the storm.
  This is TCP CUBIC's "friendly region" turned to the same end: never slower
  than a plain exponential probe. Cuts land on a node in proportion to its
  rate, so a node above its share is cut more often and probes less.
- **Off again** after ``QUIET_S`` without a throttling answer and with no request
  waiting: the steady state of a job that met throttling once at its start costs
  what it cost before.

Rates are per node and store; ``MIN_RATE`` keeps a node that met throttling many
times asking at least that often. Times are ``time.monotonic()`` seconds, one
clock for every process of a machine (Linux ``CLOCK_MONOTONIC``).
"""

from __future__ import annotations

import dataclasses
from typing import Literal, NamedTuple

INITIAL_RATE = 100.0
BETA = 0.7
CUBIC_C = 0.4
MIN_RATE = 0.5
PROBE_AFTER_S = 0.5
PROBE_AFTER_REQUESTS = 4.0
PROBE_DOUBLING_S = 0.25
PROBE_DOUBLING_REQUESTS = 2.0
# Throttling is over once this long passes without a throttling answer:
# the limiter switches off, and a store's next throttling answer starts a new
# episode that is warned about again (throttle.py).
QUIET_S = 30.0
# Far above any store's limit; keeps a probe that runs for minutes finite.
MAX_RATE = 1e6
_EPSILON = 1e-9


@dataclasses.dataclass(slots=True)
class RateRecord:
    """What the processes of a node share about one store.

    Attributes:
        on: whether requests wait for tickets.
        rate: tickets a second now.
        credit: tickets granted so far (the queue's head, fractional).
        issued: tickets handed out so far.
        stamp: when ``credit`` and ``rate`` were last brought up to date.
        grown_s: seconds with requests waiting since the last cut.
        w_max: the rate at the last cut.
        cut_at: when the rate was last cut (or switched on).
        throttled_at: when the last throttling answer came.
        epoch: bumped at each switch-on: a ticket of an earlier epoch is void.
    """

    on: bool = False
    rate: float = 0.0
    credit: float = 0.0
    issued: float = 0.0
    stamp: float = 0.0
    grown_s: float = 0.0
    w_max: float = 0.0
    cut_at: float = 0.0
    throttled_at: float = 0.0
    epoch: int = 0


class Ticket(NamedTuple):
    """One request's place in the queue: it may go once ``credit`` reaches ``number + 1``.

    Attributes:
        epoch: the record's epoch when it was taken; a switch-on voids it.
        number: its place, counted from the switch-on.
    """

    epoch: int
    number: float


# What a throttling answer did: switched the limiter on, cut its rate, or
# nothing (an answer to a request sent before the last cut).
Throttled = Literal["on", "cut", "seen"]


def curve(record: RateRecord) -> float:
    """The rate after ``record.grown_s`` seconds of waiting requests since the cut from ``record.w_max``."""
    w_max, grown_s = record.w_max, record.grown_s
    k = (w_max * (1.0 - BETA) / CUBIC_C) ** (1.0 / 3.0)
    rate = CUBIC_C * (grown_s - k) ** 3 + w_max
    share = max(w_max, MIN_RATE)
    probe_after_s = max(PROBE_AFTER_S, PROBE_AFTER_REQUESTS / share)
    if grown_s > probe_after_s:
        doublings = min(60.0, (grown_s - probe_after_s) / max(PROBE_DOUBLING_S, PROBE_DOUBLING_REQUESTS / share))
        rate = max(rate, BETA * w_max * 2.0**doublings)
    return min(MAX_RATE, max(MIN_RATE, rate))


def advance(record: RateRecord, now: float) -> None:
    """Bring ``credit`` and ``rate`` up to ``now``."""
    elapsed = now - record.stamp
    if elapsed <= 0.0:
        return
    record.stamp = now
    if not record.on:
        return
    if record.issued > record.credit + _EPSILON:
        record.grown_s += elapsed
    # At most one ticket banked: after a pause the next request goes at
    # once, the one after it a tick later, never a burst.
    record.credit = min(record.credit + elapsed * record.rate, record.issued + 1.0)
    record.rate = curve(record)


def take(record: RateRecord, now: float) -> Ticket | None:
    """A ticket for one request, or None when the limiter is off (it may switch off here)."""
    if not record.on:
        return None
    advance(record, now)
    if now - record.throttled_at > QUIET_S and record.issued <= record.credit + _EPSILON:
        record.on = False
        return None
    number = record.issued
    record.issued += 1.0
    return Ticket(record.epoch, number)


def wait_s(record: RateRecord, ticket: Ticket, now: float) -> float:
    """Seconds until ``ticket`` may go at today's rate; 0 when it may go now."""
    if not record.on or ticket.epoch != record.epoch:
        return 0.0
    advance(record, now)
    missing = ticket.number + 1.0 - record.credit
    return missing / record.rate if missing > _EPSILON else 0.0


def throttled(record: RateRecord, now: float, sent_at: float) -> Throttled:
    """Record a throttling answer to a request sent at ``sent_at``: ``"on"``, ``"cut"`` or ``"seen"``."""
    advance(record, now)
    record.stamp = max(record.stamp, now)
    record.throttled_at = now
    if not record.on:
        record.on = True
        record.epoch += 1
        record.w_max = INITIAL_RATE
        record.rate = BETA * INITIAL_RATE
        record.cut_at, record.grown_s = now, 0.0
        record.issued = record.credit = 0.0
        return "on"
    if sent_at < record.cut_at:
        return "seen"
    record.w_max = record.rate
    record.rate = max(MIN_RATE, BETA * record.rate)
    record.cut_at, record.grown_s = now, 0.0
    record.credit = min(record.credit, record.issued)
    return "cut"


__all__ = [
    "BETA",
    "CUBIC_C",
    "INITIAL_RATE",
    "MIN_RATE",
    "QUIET_S",
    "RateRecord",
    "Throttled",
    "Ticket",
    "advance",
    "curve",
    "take",
    "throttled",
    "wait_s",
]
