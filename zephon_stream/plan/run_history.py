"""A run's history: where its step numbering started over, and the steps it skipped.

The loader numbers steps from its cursor alone (docs/ORDER.md): without a
schedule step ``P div B``, with one the schedule's ``step_of_position(P)``.
A run that resumes at another global batch, or that skips steps after a
loss spike, reads from its cursor on, so the steps it read are not all
``position_of_step(N)`` of today's settings. The history says what they were:

- a **stretch** ``(step, position, global_batch)``: from step ``step`` on, the
  run read from cursor ``position``, one global batch a step (the batch in
  force at each step: ``global_batch`` without a schedule, the phase's with
  one), until the next stretch; a run starts one at its first step and
  every resume whose numbering does not continue the last one (a new batch);
- a **skip** ``(step, steps)``: at step ``step`` the run moved its cursor
  ``steps`` global steps on without reading them (``StreamingLoader.skip_steps``).

Kept in the state as one JSON object (a string) per entry: a list of strings
is one value for torch.distributed.checkpoint, whatever its length. A state
without a history (written before it was recorded) knows only its cursor.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from zephon_stream.errors import StateMismatchError

Distance = Callable[["Stretch", int], int]


@dataclass(frozen=True, slots=True)
class Stretch:
    """From ``step`` on the run read from cursor ``position``, ``global_batch`` positions a step (at the start)."""

    step: int
    position: int
    global_batch: int


@dataclass(frozen=True, slots=True)
class Skip:
    """At ``step`` the run moved ``steps`` global steps on without reading them."""

    step: int
    steps: int


Entry = Stretch | Skip


def encode(entries: Sequence[Entry]) -> list[str]:
    """The entries as the state keeps them."""
    out = []
    for entry in entries:
        if isinstance(entry, Stretch):
            record = {"step": entry.step, "position": entry.position, "global_batch": entry.global_batch}
        else:
            record = {"step": entry.step, "skipped_steps": entry.steps}
        out.append(json.dumps(record, sort_keys=True, separators=(",", ":")))
    return out


def decode(texts: Sequence[str]) -> list[Entry]:
    """Entries from the state's strings.

    Raises:
        StateMismatchError: a string that is not one of the two entries, named with its index.
    """
    entries: list[Entry] = []
    for k, text in enumerate(texts):
        try:
            record = json.loads(text)
            if set(record) == {"step", "position", "global_batch"}:
                entries.append(Stretch(int(record["step"]), int(record["position"]), int(record["global_batch"])))
            elif set(record) == {"step", "skipped_steps"}:
                entries.append(Skip(int(record["step"]), int(record["skipped_steps"])))
            else:
                raise ValueError(f"keys {sorted(record)}")
        except (ValueError, TypeError, AttributeError) as exc:
            raise StateMismatchError(
                f"loader state history entry {k}: not a stretch or a skip: {text!r} ({exc})"
            ) from None
    return entries


def last_stretch(entries: Sequence[Entry]) -> Stretch | None:
    """The stretch the run is in (the last one), if any."""
    return next((e for e in reversed(entries) if isinstance(e, Stretch)), None)


def continues(entries: Sequence[Entry], step: int, position: int, distance: Distance) -> bool:
    """Whether the last stretch, read on (skips included), reaches step ``step`` at cursor ``position``."""
    stretch = last_stretch(entries)
    return stretch is not None and step >= stretch.step and stretch.position + distance(stretch, step) == position


@dataclass(frozen=True, slots=True)
class StepRead:
    """What a run read at one of its steps.

    Attributes:
        step: the step.
        position: the cursor it started at, or None when the run did not read it.
        end: one past its last position (None when not read).
        reason: why not (skipped, numbered past by a resume, before the history), else "".
    """

    step: int
    position: int | None
    end: int | None = None
    reason: str = ""


def step_read(entries: Sequence[Entry], step: int, distance: Distance) -> StepRead:
    """Where the run read its step ``step``.

    ``distance(stretch, n)``: positions from the start of the stretch's first
    step to the start of step ``n``, reading on from it (each step one global
    batch: the stretch's own where its batch is in force, a later phase's
    where one begins). A skip moves the cursor as far as reading would, so it
    needs no stretch of its own.
    """
    stretches = [e for e in entries if isinstance(e, Stretch)]
    if not stretches or step < stretches[0].step:
        first = f"step {stretches[0].step}" if stretches else "its cursor"
        return StepRead(step, None, reason=f"before this state's history, which starts at {first}")
    for skip in (e for e in entries if isinstance(e, Skip)):
        if skip.step <= step < skip.step + skip.steps:
            return StepRead(step, None, reason=f"skipped: the run moved {skip.steps} steps on at step {skip.step}")
    index = max(k for k, s in enumerate(stretches) if s.step <= step)
    stretch = stretches[index]
    position = stretch.position + distance(stretch, step)
    if index + 1 < len(stretches) and position >= stretches[index + 1].position:
        following = stretches[index + 1]
        return StepRead(
            step,
            None,
            reason=f"not read: the run resumed at cursor {following.position} with another "
            f"global batch and numbered it step {following.step}",
        )
    return StepRead(step, position, end=stretch.position + distance(stretch, step + 1))


def history_distance(schedule: Any = None) -> Distance:
    """The ``distance`` of a run read without a schedule (None) or with ``schedule`` (a ``ScheduleOrder``)."""
    if schedule is None:
        return plain_distance
    return lambda stretch, step: schedule_distance(schedule, stretch, step)


def plain_distance(stretch: Stretch, step: int) -> int:
    """``distance`` without a schedule: the stretch's batch for every step."""
    return (step - stretch.step) * stretch.global_batch


def schedule_distance(schedule: Any, stretch: Stretch, step: int) -> int:
    """``distance`` with a schedule: the stretch's batch to the end of its phase, the schedule's after it.

    ``schedule`` is a ``ScheduleOrder`` (``phases``, ``phase_at_step``, ``position_of_step``).
    """
    phases = schedule.phases
    following = schedule.phase_at_step(stretch.step).index + 1
    if following == len(phases) or step <= phases[following].start_step:
        return (step - stretch.step) * stretch.global_batch
    after = phases[following]
    return (
        (after.start_step - stretch.step) * stretch.global_batch
        + schedule.position_of_step(step)
        - after.start_position
    )
