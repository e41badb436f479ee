"""ZephonFTDataLoader under TorchTitan's torchft trainer pieces (0.3.0 and main): replica
groups as real processes (real lighthouse, gloo on loopback) built as
``FaultTolerantTrainer`` builds them, stepping in its ``train_step`` order
with gradient accumulation; a group SIGKILLed and restarted (it heals), one
leaving, then the whole job restarted from TorchTitan's full checkpoint.

``FaultTolerantTrainer`` itself imports triton (TorchTitan's model package
does), which a CPU build of torch lacks, so the workers
(tests/dist_titan/ft_worker.py) repeat its lines, and
``test_the_repeated_lines_are_torchtitans_own`` checks them against the
installed source.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("torchtitan", reason="needs the [torchtitan] extra")
pytest.importorskip("torchft", reason="needs the [torchft] extra")

from torchtitan.experiments.torchft.checkpoint import TorchFTCheckpointManager  # noqa: E402
from torchtitan.experiments.torchft.config.job_config import FaultTolerance  # noqa: E402
from torchtitan.experiments.torchft.manager import TorchFTManager  # noqa: E402

from titan_forms import repeat, trainer_keywords  # noqa: E402
from zephon_stream.demo.torchft_run import (  # noqa: E402
    lost_and_repeated,
    reference_digests,
    run_groups,
)
from zephon_stream.errors import ConfigError  # noqa: E402
from zephon_stream.integrations.torchtitan import TITAN  # noqa: E402
from zephon_stream.integrations.torchtitan.torchft import (  # noqa: E402
    ZephonFTCheckpointManager,
    ZephonFTDataLoader,
    check_titan_ft_config,
)

WORKER = str(Path(__file__).parent / "dist_titan" / "ft_worker.py")
SEQ_LEN, LANES, LOCAL_BATCH, MICROBATCHES = 16, 12, 2, 2
GROUP_BATCH = LOCAL_BATCH * MICROBATCHES

# The lines of FaultTolerantTrainer the worker repeats, in the order they
# stand in experiments/torchft/trainer.py (main renamed the pipeline count).
TITAN_FT_LINES = (
    "batch_degree, batch_rank = self.ft_manager.get_dp_info(batch_degree, batch_rank)",
    "self.dataloader = config.dataloader.build(",
    "dp_world_size=batch_degree,",
    "dp_rank=batch_rank,",
    "optimizers=self.optimizers,",
    "ft_manager=self.ft_manager,",
    "self.optimizers.zero_grad(set_to_none=self.config.training.disable_cuda_graphs)",
    "for _ in range(self.gradient_accumulation_steps):",
    f"for _ in range(self.{TITAN.pp_microbatches_attr}):",
    "input_dict, labels = next(data_iterator)",
    "self.optimizers.step()",
    "self.checkpointer.load(step=config.checkpoint.load_step)",
    "self.train_step(data_iterator)",
    "self.checkpointer.save(",
)


def test_the_repeated_lines_are_torchtitans_own():
    source = Path(importlib.util.find_spec("torchtitan.experiments.torchft.trainer").origin).read_text()
    lines = [" ".join(line.split()) for line in source.splitlines()]
    at = 0
    for wanted in TITAN_FT_LINES:
        found = [i for i in range(at, len(lines)) if lines[i] == wanted]
        assert found, f"FaultTolerantTrainer no longer has {wanted!r} after line {at}: update ft_worker.py"
        at = found[0] + 1


def check_positions_once(counts) -> int:
    """Every trained position trained once, and they are 0..N-1; returns N."""
    lost, repeated, trained = lost_and_repeated(counts)
    assert (lost, repeated) == (0, 0), f"lost {lost}, repeated {repeated} of {trained}"
    assert trained > 0 and int(counts[:trained].sum()) == trained
    return trained


def check_tokens(run, dataset: str) -> None:
    rows = [
        (p, d) for recs in run.records.values() for rec in recs for p, d in zip(rec["positions"][0], rec["digests"][0])
    ]
    reference = reference_digests(dataset, seq_len=SEQ_LEN, lanes=LANES, positions=max(p for p, _ in rows) + 1)
    wrong = [(p, d) for p, d in rows if p >= 0 and reference[p] != d]
    assert not wrong, f"rows whose tokens differ from a single-rank reading: {wrong[:5]}"


@pytest.mark.slow
def test_titan_ft_groups_lose_and_repeat_no_sample_through_kill_heal_leave_and_a_restart_from_the_checkpoint(
    small_dataset, tmp_path
):
    dump = tmp_path / "dump"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    extra = {
        "dump": str(dump),
        "interval": 4,
        "local_batch": LOCAL_BATCH,
        "microbatches": MICROBATCHES,
        "groups": 3,
        "positions": 400,
        "device": "cuda" if torch.cuda.is_available() else None,
    }
    events = {
        0: {"hold_at": [5, "g1r0.life2.ready"]},
        1: {"kill_at": 3},
        2: {"hold_at": [5, "g1r0.life2.ready"], "leave_at": 8},
    }
    run = run_groups(
        tmp_path / "a",
        dataset=small_dataset.url,
        groups=3,
        group_world_size=1,
        async_quorum=True,
        loaders=[{"group_batch": GROUP_BATCH}],
        steps=12,
        seq_len=SEQ_LEN,
        lanes=LANES,
        events=events,
        restart={1: "g0r0.step"},
        worker=[WORKER],
        extra=extra,
        timeout_s=120,
    )
    assert run.exit_codes["g1r0"][0] == -9
    recs = run.records
    # gradient accumulation: MICROBATCHES next() calls per step, each LOCAL_BATCH rows (main: end to end)
    shape = [LOCAL_BATCH * SEQ_LEN] if TITAN.flat_batches else [LOCAL_BATCH, SEQ_LEN]
    assert all(r["shapes"] == [shape] * MICROBATCHES for rs in recs.values() for r in rs)
    assert any(r["participants"] == 3 for r in recs["g1r0"] if r["step"] > 5), "the restarted group never rejoined"
    assert any(r["participants"] == 2 for r in recs["g0r0"] if r["step"] > 8), "group 2 never left"
    check_positions_once(run.counts("ours")[0])
    check_tokens(run, small_dataset.url)
    # TorchTitan's full checkpoint, once per train step, by participating rank 0; no per-replica ones
    saved = [r["train_step"] for rs in recs.values() for r in rs if r["saved"]]
    assert saved and len(saved) == len(set(saved)), f"train steps saved by more than one group: {sorted(saved)}"
    assert not list((dump / "checkpoint").glob("ft-replicat-*"))
    last = max(saved)

    # The whole job restarts (two groups) from the newest full checkpoint: the
    # data continues where that checkpoint's model stood, none lost or repeated.
    extra["groups"] = 2
    again = run_groups(
        tmp_path / "b",
        dataset=small_dataset.url,
        groups=2,
        group_world_size=1,
        async_quorum=True,
        loaders=[{"group_batch": GROUP_BATCH}],
        steps=3,
        seq_len=SEQ_LEN,
        lanes=LANES,
        events={},
        worker=[WORKER],
        extra=extra,
        timeout_s=90,
    )
    finals = again.finals
    assert all(f["loaded"] for f in finals.values())
    start = {f["start_position"] for f in finals.values()}
    assert len(start) == 1 and start.pop() > 0
    total = check_positions_once(again.counts("ours")[0])
    assert total > int(next(iter(finals.values()))["start_position"])
    assert any(r["train_step"] == last + 1 for rs in again.records.values() for r in rs)


def test_config_refuses_what_a_torchft_run_cannot_honour():
    for bad in (
        {"max_steps": 3},
        {"phases": '[{"step": 1}]'},
        repeat(False),
        {"gradient_accumulation_steps": 2},
        *([] if TITAN.flat_batches else [{"packing_outputs": True}]),
    ):
        with pytest.raises(ConfigError, match="not supported under torchft"):
            ZephonFTDataLoader.Config(dataset_path="/data/ds", **bad)


def test_loader_refuses_iteration_before_the_manager_is_bound_and_a_disabled_manager():
    loader = ZephonFTDataLoader.Config(dataset_path="/data/ds").build(
        dp_world_size=4, dp_rank=1, **trainer_keywords(8, 2)
    )
    with pytest.raises(ConfigError, match="bind_torchft"):
        next(loader)
    with pytest.raises(ConfigError, match="fault_tolerance.enable"):
        loader.bind_torchft(TorchFTManager(FaultTolerance(enable=False)))


def test_checkpointer_keeps_per_replica_dataloader_checkpoints_off_and_the_job_check_refuses_them():
    assert ZephonFTCheckpointManager.Config().enable_ft_dataloader_checkpoints is False
    with pytest.raises(ConfigError, match="enable_ft_dataloader_checkpoints must be false"):
        ZephonFTCheckpointManager.Config(enable_ft_dataloader_checkpoints=True).build(
            dataloader=None, model_parts=[], optimizers=None, lr_schedulers=None, states={}, sd_adapter=None
        )

    class Job:
        dataloader = ZephonFTDataLoader.Config(dataset_path="/data/ds")
        fault_tolerance = FaultTolerance(enable=True, group_size=2)
        checkpoint = TorchFTCheckpointManager.Config(enable=True)

    with pytest.raises(ConfigError, match="ZephonFTCheckpointManager.Config"):
        check_titan_ft_config(Job)
    Job.checkpoint = ZephonFTCheckpointManager.Config(enable=True)
    check_titan_ft_config(Job)
    Job.fault_tolerance = FaultTolerance(enable=True, semi_sync_method="diloco")
    with pytest.raises(ConfigError, match="semi_sync_method"):
        check_titan_ft_config(Job)


def test_trainer_subclass_builds_itself_from_its_config(tmp_path):
    """``ZephonFTTrainer`` imports TorchTitan's trainer, whose models need triton:
    in a process of its own, with check_job.py's stand-in for that one module."""
    check = "\n".join(
        (
            "import check_job",
            "check_job.stand_in_for_triton_kernels()",
            "from zephon_stream.integrations.torchtitan.torchft_trainer import FaultTolerantTrainer, ZephonFTTrainer",
            "assert ZephonFTTrainer.Config._owner is ZephonFTTrainer",
            "print(ZephonFTTrainer.__mro__[1].__module__)",
        )
    )
    repo = Path(__file__).resolve().parents[1]
    path = os.pathsep.join(
        p for p in (str(repo / "examples" / "torchtitan"), os.environ.get("PYTHONPATH"), str(repo)) if p
    )
    done = subprocess.run(
        [sys.executable, "-c", check],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "PYTHONPATH": path, "TMPDIR": str(tmp_path)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "torchtitan.experiments.torchft.trainer"
    # bind_torchft takes the trainer's pipeline microbatches by the name the installed TorchTitan gives them.
    source = Path(importlib.util.find_spec("torchtitan.experiments.torchft.trainer").origin).read_text()
    assert f"self.{TITAN.pp_microbatches_attr} =" in source
