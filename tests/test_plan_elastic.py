"""Rank slicing and resume: any world size, any micro-batch, the same samples."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from zephon_stream.errors import ConfigError
from zephon_stream.plan import (
    GlobalOrder,
    LoaderState,
    OrderConfig,
    StreamShape,
    rank_positions,
    step_positions,
)


def make_shapes(sizes: list[int], block_tokens: int = 65) -> list[StreamShape]:
    return [
        StreamShape.from_counts(f"ds{i}", block_tokens, [block_tokens] * n + [block_tokens // 3])
        for i, n in enumerate(sizes)
    ]


def run_steps(order, position, local_batch, world_size, steps):
    """Every rank's slices for ``steps`` steps; returns {position: address} and the cursor."""
    read = {}
    global_batch = local_batch * world_size
    for _ in range(steps):
        seen = []
        for rank in range(world_size):
            piece = order.rank_slice(position, global_batch, world_size, rank)
            assert piece.positions.size == local_batch
            seen += piece.positions.tolist()
            for p, s, b, j in zip(
                piece.positions.tolist(), piece.stream.tolist(), piece.block.tolist(), piece.sample.tolist()
            ):
                read[p] = (s, b, j)
        assert sorted(seen) == list(range(position, position + global_batch))
        position += global_batch
    return read, position


def reference(order_args, end):
    """The uninterrupted order, computed in one vectorized call by a fresh object."""
    stream, block, sample = GlobalOrder(*order_args).sample_at(np.arange(end))
    return dict(enumerate(zip(stream.tolist(), block.tolist(), sample.tolist())))


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(2, 30), min_size=1, max_size=3),
    seq_len=st.sampled_from([4, 8, 16, 21, 32]),
    lanes=st.integers(1, 24),
    seed=st.integers(0, 2**32),
    world=st.tuples(st.integers(1, 8), st.integers(1, 8)),
    local=st.tuples(st.integers(1, 6), st.integers(1, 6)),
    steps=st.tuples(st.integers(0, 6), st.integers(1, 6)),
    window=st.integers(0, 5),
)
def test_resume_on_another_world_size_reads_the_uninterrupted_order(
    sizes, seq_len, lanes, seed, world, local, steps, window
):
    shapes = make_shapes(sizes)
    config = OrderConfig(
        seed=seed, seq_len=seq_len, lanes=lanes, window=window, weights=tuple(range(1, len(sizes) + 1))
    )
    try:
        before = GlobalOrder(shapes, config)
    except ConfigError:
        assume(False)
    read, cursor = run_steps(before, 0, local[0], world[0], steps[0])
    saved = before.state(cursor).to_dict()

    state = LoaderState.from_dict(saved)
    after = GlobalOrder(shapes, state.order_config())
    state.validate(after.state(0))
    resumed, end = run_steps(after, state.position, local[1], world[1], steps[1])
    read.update(resumed)
    assert read == reference((shapes, config), end)


@pytest.mark.parametrize("world_sizes", [(4, 3), (8, 2), (2, 8), (6, 5)])
def test_gradient_accumulation_and_micro_batch_changes_keep_the_sequence(world_sizes):
    shapes = make_shapes([40, 9])
    config = OrderConfig(seed=3, seq_len=8, lanes=12, weights=(3, 1))
    order = GlobalOrder(shapes, config)
    w1, w2 = world_sizes
    read, cursor = run_steps(order, 0, 6, w1, 5)  # 5 steps of 6 per rank
    for micro in (2, 3, 1):  # accumulation: several smaller micro-batches per step
        part, cursor = run_steps(order, cursor, micro, w2, 4)
        read.update(part)
    assert read == reference((shapes, config), cursor)


