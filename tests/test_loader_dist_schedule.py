"""A three-phase schedule under torchrun (gloo, CPU) with the data on S3 (moto):
checkpointed with DCP inside the second phase at W = 4, killed, resumed at
W = 3 across the boundary into the third phase (another batch and seq_len);
every step's union of ranks equals the uninterrupted W = 1 run's, bit for bit."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from loader_reference import run_step_hashes
from test_loader_dist import torchrun
from zephon_stream import StreamingLoader
from zephon_stream.loader.front.audit import union_sha256
from zephon_stream.storage import copy_dataset

WORKER = Path(__file__).parent / "dist_loader" / "schedule_worker.py"
SCHEDULE = [
    {"start_step": 0, "global_batch": 12, "seq_len": 256},
    {"start_step": 4, "global_batch": 24, "seq_len": 128, "weights": [1, 3]},
    {"start_step": 8, "global_batch": 12, "seq_len": 512, "weights": [0, 1]},
]
SAVE_STEP = 6  # inside the second phase
STEPS = 5  # two of the second phase, three of the third


def union_hashes(out: Path, tag: str, world: int) -> list[str]:
    parts = [np.load(out / f"{tag}_rank{r}.npz") for r in range(world)]
    steps = int(parts[0]["steps"])
    return [union_sha256((p[f"positions_{k}"], p[f"input_{k}"], p[f"labels_{k}"]) for p in parts) for k in range(steps)]


@pytest.mark.slow
@pytest.mark.torchrun
def test_a_scheduled_run_killed_in_its_second_phase_resumes_at_3_ranks_bit_identically(
    small_dataset, small_bpe_dataset, s3_bucket, tmp_path
):
    urls = [s3_bucket.url("a"), s3_bucket.url("b")]
    for src, dst in zip((small_dataset.url, small_bpe_dataset.url), urls):
        copy_dataset(src, dst, dst_options=s3_bucket.storage_options)
    with StreamingLoader([small_dataset.url, small_bpe_dataset.url], schedule=SCHEDULE, pipeline="threads") as single:
        expected = run_step_hashes([single], SAVE_STEP + STEPS)
    env = {
        **os.environ,
        **s3_bucket.env,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")]),
    }
    common = ["--data", *urls, "--schedule", json.dumps(SCHEDULE), "--save-step", str(SAVE_STEP),
              "--steps", str(STEPS), "--ckpt", str(tmp_path / "ckpt"), "--out", str(tmp_path)]  # fmt: skip
    torchrun(4, ["--mode", "save", *common], env, worker=WORKER)
    assert union_hashes(tmp_path, "save_w4", 4) == expected[:SAVE_STEP]
    torchrun(3, ["--mode", "resume", *common], env, worker=WORKER)
    assert union_hashes(tmp_path, "resume_w3", 3) == expected[SAVE_STEP:]
