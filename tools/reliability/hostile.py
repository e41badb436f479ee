"""Hostile inputs: each case runs in a child process with a timeout and an
address-space cap, and must end in a clear error (a ``ZephonError`` naming the
object) or in correct output; a hang, a crash, a ``MemoryError`` or wrong data
is a failure.

Child entry point: ``python -m tools.reliability.hostile CASE DATASET WORK
TRIES SEED`` prints one JSON line ``{"tries", "refused", "accepted",
"detected", "examples"}``.
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tools.reliability import hostile_data, hostile_manifest
from tools.reliability.common import child_env, run_limited
from tools.reliability.hostile_base import Outcome

CASES: dict[str, Callable[[Path, Path, int, random.Random], Outcome]] = {
    "manifest_mutations": hostile_manifest.case_manifest_mutations,
    "manifest_fields": hostile_manifest.case_manifest_fields,
    "huge_block_range": hostile_manifest.case_huge_block_range,
    "bit_flips": hostile_data.case_bit_flips,
    "frame_header_flips": hostile_data.case_frame_header_flips,
    "frame_past_declared_size": hostile_data.case_frame_past_declared_size,
    "truncated_objects": hostile_data.case_truncated_objects,
    "tiny_datasets": hostile_data.case_tiny_datasets,
    "writer_text": hostile_data.case_writer_text,
    "hostile_state": hostile_manifest.case_hostile_state,
}


def run_cases(
    *,
    dataset: Path,
    work: Path,
    tries: dict[str, int],
    seed: int,
    timeout_s: float = 300,
    memory_bytes: int = 3 << 30,
) -> dict[str, Any]:
    """Run each case in a capped child process.

    Returns:
        ``{case: {"tries", "refused", "accepted", "detected", "examples",
        "status", "seconds"}}``; status is ``ok``, ``hang``, ``crash``,
        ``memory`` or ``failed`` (with ``detail``).
    """
    import time

    results = {}
    for name, count in tries.items():
        folder = work / name
        folder.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        run = run_limited(
            ["-m", "tools.reliability.hostile", name, str(dataset), str(folder), str(count), str(seed)],
            timeout_s=timeout_s,
            memory_bytes=memory_bytes,
            env=child_env(),
        )
        seconds = round(time.perf_counter() - started, 2)
        if run.timed_out:
            results[name] = {"status": "hang", "detail": run.stderr[-2000:], "seconds": seconds}
        elif run.returncode < 0:
            results[name] = {
                "status": "crash",
                "detail": f"signal {-run.returncode}: {run.stderr[-2000:]}",
                "seconds": seconds,
            }
        elif "MemoryError" in run.stderr:
            results[name] = {"status": "memory", "detail": run.stderr[-2000:], "seconds": seconds}
        elif run.returncode != 0:
            results[name] = {"status": "failed", "detail": run.stderr[-3000:], "seconds": seconds}
        else:
            results[name] = {"status": "ok", **json.loads(run.stdout.strip().splitlines()[-1]), "seconds": seconds}
    return results


def main(argv: list[str]) -> int:
    name, dataset, work, tries, seed = argv
    outcome = CASES[name](Path(dataset), Path(work), int(tries), random.Random(int(seed)))
    print(json.dumps(outcome.to_dict()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
