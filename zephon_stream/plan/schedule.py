"""Data schedules: the global order when the mixture, batch, lanes or seq_len change at a step.

docs/ORDER.md ("Schedules") specifies it. A phase is today's ``GlobalOrder``
(its own seq_len, lanes, window and weights) read from its start cursor ``P0``
with, per stream, a *head* (the rest of the epoch it was in, ``plan/rest.py``)
and the epoch its own lane cut starts at. All of it is arithmetic on the start
steps and global batches, done once when the schedule is built; a query looks
the phase up by bisection. ``PhaseSlice`` is what a query of a phase's steps
returns (``schedule_order.ScheduleOrder.rank_slice``, ``rank_steps``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from zephon_stream.errors import ConfigError
from zephon_stream.plan.mixture import OrderConfig, Weight
from zephon_stream.plan.order import GlobalOrder
from zephon_stream.plan.rest import EpochRest, EpochSlots, LaneBase
from zephon_stream.plan.shape import StreamShape
from zephon_stream.plan.slicing import check_slice_args


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulePhase:
    """One phase of a schedule, as the plan sees it.

    Attributes:
        start_step: global step the phase starts at (the first phase: 0).
        global_batch: samples per step ``B`` in this phase.
        seq_len: tokens per sample input.
        lanes: lanes ``C`` (default: ``global_batch``).
        window: window-shuffle size (0 = one block's samples of each stream).
        weights: one weight per stream of the schedule; 0 = not read in this
            phase; empty = equal weights.
    """

    start_step: int
    global_batch: int
    seq_len: int
    lanes: int | None = None
    window: int = 0
    weights: tuple[Weight, ...] = ()

    @classmethod
    def from_dict(cls, data: dict, *, where: str = "phase") -> SchedulePhase:
        """Read a phase from plain values (a JSON schedule file, a config).

        Raises:
            ConfigError: not a dict, an unknown or missing key, or a non-int size.
        """
        if not isinstance(data, dict):
            raise ConfigError(f"{where}: expected an object with the phase's fields, got {data!r}")
        known = {"start_step", "global_batch", "seq_len", "lanes", "window", "weights"}
        unknown = sorted(set(data) - known)
        missing = sorted({"start_step", "global_batch", "seq_len"} - set(data))
        if unknown or missing:
            raise ConfigError(f"{where}: unknown keys {unknown}, missing keys {missing}")
        for name in ("start_step", "global_batch", "seq_len", "lanes", "window"):
            value = data.get(name, 0)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                raise ConfigError(f"{where}: {name} must be an int, got {value!r}")
        weights = data.get("weights", ())
        if not isinstance(weights, (list, tuple)):
            raise ConfigError(f"{where}: weights must be a list, got {weights!r}")
        return cls(**(data | {"weights": tuple(weights)}))

    @classmethod
    def from_order_config(cls, config: OrderConfig, global_batch: int) -> SchedulePhase:
        """The one phase from step 0 that reads what ``GlobalOrder(shapes, config)`` reads, at ``global_batch``."""
        return cls(
            start_step=0,
            global_batch=global_batch,
            seq_len=config.seq_len,
            lanes=config.lanes,
            window=config.window,
            weights=tuple(config.weights),
        )

    def order_config(self, seed: int) -> OrderConfig:
        """The ``OrderConfig`` of this phase's ``GlobalOrder``."""
        return OrderConfig(
            seed=seed,
            seq_len=self.seq_len,
            lanes=self.global_batch if self.lanes is None else self.lanes,
            window=self.window,
            weights=tuple(self.weights),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamCarry:
    """Where one stream stands at a cursor (docs/ORDER.md, "Stream progress").

    Attributes:
        epoch: the epoch in progress (the next one when ``rest`` is None).
        rest: the unread part of ``epoch`` when it is partly read, else None.
        samples: samples of this stream read so far, in total.
        samples_in_epoch: samples of ``epoch`` read so far (each counted at
            the seq_len it was read at, when the epoch spans a seq_len change).
    """

    epoch: int = 0
    rest: EpochRest | None = None
    samples: int = 0
    samples_in_epoch: int = 0


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class PhaseStream:
    """How one stream is read in one phase.

    Attributes:
        head: the rest of the epoch in progress, read first (None: none).
        head_steps: lane steps of the head, ``h``; its lanes are the
            consecutive runs of ``h`` samples of ``head``.
        first_epoch: the epoch this phase's own lane cut starts at.
        global_lanes: the global lanes of the stream in this phase.
        carry: where the stream stood when the phase began.
    """

    head: EpochRest | None
    head_steps: int
    first_epoch: int
    global_lanes: np.ndarray
    carry: StreamCarry


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Phase:
    """A built phase: its order and where it starts.

    Attributes:
        index: phase number.
        spec: the ``SchedulePhase`` it was built from.
        order: its ``GlobalOrder``.
        start_position: ``P0``, the global cursor at its first step.
        end_position: the cursor at its end (None for the last phase).
        streams: one ``PhaseStream`` per stream (None where the stream has no lane).
        carries: where each stream stood when the phase began (a stream
            without lanes keeps its carry through the phase).
    """

    index: int
    spec: SchedulePhase
    order: GlobalOrder
    start_position: int
    end_position: int | None
    streams: list[PhaseStream | None]
    carries: list[StreamCarry]

    @property
    def start_step(self) -> int:
        return self.spec.start_step

    @property
    def global_batch(self) -> int:
        return self.spec.global_batch


def check_phases(phases: list[SchedulePhase]) -> None:
    """Raise ``ConfigError`` unless the phases form a schedule."""
    if not phases:
        raise ConfigError("a schedule needs at least one phase")
    if phases[0].start_step != 0:
        raise ConfigError(f"phase 0: start_step must be 0, got {phases[0].start_step}")
    for k, phase in enumerate(phases):
        if phase.global_batch < 1:
            raise ConfigError(f"phase {k}: global_batch must be >= 1, got {phase.global_batch}")
        if k and phase.start_step <= phases[k - 1].start_step:
            raise ConfigError(
                f"phase {k}: start_step {phase.start_step} is not after phase {k - 1}'s "
                f"start_step {phases[k - 1].start_step}"
            )


def enter_phase(carry: StreamCarry, order: GlobalOrder, stream: int, global_lanes: np.ndarray) -> PhaseStream:
    """How a stream that stands at ``carry`` is read in a phase with ``order``."""
    rest, lanes = carry.rest, global_lanes.size
    if rest is not None and rest.seq_len != order.config.seq_len:
        slots = EpochSlots.of(order.shapes[stream], order.config.seq_len)
        rest = rest.at_seq_len(slots, seed=order.config.seed, stream=stream)
    if rest is None:
        return PhaseStream(head=None, head_steps=0, first_epoch=carry.epoch, global_lanes=global_lanes, carry=carry)
    # The rest is cut into equal lanes like any epoch; its last
    # ``total mod lanes`` samples are not read in this epoch.
    steps = rest.total // lanes
    return PhaseStream(
        head=rest if steps else None,
        head_steps=steps,
        first_epoch=carry.epoch + 1,
        global_lanes=global_lanes,
        carry=carry,
    )


def carry_after(phase: Phase, stream: int, positions: int) -> StreamCarry:
    """Where ``stream`` stands after ``positions`` positions of ``phase``."""
    entry = phase.streams[stream]
    if entry is None:
        return phase.carries[stream]
    lanes = phase.order.lanes
    done, extra = divmod(positions, lanes)
    steps = done + (entry.global_lanes < extra)
    read = int(steps.sum())
    h, carry = entry.head_steps, entry.carry
    if done < h:
        # The head epoch is still in progress: lane j read [j h, j h + steps_j).
        first = np.arange(steps.size, dtype=np.int64) * h
        rest = entry.head.select(first + steps, first + h)
        return StreamCarry(
            epoch=carry.epoch,
            rest=rest,
            samples=carry.samples + read,
            samples_in_epoch=carry.samples_in_epoch + read,
        )
    m = phase.order.streams[stream].lane_length
    epoch = entry.first_epoch + (done - h) // m
    taken = steps - h - (epoch - entry.first_epoch) * m
    if not taken.any():
        return StreamCarry(epoch=epoch, samples=carry.samples + read)
    base = LaneBase(order=phase.order, stream=stream, epoch=epoch, global_lanes=entry.global_lanes)
    first = np.arange(steps.size, dtype=np.int64) * m
    return StreamCarry(
        epoch=epoch,
        rest=EpochRest.from_ranges(base, first + taken, first + m),
        samples=carry.samples + read,
        samples_in_epoch=int(taken.sum()),
    )


def build_phases(shapes: list[StreamShape], specs: list[SchedulePhase], seed: int) -> list[Phase]:
    """Build every phase, with the carry of every stream at its start.

    Raises:
        ConfigError: a bad schedule, or a phase whose order is impossible.
    """
    check_phases(specs)
    current = [StreamCarry() for _ in shapes]
    phases: list[Phase] = []
    position = 0
    for k, spec in enumerate(specs):
        lanes_default = (
            None
            if spec.lanes is not None
            else (
                f"the phase's global batch of {spec.global_batch}, which gives its lanes when it sets none; "
                "lower its global_batch or seq_len"
            )
        )
        try:
            order = GlobalOrder(shapes, spec.order_config(seed), lanes_default=lanes_default)
        except ConfigError as exc:
            raise ConfigError(f"phase {k} (start step {spec.start_step}): {exc}") from exc
        length = None
        if k + 1 < len(specs):
            length = (specs[k + 1].start_step - spec.start_step) * spec.global_batch
        streams: list[PhaseStream | None] = []
        for s in range(len(shapes)):
            lanes = np.flatnonzero(order.lane_stream == s).astype(np.int64)
            streams.append(enter_phase(current[s], order, s, lanes) if lanes.size else None)
        phase = Phase(
            index=k,
            spec=spec,
            order=order,
            start_position=position,
            end_position=None if length is None else position + length,
            streams=streams,
            carries=current,
        )
        phases.append(phase)
        if length is not None:
            current = [
                carry_after(phase, s, length) if streams[s] is not None else current[s] for s in range(len(shapes))
            ]
            position += length
    return phases


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class PhaseSlice:
    """One rank's share of one or more consecutive steps of one phase.

    Attributes:
        phase: phase index.
        first_step: the global step of the first row of ``positions``.
        positions: global positions, ``[rows]`` for one step or ``[steps, rows]``.
        stream, block, sample: the address of each position (``int64``, same shape).
        seq_len: the phase's seq_len (tokens of a sample: ``seq_len + 1``).
    """

    phase: int
    first_step: int
    positions: np.ndarray
    stream: np.ndarray
    block: np.ndarray
    sample: np.ndarray
    seq_len: int


def check_phase_slice(phase: Phase, local: int, world_size: int, rank: int) -> None:
    """``check_slice_args`` for a step of ``phase``, naming the phase on error."""
    try:
        check_slice_args(local, phase.global_batch, world_size, rank)
    except ConfigError as exc:
        raise ConfigError(f"phase {phase.index} (start step {phase.start_step}): {exc}") from exc
