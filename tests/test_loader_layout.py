"""The batch layout chosen when the loader is built: ``"tokens"`` hands over
``input``, ``labels`` and ``positions`` as 1-D tensors, the rows end to end,
equal to the ``"rows"`` form flattened, step for step, in every way a batch
reaches the consumer (the helper process and threads, slots of one step and
of several, the copies a hoarding consumer gets, a resume, a phase change),
with the 1-D views made once per ring slot."""

from __future__ import annotations

import pytest
import torch

from loader_reference import steps_until_the_helper_serves
from zephon_stream import Phase, StreamingLoader
from zephon_stream.errors import ConfigError
from zephon_stream.loader import BATCH_LAYOUTS

TOKEN_KEYS = ("input", "labels", "positions")


def assert_flattened(tokens: dict[str, torch.Tensor], rows: dict[str, torch.Tensor]) -> None:
    """``tokens`` is ``rows`` with each per-token tensor laid end to end, and every other key as it is."""
    assert tokens.keys() == rows.keys()
    for key, expected in rows.items():
        got = tokens[key]
        if key in TOKEN_KEYS:
            assert got.dim() == 1 and got.shape[0] == expected.numel(), (key, tuple(got.shape))
            assert torch.equal(got, expected.reshape(-1)), key
        else:
            assert got.shape == expected.shape and torch.equal(got, expected), key


def in_ring(loader: StreamingLoader, batch: dict[str, torch.Tensor]) -> bool:
    low = loader.ring.address()
    return all(low <= tensor.data_ptr() < low + loader.ring.nbytes for tensor in batch.values())


def serving(loader: StreamingLoader, pipeline: str) -> int:
    """The loader's cursor once its steps come from where ``pipeline`` runs (the helper
    process takes over from threads)."""
    if pipeline == "process":
        steps_until_the_helper_serves(loader)
    return loader.position


def rows_reference(url: str, start: int, **settings):
    """A ``"rows"`` loader on threads, seeked to cursor ``start``."""
    reference = StreamingLoader(url, pipeline="threads", **settings)
    reference.load_state_dict({**reference.state_dict(), "position": start})
    return reference


def test_the_layouts_are_named_and_another_is_refused_naming_it(small_dataset):
    assert BATCH_LAYOUTS == ("rows", "tokens")
    with pytest.raises(ConfigError, match=r"batch_layout must be one of \('rows', 'tokens'\) \(got 'flat'\)"):
        StreamingLoader(small_dataset.url, seq_len=64, local_batch_size=2, batch_layout="flat")


# 128 rows of 128 tokens fill a ring slot (one step a slot); 4 rows share a slot with 15 more steps.
@pytest.mark.parametrize("local_batch_size", [128, 4])
@pytest.mark.parametrize("pipeline", ["process", "threads"])
def test_tokens_batches_are_the_rows_batches_flattened_and_views_of_the_ring(small_dataset, pipeline, local_batch_size):
    settings = {"seq_len": 128, "local_batch_size": local_batch_size, "seed": 3}
    with StreamingLoader(small_dataset.url, pipeline=pipeline, batch_layout="tokens", **settings) as loader:
        assert loader.batch_layout == "tokens"
        start = serving(loader, pipeline)
        got = []
        for _ in range(40):
            batch = next(loader)
            assert in_ring(loader, batch)
            assert batch["input"].shape == (local_batch_size * 128,)
            assert batch["sample_positions"].shape == (local_batch_size,)
            got.append({key: tensor.clone() for key, tensor in batch.items()})
            del batch
    with rows_reference(small_dataset.url, start, **settings) as reference:
        for batch in got:
            assert_flattened(batch, next(reference))


@pytest.mark.parametrize("local_batch_size", [128, 4])
def test_the_1d_views_are_made_once_per_slot_and_handed_over_again(small_dataset, local_batch_size):
    # A view made per step would be a new tensor object each time the
    # slot comes round; the slot's own (cached) tensors are handed over instead.
    with StreamingLoader(
        small_dataset.url, seq_len=128, local_batch_size=local_batch_size, pipeline="threads", batch_layout="tokens"
    ) as loader:
        for _ in range(3 * 16 * 8):
            batch = next(loader)
            delivery = loader.delivery
            slot_tensors = [views for views in delivery.views if views is not None]
            cached = {id(t) for views in slot_tensors for part in [views.whole, *views.steps] for t in part.values()}
            assert all(id(tensor) in cached for tensor in batch.values())
            del batch
        for views in slot_tensors:
            assert views.whole["input"].dim() == 1
            assert all(step["labels"].dim() == 1 for step in views.steps)


