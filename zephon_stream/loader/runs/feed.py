"""The trainer's side of one rank's batches: producer runs, each with its ring and delivery.

A producer run reads one stretch of the order (a whole run, one phase of a
schedule, or what is left of either from a cursor on) into a ring whose slot
layout fits that stretch's batch shape. ``BatchFeed`` starts runs, may start
the next one ahead of the cursor it begins at (its first blocks fetched and
its ring filled before the consumer gets there), and switches to it at that
cursor; the loader (loader/front/steps.py) decides where runs start and end.

How a start stays off the interpreter's start-up (docs/ARCHITECTURE.md,
"Starting fast"): with ``pipeline="process"`` a helper process is started
when the feed is made and loads while the trainer works. A run that begins
before a helper is ready begins on threads of this process; once the helper
reports ready, it is given the rest of the run from a cursor some steps
ahead, fills a ring of its own from there, and the feed switches to it at
that cursor. The order is a pure function of the cursor, so the batches are
the same whichever producer made them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import torch

from zephon_stream.errors import HelperProcessError
from zephon_stream.loader.blocks.streams import Stream
from zephon_stream.loader.delivery.device import CpuDelivery, CudaDelivery, make_delivery
from zephon_stream.loader.planning.rank_layout import RankLayout
from zephon_stream.loader.producer.pipeline import EndOfData, ReadyStep
from zephon_stream.loader.producer.process_producer import ProcessProducer
from zephon_stream.loader.producer.spec import ProducerSpec, ThreadProducer
from zephon_stream.loader.ring.shared_ring import SharedRing
from zephon_stream.loader.ring.step_board import board_is_safe
from zephon_stream.loader.runs.phase_layouts import LayoutBook
from zephon_stream.loader.runs.producer_run import ProducerRun, SteadySteps
from zephon_stream.loader.runs.retiring import RetiringRuns
from zephon_stream.storage.urls import url_scheme

# How long before the cursor reaches it a run is started: long enough
# for a producer to fetch and decode its first blocks (from S3 too) and fill
# its ring; counted in the consumer's own steps, as timed.
LEAD_S = 0.3
_MAX_LEAD_STEPS = 4096
_HELPER_POLL_S = 0.001  # How often a run on threads asks whether the starting helper is ready


class BatchFeed:
    """The producer runs of one rank.

    Args:
        book: the loader's layouts (device, host keys, batch layout, ring slots, pipeline sizes).
        streams: the user's streams.
        storage_options: fsspec options (to the helper over its socket).
        pipeline_mode: ``"process"`` or ``"threads"``.
        helper_nice: niceness the helper process adds to itself.
        first_layout: the layout the first run reads: its ring and delivery
            are made now, then the helper is started.
        node_cache_root: where the ranks of this node share metadata (the
            helper process opens it too), or None.
    """

    def __init__(
        self,
        *,
        book: LayoutBook,
        streams: Sequence[Stream],
        storage_options: dict[str, Any] | None,
        pipeline_mode: str,
        helper_nice: int = 0,
        first_layout: RankLayout | None = None,
        node_cache_root: str | None = None,
    ) -> None:
        self._book = book
        self._node_cache_root = node_cache_root
        self._streams = tuple(streams)
        self._sources = list(book.sources)
        self._storage_options = storage_options
        self._pipeline_mode = pipeline_mode
        self._helper_nice = helper_nice
        self._schemes = tuple(sorted({url_scheme(stream.url) for stream in self._streams} - {"file", "local"}))
        self._run: ProducerRun | None = None
        self._next: ProducerRun | None = None
        self._prepared: tuple[SharedRing, CpuDelivery | CudaDelivery] | None = None
        self._spare_helper: ProcessProducer | None = None
        # The runs left behind, stopping off the consumer's thread
        # (loader/runs/retiring.py).
        self._retired = RetiringRuns()
        self._last_get_s: float | None = None
        self._quiet = False
        # The short way to the next plain step, while the feed is quiet
        # (``SteadySteps``, loader/runs/producer_run.py).
        self.steady: SteadySteps | None = None
        self._step_s = 0.0
        self._helper_polled_s = 0.0
        if first_layout is not None:
            self.prepare(first_layout)
        # A helper started now loads its interpreter while the trainer
        # builds its model; runs started before it is ready begin on threads.
        self._spare_helper = self._new_helper() if pipeline_mode == "process" else None

    def _new_helper(self) -> ProcessProducer:
        """A helper process starting now, loading the client libraries of the loader's streams."""
        return ProcessProducer(nice=self._helper_nice, schemes=self._schemes)

    # -- what the loader reads ---------------------------------------------------

    @property
    def ring(self) -> SharedRing | None:
        """The ring of the run in progress (before the first run: the one prepared for it)."""
        if self._run is not None:
            return self._run.ring
        return self._prepared[0] if self._prepared is not None else None

    @property
    def delivery(self) -> CpuDelivery | CudaDelivery | None:
        """The delivery of the run in progress."""
        return self._run.delivery if self._run is not None else None

    @property
    def producer(self) -> ProcessProducer | ThreadProducer | None:
        """The producer of the run in progress, or None."""
        return self._run.producer if self._run is not None else None

    @property
    def next_start(self) -> int | None:
        """The cursor the run started ahead begins at, or None."""
        return self._next.start if self._next is not None else None

    def counters(self) -> dict[str, Any]:
        """The producer counters of the whole run (loader/producer/stats.py ``RunTotals``)."""
        runs = [run for run in (self._run, self._next) if run is not None] + self._retired.uncounted
        return self._retired.totals.totals([run.counters() for run in runs], stores=[s.store for s in self._sources])

    def lead_steps(self, layout: RankLayout) -> int:
        """Steps before its first cursor a run is started: ``LEAD_S`` of the
        consumer's steps, and never fewer than the ring's slots."""
        floor = self._book.num_slots + 2
        if self._step_s <= 0:
            return floor
        return max(floor, min(_MAX_LEAD_STEPS, math.ceil(LEAD_S / self._step_s)))

    # -- runs ------------------------------------------------------------------------

    def prepare(self, layout: RankLayout, *, steps_per_slot: int | None = None) -> None:
        """Make the ring and delivery of the next run, which reads ``layout``
        (``steps_per_slot`` steps a slot, by default the book's), now."""
        per_slot = self._book.steps_per_slot(layout) if steps_per_slot is None else steps_per_slot
        rows = layout.global_batch // self._book.world_size
        slot_layout = self._book.slot_layout(rows * per_slot, layout.order.config.seq_len)
        if self._prepared is not None:
            if self._prepared[0].layout == slot_layout:
                return
            self._release_prepared()
        ring = SharedRing.create(num_slots=self._book.num_slots, layout=slot_layout)
        try:
            self._prepared = (
                ring,
                make_delivery(
                    self._book.device, ring=ring, host_keys=self._book.host_keys, batch_layout=self._book.batch_layout
                ),
            )
        except BaseException:
            ring.close()
            raise

    def _release_prepared(self) -> None:
        if self._prepared is not None:
            ring, delivery = self._prepared
            self._prepared = None
            delivery.close()
            ring.close()

    def start(
        self,
        layout: RankLayout,
        *,
        start: int,
        start_step: int,
        num_steps: int | None,
        hash_data: bool,
        more_runs: bool = False,
    ) -> None:
        """Start a run of ``num_steps`` steps of ``layout`` from cursor ``start``
        (global step ``start_step``); ``more_runs``: another run follows this one."""
        assert self._run is None and self._next is None
        self._run = self._new_run(
            layout, start=start, start_step=start_step, num_steps=num_steps, hash_data=hash_data, more_runs=more_runs
        )

    def start_ahead(
        self,
        layout: RankLayout,
        *,
        start: int,
        start_step: int,
        num_steps: int | None,
        hash_data: bool,
        more_runs: bool = False,
    ) -> None:
        """Start the run that follows the current one at cursor ``start`` now;
        :meth:`switch` moves to it there."""
        assert self._run is not None and self._next is None
        self._next = self._new_run(
            layout, start=start, start_step=start_step, num_steps=num_steps, hash_data=hash_data, more_runs=more_runs
        )

    def switch(self, position: int) -> bool:
        """Move to the run started ahead if it begins at ``position``; whether it did."""
        if self._next is None or self._next.start != position:
            return False
        self._retired.retire(self._run, wait=False)
        self._run, self._next = self._next, None
        return True

    def get(self, position: int) -> tuple[ReadyStep | EndOfData, dict[str, torch.Tensor] | None]:
        """The step at cursor ``position`` and its tensors (None at the end of the run).

        Raises:
            HelperProcessError: a helper died (the run's, or one starting).
        """
        run = self._run
        assert run is not None
        if not self._quiet:
            run = self._watch(run, position)
            self.steady = run.steady if self._quiet else None
        try:
            return run.get()
        except HelperProcessError:
            raise
        except Exception:
            if run.spec.steps_per_slot == 1:
                raise
        # A slot of several steps failed as a whole (a corrupt block,
        # storage that stayed down). Its steps are read again one a slot, so
        # the good ones come and the error is raised at the step that needed
        # the block, as always.
        batch = run.layout.global_batch
        self._quiet, self.steady = False, None
        self._run = self._new_run(
            run.layout,
            start=position,
            start_step=run.spec.start_step + (position - run.start) // batch,
            num_steps=None if run.end is None else (run.end - position) // batch,
            hash_data=run.spec.hash_data,
            more_runs=False,
            steps_per_slot=1,
        )
        self._retired.retire(run, wait=True)
        return self._run.get()

    def _watch(self, run: ProducerRun, position: int) -> ProducerRun:
        """Before a step: time the consumer, settle retired runs, switch to a
        run started ahead or hand this one over; the run to read from."""
        now = time.perf_counter()
        if self._last_get_s is not None:
            # The consumer's step, smoothed; it sets how far ahead runs start.
            self._step_s = (
                0.8 * self._step_s + 0.2 * (now - self._last_get_s) if self._step_s else now - self._last_get_s
            )
        self._last_get_s = now
        if not self._retired.settled:
            self._retired.settle(wait=False)
        if self._next is not None and position == self._next.start:
            self.switch(position)
            run = self._run
        elif (
            self._next is None
            and not run.in_helper
            and self._spare_helper is not None
            and now - self._helper_polled_s >= _HELPER_POLL_S
        ):
            # Asking a starting helper costs a failed recv (~12 us);
            # at tiny steps, asked every step, that was half the step.
            self._helper_polled_s = now
            self._hand_over(run, position)
        # A run in the helper with no schedule and nothing left to
        # settle needs no watching until the loader stops or seeks.
        self._quiet = run.in_helper and self._next is None and self._book.schedule is None and self._retired.settled
        return run

    def _hand_over(self, run: ProducerRun, position: int) -> None:
        """A helper that has become ready takes the rest of a run on threads
        from a cursor ahead of ``position``."""
        if not self._spare_helper.ready():
            return
        batch, slot_batch = run.layout.global_batch, run.spec.slot_batch
        ahead = position + self.lead_steps(run.layout) * batch - run.start
        takeover = run.start + -(-ahead // slot_batch) * slot_batch  # At a slot boundary of the run
        end = run.end
        if end is not None and takeover >= end:
            return  # This run ends first; the next run starts in the helper
        spec = run.spec
        num_steps = None if end is None else (end - takeover) // batch
        start_step = spec.start_step + (takeover - spec.start) // batch
        self._next = self._new_run(
            run.layout,
            start=takeover,
            start_step=start_step,
            num_steps=num_steps,
            hash_data=spec.hash_data,
            more_runs=run.more_runs,
        )
        run.producer.end_at((takeover - run.start) // slot_batch)
        run.end = takeover

    def _new_run(
        self,
        layout: RankLayout,
        *,
        start: int,
        start_step: int,
        num_steps: int | None,
        hash_data: bool,
        more_runs: bool,
        steps_per_slot: int | None = None,
    ) -> ProducerRun:
        book = self._book
        per_slot = 1 if hash_data else book.steps_per_slot(layout) if steps_per_slot is None else steps_per_slot
        if num_steps is not None:
            per_slot = max(1, min(per_slot, num_steps))
        self.prepare(layout, steps_per_slot=per_slot)
        assert self._prepared is not None
        (ring, delivery), self._prepared = self._prepared, None
        spec = ProducerSpec(
            layout=layout,
            streams=self._streams,
            metadata=tuple(s.metadata for s in self._sources),
            storage_options=self._storage_options,
            start=start,
            num_steps=num_steps,
            seq_len=layout.order.config.seq_len,
            prefetch_steps=book.prefetch_steps,
            num_fetch_threads=book.num_fetch_threads,
            num_decode_threads=book.num_decode_threads,
            hash_data=hash_data,
            num_slots=ring.num_slots,
            slot_layout=ring.layout,
            start_step=start_step,
            helper_nice=self._helper_nice,
            steps_per_slot=per_slot,
            # The audit log's digests travel with their steps over the socket.
            post_steps=board_is_safe() and not hash_data,
            node_cache_root=self._node_cache_root,
        )
        ring.returned[:] = 1
        end = None if num_steps is None else start + num_steps * layout.global_batch
        try:
            producer = self._producer(spec, ring, more_runs=more_runs)
        except BaseException:
            delivery.close()
            ring.close()
            raise
        run = ProducerRun(
            ring=ring, delivery=delivery, producer=producer, layout=layout, start=start, end=end, spec=spec
        )
        run.more_runs = more_runs
        return run

    def _producer(self, spec: ProducerSpec, ring: SharedRing, *, more_runs: bool) -> ProcessProducer | ThreadProducer:
        helper = self._spare_helper
        if helper is None or not helper.ready():
            if self._pipeline_mode == "process" and helper is None:
                self._spare_helper = self._new_helper()
            return ThreadProducer(spec, sources=self._sources, ring=ring)
        helper.start(spec, ring=ring)
        # The next run (a phase, a seek) gets a helper loaded meanwhile.
        self._spare_helper = self._new_helper() if more_runs else None
        return helper

    def stop(self) -> None:
        """Stop every run, the one in progress and one started ahead (idempotent)."""
        self._quiet = False
        self.steady = None
        next_run, self._next = self._next, None
        run, self._run = self._run, None
        self._retired.retire(next_run, wait=True)
        self._retired.retire(run, wait=True)
        self._retired.settle(wait=True)
        self._last_get_s = None

    def close(self) -> None:
        """Stop every run and helper, waiting for each (idempotent)."""
        self.stop()
        if self._spare_helper is not None:
            self._spare_helper.close()
            self._spare_helper = None
        self._retired.close()
        self._release_prepared()
