"""Evaluation order: every held-out sample once per pass, any world size, padding marked."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_stream.errors import ConfigError
from zephon_stream.plan import EvalOrder, StreamShape


def all_samples(shapes: list[StreamShape], seq_len: int) -> list[tuple[int, int, int]]:
    """Every sample, stream by stream, block by block, in order (the reference)."""
    out = []
    for s, shape in enumerate(shapes):
        counts = shape.block_token_counts(np.arange(shape.num_blocks))
        for b, n in enumerate(counts.tolist()):
            out += [(s, b, j) for j in range((n - 1) // seq_len)]
    return out


@st.composite
def datasets(draw):
    shapes = []
    for i in range(draw(st.integers(1, 3))):
        counts = draw(st.lists(st.integers(1, 65), min_size=1, max_size=12))
        full = draw(st.lists(st.booleans(), min_size=len(counts), max_size=len(counts)))
        shapes.append(StreamShape.from_counts(f"eval{i}", 65, [65 if f else c for f, c in zip(full, counts)]))
    return shapes


@settings(max_examples=40, deadline=None)
@given(shapes=datasets(), seq_len=st.sampled_from([4, 7, 16]), local_batch=st.integers(1, 5))
def test_ranks_together_read_every_sample_once_at_any_world_size(shapes, seq_len, local_batch):
    reference = all_samples(shapes, seq_len)
    if not reference:
        with pytest.raises(ConfigError, match="no sample of seq_len"):
            EvalOrder(shapes, seq_len)
        return
    order = EvalOrder(shapes, seq_len)
    assert order.num_samples == len(reference)
    for world in range(1, 6):
        batch = local_batch * world
        steps = order.num_steps(batch)
        read, padding = [], 0
        for step in range(steps):
            for rank in range(world):
                piece = order.rank_slice(step, batch, world, rank)
                assert piece.indices.size == local_batch  # every rank, every step
                rows = zip(piece.valid.tolist(), piece.stream.tolist(), piece.block.tolist(), piece.sample.tolist())
                for valid, s, b, j in rows:
                    if valid:
                        read.append((s, b, j))
                    else:
                        padding += 1
        assert read == reference  # each once, in the same order whatever the world size
        assert padding == steps * batch - len(reference) < batch


def test_padding_rows_point_at_real_samples_and_bad_steps_are_refused():
    order = EvalOrder([StreamShape.from_counts("e", 65, [65, 65, 30])], 16)
    assert order.num_samples == 4 + 4 + 1
    last = order.rank_slice(2, 4, 2, 1)
    assert last.valid.tolist() == [False, False]
    assert last.indices.tolist() == [10, 11] and last.block.tolist() == [0, 0]
    with pytest.raises(ConfigError, match=r"evaluation step 3 outside \[0, 3\) at global batch 4"):
        order.rank_slice(3, 4, 2, 0)
    with pytest.raises(ConfigError, match="world size 3 does not divide the global micro-batch 4"):
        order.rank_slice(0, 4, 3, 0)
