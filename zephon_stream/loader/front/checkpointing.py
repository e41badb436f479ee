"""A ``StreamingLoader`` as a torch ``Stateful``: the global state out, a seek in.

``LoaderCheckpointing`` is a base of ``api.StreamingLoader``; a seek stops
the producer run in flight and prepares the feed for the layout at the new
cursor (with a schedule: its phase's), which the next step starts.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from zephon_stream.errors import ConfigError
from zephon_stream.loader.planning.rank_layout import RankLayout
from zephon_stream.plan import LoaderState, ScheduleOrder, ScheduleState

if TYPE_CHECKING:
    from zephon_stream.loader.runs.feed import BatchFeed
    from zephon_stream.loader.runs.phase_layouts import LayoutBook

__all__ = ["LoaderCheckpointing"]


class LoaderCheckpointing:
    """``state_dict`` and ``load_state_dict`` (mixed into ``StreamingLoader``).

    A seek into a phase enters it through the loader's ``_enter_phase``, as a step does.
    """

    # What a seek reads and sets, from ``StreamingLoader``'s construction.
    seq_len: int | None
    global_batch_size: int | None
    max_memory_bytes: int | None
    _book: LayoutBook
    _feed: BatchFeed
    _layout: RankLayout | None
    _schedule: ScheduleOrder | None
    _explicit_lanes: int | None
    _explicit_window: int | None
    _position: int
    _audit: Any

    def state_dict(self) -> dict[str, Any]:
        """The global state (plain ints, strings and lists), equal on every rank.

        Version 1 (``LoaderState``) without a schedule, version 2
        (``ScheduleState``: the phases begun, every stream's progress) with one.
        """
        return self._book.state(self._position, self._layout)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Seek to a saved state in O(1), at this loader's world size.

        Lanes and window left unset in the constructor are taken from the
        state; everything else must match, the packing included (a state
        saved before the packing was recorded is ``"concat"``'s). With a schedule, a version 1 state
        loads as its first phase; a phase that has begun must be unchanged,
        phases not begun may be added or edited.

        Raises:
            StateMismatchError: naming each field (and phase) that differs, with both values.
            VersionError: a state version this code does not read.
        """
        if self._schedule is not None:
            scheduled = ScheduleState.from_dict(dict(state_dict))
            scheduled.validate(self._schedule, packing=self._book.packing.rows)
            self._seek(scheduled.position)
            self._book.begin_history(
                self._position, self._schedule.phase_at_position(self._position).global_batch, scheduled.history
            )
            return
        state = LoaderState.from_dict(dict(state_dict))
        lanes = state.lanes if self._explicit_lanes is None else self._explicit_lanes
        window = state.window if self._explicit_window is None else self._explicit_window
        if (lanes, window) != (self._layout.order.lanes, self._layout.order.config.window):
            self._layout = self._make_layout(lanes=lanes, window=window)
        state.validate(dataclasses.replace(self._layout.order.state(0), packing=self._book.packing.rows))
        self._seek(state.position)
        self._book.begin_history(self._position, self._layout.global_batch, state.history)

    def skip_steps(self, num_steps: int) -> None:
        """Move ``num_steps`` global steps on without reading them, in O(1), at any world size.

        The next batch is the one ``num_steps`` global steps later (what a run
        that goes back to a checkpoint after a loss spike skips); ``step``
        advances by ``num_steps`` too. The skip is kept in the state's history
        (``zephon-stream which --state`` names it) and, with an audit log, as a
        ``"skip"`` record. Call it on every rank, between steps.

        Raises:
            ConfigError: ``num_steps`` is not an int >= 0.
        """
        if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 0:
            raise ConfigError(f"skip_steps takes an int >= 0 (got {num_steps!r})")
        if not num_steps:
            return
        step, cursor = self._book.step_of(self._position, self._layout), self._position
        self._seek(self._book.skip(num_steps, self._position, self._layout))
        if self._audit is not None:
            self._audit.append(
                {"step": step, "skipped_steps": num_steps, "cursor": cursor, "to_cursor": self._position}, kind="skip"
            )

    def _seek(self, position: int) -> None:
        """Stop the run in flight and prepare the one at ``position`` (with a schedule: its phase's)."""
        self._feed.stop()
        self._position = position
        if self._schedule is None:
            self._feed.prepare(self._layout)
            return
        phase = self._schedule.phase_at_position(position).index
        if phase in self._book.readable_phases():
            self._enter_phase(phase)  # Else refused, naming the phase, at the next step
            self._feed.prepare(self._layout)

    def _make_layout(self, *, lanes: int | None, window: int | None) -> RankLayout:
        layout = self._book.for_order(
            seq_len=self.seq_len, global_batch=self.global_batch_size, lanes=lanes, window=window
        )
        layout.check_memory(self.max_memory_bytes)
        return layout
