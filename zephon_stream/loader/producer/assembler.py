"""Assembler: decoded blocks + one step's sample addresses -> one host batch.

Sample ``j`` of a block is its tokens ``[j*L, j*L + L + 1)``: ``input`` is the
first ``L``, ``labels`` the last ``L``. Under ``packing="best_fit"`` the
cache holds each block as its packed rows (``[R, L + 1]``, ``plan/packing.py``)
and sample ``j`` is row ``j``, read the same way: its whole documents and
the pieces of cut ones, then the label of its last input. The pipeline's StepAssembler copies
each row's window into a ring slot at the stored width and widens the whole
step to ``int64`` at once where the consumer wants host tensors;
``gather_rows`` is the plain row-by-row form.
``positions`` restart at 0 on the token after each EOS, so document-aware
attention can tell where documents start inside a row.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from zephon_stream.loader.ring.row_documents import PackingSpec, PackingWriter
from zephon_stream.loader.ring.shared_ring import Slot

# Below this many EOS tokens per row on average, writing each document
# segment's positions is cheaper than the full-array running maximum.
_SPARSE_EOS_PER_ROW = 8


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
    # flatnonzero on the whole contiguous array is far faster than a 2-D
    # np.nonzero.
    hits = np.flatnonzero(inputs == _eos_column(eos_ids, inputs.dtype))
    return _positions_from_hits(hits, row_width=inputs.shape[1], out=out)


def _eos_column(eos_ids: np.ndarray | int, dtype: np.dtype) -> np.ndarray:
    eos = np.asarray(eos_ids, dtype=dtype)
    return eos[:, None] if eos.ndim == 1 else eos


def _positions_from_hits(
    hits: np.ndarray, *, row_width: int, out: np.ndarray, ramp: np.ndarray | None = None
) -> np.ndarray:
    """``out`` from the flat indices of EOS tokens in a ``[rows, row_width]``
    array whose first ``L`` columns are the inputs (``row_width >= L``).
    ``ramp``: ``arange(L)`` as int64, if the caller keeps one."""
    rows, seq_len = out.shape
    if ramp is None:
        ramp = np.arange(seq_len, dtype=np.int64)
    out[:] = ramp
    if seq_len < 2 or hits.size == 0:
        return out
    if hits.size <= _SPARSE_EOS_PER_ROW * rows:
        # A plain loop over few hits beats a dozen numpy calls on tiny
        # arrays. Flat indices come in row-major order, so a hit's document
        # runs to the next hit on the same row or to the row's end; a hit on
        # the last input token (or a label-only column) starts nothing.
        cells = [divmod(hit, row_width) for hit in hits.tolist()]
        cells.append((rows, 0))
        for (row, col), (next_row, next_col) in itertools.pairwise(cells):
            start = col + 1
            stop = min(next_col + 1, seq_len) if next_row == row else seq_len
            if start < stop:
                out[row, start:stop] = ramp[: stop - start]
        return out
    hit_rows, hit_cols = np.divmod(hits, row_width)
    keep = hit_cols < seq_len - 1
    hit_rows, starts = hit_rows[keep], hit_cols[keep] + 1
    marks = np.zeros((rows, seq_len), np.int64)
    marks[hit_rows, starts] = starts
    np.maximum.accumulate(marks, axis=1, out=marks)
    out -= marks
    return out


class StepAssembler:
    """Fills a ring slot from decoded blocks.

    Each row's ``L + 1`` token window is copied into the slot's narrow
    ``tokens`` array (one memcpy per row, at the stored width). The ``int64``
    arrays the slot's layout asks for (``input``, ``labels``, ``positions``)
    are then written once over the whole step, and the EOS search reads the
    narrow tokens rather than ``int64`` inputs.

    The same EOS search feeds the ``packing`` spec (loader/ring/row_documents.py):
    labels of input EOS tokens under ``"ignore"`` and the document outputs.

    Args:
        seq_len: ``L``.
        packing: cross-document targets and document outputs (default: neither).
    """

    def __init__(self, *, seq_len: int, packing: PackingSpec | None = None) -> None:
        self.seq_len = seq_len
        self.packing = packing or PackingSpec()
        self._is_eos: np.ndarray | None = None
        self._ramp = np.arange(seq_len, dtype=np.int64)
        self._writer: PackingWriter | None = None

    def assemble(
        self, blocks: Sequence[np.ndarray], samples: np.ndarray, eos_ids: np.ndarray | int, slot: Slot
    ) -> None:
        """Write the slot's ``tokens``, ``eos`` and wide arrays.

        Args:
            blocks: the decoded block of each row (the same array may repeat).
            samples: sample index within its block, per row.
            eos_ids: the EOS id, one for all rows or one per row.
            slot: the output; ``sample_positions`` is left to the caller.
        """
        staging, width = slot.tokens, self.seq_len + 1
        assert len(blocks) == len(samples) == len(staging)
        if self.packing.best_fit:
            # Each block is its packed rows, [R, L + 1]: row j is sample j.
            for row, (rows, sample) in enumerate(zip(blocks, samples.tolist())):
                staging[row] = rows[sample]
        else:
            for row, (tokens, sample) in enumerate(zip(blocks, samples.tolist())):
                start = sample * self.seq_len
                assert start + width <= len(tokens), f"sample {sample} past the end of a block of {len(tokens)} tokens"
                staging[row] = tokens[start : start + width]
        slot.eos[:] = eos_ids
        wide = slot.wide
        if "input" in wide:
            np.copyto(wide["input"], staging[:, :-1])
        if "labels" in wide:
            np.copyto(wide["labels"], staging[:, 1:])
        mask_labels = self.packing.ignore and "labels" in wide
        if "positions" not in wide and not mask_labels and not slot.packing:
            return
        if self._is_eos is None or self._is_eos.shape != staging.shape:
            self._is_eos = np.empty(staging.shape, np.bool_)
        np.equal(staging, _eos_column(eos_ids, staging.dtype), out=self._is_eos)
        hits = np.flatnonzero(self._is_eos)
        if "positions" in wide:
            _positions_from_hits(hits, row_width=width, out=wide["positions"], ramp=self._ramp)
        if mask_labels or slot.packing:
            if self._writer is None or self._writer.rows != len(staging):
                self._writer = PackingWriter(spec=self.packing, seq_len=self.seq_len, rows=len(staging))
            self._writer.write(
                hits, row_width=width, labels=wide.get("labels"), outputs=slot.packing or None, slot_index=slot.index
            )