def test_rank_slice_pieces_are_contiguous_in_lane_order():
    lanes, position, batch, world = 5, 7, 12, 3
    pieces = [rank_positions(position, batch, world, r, lanes).tolist() for r in range(world)]
    ordered = sorted(range(position, position + batch), key=lambda p: (p % lanes, p // lanes))
    assert sum(pieces, []) == ordered
    assert step_positions(position, batch, lanes).tolist() == ordered


def test_rank_slice_refuses_a_world_size_that_does_not_divide_the_batch():
    with pytest.raises(ConfigError, match="world size 3 does not divide the global micro-batch 8"):
        rank_positions(0, 8, 3, 0, 4)
    with pytest.raises(ConfigError, match=r"rank 4 outside \[0, 4\)"):
        rank_positions(0, 8, 4, 4, 4)


def test_large_pieces_use_the_vectorized_path_with_the_same_result():
    lanes, position, batch, world = 96, 1234, 960, 3
    big = rank_positions(position, batch, world, 1, lanes)
    assert big.size == 320
    ordered = sorted(range(position, position + batch), key=lambda p: (p % lanes, p // lanes))
    assert big.tolist() == ordered[320:640]


@pytest.mark.parametrize(("lanes", "world", "local"), [(16, 4, 4), (16, 16, 2), (12, 3, 8)])
def test_when_world_divides_lanes_each_lane_has_one_reader(lanes, world, local):
    """C | W and C | B: a lane is read by one rank only, every step of every epoch.

    So two ranks read the same block only when it straddles two lanes: its
    samples in that epoch come from more than one lane.
    """
    shapes = make_shapes([64])
    order = GlobalOrder(shapes, OrderConfig(seq_len=16, lanes=lanes, seed=5))
    batch = world * local
    assert batch % lanes == 0
    lane_readers = defaultdict(set)
    block_readers = defaultdict(set)
    block_lanes = defaultdict(set)
    used = order.streams[0].samples_read_per_epoch
    for step in range(3 * used // batch):
        for rank in range(world):
            piece = order.rank_slice(step * batch, batch, world, rank)
            for p, b in zip(piece.positions.tolist(), piece.block.tolist()):
                epoch = (p // lanes) // order.streams[0].lane_length
                lane_readers[p % lanes].add(rank)
                block_readers[epoch, b].add(rank)
                block_lanes[epoch, b].add(p % lanes)
    assert all(len(r) == 1 for r in lane_readers.values())
    assert len(lane_readers) == lanes
    shared = [key for key, ranks in block_readers.items() if len(ranks) > 1]
    assert all(len(block_lanes[key]) > 1 for key in shared)
    assert len(shared) <= 3 * (world - 1)  # per epoch, at most one block per rank boundary


def test_blocks_for_lists_blocks_in_first_use_order_with_last_use():
    shapes = make_shapes([30])
    order = GlobalOrder(shapes, OrderConfig(seq_len=8, lanes=8, seed=1))
    plan = order.blocks_for(16, 16, 4, 2, 10)
    firsts, lasts = {}, {}
    for t in range(10):
        piece = order.rank_slice(16 + 16 * t, 16, 4, 2)
        for b in piece.block.tolist():
            firsts.setdefault(b, t)
            lasts[b] = t
    assert plan.block.tolist() == list(firsts)
    assert plan.first_step.tolist() == list(firsts.values())
    assert plan.last_step.tolist() == [lasts[b] for b in firsts]
    assert int(plan.samples.sum()) == 10 * 4


@pytest.mark.parametrize("where", ["start", "mid-epoch", "epoch boundary", "end"])
def test_resume_checklist(where):
    shapes = make_shapes([20])
    config = OrderConfig(seed=8, seq_len=16, lanes=4)
    order = GlobalOrder(shapes, config)
    used = order.streams[0].samples_read_per_epoch
    batch = 4
    total_steps = 2 * used // batch
    step = {"start": 0, "mid-epoch": used // batch // 2 + 1, "epoch boundary": used // batch, "end": total_steps}[where]
    saved = order.state(step * batch).to_dict()
    initial = order.state(0).to_dict()
    assert saved.keys() == initial.keys()
    assert {k: type(v) for k, v in saved.items()} == {k: type(v) for k, v in initial.items()}
    assert [len(v) for v in saved.values() if isinstance(v, list)] == [
        len(v) for v in initial.values() if isinstance(v, list)
    ]
    state = LoaderState.from_dict(saved)
    resumed = GlobalOrder(shapes, state.order_config())
    read, end = run_steps(resumed, state.position, 2, 2, 5)
    expected = reference((shapes, config), end)
    assert read == {p: expected[p] for p in range(step * batch, end)}
    progress = resumed.progress(state.position)[0]
    assert progress["epoch"] * used + progress["samples_in_epoch"] == step * batch
