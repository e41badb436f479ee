"""StreamingLoader with a data schedule: every row is the sample at the plan
layer's address for its step, batch shapes follow the phases, resumes at
another world size are exact, changed begun phases are refused, and finite
runs end where asked."""

from __future__ import annotations

import json
import os
import signal
import time

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loader_reference import DirectReader, run_step_hashes, steps_until_the_helper_serves
from zephon_stream import Phase, StreamingLoader
from zephon_stream.errors import ConfigError, HelperProcessError, StateMismatchError

# The fixture datasets have 4097-token blocks: every seq_len here tiles them.
SEQ_LENS = (64, 128, 256, 512)
BATCHES = (4, 6, 8, 12)


def open_loaders(urls, schedule, world_size, **kwargs):
    kwargs.setdefault("pipeline", "threads")
    kwargs.setdefault("num_fetch_threads", 2)
    return [
        StreamingLoader(urls, schedule=schedule, world_size=world_size, rank=r, **kwargs) for r in range(world_size)
    ]


def close_all(loaders):
    for loader in loaders:
        loader.close()


def check_rows(reader, order, step, rank, world_size, batch):
    piece = order.rank_slice(step, world_size, rank)
    rows = order.phase_at_step(step).global_batch // world_size
    assert tuple(batch["input"].shape) == (rows, piece.seq_len)
    np.testing.assert_array_equal(batch["sample_positions"].numpy(), piece.positions)
    for row in range(rows):
        tokens = reader.sample(int(piece.stream[row]), int(piece.block[row]), int(piece.sample[row]), piece.seq_len)
        np.testing.assert_array_equal(batch["input"][row].numpy(), tokens[:-1])
        np.testing.assert_array_equal(batch["labels"][row].numpy(), tokens[1:])


@st.composite
def schedules(draw):
    """2-4 phases over two streams, each with its own batch, seq_len, lanes, window and weights."""
    count = draw(st.integers(2, 4))
    starts = [0] + sorted(draw(st.lists(st.integers(1, 14), min_size=count - 1, max_size=count - 1, unique=True)))
    phases = []
    for start in starts:
        weights = draw(st.sampled_from([(1, 1), (1, 3), (0, 1), (1, 0), (2, 1)]))
        batch = draw(st.sampled_from(BATCHES))
        phases.append(
            Phase(
                start_step=start,
                global_batch=batch,
                seq_len=draw(st.sampled_from(SEQ_LENS)),
                lanes=draw(st.sampled_from([None, 2 * batch])),
                window=draw(st.sampled_from([0, 8])),
                weights=weights,
            )
        )
    return phases


@pytest.fixture(scope="module")
def urls(small_dataset, small_bpe_dataset):
    return [small_dataset.url, small_bpe_dataset.url]


@pytest.fixture(scope="module")
def reader(urls):
    out = DirectReader(urls)
    yield out
    out.close()


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(schedule=schedules(), seed=st.integers(0, 3))
def test_every_row_of_a_random_schedule_is_the_plan_layers_sample(urls, reader, schedule, seed):
    # World size 2 divides every batch drawn; each rank is checked row by row.
    steps = schedule[-1].start_step + 3
    loaders = open_loaders(urls, schedule, 2, seed=seed)
    try:
        order = loaders[0].schedule
        for step in range(steps):
            for rank, loader in enumerate(loaders):
                assert loader.step == step and loader.phase == order.phase_at_step(step).index
                check_rows(reader, order, step, rank, 2, next(loader))
    finally:
        close_all(loaders)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(schedule=schedules(), data=st.data())
