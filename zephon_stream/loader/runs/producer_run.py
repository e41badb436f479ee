"""One producer run as the trainer sees it: its ring, delivery and producer, and the cursors it covers.

A run hands its steps over one at a time. Where consecutive small steps
share a slot (loader/runs/phase_layouts.py ``steps_per_slot``), each is handed
over as views of the slot's tensors; the slot goes back to the producer once
every view is dropped.
"""

from __future__ import annotations

import collections
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
from zephon_stream.loader.runs.steady import SteadySteps


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
        self.more_runs = False  # NOTE: another run follows (a helper taking this one over starts a spare)
        # NOTE: steps delivered from a slot of several, not handed over yet.
        self.pending: collections.deque[tuple[ReadyStep, dict[str, torch.Tensor]]] = collections.deque()
        # NOTE: the short way to a plain step (loader/runs/steady.py), where the
        # run has one: a helper that posts its steps, cached CPU tensors.
        self.steady: SteadySteps | None = None
        if isinstance(producer, ProcessProducer) and spec.post_steps and isinstance(delivery, CpuDelivery) and delivery.cached:
            self.steady = SteadySteps(ring=ring, delivery=delivery, producer=producer, pending=self.pending,
                                      steps_per_slot=spec.steps_per_slot, deliver_posted=self._deliver_posted)  # fmt: skip

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
        # NOTE: the slot holds consecutive steps, rows in step order; each is
        # handed over as views of the slot's tensors, which keep the slot
        # held until the last of them is dropped. A run's last slot may hold
        # rows past its end, which are not steps.
        step_batch = self.layout.global_batch
        steps = per_slot if self.end is None else min(per_slot, (self.end - ready.cursor) // step_batch)
        first, *rest = self.delivery.deliver_steps(ready.slot, steps_per_slot=per_slot, steps=steps)
        for k, batch in enumerate(rest, start=1):
            self.pending.append((ReadyStep(index=ready.index * per_slot + k, cursor=ready.cursor + k * step_batch,
                                           slot=ready.slot, data_sha256=""), batch))  # fmt: skip
        return first

    def _deliver_posted(self, slot: int) -> dict[str, torch.Tensor]:
        assert isinstance(self.producer, ProcessProducer)
        return self._deliver(self.producer.posted_step(slot))

    def counters(self) -> dict[str, Any]:
        """The producer's counters as last published."""
        return read_counters(self.ring.counters)

    def release(self) -> None:
        """Release the delivery and the ring (CPU batches the consumer holds stay valid)."""
        self.steady = None  # NOTE: it holds this run's way to deliver: a cycle that would keep the ring mapped
        if self.delivery is not None and isinstance(self.delivery, CudaDelivery):
            # NOTE: the consumer may still be copying host labels (views of
            # the pinned ring) to the device with non_blocking=True; the ring
            # is unregistered below. (Not run on a GPU yet.)
            torch.cuda.synchronize(self.delivery.device)
        self.delivery.close()
        self.ring.close()
