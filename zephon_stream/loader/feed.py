"""The trainer's side of one rank's batches: the ring, its delivery and the producer filling it.

A producer run reads one stretch of the order (a whole run, or one phase of
a schedule) into a ring whose slot layout fits that stretch's batch shape.
``BatchFeed`` starts and stops those runs and swaps the ring when the next
stretch's shape differs; the loader (loader/api.py) decides where runs start
and end.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from zephon_stream.loader.device import CpuDelivery, CudaDelivery, make_delivery
from zephon_stream.loader.layout import RankLayout
from zephon_stream.loader.layouts import LayoutBook
from zephon_stream.loader.pipeline import EndOfData, ReadyStep, hand_back, reset_returned
from zephon_stream.loader.process import ProcessProducer
from zephon_stream.loader.producer import ProducerSpec, ThreadProducer
from zephon_stream.loader.ring import SharedRing, SlotLayout
from zephon_stream.loader.stats import RunTotals, read_counters
from zephon_stream.loader.streams import Stream


class BatchFeed:
    """Ring, delivery and producer of one rank.

    Args:
        book: the loader's layouts (device, host keys, ring slots, pipeline sizes).
        streams: the user's streams.
        storage_options: fsspec options (to the helper over its socket).
        pipeline_mode: ``"process"`` or ``"threads"``.
        helper_nice: niceness the helper process adds to itself.
    """

    def __init__(
        self,
        *,
        book: LayoutBook,
        streams: Sequence[Stream],
        storage_options: dict[str, Any] | None,
        pipeline_mode: str,
        helper_nice: int = 0,
    ) -> None:
        self._device = book.device
        self._host_keys = book.host_keys
        self._num_slots = book.num_slots
        self._streams = tuple(streams)
        self._sources = list(book.sources)
        self._storage_options = storage_options
        self._pipeline_mode = pipeline_mode
        self._helper_nice = helper_nice
        self._sizes = (book.prefetch_steps, book.num_fetch_threads, book.num_decode_threads)
        self.ring: SharedRing | None = None
        self.delivery: CpuDelivery | CudaDelivery | None = None
        self.producer: ProcessProducer | ThreadProducer | None = None
        self._totals = RunTotals()
        # NOTE: a helper started now loads its interpreter while the trainer
        # builds its model; the first producer run takes it (later runs, after
        # a seek or at a phase boundary, start their own).
        self._spare_helper = ProcessProducer() if pipeline_mode == "process" else None

    def open_ring(self, slot_layout: SlotLayout) -> None:
        """Use a ring of ``slot_layout`` (a new one unless the current one has it).

        CPU batches the consumer holds from a replaced ring stay valid: they
        keep its mapping until they are dropped.
        """
        if self.ring is not None and self.ring.layout == slot_layout:
            return
        assert self.producer is None
        if self.delivery is not None and self._device.type == "cuda":
            # NOTE: the consumer may still be copying host labels (views of
            # the pinned ring) to the device with non_blocking=True; the ring
            # is unregistered below. Once per phase boundary, so the wait costs
            # nothing per step. (Not run on a GPU yet.)
            torch.cuda.synchronize(self._device)
        self._release_ring()
        self.ring = SharedRing.create(num_slots=self._num_slots, layout=slot_layout)
        self.delivery = make_delivery(self._device, ring=self.ring, host_keys=self._host_keys)

    def start(
        self, layout: RankLayout, *, start: int, start_step: int, num_steps: int | None, hash_data: bool
    ) -> None:
        """Start a producer run of ``num_steps`` steps of ``layout`` from cursor ``start`` (global step ``start_step``)."""
        assert self.producer is None and self.ring is not None and self.delivery is not None
        prefetch_steps, num_fetch_threads, num_decode_threads = self._sizes
        spec = ProducerSpec(
            layout=layout,
            streams=self._streams,
            manifests=tuple(s.manifest for s in self._sources),
            storage_options=self._storage_options,
            start=start,
            num_steps=num_steps,
            seq_len=layout.order.config.seq_len,
            prefetch_steps=prefetch_steps,
            num_fetch_threads=num_fetch_threads,
            num_decode_threads=num_decode_threads,
            hash_data=hash_data,
            num_slots=self.ring.num_slots,
            slot_layout=self.ring.layout,
            start_step=start_step,
            helper_nice=self._helper_nice,
        )
        reset_returned(self.ring, self.delivery.settle())
        if self._pipeline_mode == "threads":
            self.producer = ThreadProducer(spec, sources=self._sources, ring=self.ring)
        else:
            producer, self._spare_helper = self._spare_helper or ProcessProducer(), None
            producer.start(spec, ring=self.ring)
            self.producer = producer

    def get(self) -> tuple[ReadyStep | EndOfData, dict[str, torch.Tensor] | None]:
        """The next step and its tensors (None at the end of the run)."""
        assert self.producer is not None and self.ring is not None and self.delivery is not None
        for slot in self.delivery.reclaim():
            hand_back(self.ring, slot)
        ready = self.producer.get()
        if isinstance(ready, EndOfData):
            return ready, None
        return ready, self.delivery.deliver(ready.slot)

    def stop(self) -> None:
        """Stop the producer run, if any (idempotent)."""
        if self.producer is not None:
            self.producer.close()
            self.producer = None
            # NOTE: the producer is gone, so its counters are final; the next
            # run on this ring publishes its own from zero.
            self._totals.fold(read_counters(self.ring.counters))
            self.ring.counters[:] = 0

    def counters(self) -> dict[str, Any]:
        """The producer counters of the whole run (loader/stats.py ``RunTotals``)."""
        running = [read_counters(self.ring.counters)] if self.producer is not None else []
        return self._totals.totals(running)

    def close(self) -> None:
        """Stop the producer; release the delivery and the ring (idempotent)."""
        self.stop()
        if self._spare_helper is not None:
            self._spare_helper.close()
            self._spare_helper = None
        self._release_ring()

    def _release_ring(self) -> None:
        if self.delivery is not None:
            self.delivery.close()
            self.delivery = None
        if self.ring is not None:
            self.ring.close()
            self.ring = None
