"""How fast a loader starts: the first batch, a phase boundary and a validator rebuild, against the in-process pipeline.

Figures, each the median of paired trials in this run (the in-process
pipeline, ``pipeline="threads"``, is the baseline measured beside it):

- first batch: wall time of the first ``next()`` right after construction,
  default pipeline against threads, from local disk and from S3: SeaweedFS
  on loopback (tools/seaweedfs.py, a real S3 server; ``--s3 moto`` for
  moto's, which answers a ranged read by reading the whole object);
  construction is reported beside it. Target: process <= 1.5 x threads + 30 ms
  (local), + 60 ms (S3).
- phase boundary: ``next()`` at the first step of a new phase (batch shape
  changed) against the steady ``next()`` of the same run, with the consumer
  spending ``--step-ms`` per step (a trainer waiting on its device; a loop
  that takes no time at all leaves the loader no time to prepare a phase).
  Target: <= steady + 40 ms.
- validator rebuild: TorchTitan's validator builds its dataloader anew at
  each validation; construct, first batch and close of
  ``ZephonEvalDataLoader`` over the same held-out data, after a first build.
  Target: <= 100 ms (local).

Dataset: this machine's Python standard library sources (``bytes``
tokenizer, default 2**20 + 1-token blocks), as bench_read.py writes it. The
last printed line is one JSON object with every figure.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.bench_read import build_dataset, dataset_parser
from zephon_stream import Phase, StreamingLoader
from zephon_stream.storage import copy_dataset
from zephon_stream.storage.embedded_s3 import EmbeddedS3

PIPELINES = ("threads", "process")


def first_batch(url: str, options: dict | None, pipeline: str, seq_len: int, batch: int) -> tuple[float, float]:
    """(construction s, first next() s) of one fresh loader."""
    started = time.perf_counter()
    loader = StreamingLoader(url, seq_len=seq_len, local_batch_size=batch, pipeline=pipeline, storage_options=options)
    built = time.perf_counter()
    next(loader)
    first = time.perf_counter()
    loader.close()
    return built - started, first - built


def first_batch_figures(url: str, options: dict | None, args) -> dict[str, float]:
    times: dict[str, list[tuple[float, float]]] = {p: [] for p in PIPELINES}
    for trial in range(args.trials):
        # Paired trials, the order alternating, so drift on a shared machine hits both alike.
        for pipeline in PIPELINES if trial % 2 == 0 else PIPELINES[::-1]:
            times[pipeline].append(first_batch(url, options, pipeline, args.seq_len, args.local_batch))
    out = {}
    for pipeline in PIPELINES:
        out[f"{pipeline}_construct_ms"] = statistics.median(t[0] for t in times[pipeline]) * 1e3
        out[f"{pipeline}_first_ms"] = statistics.median(t[1] for t in times[pipeline]) * 1e3
    return out


def phase_boundary(url: str, pipeline: str, steps: int, boundary: int, step_s: float) -> dict[str, float]:
    schedule = [
        Phase(start_step=0, global_batch=8, seq_len=1024),
        Phase(start_step=boundary, global_batch=16, seq_len=512),
    ]
    times = []
    with StreamingLoader(url, schedule=schedule, pipeline=pipeline) as loader:
        for _ in range(steps):
            started = time.perf_counter()
            next(loader)
            times.append(time.perf_counter() - started)
            time.sleep(step_s)
    steady = statistics.median(times[boundary // 2 : boundary - 1] + times[boundary + 5 :])
    return {"boundary_ms": times[boundary] * 1e3, "steady_ms": steady * 1e3}


def phase_figures(url: str, args) -> dict[str, float]:
    out = {}
    for pipeline in PIPELINES:
        trials = [
            phase_boundary(url, pipeline, args.phase_steps, args.boundary, args.step_ms / 1e3)
            for _ in range(args.trials)
        ]
        for key in ("boundary_ms", "steady_ms"):
            out[f"{pipeline}_{key}"] = statistics.median(t[key] for t in trials)
    return out


def validator_rebuild(url: str, args) -> dict[str, float]:
    from zephon_stream.integrations.torchtitan import ZephonEvalDataLoader

    config = ZephonEvalDataLoader.Config(dataset_path=url)
    times = []
    for _ in range(args.trials + 1):
        started = time.perf_counter()
        loader = ZephonEvalDataLoader(
            config, dp_world_size=1, dp_rank=0, seq_len=args.seq_len, local_batch_size=args.local_batch
        )
        next(iter(loader))
        loader.close()
        times.append(time.perf_counter() - started)
    return {"first_build_ms": times[0] * 1e3, "rebuild_ms": statistics.median(times[1:]) * 1e3}


def main() -> None:
    parser = dataset_parser(__doc__)
    parser.set_defaults(local_batch=1)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--phase-steps", type=int, default=120)
    parser.add_argument("--boundary", type=int, default=60)
    parser.add_argument("--step-ms", type=float, default=5.0, help="the consumer's own time per step (phase figure)")
    parser.add_argument("--local-only", action="store_true", help="skip the S3 figures")
    parser.add_argument("--s3", choices=("seaweedfs", "moto"), default="seaweedfs", help="the S3 server on loopback")
    args = parser.parse_args()
    figures: dict[str, object] = {"cpus": os.cpu_count(), "seq_len": args.seq_len, "local_batch": args.local_batch}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.data_dir or tmp) / "stdlib-bytes"
        build_dataset(root, 2)
        url = str(root)
        local = first_batch_figures(url, None, args)
        local["target_ms"] = 1.5 * local["threads_first_ms"] + 30
        local["meets_target"] = local["process_first_ms"] <= local["target_ms"]
        figures["first_batch_local"] = local
        print(
            f"first batch, local: process {local['process_first_ms']:.1f} ms, threads (baseline) "
            f"{local['threads_first_ms']:.1f} ms; target <= {local['target_ms']:.1f} ms"
        )
        if not args.local_only:
            if args.s3 == "seaweedfs":
                from tools.seaweedfs import SeaweedFS

                server_cm = SeaweedFS(buckets=["bench"])
            else:
                server_cm = EmbeddedS3(subprocess=True)
            with server_cm as server:
                if args.s3 == "moto":
                    server.create_bucket("bench")
                options = server.storage_options()
                s3_url = "s3://bench/stdlib"
                copy_dataset(url, s3_url, dst_options=options)
                s3 = first_batch_figures(s3_url, options, args)
            s3["target_ms"] = 1.5 * s3["threads_first_ms"] + 60
            s3["meets_target"] = s3["process_first_ms"] <= s3["target_ms"]
            figures[f"first_batch_s3_{args.s3}"] = s3
            print(
                f"first batch, S3 ({args.s3}): process {s3['process_first_ms']:.1f} ms, threads (baseline) "
                f"{s3['threads_first_ms']:.1f} ms; target <= {s3['target_ms']:.1f} ms"
            )
        phase = phase_figures(url, args)
        phase["target_ms"] = phase["process_steady_ms"] + 40
        phase["meets_target"] = phase["process_boundary_ms"] <= phase["target_ms"]
        figures["phase_boundary"] = phase
        print(
            f"phase boundary: process {phase['process_boundary_ms']:.1f} ms (steady {phase['process_steady_ms']:.2f}),"
            f" threads {phase['threads_boundary_ms']:.1f} ms (steady {phase['threads_steady_ms']:.2f})"
        )
        rebuild = validator_rebuild(url, args)
        rebuild["meets_target"] = rebuild["rebuild_ms"] <= 100
        figures["validator_rebuild_local"] = rebuild
        print(
            f"validator rebuild, local: {rebuild['rebuild_ms']:.1f} ms (first build {rebuild['first_build_ms']:.1f} ms)"
        )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
