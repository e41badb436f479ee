"""A loader's data schedule: the user's phases resolved against its streams,
each phase's local batch, and the step a finite run ends at.

The order itself is the plan layer's ``ScheduleOrder`` (docs/ORDER.md,
"Schedules"); this module only turns what the user passes into it. A phase is
the plan's ``SchedulePhase`` (exported as ``zephon_stream.Phase``): the
streams are the loader's list, given once, and a phase names them only
through its ``weights``, one per stream (0 = not read in that phase).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from zephon_stream.errors import ConfigError
from zephon_stream.loader.blocks.streams import Stream, StreamSource, stream_shapes
from zephon_stream.plan import ScheduleOrder, SchedulePhase

__all__ = ["Phase", "build_schedule", "local_batch_of", "resolve_phases", "run_end_step"]

Phase = SchedulePhase
"""One phase of a loader's schedule (the plan's ``SchedulePhase``)."""


def resolve_phases(phases: Sequence[SchedulePhase | Mapping], streams: Sequence[Stream]) -> list[SchedulePhase]:
    """The phases as ``SchedulePhase``s, with the streams' own weights where a phase gives none.

    The plan reads empty weights as equal weights; the loader reads
    them as ``Stream.weight``s instead, so that a schedule that only changes
    the batch or seq_len keeps the mixture the streams were given with (and a
    one-phase schedule reads what the loader without one reads).

    Raises:
        ConfigError: a phase that is neither a ``Phase`` nor a dict of its
            fields, or whose weights are not one per stream.
    """
    if isinstance(phases, (SchedulePhase, Mapping)) or not isinstance(phases, Sequence):
        raise ConfigError(f"schedule must be a list of phases, got {type(phases).__name__}")
    out = []
    for k, phase in enumerate(phases):
        if isinstance(phase, Mapping):
            phase = SchedulePhase.from_dict(dict(phase), where=f"schedule phase {k}")
        if not isinstance(phase, SchedulePhase):
            raise ConfigError(f"schedule phase {k}: expected a Phase or a dict of its fields, got {phase!r}")
        if not phase.weights:
            phase = SchedulePhase(
                start_step=phase.start_step,
                global_batch=phase.global_batch,
                seq_len=phase.seq_len,
                lanes=phase.lanes,
                window=phase.window,
                weights=tuple(s.weight for s in streams),
            )
        elif len(phase.weights) != len(streams):
            raise ConfigError(
                f"schedule phase {k} (start step {phase.start_step}): weights has {len(phase.weights)} entries "
                f"but the loader has {len(streams)} streams; give one weight per stream (0 = not read)"
            )
        out.append(phase)
    return out


def local_batch_of(order: ScheduleOrder, phase_index: int, world_size: int) -> int:
    """Rows per rank in a phase: its global batch over the world size.

    Raises:
        ConfigError: the world size does not divide the phase's global batch.
    """
    phase = order.phases[phase_index]
    local, rest = divmod(phase.global_batch, world_size)
    if rest or not local:
        raise ConfigError(
            f"schedule phase {phase.index} (start step {phase.start_step}): global_batch "
            f"{phase.global_batch} does not divide into world_size {world_size} ranks"
        )
    return local


def run_end_step(
    order: ScheduleOrder,
    *,
    max_steps: int | None,
    max_epochs: int | None,
    epochs_stream: int,
    end_after_phase: int | None,
) -> int | None:
    """The global step a finite run stops before (the earliest end asked for), or None.

    Args:
        order: the schedule (a one-phase one for a loader without a schedule).
        max_steps: stop before this global step.
        max_epochs: stop once stream ``epochs_stream`` has read this many
            whole epochs (at the step that completes them).
        epochs_stream: the stream ``max_epochs`` counts.
        end_after_phase: stop at this phase's end.

    Raises:
        ConfigError: an end that cannot be reached (the last phase never
            ends; a stream the last phase does not read).
    """
    ends = []
    if max_steps is not None:
        ends.append(max_steps)
    if max_epochs is not None:
        ends.append(order.end_step(epochs=max_epochs, stream=epochs_stream))
    if end_after_phase is not None:
        end = order.phase_end_step(end_after_phase)
        if end is None:
            raise ConfigError(
                f"end_after_phase={end_after_phase}: the last phase does not end (schedule has "
                f"{len(order.phases)} phases); use max_steps or max_epochs"
            )
        ends.append(end)
    return min(ends) if ends else None


def build_schedule(
    phases: Sequence[SchedulePhase | Mapping] | None,
    streams: Sequence[Stream],
    sources: Sequence[StreamSource],
    *,
    seed: int,
    ends: Mapping,
) -> ScheduleOrder | None:
    """The schedule's order over the open streams, or None without phases.

    Raises:
        ConfigError: a bad phase, or a run end (``ends``: ``run_end_step``'s
            keywords) the schedule can never reach.
    """
    if phases is None:
        return None
    order = ScheduleOrder(stream_shapes(sources), resolve_phases(phases, streams), seed=seed)
    run_end_step(order, **ends)  # An end it cannot reach is refused now, not at the end
    return order