def test_a_resume_at_a_random_step_and_another_world_size_continues_bit_identically(urls, schedule, data):
    steps = schedule[-1].start_step + 3
    with StreamingLoader(urls, schedule=schedule, pipeline="threads", num_fetch_threads=2) as single:
        expected = run_step_hashes([single], steps)
    cut = data.draw(st.integers(1, steps - 1), label="cut")
    order_batches = {p.global_batch for p in schedule}
    before = data.draw(st.sampled_from([w for w in (1, 2) if all(b % w == 0 for b in order_batches)]), label="W")
    first = open_loaders(urls, schedule, before)
    try:
        got = run_step_hashes(first, cut)
        state = first[0].state_dict()
    finally:
        close_all(first)
    # The new world size need only divide the batches of the phases still to read.
    later = {p.global_batch for p in schedule if p.start_step >= cut} | {
        next(p for p in reversed(schedule) if p.start_step <= cut).global_batch
    }
    after = data.draw(st.sampled_from([w for w in (1, 2, 3, 4, 6) if all(b % w == 0 for b in later)]), label="W2")
    second = open_loaders(urls, schedule, after)
    try:
        for loader in second:
            loader.load_state_dict(json.loads(json.dumps(state)))
        got += run_step_hashes(second, steps - cut)
    finally:
        close_all(second)
    assert got == expected


THREE_PHASES = [
    Phase(start_step=0, global_batch=8, seq_len=256),
    Phase(start_step=4, global_batch=12, seq_len=128, weights=(1, 3)),
    Phase(start_step=7, global_batch=4, seq_len=512, weights=(0, 1)),
]


LONG_PHASES = [
    Phase(start_step=0, global_batch=8, seq_len=256),
    Phase(start_step=25, global_batch=12, seq_len=128, weights=(1, 3)),
    Phase(start_step=50, global_batch=4, seq_len=512, weights=(0, 1)),
]


def test_the_helper_process_reads_what_threads_read_across_shape_changes(urls, reader):
    with StreamingLoader(urls, schedule=LONG_PHASES, pipeline="threads", num_fetch_threads=2) as threads:
        expected = run_step_hashes([threads], 75)
    loaders = open_loaders(urls, LONG_PHASES, 2, pipeline="process")
    try:
        pids, hashes = [], []
        for step in range(75):
            hashes += run_step_hashes(loaders, 1)
            pids.append(loaders[0].helper_pid)
            # A helper process may take many seconds to start on a busy
            # machine; until one serves, the pauses grow (to 2 s, about 100 s
            # in all) so that one does within these steps.
            time.sleep(0.04 if any(pids) else min(2.0, 0.04 * 1.15**step))
        assert hashes == expected
        assert loaders[0].local_batch_size == 2 and loaders[0].seq_len == 512
        # Each phase's run has its own ring, laid out for its batch, and
        # its own producer: threads until a helper is ready, then a helper.
        helpers = [set(pids[a:b]) - {None} for a, b in ((0, 25), (25, 50), (50, 75))]
        assert all(len(phase) <= 1 for phase in helpers)
        assert len(set.union(*helpers)) == sum(map(len, helpers)) >= 1
    finally:
        close_all(loaders)


def test_a_one_phase_schedule_reads_what_the_loader_without_one_reads(urls):
    with StreamingLoader(urls, seq_len=128, local_batch_size=6, pipeline="threads", seed=5) as plain:
        expected = run_step_hashes([plain], 12)
        plain_state = plain.state_dict()
    schedule = [{"start_step": 0, "global_batch": 6, "seq_len": 128}]
    with StreamingLoader(urls, schedule=schedule, pipeline="threads", seed=5) as scheduled:
        assert run_step_hashes([scheduled], 12) == expected
    # A version 1 state (a loader without a schedule) loads as the first phase.
    with StreamingLoader(urls, schedule=schedule, pipeline="threads", seed=5) as resumed:
        resumed.load_state_dict(plain_state)
        assert resumed.step == 12 and resumed.state_dict()["version"] == 2


def test_state_progress_and_audit_log_name_the_phase(urls, tmp_path):
    log = tmp_path / "audit.jsonl"
    with StreamingLoader(urls, schedule=THREE_PHASES, pipeline="threads", audit_log=str(log)) as loader:
        run_step_hashes([loader], 8)
        state = loader.state_dict()
        progress = loader.progress()
    assert state["version"] == 2 and state["step"] == 8 and len(state["phases"]) == 3
    assert [p["phase"] for p in progress] == [2, 2]
    records = [json.loads(line) for line in log.read_text().splitlines()][1:]
    assert [(r["step"], r["phase"], r["local_batch_size"]) for r in records] == [
        (0, 0, 8), (1, 0, 8), (2, 0, 8), (3, 0, 8), (4, 1, 12), (5, 1, 12), (6, 1, 12), (7, 2, 4)
    ]  # fmt: skip


