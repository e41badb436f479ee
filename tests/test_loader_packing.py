"""Cross-document targets and document outputs through the whole loader: both
pipelines (helper process and threads), a mixture of streams whose EOS ids
differ, batches the consumer keeps, resume across the two settings, and the
evaluation loader's padding rows."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from packing_reference import check_attention, check_outputs, reference_documents
from zephon_stream import Stream, StreamingLoader
from zephon_stream.loader.front.evaluation import EvalLoader
from zephon_stream.loader.ring.row_documents import IGNORE_INDEX, PACKING_KEYS

SEQ_LEN = 256
ROWS = 4


def row_eos(loader, step: int, eos_ids: list[int]) -> np.ndarray:
    """The EOS id of each row of this rank's batch at ``step`` (from its stream)."""
    piece = loader.order.rank_slice(
        step * loader.global_batch_size, loader.global_batch_size, loader.world_size, loader.rank
    )
    return np.array(eos_ids, np.int64)[piece.stream]


def mixture(small_dataset, small_bpe_dataset):
    eos_ids = [small_dataset.manifest.tokenizer.eos_id, small_bpe_dataset.manifest.tokenizer.eos_id]
    assert eos_ids[0] != eos_ids[1]
    return [Stream(small_dataset.url, weight=1), Stream(small_bpe_dataset.url, weight=1)], eos_ids


@pytest.mark.parametrize("pipeline", ["process", "threads"])
def test_outputs_come_through_the_pipeline_and_agree_with_the_plain_batch(small_dataset, small_bpe_dataset, pipeline):
    streams, eos_ids = mixture(small_dataset, small_bpe_dataset)
    common = dict(seq_len=SEQ_LEN, local_batch_size=ROWS, world_size=2, rank=1, seed=4, num_fetch_threads=2)
    with (
        StreamingLoader(streams, pipeline=pipeline, **common) as plain,
        StreamingLoader(
            streams, pipeline=pipeline, cross_document_targets="ignore", packing_outputs=True, **common
        ) as packed,
    ):
        kept = []
        documents = 0
        for step in range(12):
            want, got = next(plain), next(packed)
            assert set(got) == {"input", "labels", "positions", "sample_positions", *PACKING_KEYS}
            for key in ("input", "positions", "sample_positions"):
                assert torch.equal(got[key], want[key]), key
            for key in ("segment_ids", "document_lengths", "cu_seqlens"):
                assert got[key].dtype == torch.int32 and got[key].device.type == "cpu"
            assert got["max_seqlen"].shape == () and got["num_cu_seqlens"].dtype == torch.int64
            eos = row_eos(packed, step, eos_ids)
            inputs = want["input"].numpy()
            check_outputs(got, inputs, want["labels"].numpy(), eos, ignore=True)
            documents += sum(len(pieces) for pieces in reference_documents(inputs, eos))
            if step % 4 == 0:
                check_attention(got, inputs, eos, seed=step)
            # Kept batches (past two, the consumer gets copies) stay intact.
            kept.append((got, {key: value.clone() for key, value in got.items()}))
        assert documents > 12 * ROWS, "the steps hold document boundaries"
        for batch, copy in kept:
            for key in batch:
                assert torch.equal(batch[key], copy[key]), key


@pytest.mark.parametrize("first,second", [("predict", "ignore"), ("ignore", "predict")])
def test_a_checkpoint_resumes_under_either_setting_at_the_same_samples(small_bpe_dataset, first, second):
    url = small_bpe_dataset.url
    common = dict(seq_len=SEQ_LEN, local_batch_size=8, seed=2, num_fetch_threads=2, pipeline="threads")
    eos = small_bpe_dataset.manifest.tokenizer.eos_id
    with StreamingLoader(url, cross_document_targets=first, **common) as before:
        for _ in range(5):
            next(before)
        state = before.state_dict()
        uninterrupted = [next(before) for _ in range(4)]
    with StreamingLoader(url, cross_document_targets=second, packing_outputs=True, **common) as after:
        assert after.state_dict() == {**state, "position": 0}
        after.load_state_dict(state)
        resumed = [next(after) for _ in range(4)]
    masked = 0
    for want, got in zip(uninterrupted, resumed):
        assert torch.equal(got["sample_positions"], want["sample_positions"])
        assert torch.equal(got["input"], want["input"])
        is_eos = got["input"] == eos
        assert torch.equal(got["labels"][~is_eos], want["labels"][~is_eos])
        ignored = (got if second == "ignore" else want)["labels"][is_eos]
        assert (ignored == IGNORE_INDEX).all()
        masked += int(is_eos.sum())
    assert masked > 0, "the resumed steps hold input EOS tokens"


