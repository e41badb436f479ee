"""The steps a helper process finished, posted in the batch ring's header for the trainer to read without a system call.

A helper reports each step it finished. Over the control socket that cost the
trainer a ``recv`` whenever its buffer ran dry: a system call whose kernel
path is cold after a training step (30-60 µs of the trainer's CPU measured on
a 2-vCPU virtual machine, once every few steps). Here the helper writes the
step's slot into the ring's header and then counts it (:meth:`StepBoard.post`);
the trainer reads the count and the slot (:meth:`StepBoard.take`): two loads
from shared memory.

Steps are posted in order, so the k-th step of a run is the run's k-th slot
of steps: its cursor follows from k. At most ``num_slots`` posted steps are
unread (each holds a slot the trainer has not taken), so the posts cycle
through ``num_slots`` places.

What needs no fence and what does: the helper writes the slot's bytes, then
the post, then the count; the trainer reads the count, then the post, then
the bytes. On x86 stores become visible in program order and loads are not
reordered with each other (TSO), so a counted post and its slot are whole
when seen. Weaker memory models (arm64) reorder both; the posts have not
been run on one, and there the helper reports over the socket as before
(:func:`board_is_safe`), whose system calls order the memory. A trainer that finds nothing posted says it waits
(``waiting``) and sleeps on the socket; a helper that posts and sees it
waiting sends a byte. There each side stores one word and then loads the
other's, which x86 may reorder (a store waits in its buffer while a later
load goes ahead), and then both could miss: each side takes a lock between
the two (:func:`fence`), a locked instruction that no load passes. The
trainer's sleep is bounded all the same (loader/producer/process_producer.py).

Layout, in the header after the liveness lock: the count (``int64``) on a
cache line of its own, the trainer's ``waiting`` flag on another, then
``num_slots`` posts (``int64`` slot indices).
"""

from __future__ import annotations

import platform
import threading

_LINE = 64
# Machines whose stores and loads are seen in program order (TSO).
_ORDERED_MACHINES = frozenset({"x86_64", "amd64", "i386", "i686", "x86"})


def board_is_safe() -> bool:
    """Whether this machine's memory order lets steps be posted without a fence (x86)."""
    return platform.machine().lower() in _ORDERED_MACHINES


_FENCE = threading.Lock()


def fence() -> None:
    """A full memory fence on x86: taking a lock is a locked read-modify-write
    (its semaphore's compare-and-swap), which no load passes."""
    _FENCE.acquire()
    _FENCE.release()


def board_bytes(num_slots: int) -> int:
    """Header bytes a board of ``num_slots`` slots takes (a multiple of 64)."""
    return 2 * _LINE + -(-num_slots * 8 // _LINE) * _LINE


class StepBoard:
    """The posted steps of one ring, over ``board_bytes(num_slots)`` bytes of it.

    Args:
        area: a writable memoryview of the board's bytes in the ring.
        num_slots: the ring's slots.
    """

    def __init__(self, area: memoryview, num_slots: int) -> None:
        self.num_slots = num_slots
        self.count = area[:8].cast("q")
        self.waiting = area[_LINE : _LINE + 8].cast("q")
        self.posts = area[2 * _LINE : 2 * _LINE + num_slots * 8].cast("q")
        # The trainer's side: posts it has read (only the trainer's
        # thread reads the board, so this is a plain attribute).
        self.taken = 0

    # -- the helper's side -----------------------------------------------------------

    def post(self, slot: int) -> bool:
        """Post the next step, in ``slot`` (its bytes already written); whether the trainer waits for it."""
        count = self.count[0]
        self.posts[count % self.num_slots] = slot
        self.count[0] = count + 1
        fence()  # The count's store before the flag's load (the trainer fences the other way)
        if self.waiting[0]:
            self.waiting[0] = 0
            return True
        return False

    # -- the trainer's side ----------------------------------------------------------

    def take(self) -> int | None:
        """The slot of the next posted step, or None when none is posted."""
        taken = self.taken
        if self.count[0] == taken:
            return None
        self.taken = taken + 1
        return self.posts[taken % self.num_slots]

    def posted(self) -> bool:
        """Whether a step is posted and not taken yet."""
        return self.count[0] != self.taken

    def release(self) -> None:
        """Let go of the ring's memory (before the ring is unmapped)."""
        for view in (self.count, self.waiting, self.posts):
            view.release()
