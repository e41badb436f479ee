"""The rank layouts a loader reads: one for its order, or one per phase of its schedule.

A ``RankLayout`` fixes a batch's shape (rows, seq_len) and so the ring's slot
layout; a schedule has one per phase, built when first needed and kept.
Everything here is arithmetic on the plan and the open streams: no threads,
no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from zephon_stream.loader.blocks.streams import StreamSource
from zephon_stream.loader.delivery.device import ring_slots, ring_wide_keys
from zephon_stream.loader.planning.memory import MemoryBound
from zephon_stream.loader.planning.rank_layout import RankLayout, build_order
from zephon_stream.loader.planning.schedule import local_batch_of, run_end_step
from zephon_stream.loader.ring.row_documents import PackingSpec
from zephon_stream.loader.ring.shared_ring import SharedRing, SlotLayout
from zephon_stream.plan import GlobalOrder, ScheduleOrder
from zephon_stream.plan.run_history import Skip, Stretch, continues, decode, encode, history_distance, last_stretch

# A step of few tokens costs the producer and the trainer about as much
# Python as a large one; below this many tokens a step, several consecutive
# steps share one ring slot (one assembly, one message), up to the cap.
SLOT_TOKENS = 16384
MAX_STEPS_PER_SLOT = 16


@dataclasses.dataclass(slots=True, kw_only=True)
class LayoutBook:
    """What every layout of one loader shares, and the layouts built so far.

    Attributes:
        sources: the open streams.
        weights: the streams' weights (a loader without a schedule).
        seed: order seed.
        world_size, rank: this rank's place.
        device: where batches go (fixes the ring's wide arrays and slots).
        host_keys: keys delivered on the host with CUDA.
        batch_layout: ``"rows"`` or ``"tokens"``, the shape of every delivery's
            per-token tensors (loader/delivery/widen.py).
        token_dtype: the ring's token dtype (``<u2`` or ``<u4``).
        prefetch_steps, num_fetch_threads, num_decode_threads: the pipeline's sizes.
        helper_bytes: the helper process's own footprint (0 without one).
        handover: whether producer runs may overlap (a helper taking over
            from threads, or a phase's run started ahead).
        share_slots: whether consecutive small steps may share a ring slot
            (not with CUDA delivery, an audit log or packing outputs, which
            take one step a slot).
        schedule: the schedule's order, or None.
        packing: cross-document targets and document outputs of every slot.
        history: the run's stretches and skips (plan/run_history.py), in the
            state; without a schedule they number the steps, which then
            continue across a resume at another global batch.
    """

    sources: Sequence[StreamSource]
    weights: tuple
    seed: int
    world_size: int
    rank: int
    device: torch.device
    host_keys: tuple[str, ...]
    token_dtype: str
    prefetch_steps: int
    num_fetch_threads: int
    num_decode_threads: int
    helper_bytes: int
    handover: bool = False
    share_slots: bool = True
    batch_layout: str = "rows"
    schedule: ScheduleOrder | None = None
    packing: PackingSpec = PackingSpec()
    phases: dict[int, RankLayout] = dataclasses.field(default_factory=dict)
    history: list[Stretch | Skip] = dataclasses.field(default_factory=list)

    @property
    def num_slots(self) -> int:
        """Slots of a ring."""
        return ring_slots(self.prefetch_steps, host_views=bool(self.host_keys))

    def steps_per_slot(self, layout: RankLayout) -> int:
        """Consecutive steps of ``layout`` one ring slot holds."""
        return self._steps_per_slot(layout.global_batch // self.world_size, layout.order.config.seq_len)

    def _steps_per_slot(self, rows: int, seq_len: int) -> int:
        if not self.share_slots or self.device.type != "cpu" or self.packing.outputs:
            # cu_seqlens describes a whole step's rows, so a step with
            # packing outputs cannot be cut out of a larger slot.
            return 1
        return max(1, min(MAX_STEPS_PER_SLOT, SLOT_TOKENS // (rows * seq_len)))

    def slot_layout_of(self, layout: RankLayout) -> SlotLayout:
        """The ring slot of ``layout``'s batches (``steps_per_slot`` steps of them)."""
        rows = layout.global_batch // self.world_size
        return self.slot_layout(rows * self.steps_per_slot(layout), layout.order.config.seq_len)

    def slot_layout(self, rows: int, seq_len: int) -> SlotLayout:
        """The ring slot of a batch of ``rows`` samples of ``seq_len``."""
        return SlotLayout(
            rows=rows,
            seq_len=seq_len,
            token_dtype=self.token_dtype,
            wide_keys=ring_wide_keys(self.device, self.host_keys),
            packing=self.packing,
        )

    def _layout(self, order: GlobalOrder, global_batch: int, **phase) -> RankLayout:
        rows, seq_len = global_batch // self.world_size, order.config.seq_len
        per_slot = self._steps_per_slot(rows, seq_len)
        slot = self.slot_layout(rows * per_slot, seq_len)
        return RankLayout(
            sources=self.sources,
            order=order,
            global_batch=global_batch,
            world_size=self.world_size,
            rank=self.rank,
            fetch_steps=self.prefetch_steps,
            num_fetch_threads=self.num_fetch_threads,
            num_decode_threads=self.num_decode_threads,
            ring_bytes=SharedRing.size_bytes(num_slots=self.num_slots, layout=slot),
            helper_bytes=self.helper_bytes,
            handover=self.handover,
            steps_per_slot=per_slot,
            best_fit=self.packing.best_fit,
            **phase,
        )

    def for_order(self, *, seq_len: int, global_batch: int, lanes: int | None, window: int | None) -> RankLayout:
        """The layout of a loader without a schedule (lanes default to the global batch)."""
        world = self.world_size
        order = build_order(
            self.sources,
            seed=self.seed,
            seq_len=seq_len,
            lanes=global_batch if lanes is None else lanes,
            window=0 if window is None else window,
            weights=self.weights,
            lanes_default=None
            if lanes is not None
            else (
                f"the global batch of {global_batch} (local_batch_size {global_batch // world} x world size {world}), "
                "which gives the lanes when lanes is not set; lower local_batch_size or seq_len"
            ),
        )
        return self._layout(order, global_batch)

    def for_phase(self, index: int) -> RankLayout:
        """The layout of phase ``index`` of the schedule (built once).

        Raises:
            ConfigError: the world size does not divide the phase's global batch.
        """
        layout = self.phases.get(index)
        if layout is None:
            assert self.schedule is not None
            phase = self.schedule.phases[index]
            local_batch_of(self.schedule, index, self.world_size)
            layout = self._layout(
                phase.order,
                phase.global_batch,
                start_position=phase.start_position,
                end_position=phase.end_position,
                addresses=self.schedule.sample_at,
                phase=index,
            )
            self.phases[index] = layout
        return layout

    def first_layout(
        self,
        *,
        seq_len: int | None,
        global_batch: int | None,
        lanes: int | None,
        window: int | None,
        max_memory_bytes: int | None,
    ) -> RankLayout | None:
        """Every layout the loader may read, built and checked against
        ``max_memory_bytes`` now; returns the one the cursor starts in (None:
        a schedule whose first phase this world size cannot read, refused at
        the first step).

        With a schedule the memory bound is the most any phase this
        world size can read needs; a phase it cannot read is refused on entry.

        Raises:
            ConfigError: a layout over ``max_memory_bytes``.
        """
        if self.schedule is None:
            layout = self.for_order(seq_len=seq_len, global_batch=global_batch, lanes=lanes, window=window)
            layout.check_memory(max_memory_bytes)
            return layout
        readable = self.readable_phases()
        for index in readable:
            self.for_phase(index).check_memory(max_memory_bytes)
        return self.for_phase(0) if 0 in readable else None

    def readable_phases(self) -> list[int]:
        """The phases whose global batch this world size divides."""
        assert self.schedule is not None
        return [p.index for p in self.schedule.phases if p.global_batch % self.world_size == 0]

    # ``current`` is the loader's layout: without a schedule, its order
    # is the whole order; with one, the schedule answers.

    def order_at(self, position: int, current: RankLayout) -> GlobalOrder:
        """The order read at ``position`` (with a schedule: its phase's)."""
        if self.schedule is None:
            return current.order
        return self.schedule.phase_at_position(position).order

    def step_of(self, position: int, current: RankLayout) -> int:
        """The global step at cursor ``position``: with a schedule the schedule's;
        without one, counted on from the run's last stretch (``P div B`` when it starts at 0)."""
        if self.schedule is None:
            stretch = last_stretch(self.history)
            if stretch is None or position < stretch.position:
                return position // current.global_batch
            return stretch.step + (position - stretch.position) // current.global_batch
        return self.schedule.step_of_position(position)

    def position_of_step(self, step: int, current: RankLayout) -> int:
        """The cursor at the start of global step ``step`` of this run (the inverse of ``step_of``)."""
        if self.schedule is None:
            stretch = last_stretch(self.history)
            if stretch is None:
                return step * current.global_batch
            return stretch.position + (step - stretch.step) * current.global_batch
        return self.schedule.position_of_step(step)

    def begin_history(self, position: int, global_batch: int, saved: list[str] | None = None) -> None:
        """The run's history as it starts at ``position``: the saved one (a resume's state, if it has one),
        and a new stretch unless reading on from the last one reaches this cursor at this batch."""
        entries = decode(saved) if saved else []
        stretch = last_stretch(entries)
        if self.schedule is not None:
            step = self.schedule.step_of_position(position)
        elif (
            stretch is not None
            and position >= stretch.position
            and not (position - stretch.position) % stretch.global_batch
        ):
            step = stretch.step + (position - stretch.position) // stretch.global_batch
        else:
            step = position // global_batch
        if not (
            continues(entries, step, position, history_distance(self.schedule)) and stretch.global_batch == global_batch
        ):
            entries.append(Stretch(step, position, global_batch))
        self.history = entries

    def skip(self, num_steps: int, position: int, current: RankLayout) -> int:
        """Record a skip of ``num_steps`` steps at ``position``; the cursor ``num_steps`` steps on."""
        step = self.step_of(position, current)
        target = self.position_of_step(step + num_steps, current) + position - self.position_of_step(step, current)
        self.history.append(Skip(step, num_steps))
        return target

    def progress(self, position: int, current: RankLayout) -> list[dict]:
        """Per-stream progress at ``position``, with its phase."""
        if self.schedule is None:
            return [entry | {"phase": 0} for entry in current.order.progress(position)]
        return self.schedule.progress(position)

    def state(self, position: int, current: RankLayout) -> dict:
        """The loader state at ``position``: version 1 without a schedule, 2 with one; both record the packing."""
        state = current.order.state(position) if self.schedule is None else self.schedule.state(position)
        return dataclasses.replace(state, packing=self.packing.rows, history=encode(self.history)).to_dict()

    def largest_bound(self) -> MemoryBound:
        """The memory bound of the phase (built so far) that needs the most."""
        return max((layout.memory_bound for layout in self.phases.values()), key=lambda bound: bound.total_bytes)


def run_end_position(book: LayoutBook, current: RankLayout, ends: dict) -> int | None:
    """The cursor a finite run ends at (``ends``: ``run_end_step``'s keywords), or None."""
    if all(ends[name] is None for name in ("max_steps", "max_epochs", "end_after_phase")):
        return None
    order = book.schedule
    if order is None:
        if ends["max_epochs"] is None:
            return book.position_of_step(ends["max_steps"], current)
        # A loader without a schedule reads the one-phase schedule of its order.
        order = ScheduleOrder.single(list(current.order.shapes), current.order.config, current.global_batch)
    return order.position_of_step(run_end_step(order, **ends))


def stop_position(layout: RankLayout, end: int | None) -> int | None:
    """Where reading ``layout`` stops: its own end (a phase's) or the run's ``end``, whichever comes first."""
    stops = [p for p in (end, layout.end_position) if p is not None]
    return min(stops) if stops else None
