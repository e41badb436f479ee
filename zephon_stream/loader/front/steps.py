"""A ``StreamingLoader``'s steps: the cursor, where each producer run starts and ends, the audit records.

``LoaderSteps`` is a base of ``api.StreamingLoader``. Most steps are plain and
take the short way (``SteadySteps``, loader/runs/producer_run.py); the full way
enters a schedule's phase at its boundary, starts, switches to and starts ahead
the producer runs of the feed (loader/runs/feed.py), and writes the audit log.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from zephon_stream.loader.front.audit import addresses_sha256
from zephon_stream.loader.runs.phase_layouts import run_end_position, stop_position

if TYPE_CHECKING:
    from zephon_stream.loader.front.audit import AuditLog
    from zephon_stream.loader.planning.rank_layout import RankLayout
    from zephon_stream.loader.producer.stats import LoaderStats
    from zephon_stream.loader.runs.feed import BatchFeed
    from zephon_stream.loader.runs.phase_layouts import LayoutBook
    from zephon_stream.plan import ScheduleOrder

__all__ = ["LoaderSteps"]


class LoaderSteps:
    """Iteration: ``__next__`` and the producer runs behind it (mixed into ``StreamingLoader``).

    A step into a phase enters it through the loader's ``_enter_phase``, as a seek does.
    """

    # What a step reads and sets, from ``StreamingLoader``'s construction.
    world_size: int
    local_batch_size: int | None
    global_batch_size: int | None
    _book: LayoutBook
    _feed: BatchFeed
    _layout: RankLayout | None
    _schedule: ScheduleOrder | None
    _stats: LoaderStats
    _audit: AuditLog | None
    _ends: dict[str, int | None]
    _closed: bool
    _position: int
    _steady_until: float
    _end_for: RankLayout | None
    _end_position: int | None

    def __next__(self) -> dict[str, torch.Tensor]:
        # Most steps are plain (``SteadySteps``, loader/runs/producer_run.py):
        # one short call, the cursor and the counts. The full way below arms it again after any other.
        steady = self._feed.steady
        if steady is not None and self._position < self._steady_until:
            batch = steady.take()
            if batch is not None:
                self._position += self.global_batch_size
                self._stats.record_step(self.local_batch_size, steady.stall_s)
                return batch
        return self._next_the_full_way()

    def _next_the_full_way(self) -> dict[str, torch.Tensor]:
        if self._closed:
            raise RuntimeError("StreamingLoader is closed")
        end = self._run_end_position()
        if end is not None and self._position >= end:
            raise StopIteration
        feed = self._feed
        if feed.producer is None or self._position == self._layout.end_position:
            # One producer run per phase, with a ring laid out for its
            # rows and seq_len; the next phase's run was started ahead.
            if self._schedule is not None:
                self._enter_phase(self._schedule.phase_at_position(self._position).index)
            if not feed.switch(self._position):
                feed.stop()
                feed.start(self._layout, **self._run_args(self._layout, self._position, end))
        elif self._schedule is not None and feed.next_start is None:
            self._start_next_phase_ahead(end)
        started = time.perf_counter()
        ready, batch = feed.get(self._position)
        if batch is None:
            raise StopIteration
        stall_s = time.perf_counter() - started
        assert ready.cursor == self._position, (ready.cursor, self._position)
        self._position += self.global_batch_size
        self._stats.record_step(self.local_batch_size, stall_s)
        if self._audit is not None:
            self._audit.append(self._audit_record(ready.cursor, ready.data_sha256))
        if feed.steady is not None:
            stop = stop_position(self._layout, end)
            self._steady_until = math.inf if stop is None else stop
        return batch

    def _run_args(self, layout: RankLayout, start: int, end: int | None) -> dict[str, Any]:
        """The keywords of a producer run of ``layout`` from cursor ``start`` to its end or ``end``."""
        stop = stop_position(layout, end)
        num_steps = None if stop is None else max(0, -(-(stop - start) // layout.global_batch))
        more_runs = layout.end_position is not None and (end is None or layout.end_position < end)
        return {
            "start": start,
            "start_step": self._book.step_of(start, layout),
            "num_steps": num_steps,
            "hash_data": self._audit is not None,
            "more_runs": more_runs,
        }

    def _start_next_phase_ahead(self, end: int | None) -> None:
        """Start the next phase's run once the cursor is within the feed's
        lead of the boundary, so its first blocks are fetched and its ring
        filled before the consumer gets there."""
        boundary = self._layout.end_position
        if boundary is None or (end is not None and boundary >= end):
            return
        if boundary - self._position > self._feed.lead_steps(self._layout) * self.global_batch_size:
            return
        index = self._schedule.phase_at_position(boundary).index
        if index not in self._book.readable_phases():
            return  # Refused, naming the phase, when the cursor gets there
        layout = self._book.for_phase(index)
        self._feed.start_ahead(layout, **self._run_args(layout, boundary, end))

    def _audit_record(self, cursor: int, data_sha256: str) -> dict[str, Any]:
        positions = np.arange(cursor, cursor + self.global_batch_size, dtype=np.int64)
        addresses = addresses_sha256(positions, *self._layout.addresses(positions))
        return {
            "step": self._book.step_of(cursor, self._layout),
            "phase": self._layout.phase,
            "cursor": cursor,
            "addresses_sha256": addresses,
            "data_sha256": data_sha256,
            "world_size": self.world_size,
            "local_batch_size": self.local_batch_size,
        }

    def _run_end_position(self) -> int | None:
        # Asked at every step; it changes only with the layout.
        if self._end_for is not self._layout:
            self._end_for, self._end_position = self._layout, run_end_position(self._book, self._layout, self._ends)
        return self._end_position