@pytest.mark.parametrize("pipeline", ["process", "threads"])
def test_a_hoarding_consumer_gets_copies_in_the_tokens_layout(small_dataset, pipeline):
    settings = {"seq_len": 128, "local_batch_size": 4, "seed": 2}
    with StreamingLoader(small_dataset.url, pipeline=pipeline, batch_layout="tokens", **settings) as loader:
        start = serving(loader, pipeline)
        kept = [next(loader) for _ in range(80)]
        views = [in_ring(loader, batch) for batch in kept]
        assert views[:16] == [True] * 16 and not any(views[48:]), "past two held slots, copies"
    with rows_reference(small_dataset.url, start, **settings) as reference:
        for batch in kept:
            assert_flattened(batch, next(reference))


def test_a_slot_stays_held_while_the_consumer_keeps_a_slice_of_a_1d_tensor(small_dataset):
    settings = {"seq_len": 128, "local_batch_size": 4, "seed": 5}
    with StreamingLoader(small_dataset.url, pipeline="threads", batch_layout="tokens", **settings) as loader:
        start = loader.position
        kept = []
        for step in range(60):
            batch = next(loader)
            kept.append(batch["input"][100:300] if step % 3 == 0 else None)
            del batch
        for _ in range(200):
            next(loader)
    with rows_reference(small_dataset.url, start, **settings) as reference:
        for piece in kept:
            expected = next(reference)
            if piece is not None:
                assert torch.equal(piece, expected["input"].reshape(-1)[100:300])


def test_a_state_resumes_in_either_layout_and_the_state_does_not_record_it(small_dataset):
    settings = {"seq_len": 64, "local_batch_size": 6, "seed": 9, "pipeline": "threads"}
    with StreamingLoader(small_dataset.url, batch_layout="tokens", **settings) as first:
        for _ in range(37):
            next(first)
        state = first.state_dict()
    with StreamingLoader(small_dataset.url, **settings) as rows:
        for _ in range(37):
            next(rows)
        assert rows.state_dict() == state
    with (
        StreamingLoader(small_dataset.url, batch_layout="tokens", **settings) as tokens,
        StreamingLoader(small_dataset.url, **settings) as rows,
    ):
        tokens.load_state_dict(state)
        rows.load_state_dict(state)
        for _ in range(20):
            assert_flattened(next(tokens), next(rows))


def test_a_schedule_changes_the_1d_length_at_its_phase_boundary(small_dataset):
    phases = [Phase(start_step=0, global_batch=4, seq_len=128), Phase(start_step=5, global_batch=3, seq_len=256)]
    settings = {"schedule": phases, "seed": 4, "pipeline": "threads"}
    with (
        StreamingLoader(small_dataset.url, batch_layout="tokens", **settings) as tokens,
        StreamingLoader(small_dataset.url, **settings) as rows,
    ):
        sizes = []
        for _ in range(10):
            batch = next(tokens)
            sizes.append(batch["input"].shape[0])
            assert_flattened(batch, next(rows))
    assert sizes == [4 * 128] * 5 + [3 * 256] * 5


def test_packing_outputs_keep_their_rows_under_the_tokens_layout(small_dataset):
    settings = {
        "seq_len": 128,
        "local_batch_size": 4,
        "seed": 1,
        "pipeline": "threads",
        "packing_outputs": True,
        "cross_document_targets": "ignore",
    }
    with (
        StreamingLoader(small_dataset.url, batch_layout="tokens", **settings) as tokens,
        StreamingLoader(small_dataset.url, **settings) as rows,
    ):
        for _ in range(8):
            batch = next(tokens)
            assert batch["segment_ids"].shape == (4, 128) and batch["cu_seqlens"].dim() == 1
            assert_flattened(batch, next(rows))
