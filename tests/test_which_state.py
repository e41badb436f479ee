"""``zephon-stream which --state``: the samples a run read at its own steps, after a
global batch change and a skip, from its state as JSON or a torch.distributed.checkpoint
folder; and what ``which`` without the state says it assumes."""

from __future__ import annotations

import json

import pytest

from zephon_stream import StreamingLoader
from zephon_stream.cli import main
from zephon_stream.loader import Phase

SEQ_LEN = 256


def loaders(url, world_size, global_batch, **kwargs):
    return [
        StreamingLoader(
            url,
            seq_len=SEQ_LEN,
            local_batch_size=global_batch // world_size,
            world_size=world_size,
            rank=r,
            num_fetch_threads=2,
            pipeline="threads",
            **kwargs,
        )
        for r in range(world_size)
    ]


def take(group, steps):
    """``{step: sorted positions}`` read by the ranks of ``group`` over ``steps`` steps."""
    read = {}
    for _ in range(steps):
        step = group[0].step
        read[step] = sorted(p for loader in group for p in next(loader)["sample_positions"].tolist())
    return read


def which(capsys, *args) -> dict:
    assert main(["which", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def changed_run(small_dataset, tmp_path_factory):
    """A run at global batch 24 for 7 steps, resumed at 16 on 2 ranks, a skip of 5 steps, 2 more steps."""
    first = loaders(small_dataset.url, 1, 24, lanes=24)
    read = take(first, 7)
    state = first[0].state_dict()
    first[0].close()
    second = loaders(small_dataset.url, 2, 16, lanes=24)
    for loader in second:
        loader.load_state_dict(state)
    read |= take(second, 2)
    for loader in second:
        loader.skip_steps(5)
    read |= take(second, 2)
    state = second[0].state_dict()
    for loader in second:
        loader.close()
    path = tmp_path_factory.mktemp("which_state") / "state.json"
    path.write_text(json.dumps(state))
    return read, path


def test_each_step_is_named_as_the_run_read_it(small_dataset, changed_run, capsys):
    read, path = changed_run
    assert sorted(read) == [0, 1, 2, 3, 4, 5, 6, 7, 8, 14, 15]
    for step, positions in read.items():
        out = which(capsys, small_dataset.url, "--state", str(path), "--step", str(step))
        assert out["read"] and [s["position"] for s in out["samples"]] == positions, step
        assert out["positions"] == [positions[0], positions[-1] + 1]
    assert read[7] == list(range(168, 184))  # Without the state, step 7 at batch 16 would be [112, 128)
    skipped = which(capsys, small_dataset.url, "--state", str(path), "--step", "10")
    assert skipped == {"step": 10, "read": False, "reason": "skipped: the run moved 5 steps on at step 9"}
    later = which(capsys, small_dataset.url, "--state", str(path), "--step", "16")
    assert not later["read"] and "not read yet" in later["reason"]
    assert main(["which", small_dataset.url, "--state", str(path), "--step", "10"]) == 0
    assert "step 10 (from 0): not read by this run: skipped" in capsys.readouterr().out


def test_which_without_the_state_says_what_it_assumes(small_dataset, capsys):
    assert main(["which", small_dataset.url, "--step", "7", "--seq-len", str(SEQ_LEN), "--global-batch", "16",
                 "--lanes", "24"]) == 0  # fmt: skip
    assert "a run that changed its global batch or skipped steps read other samples" in capsys.readouterr().out


def test_a_checkpoint_folder_serves_as_the_state_and_flags_it_replaces_are_refused(
    small_dataset, changed_run, tmp_path, capsys
):
    import torch.distributed.checkpoint as dcp

    read, path = changed_run
    state = json.loads(path.read_text())
    folder = tmp_path / "ckpt"
    dcp.save(
        {"dataloader": state, "model": {"w": __import__("torch").zeros(2)}}, checkpoint_id=str(folder), no_dist=True
    )
    out = which(capsys, small_dataset.url, "--state", str(folder), "--step", "8")
    assert [s["position"] for s in out["samples"]] == read[8]
    two = tmp_path / "two"
    dcp.save({"a": state, "b": state}, checkpoint_id=str(two), no_dist=True)
    assert main(["which", small_dataset.url, "--state", str(two), "--step", "8"]) == 1
    assert "2 loader states: ['a', 'b']; pick one with --state-key" in capsys.readouterr().err
    out = which(capsys, small_dataset.url, "--state", str(two), "--state-key", "b", "--step", "8")
    assert [s["position"] for s in out["samples"]] == read[8]
    assert main(["which", small_dataset.url, "--state", str(path), "--step", "8", "--global-batch", "16"]) == 1
    assert "drop --global-batch" in capsys.readouterr().err


def test_a_scheduled_runs_skip_is_named(small_dataset, tmp_path, capsys):
    schedule = [Phase(start_step=0, global_batch=8, seq_len=128), Phase(start_step=5, global_batch=4, seq_len=256)]
    with StreamingLoader(small_dataset.url, schedule=schedule, pipeline="threads", num_fetch_threads=2) as run:
        read = take([run], 3)
        run.skip_steps(4)
        read |= take([run], 2)
        state = run.state_dict()
    path = tmp_path / "state.json"
    path.write_text(json.dumps(state))
    for step, positions in read.items():
        out = which(capsys, small_dataset.url, "--state", str(path), "--step", str(step))
        assert [s["position"] for s in out["samples"]] == positions, step
    assert not which(capsys, small_dataset.url, "--state", str(path), "--step", "4")["read"]