def test_the_valid_token_count_drops_by_the_input_eos_tokens(small_bpe_dataset):
    eos = small_bpe_dataset.manifest.tokenizer.eos_id
    common = dict(seq_len=SEQ_LEN, local_batch_size=ROWS, num_fetch_threads=2, pipeline="threads")
    with (
        StreamingLoader(small_bpe_dataset.url, **common) as predict,
        StreamingLoader(small_bpe_dataset.url, cross_document_targets="ignore", **common) as ignore,
    ):
        for _ in range(6):
            a, b = next(predict), next(ignore)
            assert int((a["labels"] != IGNORE_INDEX).sum()) == ROWS * SEQ_LEN
            assert int((b["labels"] != IGNORE_INDEX).sum()) == ROWS * SEQ_LEN - int((b["input"] == eos).sum())


@pytest.mark.parametrize("targets", ["predict", "ignore"])
def test_eval_padding_rows_are_one_segment_nothing_else_attends_to(small_dataset, small_bpe_dataset, targets):
    streams, eos_ids = mixture(small_dataset, small_bpe_dataset)
    urls = [s.url for s in streams]
    with (
        EvalLoader(urls, seq_len=SEQ_LEN, local_batch_size=7) as plain,
        EvalLoader(
            urls, seq_len=SEQ_LEN, local_batch_size=7, cross_document_targets=targets, packing_outputs=True
        ) as packed,
    ):
        order = packed.order
        assert packed.num_samples % 7, "the last step must be padded"
        padded_steps = 0
        for step, (want, got) in enumerate(zip(plain, packed)):
            piece = order.rank_slice(step, 7, 1, 0)
            eos = np.array(eos_ids, np.int64)[piece.stream]
            inputs = got["input"].numpy()
            valid = got["mask"].numpy()
            assert torch.equal(got["input"], want["input"])
            # The reference sees a padding row as a row without EOS: one document.
            seen_eos = np.where(valid, eos, -1)
            check_outputs(
                got,
                inputs,
                np.where(valid[:, None], want["labels"].numpy(), IGNORE_INDEX),
                seen_eos,
                ignore=targets == "ignore",
            )
            if not valid.all():
                padded_steps += 1
                assert (got["positions"][~got["mask"]] == torch.arange(SEQ_LEN)).all()
                lengths = got["document_lengths"][~got["mask"]]
                assert (lengths[:, 0] == SEQ_LEN).all() and (lengths[:, 1:] == 0).all()
                check_attention(got, inputs, seen_eos, seed=step)
        assert padded_steps == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("host_labels", [False, True])
def test_cuda_delivery_gives_the_cpu_outputs_with_host_scalars(small_bpe_dataset, host_labels):
    common = dict(
        seq_len=SEQ_LEN,
        local_batch_size=ROWS,
        num_fetch_threads=2,
        cross_document_targets="ignore",
        packing_outputs=True,
    )
    with (
        StreamingLoader(small_bpe_dataset.url, **common) as cpu,
        StreamingLoader(small_bpe_dataset.url, device="cuda", host_labels=host_labels, **common) as gpu,
    ):
        for _ in range(8):
            want, got = next(cpu), next(gpu)
            assert set(got) == set(want)
            for key in want:
                on_host = key in ("num_cu_seqlens", "max_seqlen") or (host_labels and key == "labels")
                assert got[key].device.type == ("cpu" if on_host else "cuda"), key
                assert torch.equal(got[key].cpu(), want[key]), key
