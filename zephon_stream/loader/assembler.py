"""Assembler: decoded blocks + one step's sample addresses -> one host batch.

Sample ``j`` of a block is its tokens ``[j*L, j*L + L + 1)``: ``input`` is the
first ``L``, ``labels`` the last ``L``. Rows are copied straight from the
decoded block into the batch arrays; the copy is the ``int64`` conversion.
``positions`` restart at 0 on the token after each EOS, so document-aware
attention can tell where documents start inside a row.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

# NOTE: below this many EOS tokens per row on average, writing each document
# segment's positions is cheaper than the full-array running maximum.
_SPARSE_EOS_PER_ROW = 8


@dataclasses.dataclass(slots=True)
class HostBatch:
    """One rank's share of one step, in host memory.

    Attributes:
        input: ``int64 [rows, L]``.
        labels: ``int64 [rows, L]``, ``input`` shifted left by one token.
        positions: ``int64 [rows, L]``, position of each token in its document.
        sample_positions: ``int64 [rows]``, the global position ``p`` of each row.
    """

    input: np.ndarray
    labels: np.ndarray
    positions: np.ndarray
    sample_positions: np.ndarray

    @classmethod
    def empty(cls, rows: int, seq_len: int) -> HostBatch:
        """Fresh, uninitialised arrays for ``rows`` samples of ``seq_len`` tokens."""
        return cls(
            input=np.empty((rows, seq_len), np.int64),
            labels=np.empty((rows, seq_len), np.int64),
            positions=np.empty((rows, seq_len), np.int64),
            sample_positions=np.empty(rows, np.int64),
        )

    def nbytes(self) -> int:
        """Bytes held by the four arrays."""
        return self.input.nbytes + self.labels.nbytes + self.positions.nbytes + self.sample_positions.nbytes


def gather_rows(
    blocks: Sequence[np.ndarray],
    samples: np.ndarray,
    *,
    seq_len: int,
    out_input: np.ndarray,
    out_labels: np.ndarray,
) -> None:
    """Copy sample ``samples[i]`` of ``blocks[i]`` into row ``i`` of the outputs.

    Args:
        blocks: the decoded block of each row (the same array may repeat).
        samples: sample index within its block, per row.
        seq_len: ``L``.
        out_input: ``[rows, L]`` output, any integer dtype wide enough.
        out_labels: ``[rows, L]`` output.
    """
    assert len(blocks) == len(samples) == len(out_input) == len(out_labels)
    for row, (tokens, sample) in enumerate(zip(blocks, samples.tolist())):
        start = sample * seq_len
        end = start + seq_len + 1
        assert end <= len(tokens), f"sample {sample} past the end of a block of {len(tokens)} tokens"
        window = tokens[start:end]
        out_input[row] = window[:-1]
        out_labels[row] = window[1:]


def positions_from_eos(inputs: np.ndarray, eos_ids: np.ndarray | int, *, out: np.ndarray) -> np.ndarray:
    """Position of each input token within its document.

    A document starts at the row's first token and on every token right after
    an EOS; positions count up from 0 there. The EOS itself ends (belongs to)
    the document before it.

    Args:
        inputs: ``[rows, L]`` token ids.
        eos_ids: the EOS id, one for all rows or one per row (mixtures of
            streams with different tokenizers).
        out: ``int64 [rows, L]`` output.

    Returns:
        ``out``.
    """
    rows, seq_len = inputs.shape
    out[:] = np.arange(seq_len, dtype=np.int64)
    if seq_len < 2:
        return out
    eos = np.asarray(eos_ids, dtype=inputs.dtype)
    if eos.ndim == 1:
        eos = eos[:, None]
    # NOTE: flatnonzero on the whole contiguous array is far faster than a 2-D
    # np.nonzero; hits on a row's last token start nothing inside the row.
    hits = np.flatnonzero(inputs == eos)
    hit_rows, hit_cols = np.divmod(hits, seq_len)
    keep = hit_cols != seq_len - 1
    if not keep.all():
        hit_rows, hit_cols = hit_rows[keep], hit_cols[keep]
    if hit_rows.size == 0:
        return out
    starts = hit_cols + 1
    if hit_rows.size <= _SPARSE_EOS_PER_ROW * rows:
        # NOTE: np.nonzero yields hits in row-major order, so each hit's segment
        # runs to the next hit on the same row (or the row's end).
        next_same_row = np.empty_like(starts)
        next_same_row[:-1] = np.where(hit_rows[1:] == hit_rows[:-1], starts[1:], seq_len)
        next_same_row[-1] = seq_len
        ramp = np.arange(seq_len, dtype=np.int64)
        for row, start, stop in zip(hit_rows.tolist(), starts.tolist(), next_same_row.tolist()):
            out[row, start:stop] = ramp[: stop - start]
        return out
    marks = np.zeros((rows, seq_len), np.int64)
    marks[hit_rows, starts] = starts
    np.maximum.accumulate(marks, axis=1, out=marks)
    out -= marks
    return out
