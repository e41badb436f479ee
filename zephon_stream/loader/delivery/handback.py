"""When a slot that CUDA delivery used may go back to the producer.

Two things can still read a slot after it was delivered:

- its copy to the device, queued on the side stream (an event says when it
  has run);
- with host keys (``host_labels``), the CPU tensors the consumer got, which
  are views of the pinned slot. Dropping them is not enough: a consumer that
  wrote ``labels.to(device, non_blocking=True)`` has queued a copy out of the
  slot that runs when its stream gets there, possibly after a whole forward
  and backward. torch does not protect this memory (its caching host
  allocator tracks only memory it allocated). So once the views are gone, an
  event is recorded on the consumer's stream, and the slot goes back only
  when that event has completed: every copy queued on that stream before the
  views were dropped has then run. (A copy queued on a stream other than the
  one current when the consumer asks for its next batch is not covered.)

The events come from the caller (``record_release``), so this bookkeeping
runs on CPU in tests with events that complete when the test says so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Protocol


class EventLike(Protocol):
    """What is asked of an event (``torch.cuda.Event`` has both)."""

    def query(self) -> bool: ...

    def synchronize(self) -> None: ...


@dataclasses.dataclass(slots=True)
class _Held:
    index: int
    copied: EventLike
    viewed: bool
    released: EventLike | None = None


class SlotReturns:
    """The delivered slots not yet handed back, and which of them may go.

    Args:
        referenced: whether the consumer still holds views of slot ``i``.
        record_release: records an event on the consumer's current stream
            and returns it.
        max_viewed: slots whose host tensors may be views at once (viewed
            slots whose release event is pending count); later deliveries
            get copies, so the producer always has slots to fill.
    """

    def __init__(
        self, *, referenced: Callable[[int], bool], record_release: Callable[[], EventLike], max_viewed: int
    ) -> None:
        self._referenced = referenced
        self._record_release = record_release
        self._max_viewed = max_viewed
        self._held: list[_Held] = []
        self.views_handed_out = False

    def add(self, index: int, *, copied: EventLike, host_keys: bool) -> bool:
        """Slot ``index`` was delivered (its copy's event ``copied``); whether
        its host tensors may be views of it (else the consumer gets copies)."""
        viewed = host_keys and sum(held.viewed for held in self._held) < self._max_viewed
        self._held.append(_Held(index=index, copied=copied, viewed=viewed))
        self.views_handed_out |= viewed
        return viewed

    def reclaim(self) -> list[int]:
        """Slots nothing reads any more, each returned once.

        Copies of all but the last delivered slot are waited for, so that at
        most ``max_viewed + 1`` slots stay out of the producer's hands.
        Release events are never waited for here: they only make later
        deliveries copy their host tensors while they are pending.
        """
        free, keep = [], []
        last = len(self._held) - 1
        for position, held in enumerate(self._held):
            if not held.copied.query():
                if position < last:
                    held.copied.synchronize()
                else:
                    keep.append(held)
                    continue
            if held.viewed:
                if held.released is None:
                    if self._referenced(held.index):
                        keep.append(held)
                        continue
                    held.released = self._record_release()
                if not held.released.query():
                    keep.append(held)
                    continue
            free.append(held.index)
        self._held = keep
        return free

    def settle(self) -> tuple[int, ...]:
        """Wait for every copy; the slots still out (views the consumer
        holds, or copies it queued from them that have not run)."""
        for held in self._held:
            held.copied.synchronize()
        self.reclaim()
        return tuple(held.index for held in self._held)

    def wait(self) -> None:
        """Wait for every copy and every release event recorded so far."""
        for held in self._held:
            held.copied.synchronize()
            if held.released is not None:
                held.released.synchronize()
