"""One rank's view of the global order: its slices, horizons and memory bound.

Built from the open streams and the order config; rebuilt when a loaded state
brings other lanes or another window. Everything here is arithmetic on the
plan: no threads, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from zephon_stream.loader.blocks.streams import StreamSource, stream_shapes
from zephon_stream.loader.planning.memory import (
    MemoryBound,
    blocks_per_lane,
    check_memory,
    compute_memory_bound,
    packing_work_bytes,
    period_steps,
    retention_steps,
    window_spread,
)
from zephon_stream.loader.planning.planner import Planner
from zephon_stream.plan import GlobalOrder, OrderConfig, rank_positions

# Positions -> (stream, block, sample): a GlobalOrder's or a
# ScheduleOrder's ``sample_at`` (the latter knows a phase's epoch heads).
AddressFn = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]]

# Past this many (phase, step) pairs the lanes a rank reads are bounded
# by the lane count instead of being enumerated.
_MAX_LANE_SCAN_STEPS = 8192
_MAX_PATTERNS = 4
# A cap on the block look-ahead in steps: with short samples a block
# spans tens of thousands of steps, and planning that far ahead costs memory
# and time for nothing. Tiny steps (batch 1) may look ahead up to this many
# tokens instead: at 10 us a step, 256 steps of 1024 tokens were 2.5 ms, less
# than decoding the next block takes, and the producer stalled at each block.
_MAX_BLOCK_AHEAD_STEPS = 256
_MAX_BLOCK_AHEAD_TOKENS = 1 << 22


def build_order(
    sources: Sequence[StreamSource],
    *,
    seed: int,
    seq_len: int,
    lanes: int,
    window: int,
    weights: tuple,
    lanes_default: str | None = None,
) -> GlobalOrder:
    """The ``GlobalOrder`` of a loader without a schedule (``lanes_default``: see ``GlobalOrder``)."""
    return GlobalOrder(
        stream_shapes(sources),
        OrderConfig(seed=seed, seq_len=seq_len, lanes=lanes, window=window, weights=weights),
        lanes_default=lanes_default,
    )


class RankLayout:
    """The order, this rank's place in it, and what that costs in memory.

    For a phase of a schedule, ``order`` is the phase's own ``GlobalOrder``,
    ``start_position`` the cursor the phase starts at and ``addresses`` the
    schedule's ``sample_at``: positions are those of ``rank_positions`` at
    the cursor relative to the phase's start, as the plan layer's
    ``ScheduleOrder.rank_steps`` computes them.

    Args:
        sources: the open streams.
        order: the order read (a phase's order for a schedule).
        global_batch: ``B``.
        world_size: ``W``.
        rank: ``r``.
        fetch_steps: steps whose blocks are fetched ahead of the next step
            (raised to one block's worth of lane steps).
        num_fetch_threads: concurrent reads (compressed bytes in flight).
        num_decode_threads: concurrent decodes.
        ring_bytes: bytes of the batch ring.
        helper_bytes: the helper process's own footprint (0 without one).
        handover: whether another run may overlap this one (memory bound).
        start_position: the cursor the order starts at (a phase's start; 0).
        end_position: the cursor it ends at (a phase's end; None).
        addresses: positions -> addresses (default: ``order.sample_at``).
        phase: the phase index (0 without a schedule).
        steps_per_slot: consecutive steps a producer plans, fetches and
            assembles as one (a ring slot's worth); its fetch horizon then
            reaches up to ``2 * (steps_per_slot - 1)`` steps further.
        best_fit: whether blocks are kept as their best-fit rows (memory bound).
    """

    def __init__(
        self,
        *,
        sources: Sequence[StreamSource],
        order: GlobalOrder,
        global_batch: int,
        world_size: int,
        rank: int,
        fetch_steps: int,
        num_fetch_threads: int,
        num_decode_threads: int,
        ring_bytes: int,
        helper_bytes: int,
        handover: bool = False,
        start_position: int = 0,
        end_position: int | None = None,
        addresses: AddressFn | None = None,
        phase: int = 0,
        steps_per_slot: int = 1,
        best_fit: bool = False,
    ) -> None:
        self.order = order
        self.start_position = start_position
        self._end_position = end_position
        self.phase = phase
        self._addresses = order.sample_at if addresses is None else addresses
        lanes = order.lanes
        self.global_batch = global_batch
        self.world_size = world_size
        self.rank = rank
        self.period = period_steps(lanes=lanes, global_batch=global_batch)
        self._patterns: dict[int, np.ndarray] = {}
        streams = self.order.streams
        self.spread = max(
            window_spread(window=p.window, samples_per_block=max(1, p.samples_per_block)) for p in streams if p.lanes
        )
        self.samples_per_block = max(1, min(p.samples_per_block for p in streams if p.lanes))
        # Fetch up to one block's worth of lane steps ahead (capped), so
        # each lane's next block is decoded while it reads the current one
        # even when the consumer is fast.
        block_steps = math.ceil(self.samples_per_block * lanes / global_batch)
        cap = max(_MAX_BLOCK_AHEAD_STEPS, _MAX_BLOCK_AHEAD_TOKENS // (global_batch * order.config.seq_len))
        self.fetch_steps = max(fetch_steps, min(block_steps, cap))
        self.retention_steps = retention_steps(
            spread=self.spread, lanes=lanes, global_batch=global_batch, fetch_steps=self.fetch_steps
        )
        self.lanes_read = self._count_lanes_read()
        self.memory_bound: MemoryBound = compute_memory_bound(
            lanes_read=self.lanes_read,
            blocks_per_lane=blocks_per_lane(
                spread=self.spread,
                samples_per_block=self.samples_per_block,
                lanes=lanes,
                global_batch=global_batch,
                fetch_steps=self.fetch_steps + 2 * (steps_per_slot - 1),
            ),
            block_bytes=max(s.full_block_bytes(order.config.seq_len if best_fit else 0) for s in sources),
            max_compressed_block_bytes=max(s.max_compressed_block_bytes for s in sources),
            num_fetch_threads=num_fetch_threads,
            num_decode_threads=num_decode_threads,
            ring_bytes=ring_bytes,
            helper_bytes=helper_bytes,
            handover=handover,
            packing_bytes=num_decode_threads
            * max(packing_work_bytes(block_tokens=s.metadata.block_tokens, itemsize=s.dtype.itemsize) for s in sources)
            if best_fit
            else 0,
        )

    def _count_lanes_read(self) -> int:
        """Distinct lanes this rank reads, over every step phase the cursor can take."""
        lanes, batch = self.order.lanes, self.global_batch
        period = period_steps(lanes=lanes, global_batch=batch)
        phases = math.gcd(lanes, batch)
        rows = batch // self.world_size
        if period == 1:
            # Every step has the same lane pattern; a piece of ``rows``
            # positions touches at most ``rows`` lanes.
            return min(lanes, rows)
        if period * phases > _MAX_LANE_SCAN_STEPS:
            return min(lanes, rows * self.retention_steps)
        worst = 0
        for phase in range(phases):
            seen: set[int] = set()
            for step in range(period):
                positions = rank_positions(phase + step * batch, batch, self.world_size, self.rank, lanes)
                seen.update((positions % lanes).tolist())
            worst = max(worst, len(seen))
        return worst

    @property
    def end_position(self) -> int | None:
        """The cursor the order ends at (a phase's end), or None."""
        return self._end_position

    def addresses(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(stream, block, sample)`` at global positions of this order."""
        return self._addresses(positions)

    def check_memory(self, max_memory_bytes: int | None) -> None:
        """Raise ConfigError if the bound exceeds ``max_memory_bytes``."""
        check_memory(self.memory_bound, max_memory_bytes)

    def slice(self, cursor: int, steps: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """This rank's ``(positions, streams, blocks, samples)`` for ``steps``
        steps from ``cursor``, each ``[steps, rows]``."""
        positions = self._positions(cursor, steps)
        # One call for all the steps keeps the order on its vectorized path.
        stream, block, sample = self._addresses(positions)
        return positions, stream, block, sample

    def _positions(self, cursor: int, steps: int) -> np.ndarray:
        # A rank's positions depend on the cursor only through cursor mod
        # C, up to a shift: moving the cursor by span = period * B (a multiple
        # of C) moves every position by span. So one period of rank_positions
        # per phase gives every step.
        # A phase's positions are rank_positions of the cursor relative
        # to the phase's start, shifted by that start.
        span = self.period * self.global_batch
        cursor -= self.start_position
        phase = cursor % span
        pattern = self._patterns.get(phase)
        if pattern is None:
            pattern = np.stack(
                [
                    rank_positions(
                        phase + k * self.global_batch, self.global_batch, self.world_size, self.rank, self.order.lanes
                    )
                    for k in range(self.period)
                ]
            )
            if len(self._patterns) < _MAX_PATTERNS:
                self._patterns[phase] = pattern
        ks = np.arange(steps, dtype=np.int64)
        shift = self.start_position + cursor - phase
        return pattern[ks % self.period] + (shift + (ks // self.period) * span)[:, None]

    def planner(self, *, start: int, num_steps: int | None) -> Planner:
        """A planner for this rank from cursor ``start``."""
        return Planner(
            slice_fn=self.slice,
            start=start,
            global_batch=self.global_batch,
            num_steps=num_steps,
            fetch_steps=self.fetch_steps,
            retention_steps=self.retention_steps,
        )
