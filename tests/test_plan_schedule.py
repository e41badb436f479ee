"""Schedules: phases change the mixture, batch, lanes or seq_len at a step, exactly."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from zephon_stream.errors import ConfigError
from zephon_stream.plan import GlobalOrder, OrderConfig, ScheduleOrder, SchedulePhase, StreamShape

BLOCK_TOKENS = 65


def make_shapes(sizes: list[int], short: list[int] | None = None) -> list[StreamShape]:
    short = short or [0] * len(sizes)
    return [
        StreamShape.from_counts(f"ds{i}", BLOCK_TOKENS, [BLOCK_TOKENS] * n + [20] * k)
        for i, (n, k) in enumerate(zip(sizes, short))
    ]


@st.composite
def schedules(draw, *, seq_len_changes: bool = True):
    num_streams = draw(st.integers(1, 4))
    sizes = draw(st.lists(st.integers(6, 30), min_size=num_streams, max_size=num_streams))
    short = draw(st.lists(st.integers(0, 2), min_size=num_streams, max_size=num_streams))
    phases, step = [], 0
    for _ in range(draw(st.integers(2, 6))):
        lanes = draw(st.integers(num_streams, 8))
        batch = draw(st.sampled_from([lanes, 2 * lanes, draw(st.integers(1, 24))]))
        weights = draw(st.lists(st.integers(0, 3), min_size=num_streams, max_size=num_streams))
        assume(sum(weights))
        seq_len = draw(st.sampled_from([4, 8, 16])) if seq_len_changes or not phases else phases[0].seq_len
        window = draw(st.sampled_from([0, 0, 3]))
        phases.append(
            SchedulePhase(
                start_step=step, global_batch=batch, seq_len=seq_len, lanes=lanes, window=window, weights=tuple(weights)
            )
        )
        step += draw(st.integers(1, 30))
    try:
        order = ScheduleOrder(make_shapes(sizes, short), phases, seed=draw(st.integers(0, 2**64 - 1)))
    except ConfigError:
        assume(False)
    return order


def read_run(order: ScheduleOrder, extra_steps: int = 12):
    """Every position up to ``extra_steps`` steps into the last phase, with its address."""
    last = order.phases[-1]
    end = last.start_position + extra_steps * last.global_batch
    positions = np.arange(end, dtype=np.int64)
    stream, block, sample = order.sample_at(positions)
    seq_len = np.empty(end, dtype=np.int64)
    for phase in order.phases:
        seq_len[phase.start_position : phase.end_position or end] = phase.spec.seq_len
    return positions, stream, block, sample, order.epoch_at(positions), seq_len


def expected_drops(order: ScheduleOrder, s: int) -> tuple[dict[int, int], set[int]]:
    """Samples of each epoch of stream ``s`` not read by the rules of docs/ORDER.md.

    Returns the drop per epoch, and the epochs that span a seq_len change (for which
    the one-block-per-range allowance applies instead).
    """
    drops: dict[int, int] = defaultdict(int)
    mixed: set[int] = set()
    seen_start: set[int] = set()
    for phase in order.phases:
        entry = phase.streams[s]
        if entry is None:
            continue
        plan = phase.order.streams[s]
        rest = entry.carry.rest
        if rest is not None:
            if rest.seq_len != phase.spec.seq_len:
                mixed.add(rest.epoch)
            elif entry.head is None:
                drops[rest.epoch] += rest.total
            else:
                drops[rest.epoch] += rest.total - entry.head_steps * plan.lanes
        if phase.end_position is None:
            last = entry.first_epoch + 50
        else:
            after = order.carries(phase.end_position)[s]
            last = after.epoch if after.rest is not None or after.samples_in_epoch else after.epoch - 1
        for epoch in range(entry.first_epoch, last + 1):
            if epoch not in seen_start:
                seen_start.add(epoch)
                drops[epoch] += plan.stream_samples - plan.samples_read_per_epoch
    return drops, mixed


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(order=schedules(), data=st.data())
def test_any_world_size_dividing_the_phase_batch_slices_the_global_order(order, data):
    for phase in order.phases:
        batch = phase.global_batch
        steps = [phase.start_step, phase.start_step + data.draw(st.integers(0, 40))]
        for step in steps:
            if order.phase_at_step(step).index != phase.index:
                continue
            world = data.draw(st.sampled_from([w for w in range(1, batch + 1) if batch % w == 0]))
            pieces = [order.rank_slice(step, world, r) for r in range(world)]
            start = order.position_of_step(step)
            positions = np.concatenate([p.positions for p in pieces])
            assert sorted(positions.tolist()) == list(range(start, start + batch))
            stream, block, sample = order.sample_at(positions)
            assert np.array_equal(np.concatenate([p.stream for p in pieces]), stream)
            assert np.array_equal(np.concatenate([p.block for p in pieces]), block)
            assert np.array_equal(np.concatenate([p.sample for p in pieces]), sample)
            assert {p.phase for p in pieces} == {phase.index}
            left = (order.phase_end_step(phase.index) or step + 3) - step
            several = order.rank_steps(step, min(3, left), world, world - 1)
            assert len(several) == 1 and several[0].positions.shape == (min(3, left), batch // world)
            first = several[0]
            assert np.array_equal(first.positions[0], pieces[-1].positions)
            assert np.array_equal(first.block[0], pieces[-1].block)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(order=schedules())
def test_each_stream_reads_its_epochs_with_no_repeat_and_only_the_documented_drops(order):
    _, stream, block, sample, epoch, seq_len = read_run(order)
    for s in range(len(order.shapes)):
        mine = stream == s
        if not mine.any():
            continue
        epochs = np.unique(epoch[mine])
        assert epochs.tolist() == list(range(epochs[0], epochs[-1] + 1))
        drops, mixed = expected_drops(order, s)
        current = order.carries(len(stream))[s]
        for e in epochs.tolist():
            sel = mine & (epoch == e)
            if e in mixed:
                continue
            keys = block[sel] * 10_000 + sample[sel]
            assert np.unique(keys).size == keys.size, f"stream {s} epoch {e} repeats a sample"
            finished = e < current.epoch or (
                e == current.epoch and current.rest is None and not current.samples_in_epoch
            )
            if finished:
                total = order.shapes[s].stream_samples(int(seq_len[sel][0]))
                assert keys.size == total - drops[e], (s, e, keys.size, total, drops[e])


def token_spans(blocks, samples, seq_lens):
    spans = defaultdict(list)
    for b, j, length in zip(blocks.tolist(), samples.tolist(), seq_lens.tolist()):
        spans[b].append((j * length, j * length + length))
    return spans


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(order=schedules())
def test_at_a_seq_len_change_at_most_one_block_per_rest_range_is_read_again(order):
    assume(all(p.spec.window == 0 for p in order.phases))
    positions, stream, block, sample, epoch, seq_len = read_run(order)
    for phase in order.phases:
        for s, entry in enumerate(phase.streams):
            rest = None if entry is None else entry.carry.rest
            if rest is None or rest.seq_len == phase.spec.seq_len:
                continue
            mine = (stream == s) & (epoch == rest.epoch)
            if len(set(seq_len[mine].tolist())) > 2:
                continue
            before, after = mine & (positions < phase.start_position), mine & (positions >= phase.start_position)
            old = token_spans(block[before], sample[before], seq_len[before])
            new = token_spans(block[after], sample[after], seq_len[after])
            again = [
                b for b in new if b in old
                and any(lo < hi2 and lo2 < hi for lo, hi in old[b] for lo2, hi2 in new[b])
            ]  # fmt: skip
            assert len(again) <= rest.starts.size, (s, phase.index, again)


def test_a_seq_len_change_rereads_or_skips_at_most_one_block_per_lane():
    shapes = make_shapes([40])
    lanes = 4
    phases = [
        SchedulePhase(start_step=0, global_batch=4, seq_len=8, lanes=lanes),
        # 37 steps: each lane is 37 samples in, inside its 5th block (8 a block).
        SchedulePhase(start_step=37, global_batch=4, seq_len=16, lanes=lanes),
    ]
    order = ScheduleOrder(shapes, phases, seed=5)
    boundary = order.phases[1].start_position
    stream_samples = shapes[0].stream_samples(8)
    end = boundary + 400
    positions = np.arange(end)
    _, block, sample = order.sample_at(positions)
    epoch = order.epoch_at(positions)
    seq_len = np.where(positions < boundary, 8, 16)
    first = epoch == 0
    before = token_spans(
        block[first & (positions < boundary)],
        sample[first & (positions < boundary)],
        seq_len[first & (positions < boundary)],
    )
    after = token_spans(
        block[first & (positions >= boundary)],
        sample[first & (positions >= boundary)],
        seq_len[first & (positions >= boundary)],
    )
    reread = [b for b in after if b in before]
    skipped = [
        b for b, spans in before.items() if b not in after and sum(hi - lo for lo, hi in spans) < 64 and len(spans) < 8
    ]
    assert set(before) | set(after) == set(range(40)), "every block of the epoch is read"
    assert len(reread) <= lanes and len(skipped) <= lanes
    for b in after:
        assert len(after[b]) == 4 and len(set(after[b])) == 4  # read whole, once, at 16
    assert stream_samples == 40 * 8


@settings(max_examples=30, deadline=None)
@given(
    sizes=st.lists(st.integers(3, 20), min_size=1, max_size=3),
    seq_len=st.sampled_from([4, 8, 16]),
    lanes=st.integers(1, 9),
    window=st.sampled_from([0, 1, 5]),
    seed=st.integers(0, 2**64 - 1),
    start=st.integers(0, 5000),
)
def test_any_one_phase_schedule_is_the_global_order(sizes, seq_len, lanes, window, seed, start):
    shapes = make_shapes(sizes, short=[1] * len(sizes))
    config = OrderConfig(seed=seed, seq_len=seq_len, lanes=max(lanes, len(sizes)), window=window)
    try:
        order = GlobalOrder(shapes, config)
    except ConfigError:
        assume(False)
    schedule = ScheduleOrder.single(shapes, config, global_batch=config.lanes)
    for positions in (np.arange(start, start + 300), np.array([start]), np.arange(start, start + 7)):
        for a, b in zip(order.sample_at(positions), schedule.sample_at(positions)):
            assert np.array_equal(a, b)


def test_one_phase_schedule_reads_exactly_the_global_order():
    shapes = make_shapes([20, 13], short=[1, 2])
    config = OrderConfig(seed=9, seq_len=8, lanes=6, window=0, weights=(2, 1))
    order, schedule = GlobalOrder(shapes, config), ScheduleOrder.single(shapes, config, 12)
    positions = np.arange(3000)
    for a, b in zip(order.sample_at(positions), schedule.sample_at(positions)):
        assert np.array_equal(a, b)
    for p in (0, 5, 12 * 40, 2999):
        old, new = order.progress(p), schedule.progress(p)
        for o, n in zip(old, new):
            assert {k: o[k] for k in o} == {k: n[k] for k in o}
    piece = schedule.rank_slice(17, 3, 2)
    legacy = order.rank_slice(17 * 12, 12, 3, 2)
    assert np.array_equal(piece.positions, legacy.positions) and np.array_equal(piece.block, legacy.block)


def test_a_stream_added_later_starts_at_its_position_zero_and_a_removed_one_resumes():
    shapes = make_shapes([12, 12])
    phases = [
        SchedulePhase(start_step=0, global_batch=4, seq_len=8, lanes=4, weights=(1, 0)),
        SchedulePhase(start_step=5, global_batch=4, seq_len=8, lanes=4, weights=(1, 1)),
        SchedulePhase(start_step=9, global_batch=4, seq_len=8, lanes=4, weights=(0, 1)),
        SchedulePhase(start_step=12, global_batch=4, seq_len=8, lanes=4, weights=(1, 1)),
    ]
    order = ScheduleOrder(shapes, phases, seed=1)
    alone = GlobalOrder(shapes, OrderConfig(seed=1, seq_len=8, lanes=2, weights=(0, 1)))
    start = order.phases[1].start_position
    positions = np.arange(start, start + 16)
    stream, block, sample = order.sample_at(positions)
    # stream 1's first samples are its own order's first: lane j, step 0, 1, ...
    first_of_1 = [(b, j) for s, b, j in zip(stream, block, sample) if s == 1]
    _, ab, aj = alone.sample_at(np.arange(8))
    assert sorted(first_of_1) == sorted(zip(ab.tolist(), aj.tolist()))
    # stream 0 is absent in phase 2 and keeps its progress
    assert (
        order.carries(order.phases[2].start_position)[0].samples
        == order.carries(order.phases[3].start_position)[0].samples
    )
    assert order.phases[3].streams[0].carry.samples == 20 + 8


def test_lanes_kept_at_a_whole_round_continue_each_lane_with_nothing_dropped():
    shapes = make_shapes([30])
    phases = [
        SchedulePhase(start_step=0, global_batch=8, seq_len=8, lanes=4),
        SchedulePhase(start_step=7, global_batch=12, seq_len=8, lanes=4),
    ]
    order = ScheduleOrder(shapes, phases, seed=2)
    flat = GlobalOrder(shapes, OrderConfig(seed=2, seq_len=8, lanes=4))
    positions = np.arange(4 * 60)
    for a, b in zip(order.sample_at(positions), flat.sample_at(positions)):
        assert np.array_equal(a, b), "the batch change alone does not change the order"


def test_end_step_is_where_the_stream_has_read_its_epochs():
    shapes = make_shapes([10, 25])
    phases = [
        SchedulePhase(start_step=0, global_batch=6, seq_len=8, lanes=6, weights=(1, 1)),
        SchedulePhase(start_step=11, global_batch=5, seq_len=16, lanes=5, weights=(2, 3)),
    ]
    order = ScheduleOrder(shapes, phases, seed=4)
    for stream in (0, 1):
        for epochs in (1, 2, 3):
            end = order.end_step(epochs=epochs, stream=stream)
            assert order.carries(order.position_of_step(end))[stream].epoch >= epochs
            before = order.carries(order.position_of_step(end - 1))[stream]
            assert before.epoch < epochs or before.rest is not None or before.samples_in_epoch
    assert order.phase_end_step(0) == 11 and order.phase_end_step(1) is None


def test_bad_schedules_are_refused_with_the_phase_named():
    shapes = make_shapes([10])
    with pytest.raises(ConfigError, match="phase 0: start_step must be 0, got 3"):
        ScheduleOrder(shapes, [SchedulePhase(start_step=3, global_batch=4, seq_len=8)])
    with pytest.raises(ConfigError, match="phase 1: start_step 0 is not after phase 0's start_step 0"):
        ScheduleOrder(shapes, [SchedulePhase(start_step=0, global_batch=4, seq_len=8)] * 2)
    with pytest.raises(ConfigError, match=r"phase 1 \(start step 5\): seq_len must be >= 1, got 0"):
        ScheduleOrder(
            shapes,
            [
                SchedulePhase(start_step=0, global_batch=4, seq_len=8),
                SchedulePhase(start_step=5, global_batch=4, seq_len=0),
            ],
        )
    samples = shapes[0].stream_samples(8)
    first = SchedulePhase(start_step=0, global_batch=4, seq_len=8)
    with pytest.raises(
        ConfigError,
        match=rf"phase 1 \(start step 5\): stream 0 \(.*\): {samples} samples of seq_len 8 "
        rf"per epoch, fewer than the phase's global batch of {samples + 1}, which gives its lanes when "
        r"it sets none; lower its global_batch or seq_len$",
    ):
        ScheduleOrder(shapes, [first, SchedulePhase(start_step=5, global_batch=samples + 1, seq_len=8)])
    with pytest.raises(ConfigError, match=rf"fewer than its {samples + 1} lanes; lower the lanes or seq_len$"):
        ScheduleOrder(shapes, [first, SchedulePhase(start_step=5, global_batch=4, seq_len=8, lanes=samples + 1)])


# docs/ORDER.md ("Golden vectors: a three-phase schedule") lists the same
# steps; a change here is a change of the order and needs a new state version.
GOLDEN_STEPS = {
    0: "0:6.5 0:0.4 0:3.0 0:2.6",
    1: "0:6.2 0:0.6 0:3.6 0:2.7",
    2: "0:6.0 0:0.7 0:3.5 0:2.4",
    3: "0:6.7 1:0.6 0:4.2 1:4.6 0:9.1 1:5.5",
    4: "0:6.6 1:0.7 0:4.0 1:4.3 0:9.5 1:5.4",
    5: "0:6.3 1:0.2 0:4.7 1:4.7 0:9.2 1:5.6",
    6: "0:8.1 1:6.2 0:9.2 1:5.0",
    7: "0:8.3 1:6.1 0:9.1 1:5.2",
    8: "0:8.2 1:6.3 0:9.3 1:5.3",
    9: "0:8.0 1:6.0 0:9.0 1:5.1",
}


def golden_schedule() -> ScheduleOrder:
    shapes = [
        StreamShape.from_counts("golden-a", 65, [65] * 10 + [20]),
        StreamShape.from_counts("golden-b", 65, [65] * 7),
    ]
    phases = [
        SchedulePhase(start_step=0, global_batch=4, seq_len=8, lanes=4, weights=(1, 0)),
        SchedulePhase(start_step=3, global_batch=6, seq_len=8, lanes=6, weights=(1, 1)),
        SchedulePhase(start_step=6, global_batch=4, seq_len=16, lanes=4, weights=(1, 1)),
    ]
    return ScheduleOrder(shapes, phases, seed=42)


def test_three_phase_schedule_golden_vectors():
    order = golden_schedule()
    for step, expected in GOLDEN_STEPS.items():
        piece = order.rank_slice(step, 1, 0)
        got = " ".join(f"{s}:{b}.{j}" for s, b, j in zip(piece.stream, piece.block, piece.sample))
        assert got == expected, step
    assert [order.position_of_step(s) for s in (3, 6, 10)] == [12, 30, 46]
    heads = [[(e.head_steps, e.first_epoch) if e else None for e in p.streams] for p in order.phases]
    assert heads == [[(0, 0), None], [(22, 1), (0, 0)], [(16, 1), (12, 1)]]
    progress = order.progress(46)
    assert [(p["epoch"], p["samples"], p["samples_in_epoch"]) for p in progress] == [(0, 29, 29), (0, 17, 17)]


def test_rank_steps_across_boundaries_give_one_piece_per_phase():
    order = golden_schedule()
    pieces = order.rank_steps(1, 7, 2, 1)
    assert [(p.phase, p.first_step, p.positions.shape, p.seq_len) for p in pieces] == [
        (0, 1, (2, 2), 8), (1, 3, (3, 3), 8), (2, 6, (2, 2), 16),
    ]  # fmt: skip
    for piece in pieces:
        for k in range(piece.positions.shape[0]):
            one = order.rank_slice(piece.first_step + k, 2, 1)
            assert np.array_equal(one.positions, piece.positions[k]) and np.array_equal(one.sample, piece.sample[k])
    with pytest.raises(
        ConfigError, match=r"phase 1 \(start step 3\): world size 4 does not divide the global micro-batch 6"
    ):
        order.rank_steps(2, 2, 4, 0)


def test_a_pickled_schedule_reads_the_same_addresses():
    # The loader's helper process receives the schedule pickled.
    import pickle

    order = golden_schedule()
    copy = pickle.loads(pickle.dumps(order))
    positions = np.arange(0, order.position_of_step(max(GOLDEN_STEPS) + 3), dtype=np.int64)
    for got, want in zip(copy.sample_at(positions), order.sample_at(positions)):
        np.testing.assert_array_equal(got, want)
    assert [p.spec for p in copy.phases] == [p.spec for p in order.phases]
