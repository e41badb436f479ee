"""A run's steps across a batch change and a skip: the numbering a trainer keeps,
the samples read, the state's history, and the audit log."""

from __future__ import annotations

import json

import pytest

from loader_reference import run_step_hashes
from zephon_stream import StreamingLoader
from zephon_stream.errors import ConfigError
from zephon_stream.loader import Phase
from zephon_stream.plan.run_history import Skip, Stretch, decode

SEQ_LEN = 256


def ranks(url, world_size, global_batch, **kwargs):
    kwargs.setdefault("num_fetch_threads", 2)
    return [
        StreamingLoader(
            url, seq_len=SEQ_LEN, local_batch_size=global_batch // world_size, world_size=world_size, rank=r, **kwargs
        )
        for r in range(world_size)
    ]


def close_all(loaders):
    for loader in loaders:
        loader.close()


def read_steps(loaders, steps):
    """``(step, sorted global positions)`` of each of the next ``steps`` steps."""
    out = []
    for _ in range(steps):
        step = loaders[0].step
        batches = [next(loader) for loader in loaders]
        out.append((step, sorted(p for b in batches for p in b["sample_positions"].tolist())))
    return out


def test_a_resume_at_another_global_batch_numbers_its_steps_on_and_reads_from_its_cursor(small_dataset):
    first = ranks(small_dataset.url, 1, 24, lanes=24)
    try:
        read_steps(first, 7)
        state = first[0].state_dict()
    finally:
        close_all(first)
    assert state["position"] == 168 and decode(state["history"]) == [Stretch(0, 0, 24)]
    resumed = ranks(small_dataset.url, 2, 16, lanes=24)
    try:
        for loader in resumed:
            loader.load_state_dict(state)
        assert resumed[0].step == 7  # Was 168 // 16 = 10: a step number the run never took
        assert read_steps(resumed, 2) == [(7, list(range(168, 184))), (8, list(range(184, 200)))]
        again = resumed[0].state_dict()
    finally:
        close_all(resumed)
    assert decode(again["history"]) == [Stretch(0, 0, 24), Stretch(7, 168, 16)]
    # A resume at the same batch continues the stretch; max_steps counts the run's steps.
    with StreamingLoader(small_dataset.url, seq_len=SEQ_LEN, local_batch_size=16, lanes=24, max_steps=12) as third:
        third.load_state_dict(again)
        steps = [step for step, _ in read_steps([third], 3)]
        with pytest.raises(StopIteration):
            next(third)
    assert steps == [9, 10, 11] and decode(third.state_dict()["history"]) == decode(again["history"])


def test_skipped_steps_are_never_read_and_a_resume_at_another_world_size_goes_on_exactly(small_dataset, tmp_path):
    log = tmp_path / "audit.jsonl"
    with StreamingLoader(small_dataset.url, seq_len=SEQ_LEN, local_batch_size=16, seed=4, audit_log=str(log)) as run:
        before = read_steps([run], 3)
        run.skip_steps(5)
        assert run.step == 8
        after = read_steps([run], 2)
        state = run.state_dict()
        continued = run_step_hashes([run], 4)
    assert before[-1] == (2, list(range(32, 48))) and after == [(8, list(range(128, 144))), (9, list(range(144, 160)))]
    assert decode(state["history"]) == [Stretch(0, 0, 16), Skip(3, 5)]
    records = [json.loads(line) for line in log.read_text().splitlines()]
    skips = [r for r in records if r["kind"] == "skip"]
    assert skips == [{"kind": "skip", "step": 3, "skipped_steps": 5, "cursor": 48, "to_cursor": 128}]
    assert [r["step"] for r in records if r["kind"] == "step"] == [0, 1, 2, 8, 9, 10, 11, 12, 13]
    resumed = ranks(small_dataset.url, 4, 16, seed=4)
    try:
        for loader in resumed:
            loader.load_state_dict(state)
        assert resumed[0].step == 10 and run_step_hashes(resumed, 4) == continued
    finally:
        close_all(resumed)
    with pytest.raises(ConfigError, match=r"skip_steps takes an int >= 0 \(got -1\)"):
        resumed[0].skip_steps(-1)


def test_a_skip_in_a_schedule_lands_on_the_schedules_step(small_dataset):
    schedule = [Phase(start_step=0, global_batch=8, seq_len=128), Phase(start_step=5, global_batch=4, seq_len=256)]
    with StreamingLoader(small_dataset.url, schedule=schedule, pipeline="threads", num_fetch_threads=2) as run:
        read_steps([run], 3)
        run.skip_steps(4)
        assert run.step == 7 and run.phase == 1
        step, positions = read_steps([run], 1)[0]
        order = run.schedule
        assert step == 7 and positions == list(range(order.position_of_step(7), order.position_of_step(7) + 4))
        assert decode(run.state_dict()["history"]) == [Stretch(0, 0, 8), Skip(3, 4)]
