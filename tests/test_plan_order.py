"""The global order of one or several streams: epochs, lanes, windows, mixtures."""

from __future__ import annotations

from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from test_plan_permutation import spec_permute  # the permutation spec, transcribed
from zephon_stream.errors import ConfigError
from zephon_stream.plan import GlobalOrder, OrderConfig, StreamShape, lane_map, split_lanes


def shape_of(name: str, block_tokens: int, counts: list[int]) -> StreamShape:
    return StreamShape.from_counts(name, block_tokens, counts)


def merged_shape(name: str, block_tokens: int, shard_blocks: list[int], tails: list[int]):
    """Blocks of several writer parts: each part's last block is short."""
    counts = []
    for blocks, tail in zip(shard_blocks, tails):
        counts += [block_tokens] * blocks + [tail]
    return shape_of(name, block_tokens, counts)


def all_samples(shape: StreamShape, seq_len: int) -> set[tuple[int, int]]:
    counts = shape.block_token_counts(np.arange(shape.num_blocks))
    return {(b, j) for b, n in enumerate(counts.tolist()) for j in range((n - 1) // seq_len)}


@st.composite
def stream_shapes(draw, name="s"):
    block_tokens = draw(st.sampled_from([17, 33, 65, 129]))
    parts = draw(st.integers(1, 3))
    shard_blocks = draw(st.lists(st.integers(0, 12), min_size=parts, max_size=parts))
    tails = draw(st.lists(st.integers(1, block_tokens), min_size=parts, max_size=parts))
    return merged_shape(name, block_tokens, shard_blocks, tails)


def test_compact_shape_matches_counts_and_is_size_independent():
    counts = [65] * 5 + [10] + [65] * 3 + [65] + [2]
    shape = shape_of("x", 65, counts)
    assert shape.num_blocks == 11 and shape.num_full_blocks == 9
    assert shape.short_ids.tolist() == [5, 10] and shape.short_counts.tolist() == [10, 2]
    assert shape.block_token_counts(np.arange(11)).tolist() == counts
    assert shape.num_tokens == sum(counts)
    huge = StreamShape(
        fingerprint="h", block_tokens=2**20 + 1, num_blocks=10**12, short_ids=[10**12 - 1], short_counts=[5]
    )
    assert huge.short_ids.nbytes == 8 and huge.num_full_blocks == 10**12 - 1


def test_shape_rejects_impossible_counts():
    with pytest.raises(ConfigError, match="block 2: holds 70 tokens, expected 1..65"):
        shape_of("x", 65, [65, 65, 70])
    with pytest.raises(ConfigError, match="short block ids must lie in"):
        StreamShape(fingerprint="x", block_tokens=65, num_blocks=3, short_ids=[3], short_counts=[1])


@settings(max_examples=60, deadline=None)
@given(
    shape=stream_shapes(),
    seq_len=st.integers(1, 40),
    lanes=st.integers(1, 9),
    seed=st.integers(0, 2**64 - 1),
    window=st.integers(0, 6),
)
def test_each_epoch_reads_every_sample_once_minus_a_remainder_below_lanes(shape, seq_len, lanes, seed, window):
    try:
        order = GlobalOrder([shape], OrderConfig(seed=seed, seq_len=seq_len, lanes=lanes, window=window))
    except ConfigError:
        assume(False)
    plan = order.streams[0]
    universe = all_samples(shape, seq_len)
    assert len(universe) == plan.stream_samples
    for epoch in range(2):
        positions = np.arange(epoch * plan.samples_read_per_epoch, (epoch + 1) * plan.samples_read_per_epoch)
        stream, block, sample = order.sample_at(positions)
        read = list(zip(block.tolist(), sample.tolist()))
        assert len(set(read)) == len(read), "a sample was read twice in one epoch"
        assert set(read) <= universe
        assert 0 <= len(universe) - len(read) < lanes
        assert order.progress(int(positions[-1]) + 1)[0]["epoch"] == epoch + 1


def test_short_blocks_come_after_the_permuted_full_blocks():
    shape = merged_shape("m", 33, [4, 3, 5], [20, 33, 9])
    order = GlobalOrder([shape], OrderConfig(seq_len=8, lanes=1, window=1, seed=4))
    _, block, _ = order.sample_at(np.arange(order.streams[0].samples_read_per_epoch))
    first_use = list(dict.fromkeys(block.tolist()))
    short = shape.short_ids.tolist()
    assert short == [4, 14]
    assert first_use[-len(short) :] == short
    assert sorted(first_use[: -len(short)]) == sorted(set(range(15)) - set(short))
    assert first_use[: -len(short)] != sorted(first_use[: -len(short)])


def test_epochs_use_different_block_permutations():
    shape = shape_of("x", 65, [65] * 40)
    order = GlobalOrder([shape], OrderConfig(seq_len=64, lanes=1, seed=9))
    _, block, _ = order.sample_at(np.arange(80))
    assert sorted(block[:40].tolist()) == sorted(block[40:].tolist()) == list(range(40))
    assert block[:40].tolist() != block[40:].tolist()


@pytest.mark.parametrize("lanes", [4, 5, 7])
def test_each_lane_has_one_block_in_use_at_a_time(lanes):
    """Default windows are whole blocks: a lane finishes a block before the next."""
    shape = shape_of("x", 129, [129] * 63 + [50])
    order = GlobalOrder([shape], OrderConfig(seq_len=8, lanes=lanes, seed=1))
    plan = order.streams[0]
    assert plan.samples_per_block == 16 and plan.window == 16
    positions = np.arange(2 * plan.samples_read_per_epoch)
    _, block, sample = order.sample_at(positions)
    for lane in range(lanes):
        for epoch in range(2):
            mine = (positions % lanes == lane) & (positions // lanes // plan.lane_length == epoch)
            runs = np.flatnonzero(np.diff(block[mine])) + 1
            assert len(runs) + 1 == len(set(block[mine].tolist())), "a block was left and resumed"
            first_run = sample[mine][: runs[0]] if runs.size else sample[mine]
            if first_run.size == 16:  # a whole block: shuffled inside the block
                assert sorted(first_run.tolist()) == list(range(16))
                assert first_run.tolist() != list(range(16))


@settings(max_examples=40, deadline=None)
@given(
    shapes=st.lists(stream_shapes(), min_size=1, max_size=3),
    seq_len=st.integers(1, 16),
    lanes=st.integers(1, 12),
    seed=st.integers(0, 1000),
    data=st.data(),
)
def test_small_and_vectorized_paths_agree(shapes, seq_len, lanes, seed, data):
    weights = tuple(data.draw(st.integers(1, 5)) for _ in shapes)
    try:
        order = GlobalOrder(shapes, OrderConfig(seed=seed, seq_len=seq_len, lanes=lanes, weights=weights))
    except ConfigError:
        assume(False)
    positions = np.array(data.draw(st.lists(st.integers(0, 10**6), min_size=65, max_size=200)))
    whole = order.sample_at(positions)
    pieces = [order.sample_at(positions[i : i + 7]) for i in range(0, positions.size, 7)]
    for k in range(3):
        assert whole[k].tolist() == np.concatenate([p[k] for p in pieces]).tolist()


def test_mixture_lane_split_largest_remainder_and_spread():
    assert split_lanes(("1", "1", "1"), 10) == [4, 3, 3]
    assert split_lanes(("7/10", "3/10"), 10) == [7, 3]
    assert split_lanes(("2", "1", "0"), 8) == [5, 3, 0]
    stream, index = lane_map([8, 4])
    assert stream.tolist() == [0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0]
    assert index.tolist() == [0, 0, 1, 2, 1, 3, 4, 2, 5, 6, 3, 7]


def test_mixture_errors_name_the_stream_and_numbers():
    with pytest.raises(ConfigError, match=r"stream 1: weight 1 of 100 gets no lane out of 8"):
        split_lanes(("99", "1"), 8)
    shapes = [shape_of("big", 65, [65] * 40), shape_of("tiny", 65, [65])]
    with pytest.raises(
        ConfigError,
        match=r"stream 1 \(tiny\): 2 samples of seq_len 32 per "
        r"epoch, fewer than its 4 lanes",
    ):
        GlobalOrder(shapes, OrderConfig(seq_len=32, lanes=8))
    with pytest.raises(ConfigError, match="2 streams but 1 weights"):
        GlobalOrder(shapes, OrderConfig(seq_len=32, lanes=2, weights=(1,)))


def test_too_few_samples_for_default_lanes_names_what_the_user_set():
    shapes = [shape_of("big", 65, [65] * 40), shape_of("tiny", 65, [65])]
    said = "the global batch of 8 (local_batch_size 4 x world size 2), ...; lower local_batch_size or seq_len"
    # Every lane is the stream's: the lanes are not named, the global batch is.
    with pytest.raises(
        ConfigError,
        match=r"^stream 0 \(tiny\): 2 samples of seq_len 32 per epoch, fewer than the "
        r"global batch of 8 \(local_batch_size 4 x world size 2\), \.\.\.; lower local_batch_size or seq_len$",
    ):
        GlobalOrder(shapes[1:], OrderConfig(seq_len=32, lanes=8), lanes_default=said)
    with pytest.raises(
        ConfigError,
        match=r"^stream 1 \(tiny\): 2 samples of seq_len 32 per epoch, fewer than its "
        r"share, 4 lanes, of the global batch of 8 \(local_batch_size 4",
    ):
        GlobalOrder(shapes, OrderConfig(seq_len=32, lanes=8), lanes_default=said)
    # A stream with no sample at all keeps its own reason.
    empty = StreamShape.from_counts("fp-empty", 65, [], name="./empty")
    with pytest.raises(ConfigError, match=r"^stream 0 \(\./empty\): the dataset holds no tokens"):
        GlobalOrder([empty], OrderConfig(seq_len=32, lanes=2), lanes_default=said)


def test_a_stream_without_samples_is_named_by_its_url_with_the_reason():
    empty = StreamShape.from_counts("fp-empty", 65, [], name="s3://b/empty")
    with pytest.raises(ConfigError, match=r"^stream 0 \(s3://b/empty\): the dataset holds no tokens"):
        GlobalOrder([empty], OrderConfig(seq_len=32, lanes=2))
    short = StreamShape.from_counts("fp-short", 65, [20, 10], name="./short")
    with pytest.raises(
        ConfigError,
        match=r"^stream 1 \(\./short\): its longest block holds 20 tokens, fewer than "
        r"the 33 a sample of seq_len 32 needs; use a seq_len of at most 19$",
    ):
        GlobalOrder([shape_of("big", 65, [65] * 40), short], OrderConfig(seq_len=32, lanes=4))
    single = StreamShape.from_counts("fp-one", 65, [1], name="./one")
    assert single.no_samples_reason(1) == "every block holds a single token, and a sample needs two at least"
    assert short.no_samples_reason(19) is None and short.label == "./short" and shape_of("x", 65, [65]).label == "x"


@settings(max_examples=40, deadline=None)
@given(
    weights=st.lists(st.integers(1, 9), min_size=2, max_size=4),
    lanes=st.integers(4, 40),
    start=st.integers(0, 500),
    batch=st.integers(1, 90),
)
def test_mixture_proportions_per_global_batch(weights, lanes, start, batch):
    shapes = [shape_of(f"s{i}", 65, [65] * 200) for i in range(len(weights))]
    try:
        order = GlobalOrder(shapes, OrderConfig(seq_len=4, lanes=lanes, weights=tuple(weights)))
    except ConfigError:
        assume(False)
    counts = order.lane_counts
    stream, _, _ = order.sample_at(np.arange(start, start + batch))
    got = Counter(stream.tolist())
    for s, c in enumerate(counts):
        # Exact per lane; a batch not aligned to whole lanes deviates by
        # less than 1 with two streams and by at most the stream count with more.
        bound = 1 if len(weights) == 2 else len(weights)
        assert abs(got[s] - batch * c / lanes) <= bound
    aligned = start - start % lanes
    stream, _, _ = order.sample_at(np.arange(aligned, aligned + 3 * lanes))
    assert Counter(stream.tolist()) == {s: 3 * c for s, c in enumerate(counts) if c}


def test_each_stream_rolls_over_its_epochs_independently():
    big = shape_of("big", 65, [65] * 48)  # 96 samples of seq_len 32
    tiny = shape_of("tiny", 65, [65] * 3 + [40])  # 7 samples
    order = GlobalOrder([big, tiny], OrderConfig(seq_len=32, lanes=4, weights=(3, 1), seed=2))
    big_plan, tiny_plan = order.streams
    assert (big_plan.lanes, big_plan.lane_length, tiny_plan.lanes, tiny_plan.lane_length) == (3, 32, 1, 7)
    positions = np.arange(4 * 32)  # exactly one epoch of the big stream
    stream, block, sample = order.sample_at(positions)
    big_read = list(zip(block[stream == 0].tolist(), sample[stream == 0].tolist()))
    assert sorted(big_read) == sorted(all_samples(big, 32))
    tiny_read = list(zip(block[stream == 1].tolist(), sample[stream == 1].tolist()))
    epochs = [tiny_read[i : i + 7] for i in range(0, 28, 7)]  # 32 steps: 4 epochs + 4
    for epoch in epochs:
        assert sorted(epoch) == sorted(all_samples(tiny, 32))
    assert epochs[0] != epochs[1]
    progress = order.progress(4 * 32)
    assert [p["epoch"] for p in progress] == [1, 4]
    assert [p["samples_in_epoch"] for p in progress] == [0, 4]
    assert [p["samples"] for p in progress] == [96, 32]


def spec_key(tag: int, *values: int) -> int:
    """docs/ORDER.md key derivation, transcribed."""
    mask, golden = (1 << 64) - 1, 0x9E3779B97F4A7C15

    def mix(z):
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        return z ^ (z >> 31)

    key = tag
    for v in values:
        key = mix(((key ^ v) + golden) & mask)
    return key


def spec_order(shapes, seq_len, lanes, seed, window, weights, positions):
    """docs/ORDER.md read literally: epoch sequences materialized, lanes cut, windows shuffled."""
    values = [Fraction(w) for w in weights]
    quotas = [lanes * v / sum(values) for v in values]
    counts = [int(q) for q in quotas]
    for s in sorted(range(len(values)), key=lambda s: (-(quotas[s] - counts[s]), s))[: lanes - sum(counts)]:
        counts[s] += 1
    places = sorted((Fraction(2 * j + 1, 2 * counts[s]), s, j) for s in range(len(counts)) for j in range(counts[s]))
    out = []
    for p in positions:
        c, q = p % lanes, p // lanes
        _, s, j = places[c]
        shape = shapes[s]
        token_counts = shape.block_token_counts(np.arange(shape.num_blocks)).tolist()
        full = [b for b, n in enumerate(token_counts) if n == shape.block_tokens]
        short = [b for b, n in enumerate(token_counts) if n < shape.block_tokens]
        spb = (shape.block_tokens - 1) // seq_len
        stream_samples = len(full) * spb + sum((token_counts[b] - 1) // seq_len for b in short)
        m = stream_samples // counts[s]
        w = max(1, min(window or spb, m))
        e, r = divmod(q, m)
        key_b = spec_key(0x5A450001, seed, s, e)
        order = [full[spec_permute(t, len(full), key_b)] for t in range(len(full))] + short
        sequence = [(b, k) for b in order for k in range((token_counts[b] - 1) // seq_len)]
        u = j * m + r
        v = u // w
        a, b = max(v * w, j * m), min((v + 1) * w, (j + 1) * m)
        i = a + spec_permute(u - a, b - a, spec_key(0x5A450002, seed, s, e, j, v))
        out.append((s, *sequence[i]))
    return out


@settings(max_examples=25, deadline=None)
@given(
    shapes=st.lists(stream_shapes(), min_size=1, max_size=3),
    seq_len=st.integers(1, 16),
    lanes=st.integers(1, 10),
    seed=st.integers(0, 2**64 - 1),
    window=st.integers(0, 7),
    data=st.data(),
)
def test_order_matches_the_spec_read_literally(shapes, seq_len, lanes, seed, window, data):
    weights = tuple(str(data.draw(st.integers(1, 4))) for _ in shapes)
    try:
        order = GlobalOrder(
            shapes, OrderConfig(seed=seed, seq_len=seq_len, lanes=lanes, window=window, weights=weights)
        )
    except ConfigError:
        assume(False)
    positions = data.draw(st.lists(st.integers(0, 5000), min_size=1, max_size=80))
    stream, block, sample = order.sample_at(np.array(positions))
    got = list(zip(stream.tolist(), block.tolist(), sample.tolist()))
    assert got == spec_order(shapes, seq_len, lanes, seed, window, weights, positions)


def test_old_epoch_size_names_remain_aliases():
    shape = StreamShape.from_counts("alias", 65, [65] * 9 + [30])
    order = GlobalOrder([shape], OrderConfig(seq_len=8, lanes=4))
    plan, progress = order.streams[0], order.progress(0)[0]
    assert (plan.stream_samples, plan.samples_read_per_epoch) == (9 * 8 + 3, 4 * 18)
    assert plan.epoch_samples == plan.stream_samples == shape.epoch_samples(8) == shape.stream_samples(8)
    assert plan.used_samples == plan.samples_read_per_epoch
    assert progress["epoch_samples"] == progress["samples_read_per_epoch"] == 72
    assert progress["stream_samples"] == 75 and progress["lane_steps_per_epoch"] == 18
