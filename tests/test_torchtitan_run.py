"""TorchTitan main's own ``Trainer`` trains on the loader under ``torchrun``
(gloo, CPU, its llama3 debug model), checkpoints through its own
checkpointer, is SIGKILLed, and resumes at other dp degrees (2 -> 1, 2 -> 3):
every global step's data bit-identical to an uninterrupted reading; the same
with ``packing="best_fit"``.

TorchTitan 0.3.0 cannot take a training step on a CPU (its language models
refuse SDPA, and flex attention has no backward there), so this runs against
TorchTitan main only (tests/test_torchtitan_main.py), with the CPU stand-ins
of tests/dist_titan/cpu_site/ and the graph trainer's SDPA (one causal
sequence a microbatch: the model's math changes, its data does not).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytest.importorskip("torchtitan", reason="needs the [torchtitan] extra")

from fixtures_corpus import EOS_TOKEN  # noqa: E402
from test_torchtitan import _hash_rows, dataloader_entries, reference_hashes  # noqa: E402
from zephon_stream.integrations.torchtitan import TITAN, ZephonDataLoader  # noqa: E402

if not TITAN.flat_batches:
    pytest.skip(
        "TorchTitan 0.3.0 takes no training step on a CPU (SDPA refused for its language models, flex "
        "attention without a backward): tests/test_torchtitan_main.py runs this against main",
        allow_module_level=True,
    )

REPO = Path(__file__).resolve().parents[1]
WORKERS = REPO / "tests" / "dist_titan"
SEQ_LEN, GLOBAL_ROWS = 32, 6


@pytest.fixture(scope="module")
def assets(bpe_tokenizer_json: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The BPE fixture as the trainer's ``hf_assets_path`` (vocab 2000: the debug model has 2048 ids)."""
    folder = tmp_path_factory.mktemp("titan_assets")
    shutil.copy(bpe_tokenizer_json, folder / "tokenizer.json")
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": EOS_TOKEN}))
    return folder


def train(job: dict, *, nproc: int, dump: Path, kill_after_steps: int | None = None) -> None:
    """``torchrun -m torchtitan.train`` on ``nproc`` ranks; with ``kill_after_steps``,
    SIGKILL the whole job once rank 0 has taken that many batches."""
    path = os.pathsep.join(
        p for p in (str(WORKERS / "cpu_site"), str(WORKERS), os.environ.get("PYTHONPATH"), str(REPO)) if p
    )
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "torchtitan.train",
        "--module",
        "titan_job",
        "--config",
        "zephon_debugmodel",
        "--dump_folder",
        str(dump),
    ]
    with tempfile.TemporaryDirectory(prefix="zs-torchrun-") as tmp:
        env = {
            **os.environ,
            "PYTHONPATH": path,
            "OMP_NUM_THREADS": "1",
            "TMPDIR": tmp,
            "ZEPHON_NODE_CACHE": os.path.join(tmp, "node-cache"),
            "ZEPHON_TITAN_JOB": json.dumps(job),
        }
        log = dump.with_suffix(".log")
        with open(log, "w") as out:
            job_process = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            if kill_after_steps is None:
                code = job_process.wait(timeout=300)
                assert code == 0, f"{dump.name} failed:\n{log.read_text()[-6000:]}"
                return
            record = Path(job["record"]) / "rank0.jsonl"
            deadline = time.monotonic() + 300
            while not (record.exists() and len(record.read_text().splitlines()) >= kill_after_steps):
                assert job_process.poll() is None, f"{dump.name} ended before the kill:\n{log.read_text()[-6000:]}"
                assert time.monotonic() < deadline, f"{dump.name}: no step {kill_after_steps} in 300 s"
                time.sleep(0.1)
            os.killpg(job_process.pid, signal.SIGKILL)
            job_process.wait(timeout=60)
        finally:
            if job_process.poll() is None:
                os.killpg(job_process.pid, signal.SIGKILL)
                job_process.wait()


def recorded_steps(record: Path, *, shape: tuple[int, ...]) -> dict[int, str]:
    """Per global step: the hash of every rank's rows (``_hash_rows``)."""
    rows: dict[int, list] = {}
    for path in sorted(record.glob("rank*.jsonl")):
        for line in path.read_text().splitlines():
            taken = json.loads(line)
            assert tuple(taken["shape"]) == shape, f"{path.name}: a batch of shape {taken['shape']}"
            step = taken["positions"][0] // GLOBAL_ROWS
            rows.setdefault(step, []).extend(map(list, zip(taken["positions"], taken["digests"])))
    return {step: _hash_rows(step_rows) for step, step_rows in rows.items()}


@pytest.mark.slow
@pytest.mark.torchrun
@pytest.mark.parametrize("packing", ["concat", "best_fit"])
def test_mains_trainer_resumes_at_another_dp_degree_bit_identically(small_bpe_dataset, assets, tmp_path, packing):
    job = {
        "dataset": small_bpe_dataset.url,
        "assets": str(assets),
        "seq_len": SEQ_LEN,
        "global_rows": GLOBAL_ROWS,
        "steps": 7,
        "interval": 3,
        "packing": packing,
        "seed": 5,
    }
    steps, kill = (7, 5) if packing == "concat" else (5, None)
    expected = reference_hashes(
        ZephonDataLoader.Config(dataset_path=small_bpe_dataset.url, seed=5, packing=packing),
        seq_len=SEQ_LEN,
        global_batch=GLOBAL_ROWS,
        num_steps=steps,
    )

    # dp 2: three rows of 32 tokens a rank, one 1-D batch of 96 tokens; killed after step 5 (concat).
    first = tmp_path / "dp2"
    (first / "record").mkdir(parents=True)
    train({**job, "steps": steps, "record": str(first / "record")}, nproc=2, dump=first / "dump", kill_after_steps=kill)
    checkpoint = first / "dump" / "checkpoint" / "step-3"
    assert dataloader_entries(first / "dump", 3) == ["dataloader.zephon"], "one entry for every rank"
    taken = recorded_steps(first / "record", shape=(GLOBAL_ROWS // 2 * SEQ_LEN,))
    # Rank 0 took its 5th batch: both ranks have taken the first 4 whole (each step ends in collectives).
    whole = range(4) if kill else range(steps)
    assert set(whole) <= set(taken) and all(taken[step] == expected[step] for step in whole)

    for dp in (1, 3) if packing == "concat" else (3,):
        resumed = tmp_path / f"dp{dp}"
        (resumed / "record").mkdir(parents=True)
        train(
            {**job, "steps": steps, "record": str(resumed / "record"), "load": str(checkpoint)},
            nproc=dp,
            dump=resumed / "dump",
        )
        got = recorded_steps(resumed / "record", shape=(GLOBAL_ROWS // dp * SEQ_LEN,))
        assert sorted(got) == list(range(3, steps)), f"dp {dp} took steps {sorted(got)}"
        mismatched = [step for step in got if got[step] != expected[step]]
        assert not mismatched, f"dp {dp}: steps {mismatched} differ from the uninterrupted run"
