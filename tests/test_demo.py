"""The demo: its model, its verdict on per-step data hashes, and one real run
end to end (embedded S3, writer, torchrun ranks, SIGKILL, resume at another
world size)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from zephon_stream.demo import report
from zephon_stream.demo.model import ModelConfig, TinyTransformer
from zephon_stream.demo.orchestrate import DemoConfig
from zephon_stream.errors import ConfigError


def test_model_is_causal():
    torch.manual_seed(0)
    model = TinyTransformer(ModelConfig(vocab_size=257, dim=32, num_layers=2, num_heads=4, max_seq_len=16))
    tokens = torch.randint(0, 257, (2, 16))
    changed = tokens.clone()
    changed[:, 10] = (changed[:, 10] + 1) % 257
    with torch.no_grad():
        before, after = model(tokens), model(changed)
    assert torch.equal(before[:, :10], after[:, :10])
    assert not torch.allclose(before[:, 10:], after[:, 10:])


def _events(world_size: int, steps: range, hashes: dict[int, str], start_step: int = 0) -> list[dict]:
    out = [{"event": "start", "world_size": world_size, "start_step": start_step, "resumed": start_step > 0}]
    for step in steps:
        out.append(
            {
                "event": "step",
                "step": step,
                "world_size": world_size,
                "loss": 5.0,
                "step_s": 0.1,
                "tokens_per_s": 1000.0,
                "hash": hashes[step],
                "loader": {"bytes_fetched": 10 * step, "stall_s": 0.0},
                "state": {"consumed": step},
            }
        )
    return out


def test_report_flags_a_step_whose_data_differ_and_a_step_never_run():
    """Steps count from 0; kill_step=4: steps 0-3 checkpointed, step 4 lost with the kill, resumed at step 4."""
    good = {step: f"h{step}" for step in range(8)}
    kwargs = dict(kill_step=4, last_step_before_kill=4)
    ok = report.build(
        reference=_events(1, range(8), good),
        interrupted=_events(2, range(5), good),
        resumed=_events(3, range(4, 8), good, start_step=4),
        **kwargs,
    )
    assert ok.all_match and "OK: all 8 steps" in ok.text()
    assert (
        "after the checkpoint of steps 0 to 3 (1 later steps lost with the kill), resumed at W=3 at step 4" in ok.text()
    )
    # Step 4 of the interrupted run was lost with the kill; only the resumed run's step 4 counts.
    lost_differs = report.build(
        reference=_events(1, range(8), good),
        interrupted=_events(2, range(5), {**good, 4: "other"}),
        resumed=_events(3, range(4, 8), good, start_step=4),
        **kwargs,
    )
    assert lost_differs.all_match
    bad = report.build(
        reference=_events(1, range(8), good),
        interrupted=_events(2, range(5), good),
        resumed=_events(3, range(4, 7), {**good, 5: "other"}, start_step=4),
        **kwargs,
    )
    assert bad.mismatches == [5, 7]
    assert not bad.all_match
    assert "MISMATCH: 2 of 8 steps differ from the reference, first at step 5" in bad.text()
    # A counter the loader did not report is shown as n/a, not as zero.
    assert "n/a" in bad.text()
    # The hash table shows the first step, both sides of the resize and the last step, by their numbers.
    shown = [line.split()[0] for line in bad.text().split("selected steps:\n")[1].splitlines()[2:] if line.strip()]
    assert shown[:5] == ["0", "3", "4", "5", "7"]


def test_demo_schedule_refuses_a_resize_outside_the_anneal():
    with pytest.raises(ConfigError, match="inside the anneal"):
        DemoConfig(schedule=True, steps=40, ckpt_every=5, kill_after=10).checked()
    assert DemoConfig(schedule=True).checked().kill_step == 20


def test_demo_config_refuses_what_cannot_work():
    with pytest.raises(ConfigError, match="another world size"):
        DemoConfig(world_sizes=(2, 2)).checked()
    with pytest.raises(ConfigError, match="--global-batch 10 is not divisible by world size 3"):
        DemoConfig(world_sizes=(2, 3), global_batch=10).checked()
    with pytest.raises(ConfigError, match="--kill-after 7 must be a checkpoint step"):
        DemoConfig(kill_after=7, ckpt_every=5).checked()
    assert DemoConfig(steps=40, ckpt_every=5).kill_step == 20


@pytest.mark.slow
def run_demo(stdlib_corpus, tmp_path, *args: str) -> tuple[subprocess.CompletedProcess, str]:
    """``zephon-stream demo`` on 20 stdlib files, small shapes, W = 2 then 1, on
    a fresh embedded S3 (no AWS variables of the caller's); ``args`` add to it."""
    command = [sys.executable, "-m", "zephon_stream", "demo", *args, "--ckpt-every", "2", "--world-sizes", "2,1",
               "--global-batch", "4", "--seq-len", "64", "--block-tokens", "257", "--blocks-per-shard", "8",
               "--s3-port", "0", "--workdir", str(tmp_path / "work")]  # fmt: skip
    for path in stdlib_corpus.files[:20]:
        command += ["--input", str(path)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    # The machine's temp folder, as the demo sees it: it must be empty
    # afterwards (torchrun's torchelastic_* folders go to the workdir).
    machine_tmp = tmp_path / "machine-tmp"
    machine_tmp.mkdir()
    env["TMPDIR"] = str(machine_tmp)
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    left = sorted(path.name for path in machine_tmp.iterdir())
    assert left == [], f"the demo left {left} in the temp folder"
    return done, done.stdout + done.stderr


@pytest.mark.torchrun
def test_demo_end_to_end_resumes_at_another_world_size_with_the_same_data(stdlib_corpus, tmp_path):
    plot = tmp_path / "demo.png"
    done, output = run_demo(stdlib_corpus, tmp_path, "--steps", "8", "--kill-after", "4", "--plot", str(plot))
    assert done.returncode == 0, output
    assert "OK: all 8 steps read exactly the reference's data" in done.stdout, output
    assert "killed at W=2 after the checkpoint of steps 0 to 3" in done.stdout
    assert "resumed at W=1 at step 4" in done.stdout
    assert "embedded S3 (moto) serving on http://127.0.0.1:" in done.stdout
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    events = (tmp_path / "work" / "resumed.jsonl").read_text()
    assert '"start_step": 4' in events and '"world_size": 1' in events


@pytest.mark.slow
@pytest.mark.torchrun
def test_demo_with_best_fit_rows_resumes_at_another_world_size_with_the_same_data(stdlib_corpus, tmp_path):
    done, output = run_demo(stdlib_corpus, tmp_path, "--packing", "best_fit", "--steps", "4", "--kill-after", "2")
    assert done.returncode == 0, output
    assert "OK: all 4 steps read exactly the reference's data" in done.stdout, output
    assert "uninterrupted, packing best_fit" in done.stdout
    for run in ("reference", "interrupted", "resumed"):
        records = [json.loads(line) for line in (tmp_path / "work" / f"{run}.jsonl").read_text().splitlines()]
        assert records[0]["event"] == "start" and records[0]["packing"] == "best_fit", run
        steps = [r for r in records if r["event"] == "step"]
        assert {r["state"]["packing"] for r in steps} == {"best_fit"}, run
        # The workers' loaders packed blocks (their summed counters time it).
        assert sum(r["loader"]["pack_s"] for r in steps) > 0, run


def test_the_demo_packing_reaches_every_workers_loader(small_dataset, tmp_path, capsys):
    """What `demo --packing` sets travels in the workers' arguments to each rank's loader (no torchrun here)."""
    from zephon_stream.cli import main
    from zephon_stream.demo.orchestrate import worker_args
    from zephon_stream.demo.train import build_loader, parse_args

    for packing in ("best_fit", "concat"):
        args = worker_args(DemoConfig(packing=packing, global_batch=4, seq_len=64), small_dataset.url, vocab_size=257)
        parsed = parse_args([*args, "--events", str(tmp_path / "events.jsonl"), "--ckpt-dir", str(tmp_path)])
        loader = build_loader(parsed, rank=1, world_size=2)
        try:
            assert loader.state_dict()["packing"] == packing and loader.local_batch_size == 2
        finally:
            loader.close()
    assert DemoConfig().packing == "concat" and "--packing concat" in " ".join(
        worker_args(DemoConfig(), "u", vocab_size=1)
    )
    with pytest.raises(ConfigError, match="--packing must be one of concat, best_fit, got 'first_fit'"):
        DemoConfig(packing="first_fit").checked()
    # The demo's printed `which` line carries the packing, and `which` takes it as printed.
    command = report.which_command(
        [small_dataset.url], step=3, world_size=1, seed=0, seq_len=64, global_batch=4, packing="best_fit"
    )
    assert command.endswith("--seed 0 --packing best_fit --world-size 1 --text")
    assert main(shlex.split(command)[1:]) == 0
    assert ", packing best_fit\n" in capsys.readouterr().out
    assert main(["demo", "--torchft", "--packing", "best_fit"]) == 1
    assert "--packing belongs to the kill-and-resize demo" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["demo", "--packing", "first_fit"])
    assert exc.value.code == 2 and "invalid choice: 'first_fit'" in capsys.readouterr().err


def which_batch_hash(urls: list[str], step: int, schedule: Path, capsys) -> str:
    """The demo's hash of global step ``step``, from ``zephon-stream which --step`` alone."""
    return which_args_hash(
        ["which", *urls, "--step", str(step), "--schedule", str(schedule), "--world-size", "1"], capsys
    )


def which_args_hash(args: list[str], capsys) -> str:
    """The demo's hash of the step that ``zephon-stream ARGS`` (a ``which`` line) shows."""
    import hashlib

    import numpy as np

    from zephon_stream.cli import main
    from zephon_stream.reader import DatasetReader

    assert main([arg for arg in args if arg != "--text"] + ["--json"]) == 0
    samples = json.loads(capsys.readouterr().out)["samples"]
    rows = []
    for s in samples:
        with DatasetReader.open(s["dataset"]) as reader:
            rows.append(reader.read_tokens(s["token_start"], s["token_start"] + s["num_tokens"]).astype(np.int64))
    digest = hashlib.sha256(np.stack([r[:-1] for r in rows]).tobytes())
    digest.update(np.stack([r[1:] for r in rows]).tobytes())
    return digest.hexdigest()[:16]


@pytest.mark.slow
def test_demo_schedule_resizes_inside_the_anneal_and_reads_the_reference_data(stdlib_corpus, tmp_path, capsys):
    store = tmp_path / "store"
    done, output = run_demo(
        stdlib_corpus, tmp_path, "--schedule", "--steps", "10", "--kill-after", "6", "--store", str(store)
    )
    assert done.returncode == 0, output
    assert "OK: all 10 steps read exactly the reference's data" in done.stdout, output
    assert "match  phase" in done.stdout, output
    steps = [json.loads(line) for line in (tmp_path / "work" / "reference.jsonl").read_text().splitlines()]
    # Phases start at steps 0 (pretrain), 4 (anneal) and 7 (long context).
    assert [r["phase"] for r in steps if r["event"] == "step"] == [0] * 4 + [1] * 3 + [2] * 3
    resumed = [json.loads(line) for line in (tmp_path / "work" / "resumed.jsonl").read_text().splitlines()]
    assert resumed[0]["start_step"] == 6 and resumed[0]["world_size"] == 1
    # The demo's step N is `which --step N` (steps count from 0), in every phase.
    schedule = tmp_path / "schedule.json"
    phases = DemoConfig(schedule=True, steps=10, seq_len=64, global_batch=4).phases()
    schedule.write_text(json.dumps({"seed": 0, "phases": phases}))
    urls = [str(store / "stdlib-bytes"), str(store / "stdlib-bytes-anneal")]
    events = {r["step"]: r for r in steps if r["event"] == "step"}
    for step in (0, 3, 4, 7, 9):
        assert which_batch_hash(urls, step, schedule, capsys) == events[step]["hash"], step
    # The demo prints the `which` line for its kept dataset, settings and all; run as printed, it
    # shows the step the resumed run read first.
    printed = done.stdout.split("(the first after the resize), with the demo's settings:\n  ")[1].splitlines()[0]
    args = shlex.split(printed)
    assert args[:4] == ["zephon-stream", "which", *urls] and "--schedule" in args, printed
    assert args[args.index("--step") + 1] == "6" and args[args.index("--world-size") + 1] == "1"
    assert which_args_hash(args[1:], capsys) == events[6]["hash"]


def test_the_demo_which_line_carries_the_demo_settings(small_dataset, capsys):
    """With --store the demo prints this line; `which` takes it as printed."""
    config = DemoConfig()
    command = report.which_command(
        [small_dataset.url],
        step=config.kill_step,
        world_size=config.world_sizes[1],
        seed=config.seed,
        seq_len=config.seq_len,
        global_batch=config.global_batch,
    )
    assert command == (
        f"zephon-stream which {shlex.quote(small_dataset.url)} --step 20 --seq-len 128 "
        "--global-batch 12 --seed 0 --world-size 1 --text"
    )
    from zephon_stream.cli import main

    assert main(shlex.split(command)[1:]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(
        "step 20 (from 0; TorchTitan train step 21 without accumulation): positions [240, 252), "
        "seq_len 128, lanes 12, seed 0\n"
    )
    assert printed.count(" rank 0: ") == 12
