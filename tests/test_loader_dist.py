"""Multi-rank runs under torchrun (gloo, CPU) with the data on S3 (moto):
checkpoint at W = 4 through torch.distributed.checkpoint, kill, resume at
W = 2 and W = 3 with the global batch held; every step's union of ranks equals
the uninterrupted W = 1 run's, bit for bit."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from loader_reference import resume_points, run_step_hashes
from zephon_stream import StreamingLoader
from zephon_stream.loader.front.audit import union_sha256
from zephon_stream.storage import copy_dataset

WORKER = Path(__file__).parent / "dist_loader" / "loader_worker.py"
SEQ_LEN = 256
GLOBAL_BATCH = 12
RESUME_STEPS = 4
SEED = 9


def torchrun(nproc: int, args: list[str], env: dict[str, str], timeout_s: float = 240, worker: Path = WORKER) -> None:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        str(worker),
        *args,
    ]
    # torchrun leaves a torchelastic_* folder in its TMPDIR, and ranks
    # killed their node cache's files: both in a folder that is removed.
    with tempfile.TemporaryDirectory(prefix="zs-torchrun-") as tmp:
        env = {**env, "TMPDIR": tmp, "ZEPHON_NODE_CACHE": os.path.join(tmp, "node-cache")}
        result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
    assert result.returncode == 0, (
        f"torchrun failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    )


def union_hashes(out: Path, tag: str, world: int) -> list[str]:
    parts = [np.load(out / f"{tag}_rank{r}.npz") for r in range(world)]
    steps = parts[0]["positions"].shape[0]
    return [union_sha256((p["positions"][k], p["input"][k], p["labels"][k]) for p in parts) for k in range(steps)]


@pytest.mark.slow
@pytest.mark.torchrun
def test_checkpoint_at_4_ranks_resumes_at_2_and_3_ranks_bit_identically(small_dataset, s3_bucket, tmp_path):
    url = s3_bucket.url("data")
    copy_dataset(small_dataset.url, url, dst_options=s3_bucket.storage_options)
    with StreamingLoader(
        url, seq_len=SEQ_LEN, local_batch_size=GLOBAL_BATCH, seed=SEED, storage_options=s3_bucket.storage_options
    ) as single:
        points = resume_points(single.order, GLOBAL_BATCH, small_dataset.manifest)
        last = max(points.values())
        expected = run_step_hashes([single], last + RESUME_STEPS)
    with StreamingLoader(small_dataset.url, seq_len=SEQ_LEN, local_batch_size=GLOBAL_BATCH, seed=SEED) as local:
        assert run_step_hashes([local], 3) == expected[:3]
    save_steps = [str(points[name]) for name in ("mid_block", "mid_shard", "epoch")]
    env = {
        **os.environ,
        **s3_bucket.env,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")]),
    }
    common = [
        "--data",
        url,
        "--seq-len",
        str(SEQ_LEN),
        "--global-batch",
        str(GLOBAL_BATCH),
        "--seed",
        str(SEED),
        "--save-steps",
        *save_steps,
        "--steps",
        str(RESUME_STEPS),
        "--ckpt",
        str(tmp_path / "ckpt"),
        "--out",
        str(tmp_path),
    ]

    torchrun(4, ["--mode", "save", *common], env)
    assert union_hashes(tmp_path, "save_w4", 4) == expected[:last]
    for world in (2, 3):
        torchrun(world, ["--mode", "resume", *common], env)
        for name, step in points.items():
            got = union_hashes(tmp_path, f"resume_w{world}_from{step}", world)
            assert got == expected[step : step + RESUME_STEPS], f"resume at {name} (step {step}) on {world} ranks"
