"""Rank slicing: which global positions of a step each rank reads.

A step covers positions ``[P, P + B)``. Ordered by ``(lane, q)`` (lane
``p mod C`` first, then lane step ``q = p div C``) they are cut into ``W``
equal contiguous pieces and rank ``r`` takes piece ``r``.

Per lane the count of positions in the step is ``k = B div C`` or ``k + 1``,
the ``B mod C`` lanes with ``k + 1`` forming the cyclic interval starting at
lane ``P mod C``. So the ordered positions are three runs of lanes with equal
counts, and any ordered index maps to its position in O(1): one rank's piece
costs O(B / W) and never touches the other lanes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from zephon_stream.errors import ConfigError

_SMALL_PIECE = 64


class SampleOrder(Protocol):
    """What slicing reads of an order (``order.GlobalOrder`` has it): its lanes
    and the sample address of each position.

    Slicing needs nothing else of the order, so it sits below
    ``order.py``, which calls it.
    """

    @property
    def lanes(self) -> int: ...

    def sample_at(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...


@dataclass(frozen=True, slots=True, eq=False)
class RankSlice:
    """One rank's share of one step, in piece order.

    Attributes:
        positions: global positions (``int64``).
        stream: stream of each sample.
        block: global block id of each sample within its stream.
        sample: sample index within its block (tokens start at ``sample * seq_len``).
    """

    positions: np.ndarray
    stream: np.ndarray
    block: np.ndarray
    sample: np.ndarray


@dataclass(frozen=True, slots=True, eq=False)
class BlockPlan:
    """Blocks one rank needs over a run of steps, in first-use order.

    Attributes:
        stream: stream of each block.
        block: block id within the stream.
        first_step: index (from 0) of the first step that reads it.
        last_step: index of the last step that reads it; after it the block
            can be evicted.
        samples: samples read from the block over the run.
    """

    stream: np.ndarray
    block: np.ndarray
    first_step: np.ndarray
    last_step: np.ndarray
    samples: np.ndarray


def check_slice_args(position: int, global_batch: int, world_size: int, rank: int) -> None:
    """Raise ``ConfigError`` unless the rank-slice arguments are usable."""
    if position < 0:
        raise ConfigError(f"position must be >= 0, got {position}")
    if global_batch < 1 or world_size < 1:
        raise ConfigError(f"global batch and world size must be >= 1, got {global_batch} and {world_size}")
    if global_batch % world_size:
        raise ConfigError(f"world size {world_size} does not divide the global micro-batch {global_batch}")
    if not 0 <= rank < world_size:
        raise ConfigError(f"rank {rank} outside [0, {world_size})")


def _runs(position: int, global_batch: int, lanes: int) -> list[tuple[int, int, int, int]]:
    """``(first ordered index, first lane, lanes, positions per lane)`` runs of a step."""
    per_lane, extra = divmod(global_batch, lanes)
    start = position % lanes
    if start + extra <= lanes:
        runs = [(0, start, per_lane), (start, extra, per_lane + 1)]
        runs.append((start + extra, lanes - start - extra, per_lane))
    else:
        wrap = start + extra - lanes
        runs = [(0, wrap, per_lane + 1), (wrap, start - wrap, per_lane)]
        runs.append((start, lanes - start, per_lane + 1))
    out, index = [], 0
    for first_lane, num_lanes, count in runs:
        if num_lanes and count:
            out.append((index, first_lane, num_lanes, count))
            index += num_lanes * count
    assert index == global_batch, (index, global_batch)
    return out


def rank_positions(position: int, global_batch: int, world_size: int, rank: int, lanes: int) -> np.ndarray:
    """Global positions of rank ``rank``'s piece of the step at ``position``.

    Raises:
        ConfigError: ``world_size`` does not divide ``global_batch``, or a bad rank.
    """
    check_slice_args(position, global_batch, world_size, rank)
    piece = global_batch // world_size
    lo, hi = rank * piece, rank * piece + piece
    parts = []
    small = []
    for index, first_lane, num_lanes, count in _runs(position, global_batch, lanes):
        a, b = max(lo, index), min(hi, index + num_lanes * count)
        if a >= b:
            continue
        if piece <= _SMALL_PIECE:
            for i in range(a, b):
                d, o = divmod(i - index, count)
                lane = first_lane + d
                small.append(((position - lane + lanes - 1) // lanes + o) * lanes + lane)
            continue
        d, o = np.divmod(np.arange(a - index, b - index, dtype=np.int64), count)
        lane = first_lane + d
        parts.append(((position - lane + lanes - 1) // lanes + o) * lanes + lane)
    if piece <= _SMALL_PIECE:
        return np.array(small, dtype=np.int64)
    return np.concatenate(parts)


def step_positions(position: int, global_batch: int, lanes: int) -> np.ndarray:
    """Every position of the step, in piece order (ranks 0, 1, ... concatenated)."""
    return rank_positions(position, global_batch, 1, 0, lanes)


def rank_slice(order: SampleOrder, position: int, global_batch: int, world_size: int, rank: int) -> RankSlice:
    """Rank ``rank``'s positions and sample addresses for the step at ``position``."""
    positions = rank_positions(position, global_batch, world_size, rank, order.lanes)
    stream, block, sample = order.sample_at(positions)
    return RankSlice(positions=positions, stream=stream, block=block, sample=sample)


def blocks_for(
    order: SampleOrder,
    position: int,
    global_batch: int,
    world_size: int,
    rank: int,
    steps: int,
) -> BlockPlan:
    """Blocks rank ``rank`` reads over ``steps`` steps from ``position``, in first-use order."""
    if steps < 1:
        raise ConfigError(f"steps must be >= 1, got {steps}")
    check_slice_args(position, global_batch, world_size, rank)
    positions = [
        rank_positions(position + t * global_batch, global_batch, world_size, rank, order.lanes) for t in range(steps)
    ]
    step = np.repeat(np.arange(steps, dtype=np.int64), [p.size for p in positions])
    stream, block, _ = order.sample_at(np.concatenate(positions))
    # One int64 key per (stream, block); block ids stay far below 2**40.
    assert int(block.max()) < 1 << 40, "block id too large for the (stream, block) key"
    key = stream * (1 << 40) + block
    uniq, first, inverse, counts = np.unique(key, return_index=True, return_inverse=True, return_counts=True)
    last = np.zeros(uniq.size, dtype=np.int64)
    np.maximum.at(last, inverse, step)
    by_first = np.argsort(first, kind="stable")
    return BlockPlan(
        stream=(uniq >> 40)[by_first],
        block=(uniq & ((1 << 40) - 1))[by_first],
        first_step=step[first][by_first],
        last_step=last[by_first],
        samples=counts[by_first],
    )
