"""The ring's slots between producer and consumer: which the producer may
fill (``FreeSlots``), and the consumer's hand-back (``hand_back``).

A slot's ``returned`` flag in the ring (loader/ring/shared_ring.py) is set by the
consumer when it is done with the slot and cleared by the producer when it
fills it again. A producer a whole ring ahead waits, and is woken by the
consumer only after several slots came back (a wake-up costs the consumer a
system call); meanwhile it looks for returned slots itself.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

import numpy as np

from zephon_stream.loader.ring.shared_ring import SharedRing

_FREE_POLL_MIN_S = 0.0002
_FREE_POLL_FIRST_MIN_S = 0.0001
_FREE_POLL_MAX_S = 0.002
# The most returned slots a waiting producer asks to be woken after (a byte of the ring's header).
MAX_WAKE_AFTER = 255


class FreeSlots:
    """The ring slots the producer may fill: those whose ``returned`` flag the
    consumer has set (loader/ring/shared_ring.py).

    Args:
        ring: the batch ring.
        wake_after: when the producer waits (a whole ring ahead), the slots
            the consumer hands back before it wakes the producer; until then
            the producer looks for returned slots itself, at growing
            intervals.
    """

    def __init__(self, ring: SharedRing, *, wake_after: int = 1) -> None:
        # The ring, not a view of its flags: a view left behind would
        # keep the mapping (and its descriptor) open after the ring's close().
        self._ring = ring
        self._next = 0
        self._wake_after = max(1, min(MAX_WAKE_AFTER, wake_after))
        # When the last wait ended, and the first look of the next one:
        # a quarter of the time between the last two waits' ends (about the
        # consumer's step while the producer is ahead), so a returned slot is
        # found within a fraction of a step.
        self._waited_at: float | None = None
        self._first_look_s = _FREE_POLL_MIN_S

    def acquire(self, stop: threading.Event, *, idle: Callable[[], None] | None = None) -> int | None:
        """A returned slot (its flag cleared), waiting for one; None once ``stop`` is set.

        ``idle`` is called at each look while it waits (the producer
        publishes its counters meanwhile)."""
        returned = self._ring.returned
        index = self._next
        if returned[index]:
            # Slots mostly come back in the order they went out; the
            # one after the last taken is the first to look at.
            returned[index] = 0
            self._next = (index + 1) % len(returned)
            return index
        wait_s = self._first_look_s
        waiting, woken = self._ring.producer_waiting, self._ring.slot_returned
        try:
            while not stop.is_set():
                woken.clear()
                waiting[0] = self._wake_after
                # A snapshot: the consumer sets flags while this reads them
                # (numpy refuses to count a changing array).
                ready = np.flatnonzero(returned.copy())
                if ready.size:
                    index = int(ready[0])
                    returned[index] = 0
                    self._next = (index + 1) % len(returned)
                    now = time.monotonic()
                    if self._waited_at is not None:
                        look = (now - self._waited_at) / 4
                        self._first_look_s = min(_FREE_POLL_MAX_S, max(_FREE_POLL_FIRST_MIN_S, look))
                    self._waited_at = now
                    return index
                # The producer waits here only when it is a whole ring
                # ahead of the consumer. A wake-up costs the consumer's thread
                # a system call and the other side's wake (10-15 us of the
                # trainer's CPU, measured), so the consumer wakes it only
                # once ``wake_after`` slots came back unnoticed, with steps
                # still queued; until then the producer finds them itself at
                # its next look, paced by the consumer's steps. The flags are
                # read and written without a fence, so a wake-up can be
                # missed or come early: the bounded wait covers both.
                if idle is not None:
                    idle()
                woken.wait(wait_s)
                wait_s = min(2 * wait_s, _FREE_POLL_MAX_S)
            return None
        finally:
            waiting[0] = 0


def hand_back(ring: SharedRing, slot: int) -> None:
    """The consumer is done with ``slot``: the producer may fill it again
    (woken if it waits and this is the ``wake_after``-th slot back since it
    began to, see :class:`FreeSlots`)."""
    flags = ring.flags
    flags[slot] = 1
    waiting = ring.num_slots  # The producer_waiting byte follows the slots' flags
    left = flags[waiting]
    if left:
        flags[waiting] = left - 1
        if left == 1:
            ring.notify()


def reset_returned(ring: SharedRing, busy: Sequence[int]) -> None:
    """Before a producer starts: every slot returned but those in ``busy``."""
    ring.returned[:] = 1
    for index in busy:
        ring.returned[index] = 0
