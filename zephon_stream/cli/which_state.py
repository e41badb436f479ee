"""``zephon-stream which --state FILE``: the samples a run read at its own steps, from its loader state.

The loader numbers steps from its cursor, and a run that resumed at another
global batch or skipped steps read each step where its history says
(plan/run_history.py), not where today's settings would put it. A state
(``StreamingLoader.state_dict()``: version 1, or 2 with a schedule) holds the
order's settings and that history, so ``which`` needs nothing else.

FILE is the state saved as JSON, or a torch.distributed.checkpoint folder
holding it under some key (found by its ``version`` and ``position``
entries; ``--state-key`` picks one when there are several).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import TYPE_CHECKING, Any

from zephon_stream.errors import ConfigError

if TYPE_CHECKING:
    from zephon_stream.plan.run_history import StepRead


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """What a saved state says of its run.

    Attributes:
        seed: the order's seed.
        phases: ``SchedulePhase`` of each phase the run began (one without a schedule).
        packing: how rows were filled.
        history: the run's stretches and skips.
        scheduled: whether the run had a schedule (its steps numbered by it).
        position: the state's cursor.
    """

    seed: int
    phases: list[Any]
    packing: str
    history: list[Any]
    scheduled: bool
    position: int


def load_state(path: str, key: str | None = None) -> dict[str, Any]:
    """The loader state in a JSON file or a torch.distributed.checkpoint folder.

    Raises:
        ConfigError: no file or folder there, not a loader state, or several
            states in a checkpoint and no ``key`` (the message lists them).
    """
    if os.path.isdir(path):
        if not os.path.exists(os.path.join(path, ".metadata")):
            raise ConfigError(f"--state {path}: a folder without '.metadata': not a torch.distributed.checkpoint")
        return _from_checkpoint(path, key)
    try:
        with open(path, encoding="utf-8") as file:
            data = json.load(file)
    except OSError as exc:
        raise ConfigError(f"--state {path}: cannot read it ({exc.strerror})") from None
    except ValueError as exc:
        raise ConfigError(f"--state {path}: not JSON ({exc})") from None
    return _pick(_states_in(data, ""), path, key)


def _from_checkpoint(path: str, key: str | None) -> dict[str, Any]:
    from torch.distributed.checkpoint import FileSystemReader

    # torch's private loader of chosen keys, into one process without a
    # process group: checked with torch 2.13.0, where its signature is
    # ``(keys, *, checkpoint_id, storage_reader, process_group)``; the other
    # versions the package allows are not checked (tests/test_which_state.py
    # reads a checkpoint through it).
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    names = FileSystemReader(path).read_metadata().state_dict_metadata
    prefixes = sorted(
        {
            name[: -len(".position")]
            for name in names
            if name.endswith(".position") and f"{name[: -len('.position')]}.version" in names
        }
    )
    prefix = _pick({p: p for p in prefixes}, path, key)
    top = prefix.split(".")[0]
    import warnings

    with warnings.catch_warnings():
        # "torch.distributed is unavailable or uninitialized, assuming ... a single process": as meant.
        warnings.simplefilter("ignore", UserWarning)
        loaded = _load_state_dict_from_keys({top}, checkpoint_id=path)
    state: Any = loaded
    for part in prefix.split("."):
        state = state[part]
    return state


def _states_in(data: Any, where: str) -> dict[str, Any]:
    """Every loader state in ``data`` (a dict holding ``version`` and ``position``), by its key path."""
    if not isinstance(data, dict):
        return {}
    if "version" in data and "position" in data:
        return {where or "(top)": data}
    found = {}
    for name, value in data.items():
        found.update(_states_in(value, f"{where}.{name}" if where else str(name)))
    return found


def _pick(found: dict[str, Any], path: str, key: str | None) -> Any:
    if key is not None:
        if key not in found:
            raise ConfigError(f"--state {path}: no loader state under key {key!r} (found: {sorted(found) or 'none'})")
        return found[key]
    if len(found) != 1:
        what = "no loader state (a dict with 'version' and 'position')" if not found else f"{len(found)} loader states"
        raise ConfigError(
            f"--state {path}: {what}" + (f": {sorted(found)}; pick one with --state-key" if found else "")
        )
    return next(iter(found.values()))


def run_settings(state: dict[str, Any]) -> RunSettings:
    """The order's settings and the history a state records.

    Raises:
        StateMismatchError, VersionError: not a state this code reads.
    """
    from zephon_stream.plan import LoaderState, SchedulePhase, ScheduleState
    from zephon_stream.plan.run_history import decode

    if state.get("version") == 1:
        old = LoaderState.from_dict(dict(state))
        entries = decode(old.history)
        batch = next((e.global_batch for e in entries if hasattr(e, "global_batch")), old.lanes)
        phase = SchedulePhase.from_order_config(old.order_config(), batch)
        return RunSettings(
            seed=old.seed, phases=[phase], packing=old.packing, history=entries, scheduled=False, position=old.position
        )
    saved = ScheduleState.from_dict(dict(state))
    # A begun phase records more than the phase (its lane counts, a fingerprint): only the phase's own fields.
    names = [field.name for field in dataclasses.fields(SchedulePhase)]
    phases = [
        SchedulePhase.from_dict({name: record[name] for name in names}, where=f"--state phase {k}")
        for k, record in enumerate(saved.phases)
    ]
    history = decode(saved.history)
    return RunSettings(
        seed=saved.seed, phases=phases, packing=saved.packing, history=history, scheduled=True, position=saved.position
    )


def step_reads(order: Any, settings: RunSettings, steps: list[int]) -> list[StepRead]:
    """Each step as the run read it: where it started and ended, or (position None) why it was not read."""
    from zephon_stream.plan.run_history import StepRead, history_distance, step_read

    distance = history_distance(order if settings.scheduled else None)
    out = []
    for step in steps:
        read = step_read(settings.history, step, distance)
        if read.position is not None and read.position >= settings.position:
            read = StepRead(step, None, reason=f"not read yet: the state's cursor is {settings.position}")
        out.append(read)
    return out