def test_a_changed_begun_phase_is_refused_naming_phase_and_field(urls):
    with StreamingLoader(urls, schedule=THREE_PHASES, pipeline="threads") as loader:
        run_step_hashes([loader], 5)
        state = loader.state_dict()
    changed = list(THREE_PHASES)
    changed[1] = Phase(start_step=4, global_batch=12, seq_len=64, weights=(1, 3))
    with StreamingLoader(urls, schedule=changed, pipeline="threads") as loader:
        with pytest.raises(
            StateMismatchError, match=r"phase 1 \(start step 4\): seq_len: checkpoint has 128, this loader has 64"
        ):
            loader.load_state_dict(state)


def test_a_phase_added_or_edited_before_it_begins_is_accepted(urls):
    with StreamingLoader(urls, schedule=THREE_PHASES[:2], pipeline="threads") as loader:
        run_step_hashes([loader], 5)
        state = loader.state_dict()
    with StreamingLoader(urls, schedule=THREE_PHASES, pipeline="threads") as full:
        expected = run_step_hashes([full], 10)
    with StreamingLoader(urls, schedule=THREE_PHASES, pipeline="threads") as resumed:
        resumed.load_state_dict(state)
        assert (resumed.phase, resumed.local_batch_size, resumed.seq_len) == (1, 12, 128)
        assert run_step_hashes([resumed], 5) == expected[5:]


def test_a_world_size_that_does_not_divide_a_phase_batch_is_refused_naming_it(urls):
    loaders = open_loaders(urls, THREE_PHASES, 8)
    try:
        with pytest.raises(
            ConfigError, match=r"phase 1 \(start step 4\): global_batch 12 does not divide into world_size 8"
        ):
            run_step_hashes(loaders, 5)
    finally:
        close_all(loaders)


def test_phase_arguments_are_refused_beside_a_schedule(urls):
    with pytest.raises(ConfigError, match="seq_len"):
        StreamingLoader(urls, schedule=THREE_PHASES, seq_len=128)
    with pytest.raises(ConfigError, match="weights has 1 entries but the loader has 2 streams"):
        StreamingLoader(urls, schedule=[Phase(start_step=0, global_batch=4, seq_len=64, weights=(1,))])


@pytest.mark.parametrize(
    ("ends", "steps"),
    [({"max_steps": 6}, 6), ({"end_after_phase": 0}, 4), ({"end_after_phase": 1, "max_steps": 9}, 7)],
)
def test_a_finite_run_ends_at_max_steps_or_a_phase_end(urls, ends, steps):
    with StreamingLoader(urls, schedule=THREE_PHASES, pipeline="threads", **ends) as loader:
        assert sum(1 for _ in loader) == steps
        assert loader.step == steps
        with pytest.raises(StopIteration):
            next(loader)


def test_a_run_of_n_epochs_stops_where_the_plan_says_the_epochs_end(urls):
    schedule = [Phase(start_step=0, global_batch=8, seq_len=512), Phase(start_step=3, global_batch=16, seq_len=1024)]
    with StreamingLoader(urls, schedule=schedule, pipeline="threads", max_epochs=1, epochs_stream=1) as loader:
        end = loader.schedule.end_step(epochs=1, stream=1)
        assert sum(1 for _ in loader) == end
        assert loader.progress()[1]["epoch"] == 1


