"""What a phase boundary of a data schedule costs the consumer (one rank, local disk).

At a boundary the loader stops the phase's producer and starts the next
phase's (a new helper process by default), with a ring laid out for the new
batch shape when it changes. Figure: the wall time of ``next()`` at the first
step of the second phase, against the steady per-step median of the same run
(the baseline) and the first step of the run (a cold start). Measured for the
helper process and in-process threads, with the batch shape kept and changed
(global batch 8 -> 16, seq_len 256 -> 512).

Dataset: two small datasets of this machine's Python standard library sources
(``bytes`` tokenizer, 4097-token blocks): the top-level modules and ``email/``.
The last printed line is one JSON object with the figures.
"""

from __future__ import annotations

import json
import os
import statistics
import sysconfig
import tempfile
import time
from pathlib import Path

from zephon_stream import Phase, StreamingLoader, write_dataset

BOUNDARY = 30
STEPS = 60


def build(out: Path, pattern: str) -> str:
    files = sorted(str(p) for p in Path(sysconfig.get_paths()["stdlib"]).glob(pattern))
    write_dataset(files, str(out), tokenizer="bytes", block_tokens=4097, blocks_per_shard=8, progress=False)
    return str(out)


def measure(urls: list[str], pipeline: str, changed: bool) -> dict[str, float]:
    schedule = [
        Phase(start_step=0, global_batch=8, seq_len=256),
        Phase(start_step=BOUNDARY, global_batch=16 if changed else 8, seq_len=512 if changed else 256, weights=(1, 3)),
    ]
    times = []
    with StreamingLoader(urls, schedule=schedule, pipeline=pipeline, num_fetch_threads=2) as loader:
        for _ in range(STEPS):
            started = time.perf_counter()
            next(loader)
            times.append(time.perf_counter() - started)
    steady = statistics.median(times[10 : BOUNDARY - 1] + times[BOUNDARY + 10 :])
    return {"first_ms": times[0] * 1e3, "boundary_ms": times[BOUNDARY] * 1e3, "steady_ms": steady * 1e3}


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        urls = [build(Path(tmp) / "top", "*.py"), build(Path(tmp) / "email", "email/*.py")]
        figures = {}
        for pipeline in ("process", "threads"):
            for changed in (False, True):
                name = f"{pipeline}_{'shape_changed' if changed else 'shape_kept'}"
                figures[name] = result = measure(urls, pipeline, changed)
                print(
                    f"{name:24s} boundary step {result['boundary_ms']:7.1f} ms   steady step (baseline) "
                    f"{result['steady_ms']:6.2f} ms   first step {result['first_ms']:7.1f} ms"
                )
    print(json.dumps({"cpus": os.cpu_count(), **figures}))


if __name__ == "__main__":
    main()
