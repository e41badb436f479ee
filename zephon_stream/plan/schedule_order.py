"""``ScheduleOrder``: the global order of a schedule, queried by step or by cursor.

A loader plans with it per step::

    order = ScheduleOrder(shapes, [SchedulePhase(start_step=0, global_batch=512, seq_len=2048),
                                   SchedulePhase(start_step=90_000, global_batch=1024,
                                                 seq_len=4096, weights=("1", "1"))], seed=0)
    for piece in order.rank_steps(step, 8, world_size, rank):   # one PhaseSlice per phase
        piece.phase, piece.first_step, piece.positions   # [steps, B_k / W]
        piece.stream, piece.block, piece.sample          # the sample addresses
    state = order.state(cursor)                # ScheduleState; .to_dict()
    ScheduleState.from_dict(d).validate(order) # refuses a changed phase that has begun
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import numpy as np

from zephon_stream.errors import ConfigError
from zephon_stream.plan.mixture import OrderConfig
from zephon_stream.plan.order import SMALL_BATCH
from zephon_stream.plan.schedule import (
    Phase,
    PhaseSlice,
    SchedulePhase,
    StreamCarry,
    build_phases,
    carry_after,
    check_phase_slice,
)
from zephon_stream.plan.schedule_state import ScheduleState, phase_record, stream_record
from zephon_stream.plan.shape import StreamShape
from zephon_stream.plan.slicing import rank_positions


class ScheduleOrder:
    """The global order of a schedule of phases, as a pure function of the cursor.

    Args:
        shapes: one ``StreamShape`` per stream of the schedule, in key order
            (a stream's index keys its permutations; append new streams).
        phases: the phases, by increasing ``start_step``, the first at 0.
        seed: order seed, for every phase.

    Raises:
        ConfigError: a bad schedule or an impossible phase, named by index.
    """

    def __init__(self, shapes: list[StreamShape], phases: Sequence[SchedulePhase], *, seed: int = 0) -> None:
        self.shapes = list(shapes)
        self.seed = seed
        self.phases: list[Phase] = build_phases(self.shapes, list(phases), seed)
        self._start_steps = [p.start_step for p in self.phases]
        self._start_positions = [p.start_position for p in self.phases]
        # Per phase, per stream: head lane steps, first epoch of its own
        # cut, lane length; arrays so a query indexes them by stream.
        self._per_stream = []
        self._per_stream_lists = []
        for phase in self.phases:
            h = np.array([e.head_steps if e else 0 for e in phase.streams], dtype=np.int64)
            first = np.array([e.first_epoch if e else 0 for e in phase.streams], dtype=np.int64)
            m = np.array([p.lane_length for p in phase.order.streams], dtype=np.int64)
            self._per_stream.append((h, first, m))
            lists = (
                h.tolist(),
                first.tolist(),
                m.tolist(),
                phase.order.lane_stream.tolist(),
                phase.order.lane_index.tolist(),
            )
            self._per_stream_lists.append(lists)

    def __reduce__(self) -> tuple:
        # The built phases hold closures (epoch heads) that do not
        # pickle; a schedule travels as its inputs and is rebuilt (the same
        # arithmetic, so the same order) where it lands, e.g. a helper process.
        return (build_schedule_order, (self.shapes, [p.spec for p in self.phases], self.seed))

    @classmethod
    def single(cls, shapes: list[StreamShape], config: OrderConfig, global_batch: int) -> ScheduleOrder:
        """The one-phase schedule that reads exactly what ``GlobalOrder(shapes, config)`` reads."""
        return cls(shapes, [SchedulePhase.from_order_config(config, global_batch)], seed=config.seed)

    # -- where a step or cursor falls --

    def phase_at_step(self, step: int) -> Phase:
        """The phase global step ``step`` belongs to."""
        if step < 0:
            raise ConfigError(f"step must be >= 0, got {step}")
        return self.phases[bisect.bisect_right(self._start_steps, step) - 1]

    def phase_at_position(self, position: int) -> Phase:
        """The phase the sample at global cursor ``position`` belongs to."""
        if position < 0:
            raise ConfigError(f"position must be >= 0, got {position}")
        return self.phases[bisect.bisect_right(self._start_positions, position) - 1]

    def position_of_step(self, step: int) -> int:
        """The cursor ``P`` at the start of global step ``step``."""
        phase = self.phase_at_step(step)
        return phase.start_position + (step - phase.start_step) * phase.global_batch

    def step_of_position(self, position: int) -> int:
        """The global step the cursor ``position`` is in (its start, if on a boundary)."""
        phase = self.phase_at_position(position)
        return phase.start_step + (position - phase.start_position) // phase.global_batch

    # -- addresses --

    def sample_at(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(stream, block, sample)`` at global positions, shaped like ``positions``.

        The sample's tokens are ``[sample * L, sample * L + L + 1)`` of the block,
        with ``L`` the seq_len of the phase the position falls in.
        """
        positions = np.asarray(positions, dtype=np.int64)
        if positions.size and int(positions.min()) < 0:
            raise ConfigError(f"positions must be >= 0, got {int(positions.min())}")
        flat = positions.ravel()
        which = np.searchsorted(np.asarray(self._start_positions), flat, side="right") - 1
        if len(self.phases) == 1 or (which.size and which.min() == which.max()):
            out = self._phase_addresses(self.phases[int(which[0]) if which.size else 0], flat)
            return tuple(a.reshape(positions.shape) for a in out)
        stream, block, sample = (np.empty_like(flat) for _ in range(3))
        for k in np.unique(which).tolist():
            sel = np.flatnonzero(which == k)
            stream[sel], block[sel], sample[sel] = self._phase_addresses(self.phases[k], flat[sel])
        return stream.reshape(positions.shape), block.reshape(positions.shape), sample.reshape(positions.shape)

    def _phase_addresses(self, phase: Phase, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if positions.size <= SMALL_BATCH:
            return self._phase_addresses_small(phase, positions)
        order = phase.order
        heads, first, lane_length = self._per_stream[phase.index]
        lanes = order.lanes
        q, lane = np.divmod(positions - phase.start_position, lanes)
        stream = order.lane_stream[lane]
        h = heads[stream]
        standard = (q - h + first[stream] * lane_length[stream]) * lanes + lane
        in_head = q < h
        if not in_head.any():
            _, block, sample = order.sample_at(standard)
            return stream, block, sample
        block, sample = np.empty_like(positions), np.empty_like(positions)
        rest = np.flatnonzero(~in_head)
        if rest.size:
            _, block[rest], sample[rest] = order.sample_at(standard[rest])
        for s in np.unique(stream[in_head]).tolist():
            sel = np.flatnonzero(in_head & (stream == s))
            entry = phase.streams[s]
            index = order.lane_index[lane[sel]] * entry.head_steps + q[sel]
            block[sel], sample[sel] = entry.head.addresses(index)
        return stream, block, sample

    def epoch_at(self, positions: np.ndarray) -> np.ndarray:
        """The epoch of its stream that the sample at each position belongs to."""
        positions = np.asarray(positions, dtype=np.int64)
        flat = positions.ravel()
        which = np.searchsorted(np.asarray(self._start_positions), flat, side="right") - 1
        out = np.empty_like(flat)
        for k in np.unique(which).tolist():
            sel = np.flatnonzero(which == k)
            phase = self.phases[k]
            heads, first, lane_length = self._per_stream[k]
            q, lane = np.divmod(flat[sel] - phase.start_position, phase.order.lanes)
            stream = phase.order.lane_stream[lane]
            h = heads[stream]
            carried = np.array([e.carry.epoch if e else 0 for e in phase.streams], dtype=np.int64)
            standard = first[stream] + (q - h) // np.maximum(lane_length[stream], 1)
            out[sel] = np.where(q < h, carried[stream], standard)
        return out.reshape(positions.shape)

    def _phase_addresses_small(self, phase: Phase, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        # One rank's step is a few samples; Python ints beat numpy's
        # per-call overhead there (same results as the vectorized path).
        heads, first, lane_length, lane_stream, lane_index = self._per_stream_lists[phase.index]
        lanes, start = phase.order.lanes, phase.start_position
        stream, standard, standard_rows = [], [], []
        in_head: dict[int, tuple[list[int], list[int]]] = {}
        for row, p in enumerate(positions.tolist()):
            q, lane = divmod(p - start, lanes)
            s = lane_stream[lane]
            stream.append(s)
            h = heads[s]
            if q >= h:
                standard.append((q - h + first[s] * lane_length[s]) * lanes + lane)
                standard_rows.append(row)
            else:
                rows, index = in_head.setdefault(s, ([], []))
                rows.append(row)
                index.append(lane_index[lane] * h + q)
        block = [0] * len(stream)
        sample = [0] * len(stream)
        if standard:
            _, b, j = phase.order.sample_at(np.array(standard, dtype=np.int64))
            for row, bb, jj in zip(standard_rows, b.tolist(), j.tolist()):
                block[row], sample[row] = bb, jj
        for s, (rows, index) in in_head.items():
            for row, (bb, jj) in zip(rows, phase.streams[s].head.addresses_small(index)):
                block[row], sample[row] = bb, jj
        return tuple(np.array(a, dtype=np.int64) for a in (stream, block, sample))

    def rank_slice(self, step: int, world_size: int, rank: int) -> PhaseSlice:
        """Rank ``rank``'s share of global step ``step``, with its phase.

        Raises:
            ConfigError: ``world_size`` does not divide the phase's global batch, or a bad rank.
        """
        phase = self.phase_at_step(step)
        batch, lanes = phase.global_batch, phase.order.lanes
        local = (step - phase.start_step) * batch
        check_phase_slice(phase, local, world_size, rank)
        positions = rank_positions(local, batch, world_size, rank, lanes) + phase.start_position
        stream, block, sample = self._phase_addresses(phase, positions)
        return PhaseSlice(
            phase=phase.index,
            first_step=step,
            positions=positions,
            stream=stream,
            block=block,
            sample=sample,
            seq_len=phase.spec.seq_len,
        )

    def rank_steps(self, step: int, steps: int, world_size: int, rank: int) -> list[PhaseSlice]:
        """Rank ``rank``'s share of ``steps`` steps from ``step``: one 2-D ``PhaseSlice`` per phase.

        Raises:
            ConfigError: ``steps < 1``, or ``world_size`` does not divide a phase's global batch.
        """
        if steps < 1:
            raise ConfigError(f"steps must be >= 1, got {steps}")
        out, end = [], step + steps
        while step < end:
            phase = self.phase_at_step(step)
            stop = end
            if phase.index + 1 < len(self.phases):
                stop = min(end, self.phases[phase.index + 1].start_step)
            batch, lanes = phase.global_batch, phase.order.lanes
            rows = []
            for t in range(step, stop):
                local = (t - phase.start_step) * batch
                check_phase_slice(phase, local, world_size, rank)
                rows.append(rank_positions(local, batch, world_size, rank, lanes))
            positions = np.stack(rows) + phase.start_position
            stream, block, sample = self._phase_addresses(phase, positions.ravel())
            out.append(
                PhaseSlice(
                    phase=phase.index,
                    first_step=step,
                    positions=positions,
                    stream=stream.reshape(positions.shape),
                    block=block.reshape(positions.shape),
                    sample=sample.reshape(positions.shape),
                    seq_len=phase.spec.seq_len,
                )
            )
            step = stop
        return out

    # -- progress, epochs, state --

    def carries(self, position: int) -> list[StreamCarry]:
        """Where each stream stands after ``position`` samples were consumed."""
        phase = self.phase_at_position(position)
        local = position - phase.start_position
        return [carry_after(phase, s, local) for s in range(len(self.shapes))]

    def progress(self, position: int, *, begun: bool = False) -> list[dict]:
        """Per-stream progress at cursor ``position``, for logs and the state.

        On the first position of a phase, the progress is that phase's view
        of its start, which depends on the phase (its lanes cut the epoch in
        progress); with ``begun`` it is the end of the phase before it, the
        last one a sample was consumed from, which is what a state records:
        a phase not yet begun may still be edited on resume.

        Returns:
            One dict per stream: ``stream``, ``fingerprint``, ``phase``,
            ``lanes`` (in that phase), ``epoch`` (in progress),
            ``samples`` (read in total), ``samples_in_epoch``,
            ``samples_read_per_epoch`` (``lanes * lane_length``: one epoch
            after the lane cut), ``stream_samples`` (one pass over every
            block at the phase's seq_len, before the cut),
            ``lane_steps_per_epoch`` and ``steps_per_epoch`` (at the phase's
            global batch; a float). ``epoch_samples`` is the old name of
            ``samples_read_per_epoch``, kept as an alias.
        """
        phase = self.phase_at_position(position - 1 if begun and position > 0 else position)
        lanes, batch = phase.order.lanes, phase.global_batch
        carries = [carry_after(phase, s, position - phase.start_position) for s in range(len(self.shapes))]
        out = []
        for plan, carry in zip(phase.order.streams, carries):
            read_per_epoch = plan.lanes * plan.lane_length
            out.append(
                {
                    "stream": plan.index,
                    "fingerprint": plan.shape.fingerprint,
                    "phase": phase.index,
                    "lanes": plan.lanes,
                    "epoch": carry.epoch,
                    "samples": carry.samples,
                    "samples_in_epoch": carry.samples_in_epoch,
                    "samples_read_per_epoch": read_per_epoch,
                    "epoch_samples": read_per_epoch,
                    "stream_samples": plan.stream_samples,
                    "lane_steps_per_epoch": plan.lane_length,
                    "steps_per_epoch": plan.lane_length * lanes / batch if plan.lanes else None,
                }
            )
        return out

    def end_step(self, *, epochs: int, stream: int = 0) -> int:
        """The first global step at which ``stream`` has read ``epochs`` whole epochs.

        A run that should stop after ``epochs`` epochs of that stream stops
        before this step (it is the number of steps to run).

        Raises:
            ConfigError: ``epochs < 1``, a bad stream, or a stream the last
                phase does not read that never gets there.
        """
        if epochs < 1:
            raise ConfigError(f"epochs must be >= 1, got {epochs}")
        if not 0 <= stream < len(self.shapes):
            raise ConfigError(f"stream {stream} outside [0, {len(self.shapes)})")
        last_epoch = epochs - 1
        for phase in self.phases:
            entry = phase.streams[stream]
            if entry is None:
                continue
            head_epoch = entry.carry.epoch if entry.head is not None else entry.first_epoch
            if head_epoch > last_epoch:
                return phase.start_step
            m = phase.order.streams[stream].lane_length
            if entry.head is not None and head_epoch == last_epoch:
                end_steps = entry.head_steps
            else:
                end_steps = entry.head_steps + (last_epoch - entry.first_epoch + 1) * m
            needed = (end_steps - 1) * phase.order.lanes + int(entry.global_lanes.max()) + 1
            if phase.end_position is None or phase.start_position + needed <= phase.end_position:
                return phase.start_step + -(-needed // phase.global_batch)
        raise ConfigError(f"stream {stream} never reads {epochs} epochs: the last phase does not read it")

    def phase_end_step(self, phase: int) -> int | None:
        """The step phase ``phase`` ends before (None for the last phase, which does not end)."""
        if not 0 <= phase < len(self.phases):
            raise ConfigError(f"phase {phase} outside [0, {len(self.phases)})")
        return self.phases[phase + 1].start_step if phase + 1 < len(self.phases) else None

    def state(self, position: int) -> ScheduleState:
        """The resumable state at cursor ``position``: phases begun and stream progress.

        A phase has begun once a sample of it was consumed (phase 0 always has).
        """
        begun = max(1, bisect.bisect_left(self._start_positions, position))
        return ScheduleState(
            position=int(position),
            step=self.step_of_position(position),
            seed=self.seed,
            fingerprints=[shape.fingerprint for shape in self.shapes],
            phases=[phase_record(p, self.shapes) for p in self.phases[:begun]],
            streams=[stream_record(p) for p in self.progress(position, begun=True)],
        )


def build_schedule_order(shapes: list[StreamShape], phases: list[SchedulePhase], seed: int) -> ScheduleOrder:
    """``ScheduleOrder(shapes, phases, seed=seed)`` (what an unpickled schedule is rebuilt with)."""
    return ScheduleOrder(shapes, phases, seed=seed)