def test_a_new_dataset_joins_as_a_stream_at_a_future_phase(urls):
    # The recipe for a dataset that grows (docs/STREAMING.md).
    with StreamingLoader(
        urls[:1], schedule=[Phase(start_step=0, global_batch=8, seq_len=128)], pipeline="threads"
    ) as old:
        run_step_hashes([old], 5)
        state = old.state_dict()
    grown = [
        Phase(start_step=0, global_batch=8, seq_len=128, weights=(1, 0)),
        Phase(start_step=8, global_batch=8, seq_len=128, weights=(1, 1)),
    ]
    with StreamingLoader(urls, schedule=grown, pipeline="threads") as full:
        expected = run_step_hashes([full], 12)
    with StreamingLoader(urls, schedule=grown, pipeline="threads") as resumed:
        resumed.load_state_dict(state)
        assert run_step_hashes([resumed], 7) == expected[5:]
        assert [p["samples"] for p in resumed.progress()] == [8 * 8 + 4 * 4, 4 * 4]


def test_bad_run_ends_are_refused(urls):
    with pytest.raises(ConfigError, match="max_epochs must be an int >= 1"):
        StreamingLoader(urls, schedule=THREE_PHASES, max_epochs=0)
    with pytest.raises(ConfigError, match="end_after_phase=0 needs a schedule"):
        StreamingLoader(urls, seq_len=64, local_batch_size=4, end_after_phase=0)
    with pytest.raises(ConfigError, match="the last phase does not end"):
        StreamingLoader(urls, schedule=THREE_PHASES, end_after_phase=2)


@pytest.mark.parametrize("pipeline", ["process", "threads"])
def test_a_batch_kept_across_a_boundary_stays_valid_after_its_ring_is_replaced(urls, pipeline):
    with StreamingLoader(urls, schedule=THREE_PHASES, pipeline=pipeline, num_fetch_threads=2) as loader:
        batches = [next(loader) for _ in range(4)]
        kept = batches[-1]  # phase 0's last step: a view of phase 0's ring
        copy = {key: tensor.clone() for key, tensor in kept.items()}
        ring = loader.ring
        after = [next(loader) for _ in range(3)]
        assert loader.ring is not ring and after[0]["input"].shape == (12, 128)
        for key in copy:
            assert torch.equal(kept[key], copy[key])


FETCH_TOTALS = (
    "bytes_fetched",
    "blocks_fetched",
    "blocks_decoded",
    "cache_misses",
    "fetch_s",
    "decode_s",
    "assemble_s",
    "steps",
    "samples",
)


@pytest.mark.parametrize("pipeline", ["process", "threads"])
def test_stats_count_the_whole_run_across_phases_and_a_restarted_helper(urls, pipeline):
    seen = []
    with StreamingLoader(urls, schedule=THREE_PHASES, pipeline=pipeline, num_fetch_threads=2) as loader:
        for _ in range(10):
            next(loader)
            seen.append(loader.stats())
        taken = 0
        if pipeline == "process":
            # The helper serving the last phase is killed; a seek to
            # where the run stands starts another.
            taken = steps_until_the_helper_serves(loader)
            seen.append(loader.stats())
            state = loader.state_dict()
            steps_at_the_kill = seen[-1]["steps"]
            os.kill(loader.helper_pid, signal.SIGKILL)
            with pytest.raises(HelperProcessError):
                for _ in range(10_000):
                    next(loader)  # Steps it finished before it died may still come
                    taken += 1
            loader.load_state_dict(state)
        for _ in range(3):
            next(loader)
            seen.append(loader.stats())
    for key in FETCH_TOTALS:
        values = [stats[key] for stats in seen]
        assert values == sorted(values), (key, values)  # Totals never drop at a phase change
    # Each phase's run has a cache of its own, so it decodes every
    # block it serves; the run's total covers every phase's (the last phase's
    # counters alone would not).
    served: dict[int, set] = {}
    for step in range(10):
        piece = loader.schedule.rank_slice(step, 1, 0)
        served.setdefault(piece.phase, set()).update(zip(piece.stream.tolist(), piece.block.tolist()))
    assert len(served) == 3
    assert seen[9]["blocks_decoded"] >= sum(len(blocks) for blocks in served.values()) > max(map(len, served.values()))
    assert seen[-1]["steps"] == 13 + taken and seen[-1]["retries"] == 0
    if pipeline == "process":
        assert seen[-1]["blocks_fetched"] > seen[-4]["blocks_fetched"] and seen[-4]["steps"] == steps_at_the_kill
