"""The row-by-row reference of the document outputs and the attention proof
(tests/test_packing.py, tests/test_loader_packing.py, tests/test_torchtitan_packing.py).

A document ends with (owns) its EOS; the next starts on the token after it or
at the row's first token. The ground truth for attention is causal SDPA run on
each document piece alone."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from zephon_stream.loader.ring.row_documents import IGNORE_INDEX

VOCAB = 6
HEADS, HEAD_DIM = 2, 4


def make_stream(doc_lengths: list[int], eos: int, rng: np.random.Generator) -> np.ndarray:
    """Whole documents of the given lengths (EOS included), concatenated."""
    parts = []
    for length in doc_lengths:
        body = rng.integers(0, VOCAB, length - 1)
        body[body == eos] = (eos + 2) % VOCAB  # No EOS inside a document
        parts.append(np.append(body, eos))
    return np.concatenate(parts).astype(np.uint16)


def reference_documents(inputs: np.ndarray, eos: np.ndarray) -> list[list[tuple[int, int]]]:
    """Per row, ``(start, end)`` of each document piece: a document ends with its EOS."""
    rows, seq_len = inputs.shape
    out = []
    for row in range(rows):
        docs, start = [], 0
        for t in range(seq_len):
            if inputs[row, t] == eos[row]:
                docs.append((start, t + 1))
                start = t + 1
        if start < seq_len:
            docs.append((start, seq_len))
        out.append(docs)
    return out


def check_outputs(batch: dict, inputs: np.ndarray, window_labels: np.ndarray, eos: np.ndarray, ignore: bool) -> None:
    """The outputs against the row-by-row reference."""
    rows, seq_len = inputs.shape
    docs = reference_documents(inputs, eos)
    want_labels = window_labels.astype(np.int64).copy()
    if ignore:
        want_labels[inputs == eos[:, None]] = IGNORE_INDEX
    np.testing.assert_array_equal(np.asarray(batch["labels"]), want_labels)
    segments = np.zeros((rows, seq_len), np.int64)
    lengths = np.zeros((rows, seq_len), np.int64)
    cu = []
    for row, pieces in enumerate(docs):
        for index, (start, end) in enumerate(pieces):
            segments[row, start:end] = index
            lengths[row, index] = end - start
            cu.append(row * seq_len + start)
    total = rows * seq_len
    cu.append(total)
    np.testing.assert_array_equal(np.asarray(batch["segment_ids"]), segments)
    np.testing.assert_array_equal(np.asarray(batch["document_lengths"]), lengths)
    count = int(batch["num_cu_seqlens"])
    assert count == len(cu)
    got_cu = np.asarray(batch["cu_seqlens"])
    assert got_cu.shape == (total + 1,) and got_cu.dtype == np.int32
    np.testing.assert_array_equal(got_cu[:count], cu)
    assert (got_cu[count:] == total).all(), "the padding repeats the total: empty documents"
    assert int(batch["max_seqlen"]) == max(end - start for pieces in docs for start, end in pieces)


# -- attention --------------------------------------------------------------------


def attention_by_document(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, docs) -> torch.Tensor:
    """Causal attention run on each document piece alone: the ground truth."""
    out = torch.zeros_like(q)
    for row, pieces in enumerate(docs):
        for start, end in pieces:
            out[row, :, start:end] = F.scaled_dot_product_attention(
                q[row, :, start:end], k[row, :, start:end], v[row, :, start:end], is_causal=True
            )
    return out


def masked_attention(q, k, v, same_document: torch.Tensor) -> torch.Tensor:
    """SDPA with ``same_document [rows, L, L]`` and causality as one boolean mask."""
    seq_len = q.shape[2]
    causal = torch.ones(seq_len, seq_len, dtype=torch.bool).tril()
    return F.scaled_dot_product_attention(q, k, v, attn_mask=(same_document & causal)[:, None])


def mask_from_segment_ids(segment_ids: torch.Tensor) -> torch.Tensor:
    return segment_ids[:, :, None] == segment_ids[:, None, :]


def mask_from_document_lengths(lengths: torch.Tensor) -> torch.Tensor:
    rows, seq_len = lengths.shape
    segments = torch.stack(
        [
            torch.repeat_interleave(torch.arange(seq_len), lengths[row].long(), output_size=seq_len)
            for row in range(rows)
        ]
    )
    return mask_from_segment_ids(segments)


def mask_from_positions(positions: torch.Tensor) -> torch.Tensor:
    # The convention of TorchTitan's document masks: a document starts where positions are 0.
    return mask_from_segment_ids(torch.cumsum((positions == 0).int(), dim=1))


def thd_attention(q, k, v, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Attention over the flattened batch (THD) with a block-diagonal causal mask
    built from ``cu_seqlens`` as a varlen kernel reads it (every entry; a padded
    tail describes empty documents)."""
    rows, heads, seq_len, dim = q.shape
    total = rows * seq_len
    mask = torch.zeros(total, total, dtype=torch.bool)
    bounds = cu_seqlens.tolist()
    assert bounds[0] == 0 and bounds[-1] == total and all(a <= b for a, b in zip(bounds, bounds[1:]))
    for start, end in zip(bounds, bounds[1:]):
        mask[start:end, start:end] = torch.ones(end - start, end - start, dtype=torch.bool).tril()

    def flat(x):
        return x.transpose(0, 1).reshape(1, heads, total, dim)

    out = F.scaled_dot_product_attention(flat(q), flat(k), flat(v), attn_mask=mask)
    return out.reshape(heads, rows, seq_len, dim).transpose(0, 1)


def check_attention(batch: dict, inputs: np.ndarray, eos: np.ndarray, seed: int) -> None:
    rows, seq_len = inputs.shape
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(rows, HEADS, seq_len, HEAD_DIM, generator=generator, dtype=torch.float64) for _ in range(3))
    want = attention_by_document(q, k, v, reference_documents(inputs, eos))
    segment_ids = torch.as_tensor(np.asarray(batch["segment_ids"]))
    lengths = torch.as_tensor(np.asarray(batch["document_lengths"]))
    cu = torch.as_tensor(np.asarray(batch["cu_seqlens"]))
    count = int(batch["num_cu_seqlens"])
    torch.testing.assert_close(masked_attention(q, k, v, mask_from_segment_ids(segment_ids)), want)
    torch.testing.assert_close(masked_attention(q, k, v, mask_from_document_lengths(lengths)), want)
    torch.testing.assert_close(
        masked_attention(q, k, v, mask_from_positions(torch.as_tensor(np.asarray(batch["positions"])))), want
    )
    torch.testing.assert_close(thd_attention(q, k, v, cu[:count]), want)
    torch.testing.assert_close(thd_attention(q, k, v, cu), want)
    assert int(batch["max_seqlen"]) == int(torch.diff(cu[:count]).max())
