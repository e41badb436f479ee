"""What runs inside Ray's worker processes: one unit's conversion, one batch of line counts.

Plain functions; ``ray_engine`` wraps them with ``ray.remote`` (so importing
this module needs no Ray). A task tokenizes on its own core: the tokenizer's
own thread pool is turned off, as in the process pool's workers.

The run's ``UnitSpec`` (settings and tokenizer) reaches a task as a boxed
object ref, ``[ref]``, which Ray passes as it is instead of resolving it for
every task: each worker process fetches it once a run and keeps it, so its
tokenizer is built once and stays warm, as in a pool worker (building it is a
parse of ``tokenizer.json``, and a fresh BPE tokenizer has an empty cache of
encoded words).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from zephon_stream.writer.unit_part import UnitRecord, UnitSpec, convert_unit
from zephon_stream.writer.units import WorkUnit, count_lines

# One run's spec, by its object ref's id: a worker process serves one
# Ray job, and a new run's spec replaces the old one.
_run_spec: dict[str, UnitSpec] = {}


def convert_unit_task(unit: WorkUnit, spec_box: Sequence[Any], name: str, key: str) -> UnitRecord:
    """Convert one unit into its part (the driver already knows it is not complete).

    Args:
        unit: the unit.
        spec_box: ``[ref]``, the object ref of the run's ``UnitSpec``.
        name: the unit's part folder.
        key: the unit's key, for its record.
    """
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    return convert_unit(unit, _spec(spec_box[0]), name=name, key=key)


def _spec(ref: Any) -> UnitSpec:
    spec = _run_spec.get(ref.hex())
    if spec is None:
        import ray

        spec = ray.get(ref)
        _run_spec.clear()
        _run_spec[ref.hex()] = spec
    return spec


def count_lines_task(requests: Sequence[tuple[str, int, int]], storage_options: Mapping[str, Any] | None) -> list[int]:
    """Newlines in each ``(url, start, end)`` range."""
    return count_lines(requests, storage_options)
