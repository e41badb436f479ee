"""The state of a scheduled order (version 2): the cursor, the phases begun, every stream's progress.

Version 1 states (``LoaderState``, one phase) load as a one-phase schedule
whose global batch was not recorded.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Protocol

from zephon_stream.errors import StateMismatchError, VersionError
from zephon_stream.plan.mixture import same_proportions
from zephon_stream.plan.run_history import decode
from zephon_stream.plan.state import MAX_POSITION, OPTIONAL_KEYS, SCHEDULE_STATE_VERSION, LoaderState, check_packing

if TYPE_CHECKING:
    from zephon_stream.plan.schedule import Phase
    from zephon_stream.plan.shape import StreamShape


class ScheduledOrder(Protocol):
    """What a state is checked against (``schedule_order.ScheduleOrder`` has
    it): the seed, the streams' shapes, the built phases and each stream's
    progress at a cursor.

    The state reads nothing else of the order, so it sits below
    ``schedule_order.py``, which builds states.
    """

    seed: int
    shapes: list[StreamShape]
    phases: list[Phase]

    def progress(self, position: int, *, begun: bool = False) -> list[dict]: ...


# The fields of a begun phase that fix its order, in the order errors
# list them; ``global_batch`` also fixes where later phases start.
PHASE_FIELDS = ("start_step", "seq_len", "lanes", "window", "weights", "lane_counts", "global_batch")
_STREAM_FIELDS = ("fingerprint", "epoch", "samples", "samples_in_epoch")


def phase_record(phase: Phase, shapes: list[StreamShape]) -> dict:
    """A begun phase as plain values, with a fingerprint of them and the streams."""
    record = {
        "start_step": phase.spec.start_step,
        "global_batch": phase.spec.global_batch,
        "seq_len": phase.order.config.seq_len,
        "lanes": phase.order.lanes,
        "window": phase.order.config.window,
        "weights": list(phase.order.weights),
        "lane_counts": list(phase.order.lane_counts),
    }
    return record | {"fingerprint": phase_fingerprint(record, [s.fingerprint for s in shapes])}


def phase_fingerprint(record: dict, stream_fingerprints: list[str]) -> str:
    """sha256 (first 16 hex digits) of a phase record's fields and the stream fingerprints."""
    payload = {name: record[name] for name in PHASE_FIELDS} | {"streams": stream_fingerprints}
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _json(value: dict) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _parse(text: str, where: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise StateMismatchError(f"loader state {where}: not a JSON object: {text!r}") from exc
    if not isinstance(value, dict):
        raise StateMismatchError(f"loader state {where}: not a JSON object: {text!r}")
    return value


def stream_record(progress: dict) -> dict:
    """One stream's progress entry of the state."""
    return {name: progress[name] for name in _STREAM_FIELDS}


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleState:
    """Everything needed to resume a scheduled order, in plain values.

    Attributes:
        version: ``SCHEDULE_STATE_VERSION`` (a version 1 state reads as 1).
        position: ``P``, samples consumed globally.
        step: the global step at ``P`` (None when read from version 1).
        seed: order seed.
        fingerprints: one dataset fingerprint per stream of the schedule.
        phases: the phases begun, as dicts (``start_step, global_batch,
            seq_len, lanes, window, weights, lane_counts, fingerprint``); a
            phase has begun once a sample of it was consumed (phase 0 always has).
        streams: per stream a dict ``fingerprint, epoch, samples,
            samples_in_epoch`` (empty when read from version 1).
        packing: how rows are filled (``"concat"``, ``"best_fit"``); a state
            written before it was recorded reads as ``"concat"``.
        history: the run's stretches and skips (plan/run_history.py), as ``LoaderState``'s.
    """

    version: int = SCHEDULE_STATE_VERSION
    position: int
    step: int | None
    seed: int
    fingerprints: list[str] = field(default_factory=list)
    phases: list[dict] = field(default_factory=list)
    streams: list[dict] = field(default_factory=list)
    packing: str = "concat"
    history: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        """The state as a dict of ints, strings and lists of strings.

        ``phases`` and ``streams`` hold one JSON object per entry, as a string.
        torch.distributed.checkpoint walks into lists that hold dicts and
        stores one value per path; a phase that begins later would add paths
        that a template state from step 0 lacks, and be dropped on load. A
        list of strings is one value, whatever its length.
        """
        return {
            "version": SCHEDULE_STATE_VERSION,
            "position": int(self.position),
            "step": self.step,
            "seed": int(self.seed),
            "fingerprints": list(self.fingerprints),
            "phases": [_json(p) for p in self.phases],
            "streams": [_json(s) for s in self.streams],
            "packing": str(self.packing),
            "history": list(self.history),
        }

    @classmethod
    def from_dict(cls, data: dict) -> ScheduleState:
        """Read a version 2 state, or a version 1 ``LoaderState`` dict as one phase.

        Raises:
            VersionError: a version this code does not read.
            StateMismatchError: a missing, unknown or mistyped key.
        """
        if not isinstance(data, dict):
            raise StateMismatchError(f"loader state must be a dict, got {type(data).__name__}")
        version = data.get("version")
        if version == 1:
            old = LoaderState.from_dict(data)
            phase = {
                "start_step": 0,
                "global_batch": None,
                "seq_len": old.seq_len,
                "lanes": old.lanes,
                "window": old.window,
                "weights": list(old.weights),
                "lane_counts": list(old.lane_counts),
                "fingerprint": None,
            }
            return cls(
                version=1,
                position=old.position,
                step=None,
                seed=old.seed,
                fingerprints=list(old.fingerprints),
                phases=[phase],
                packing=old.packing,
                history=list(old.history),
            )
        if version != SCHEDULE_STATE_VERSION:
            raise VersionError(
                f"loader state version {version!r} is not supported (this code reads versions 1 "
                f"and {SCHEDULE_STATE_VERSION})"
            )
        names = {f.name for f in fields(cls)}
        data = {**OPTIONAL_KEYS, **data}
        missing, unknown = sorted(names - set(data)), sorted(set(data) - names)
        if missing or unknown:
            raise StateMismatchError(f"loader state version {version}: missing keys {missing}, unknown keys {unknown}")
        for name in ("position", "step", "seed"):
            if name == "step" and data[name] is None:
                continue  # A version 1 state read and written again
            if not isinstance(data[name], int) or isinstance(data[name], bool):
                raise StateMismatchError(f"loader state key {name!r}: expected an int, got {data[name]!r}")
        if not 0 <= data["position"] < MAX_POSITION:
            raise StateMismatchError(f"loader state key 'position': {data['position']} is outside [0, 2**62)")
        for name in ("fingerprints", "phases", "streams", "history"):
            value = data[name]
            if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
                raise StateMismatchError(f"loader state key {name!r}: expected a list of str, got {value!r}")
        decode(data["history"])
        phases = [_parse(text, f"phase {k}") for k, text in enumerate(data["phases"])]
        streams = [_parse(text, f"stream {k}") for k, text in enumerate(data["streams"])]
        if not phases:
            raise StateMismatchError("loader state key 'phases': no phase has begun")
        for k, phase in enumerate(phases):
            absent = sorted(set(PHASE_FIELDS) - set(phase))
            if absent:
                raise StateMismatchError(f"loader state phase {k}: missing keys {absent}")
            for name in ("weights", "lane_counts"):
                if isinstance(phase[name], list) and len(phase[name]) != len(data["fingerprints"]):
                    raise StateMismatchError(
                        f"loader state phase {k}: {name} has {len(phase[name])} entries for the "
                        f"{len(data['fingerprints'])} streams of its fingerprints: the state is damaged or was edited"
                    )
        return cls(
            position=data["position"],
            step=data["step"],
            seed=data["seed"],
            fingerprints=list(data["fingerprints"]),
            phases=phases,
            streams=streams,
            packing=check_packing(data["packing"]),
            history=list(data["history"]),
        )

    def validate(self, order: ScheduledOrder, *, packing: str = "concat") -> None:
        """Check this (loaded) state can resume ``order`` read with ``packing``: no begun phase changed.

        Phases that have not begun may be added, edited or removed, and
        streams appended. Every problem is named with the phase, the field and
        both values.

        Raises:
            StateMismatchError: one or more differences.
        """
        problems = []
        if self.seed != order.seed:
            problems.append(f"seed: checkpoint has {self.seed!r}, this loader has {order.seed!r}")
        if self.packing != packing:
            problems.append(
                f"packing (how rows are filled): checkpoint has {self.packing!r}, this loader has {packing!r}"
            )
        wanted = [s.fingerprint for s in order.shapes]
        if wanted[: len(self.fingerprints)] != list(self.fingerprints):
            problems.append(
                f"dataset fingerprints (a different dataset; new streams go last): checkpoint has "
                f"{list(self.fingerprints)!r}, this loader has {wanted!r}"
            )
        problems += self._phase_problems(order)
        if not problems and self.streams:
            # A state saved on a phase's first position by an earlier
            # version holds that phase's view of its start; either view is the same cursor.
            views = zip(order.progress(self.position, begun=True), order.progress(self.position))
            for s, (saved, (now, phase_start)) in enumerate(zip(self.streams, views)):
                if saved not in (stream_record(now), stream_record(phase_start)):
                    problems.append(
                        f"stream {s} progress: checkpoint has {saved!r}, this code computes {stream_record(now)!r}"
                    )
        if problems:
            raise StateMismatchError("loader state does not match this schedule: " + "; ".join(problems))

    def _phase_problems(self, order: ScheduledOrder) -> list[str]:
        problems, extra = [], len(order.shapes) - len(self.fingerprints)
        for k, saved in enumerate(self.phases):
            where = f"phase {k} (start step {saved['start_step']})"
            if k >= len(order.phases):
                problems.append(f"{where} has begun but this schedule has {len(order.phases)} phases")
                continue
            now = phase_record(order.phases[k], order.shapes)
            later = k + 1 < len(order.phases)
            for name in PHASE_FIELDS:
                mine = saved[name]
                if name in ("weights", "lane_counts") and isinstance(mine, list) and extra:
                    # Streams appended since the checkpoint read nothing in a begun phase.
                    mine = list(mine) + ["0" if name == "weights" else 0] * extra
                if name == "global_batch" and (mine is None or not later):
                    # The batch of the last phase only numbers its steps;
                    # a resume may change it unless a later phase starts from it.
                    continue
                if name == "weights" and same_proportions(mine, now[name]):
                    continue
                if mine != now[name]:
                    appended = f" (with 0 for the {extra} streams added since)" if mine != saved[name] else ""
                    problems.append(
                        f"{where}: {name}: checkpoint has {mine!r}{appended}, this loader has {now[name]!r}"
                    )
        begun = len(self.phases)
        for phase in order.phases[begun:]:
            if phase.start_position < self.position:
                problems.append(
                    f"phase {phase.index} (start step {phase.start_step}) starts before the "
                    f"checkpoint's position {self.position} but had not begun in it"
                )
        return problems
