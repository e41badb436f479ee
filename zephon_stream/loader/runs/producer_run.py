"""One producer run as the trainer takes its steps: its ring, delivery and producer, the cursors it
covers, and the short way to a plain step.

A run hands its steps over one at a time (:class:`ProducerRun`). Where
consecutive small steps share a slot (loader/runs/phase_layouts.py
``steps_per_slot``), each is handed over as views of the slot's tensors; the
slot goes back to the producer once every view is dropped.

Most steps of a run need nothing but the next slot: the helper has posted it
(loader/ring/step_board.py), the slot's tensors were made the first time it
came round (loader/delivery/slot_views.py), and the slots the consumer dropped
go back as one byte each. The full way there passes through the feed, the
run, the producer and the delivery, each checking what may have changed (a
run started ahead, a phase boundary, a helper taking over, the end, an
error): some forty Python calls. After a training step the interpreter's
caches are cold, and each call and object touched costs a cache miss; on a
2-vCPU virtual machine that path took 20-40 µs of the trainer's CPU a step.

:class:`SteadySteps` is that step in one call over the objects it needs,
kept at hand. It serves a step only when the step is plain: posted (it
sleeps until it is, as the full way would), in a slot whose tensors are
made, with room for the consumer to hold it; a slot of several steps is
handed over the run's own way. Anything else (an end, an error, a helper
gone), it returns None before it takes anything, and the loader takes the
full way (loader/runs/feed.py), which raises, waits, ends or switches as it
always did.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from typing import Any

import torch

from zephon_stream.loader.delivery.device import CpuDelivery, CudaDelivery
from zephon_stream.loader.planning.rank_layout import RankLayout
from zephon_stream.loader.producer.pipeline import EndOfData, ReadyStep
from zephon_stream.loader.producer.process_producer import ProcessProducer
from zephon_stream.loader.producer.spec import ProducerSpec, ThreadProducer
from zephon_stream.loader.producer.stats import read_counters
from zephon_stream.loader.ring.free_slots import hand_back
from zephon_stream.loader.ring.shared_ring import SharedRing


class ProducerRun:
    """One producer run: its ring, delivery and producer, and the cursors it covers.

    Args:
        ring: the run's own ring (overlapping runs never share one).
        delivery: the ring's delivery.
        producer: what fills the ring.
        layout: the layout it reads.
        start: the cursor of its first step.
        end: the cursor it ends at, or None.
        spec: the spec it was started with (a helper taking over reuses it).
    """

    def __init__(
        self,
        *,
        ring: SharedRing,
        delivery: CpuDelivery | CudaDelivery,
        producer: ProcessProducer | ThreadProducer,
        layout: RankLayout,
        start: int,
        end: int | None,
        spec: ProducerSpec,
    ) -> None:
        self.ring = ring
        self.delivery = delivery
        self.producer = producer
        self.layout = layout
        self.start = start
        self.end = end
        self.spec = spec
        self.more_runs = False  # Another run follows (a helper taking this one over starts a spare)
        # Steps delivered from a slot of several, not handed over yet.
        self.pending: collections.deque[tuple[ReadyStep, dict[str, torch.Tensor]]] = collections.deque()
        # The short way to a plain step (:class:`SteadySteps` below), where the
        # run has one: a helper that posts its steps, cached CPU tensors.
        self.steady: SteadySteps | None = None
        if (
            isinstance(producer, ProcessProducer)
            and spec.post_steps
            and isinstance(delivery, CpuDelivery)
            and delivery.cached
        ):
            self.steady = SteadySteps(
                ring=ring,
                delivery=delivery,
                producer=producer,
                pending=self.pending,
                steps_per_slot=spec.steps_per_slot,
                deliver_posted=self._deliver_posted,
            )

    @property
    def in_helper(self) -> bool:
        """Whether a helper process fills the ring."""
        return isinstance(self.producer, ProcessProducer)

    def get(self) -> tuple[ReadyStep | EndOfData, dict[str, torch.Tensor] | None]:
        """The next step and its tensors (None at the end of the run)."""
        if self.pending:
            ready, batch = self.pending.popleft()
            if isinstance(self.producer, ProcessProducer):
                self.producer.check_alive(ready.cursor)
            return ready, batch
        for slot in self.delivery.reclaim():
            hand_back(self.ring, slot)
        ready = self.producer.get()
        if isinstance(ready, EndOfData):
            return ready, None
        return ready, self._deliver(ready)

    def _deliver(self, ready: ReadyStep) -> dict[str, torch.Tensor]:
        """The tensors of the step ``ready`` names; a slot's further steps are queued."""
        per_slot = self.spec.steps_per_slot
        if per_slot == 1:
            return self.delivery.deliver(ready.slot)
        # The slot holds consecutive steps, rows in step order; each is
        # handed over as views of the slot's tensors, which keep the slot
        # held until the last of them is dropped. A run's last slot may hold
        # rows past its end, which are not steps.
        step_batch = self.layout.global_batch
        steps = per_slot if self.end is None else min(per_slot, (self.end - ready.cursor) // step_batch)
        first, *rest = self.delivery.deliver_steps(ready.slot, steps_per_slot=per_slot, steps=steps)
        for k, batch in enumerate(rest, start=1):
            self.pending.append(
                (
                    ReadyStep(
                        index=ready.index * per_slot + k,
                        cursor=ready.cursor + k * step_batch,
                        slot=ready.slot,
                        data_sha256="",
                    ),
                    batch,
                )
            )
        return first

    def _deliver_posted(self, slot: int) -> dict[str, torch.Tensor]:
        assert isinstance(self.producer, ProcessProducer)
        return self._deliver(self.producer.posted_step(slot))

    def counters(self) -> dict[str, Any]:
        """The producer's counters as last published."""
        return read_counters(self.ring.counters)

    def release(self) -> None:
        """Release the delivery and the ring (CPU batches the consumer holds stay valid)."""
        self.steady = None  # It holds this run's way to deliver: a cycle that would keep the ring mapped
        if self.delivery is not None and isinstance(self.delivery, CudaDelivery):
            # The consumer may still be copying host labels (views of
            # the pinned ring) to the device with non_blocking=True; the ring
            # is unregistered below. (Not run on a GPU yet.)
            torch.cuda.synchronize(self.delivery.device)
        self.delivery.close()
        self.ring.close()


class SteadySteps:
    """The plain steps of one run whose helper posts its steps and whose
    delivery hands over cached CPU tensors.

    Args:
        ring: the run's ring.
        delivery: its CPU delivery.
        producer: its helper.
        pending: the run's steps already delivered from a slot of several
            steps, not yet handed over (the run's own queue).
        steps_per_slot: steps a slot holds.
        deliver_posted: the run's way to hand over the steps of the slot a
            post names, after the post is taken (slots of several steps).
    """

    def __init__(
        self,
        *,
        ring: SharedRing,
        delivery: CpuDelivery,
        producer: ProcessProducer,
        pending: collections.deque[tuple[ReadyStep, dict[str, torch.Tensor]]],
        steps_per_slot: int,
        deliver_posted: Callable[[int], dict[str, torch.Tensor]],
    ) -> None:
        self._ring = ring
        self._num_slots = ring.num_slots
        self._lock_word = ring.helper_lock_word
        self._pid = producer.pid
        self._board = ring.board
        self._count = ring.board.count
        self._posts = ring.board.posts
        self._delivery = delivery
        self._held = delivery.held
        self._views = delivery.views
        self._max_held = delivery.max_held
        self._pending = pending
        self._steps_per_slot = steps_per_slot
        self._deliver_posted = deliver_posted
        self._reports = producer.reports
        # How long the last step served waited for its post.
        self.stall_s = 0.0

    def take(self) -> dict[str, torch.Tensor] | None:
        """The next step's tensors, or None when the step is not plain (nothing taken then)."""
        if self._lock_word[0] != self._pid:
            return None  # The helper may be gone; the full way asks the kernel
        pending = self._pending
        if pending:
            self.stall_s = 0.0
            return pending.popleft()[1]
        if self._delivery.done:
            return None
        held, views = self._held, self._views
        # Slots come back in the order they went out, one a step: the
        # oldest held goes back once the consumer dropped it. A consumer that
        # keeps an older batch fills ``held``; then a later slot may be free.
        if held and not views[held[0]].in_use():
            hand_back(self._ring, held.pop(0))
        elif len(held) >= self._max_held:
            for index in held[1:]:
                if not views[index].in_use():
                    held.remove(index)
                    hand_back(self._ring, index)
                    break
        if len(held) >= self._max_held:
            return None
        board = self._board
        taken = board.taken
        if self._count[0] == taken:
            if not self._wait_for_post():
                return None
        else:
            self.stall_s = 0.0
        slot = self._posts[taken % self._num_slots]
        slot_views = views[slot]
        if slot_views is None or slot_views.steps_per_slot != self._steps_per_slot:
            return None  # The slot's first time round: the full way makes its tensors
        board.taken = taken + 1
        if self._steps_per_slot != 1:
            return self._deliver_posted(slot)
        held.append(slot)
        return dict(slot_views.whole)

    def _wait_for_post(self) -> bool:
        """Sleep until the helper posts the next step (True, the wait in
        ``stall_s``), or until it sent something else or is gone (False)."""
        started = time.perf_counter()
        reports = self._reports
        try:
            while True:
                reports.sleep()
                if self._board.posted():
                    break
                if reports.sent():
                    return False  # An end or an error: the full way takes it
        except (EOFError, OSError):
            return False  # The helper is gone: the full way names it
        reports.done_waiting()
        self.stall_s = time.perf_counter() - started
        return True
