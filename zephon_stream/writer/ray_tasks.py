"""What runs inside Ray's worker processes: one unit's conversion, one batch of line counts.

Plain functions; ``ray_engine`` wraps them with ``ray.remote`` (so importing
this module needs no Ray). A task tokenizes on its own core: the tokenizer's
own thread pool is turned off, as in the process pool's workers.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from zephon_stream.writer.unit_part import UnitRecord, UnitSpec, convert_unit
from zephon_stream.writer.units import WorkUnit, count_lines


def convert_unit_task(unit: WorkUnit, spec: UnitSpec, name: str, key: str) -> UnitRecord:
    """Convert one unit into its part (the driver already knows it is not complete)."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    return convert_unit(unit, spec, name=name, key=key)


def count_lines_task(requests: Sequence[tuple[str, int, int]], storage_options: Mapping[str, Any] | None) -> list[int]:
    """Newlines in each ``(url, start, end)`` range."""
    return count_lines(requests, storage_options)
