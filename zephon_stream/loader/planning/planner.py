"""Planner: the rank's sample addresses for the steps ahead, and block lifetimes.

It keeps a sliding horizon of planned steps after the next step to assemble.
The first ``fetch_steps`` of them say which blocks to fetch, in the order they
are first needed. The whole horizon (``retention_steps``) says which resident
blocks are still needed: a block no planned step uses is released. The
horizon is long enough that a block unused for that long is not needed again
before its lane moves on (see ``memory.retention_steps``), so releasing it
never causes a re-fetch within an epoch.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
from collections.abc import Callable, Iterator

import numpy as np

BlockKey = tuple[int, int]
# (first cursor, steps) -> (positions, streams, blocks, samples), each
# [steps, rows]: planning many steps per call lets the order run vectorized.
SliceFn = Callable[[int, int], tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]


@dataclasses.dataclass(frozen=True, slots=True)
class StepPlan:
    """One step of one rank.

    Attributes:
        index: steps since the planner started (0 = the first).
        cursor: the global cursor ``P`` before this step.
        positions: global position of each row (int64).
        streams: stream index of each row.
        blocks: block id (within its stream) of each row.
        samples: sample index within its block, per row.
        keys: ``(stream, block)`` of each row.
        unique_keys: the distinct keys, in order of first use.
    """

    index: int
    cursor: int
    positions: np.ndarray
    streams: np.ndarray
    blocks: np.ndarray
    samples: np.ndarray
    keys: tuple[BlockKey, ...]
    unique_keys: tuple[BlockKey, ...]


class Planner:
    """Sliding plan of the steps after cursor ``start``.

    Args:
        slice_fn: ``(P, n)`` -> this rank's ``(positions, streams, blocks,
            samples)`` for the ``n`` steps from cursor ``P``, each ``[n, rows]``.
        start: the cursor of the first step.
        global_batch: ``B``, samples per step over all ranks.
        num_steps: steps to plan in total, or None for no end.
        fetch_steps: steps after the next one whose blocks are fetched ahead.
        retention_steps: steps planned ahead to decide block lifetimes
            (at least ``fetch_steps + 1``).
        chunk_steps: steps planned past the horizon at each top-up.
    """

    def __init__(
        self,
        *,
        slice_fn: SliceFn,
        start: int,
        global_batch: int,
        num_steps: int | None,
        fetch_steps: int,
        retention_steps: int,
        chunk_steps: int = 512,
    ) -> None:
        assert global_batch > 0 and fetch_steps >= 0
        self._slice_fn = slice_fn
        self._start = start
        self._global_batch = global_batch
        self._num_steps = num_steps
        self._fetch_steps = fetch_steps
        self._retention_steps = max(retention_steps, fetch_steps + 1)
        self._chunk_steps = max(1, chunk_steps)
        self._planned: collections.deque[StepPlan] = collections.deque()
        self._next_index = 0  # index of the next step to assemble
        self._fetch_cursor = 0  # first step whose blocks may not all be issued
        self._refcounts: collections.Counter[BlockKey] = collections.Counter()
        self._counted_until = 0  # steps before this one are in the refcounts
        self._unreferenced: set[BlockKey] = set()

    @property
    def next_index(self) -> int:
        """Index of the next step to assemble."""
        return self._next_index

    def finished(self) -> bool:
        """Whether every step to plan has been assembled."""
        return self._num_steps is not None and self._next_index >= self._num_steps

    def limit(self, num_steps: int) -> None:
        """Plan no step from index ``num_steps`` on (a run cut short; steps
        already planned past it are neither fetched nor assembled)."""
        if self._num_steps is None or num_steps < self._num_steps:
            self._num_steps = num_steps

    def _horizon_end(self) -> int:
        end = self._next_index + self._retention_steps
        return end if self._num_steps is None else min(end, self._num_steps)

    def horizon_complete(self) -> bool:
        """Whether every step of the retention horizon is planned (and counted)."""
        return self._counted_until >= self._horizon_end()

    def extend(self, max_new_steps: int | None = None) -> int:
        """Plan up to ``max_new_steps`` more steps of the horizon; returns how many."""
        if self.horizon_complete():
            return 0
        first = self._next_index + len(self._planned)
        # Top up past the horizon by a chunk, so planning runs in
        # vectorized chunks rather than one step at a time.
        end = self._next_index + self._retention_steps + self._chunk_steps
        count = (end if self._num_steps is None else min(end, self._num_steps)) - first
        if max_new_steps is not None:
            count = min(count, max_new_steps)
        if count <= 0:
            return 0
        self._plan_steps(count)
        return count

    def _plan_steps(self, count: int) -> None:
        if self._num_steps is not None:
            count = min(count, self._num_steps - self._next_index - len(self._planned))
        if count <= 0:
            return
        first = self._next_index + len(self._planned)
        cursor = self._start + first * self._global_batch
        positions, streams, blocks, samples = (np.asarray(a, dtype=np.int64) for a in self._slice_fn(cursor, count))
        stream_rows, block_rows = streams.tolist(), blocks.tolist()
        for k in range(count):
            keys = tuple(zip(stream_rows[k], block_rows[k]))
            unique = tuple(dict.fromkeys(keys))
            self._planned.append(
                StepPlan(
                    index=first + k,
                    cursor=cursor + k * self._global_batch,
                    positions=positions[k],
                    streams=streams[k],
                    blocks=blocks[k],
                    samples=samples[k],
                    keys=keys,
                    unique_keys=unique,
                )
            )
        self._count_window()

    def _count_window(self) -> None:
        # Only steps inside the retention horizon hold blocks; steps
        # planned past it (the top-up chunk) must not, or a block read again
        # next epoch would never be released.
        end = self._next_index + min(self._retention_steps, len(self._planned))
        while self._counted_until < end:
            plan = self._planned[self._counted_until - self._next_index]
            # A block's count is the planned steps that use it (not rows).
            self._refcounts.update(plan.unique_keys)
            self._unreferenced.difference_update(plan.unique_keys)
            self._counted_until += 1

    def next_step(self) -> StepPlan:
        """The plan of the next step to assemble (planned now if needed)."""
        assert not self.finished()
        if not self._planned:
            self._plan_steps(self._fetch_steps + 1)
        return self._planned[0]

    def fetch_ahead(self) -> Iterator[tuple[int, tuple[BlockKey, ...]]]:
        """``(step index, its distinct keys)`` for the fetch horizon, in step order.

        Covers the steps planned so far (:meth:`extend` plans more); starts at
        the fetch cursor (see :meth:`fetched_through`), so steps already
        issued are not scanned again. Keys repeat across steps; the caller
        skips those it has issued.
        """
        if not self._planned and not self.finished():
            self._plan_steps(1)
        first = max(self._fetch_cursor, self._next_index)
        stop = min(self._next_index + self._fetch_steps + 1, self._next_index + len(self._planned))
        if self._num_steps is not None:
            stop = min(stop, self._num_steps)
        for plan in itertools.islice(self._planned, first - self._next_index, stop - self._next_index):
            yield plan.index, plan.unique_keys

    def fetched_through(self, index: int) -> None:
        """Every block of steps up to ``index`` has been issued."""
        self._fetch_cursor = max(self._fetch_cursor, index + 1)

    def advance(self) -> list[BlockKey]:
        """Mark the next step assembled; returns the blocks no planned step needs.

        Release decisions wait until the horizon is fully planned; until then
        unreferenced blocks are remembered and returned by a later call.
        """
        plan = self.next_step()
        assert self._counted_until > plan.index
        self._planned.popleft()
        self._next_index += 1
        refcounts = self._refcounts
        for key in plan.unique_keys:
            left = refcounts[key] - 1
            if left:
                refcounts[key] = left
            else:
                del refcounts[key]
                self._unreferenced.add(key)
        # A key counted again by the step entering the horizon leaves
        # the unreferenced set here.
        self._count_window()
        if not self._unreferenced or not self.horizon_complete():
            return []
        released = [key for key in self._unreferenced if key not in self._refcounts]
        self._unreferenced.clear()
        return released

    def needed(self, key: BlockKey) -> bool:
        """Whether a step of the retention horizon still uses ``key``."""
        return self._refcounts.get(key, 0) > 0
