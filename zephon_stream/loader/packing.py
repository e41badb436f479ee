"""Packed rows as attention kernels see them: cross-document targets and document boundaries.

A row is a window of the token stream, so it packs several documents; a
document ends with (owns) its EOS and the next one starts on the token after
it, or at the row's first token. From the same EOS scan that makes
``positions`` (loader/assembler.py) this module writes, per step:

- under ``cross_document_targets="ignore"``, ``labels = -100`` at every input
  EOS (its target would be the next document's first token);
- with ``outputs`` on, in the slot's part that device delivery copies:
  ``segment_ids`` (``int32 [rows, L]``, each token's document index within its
  row), ``document_lengths`` (``int32 [rows, L]``, each row's document lengths
  in order, then zeros), ``cu_seqlens`` (``int32 [rows * L + 1]``, the THD
  convention: document starts across the flattened batch, closed by the total
  ``rows * L``, then padded with that total), ``num_cu_seqlens`` (the valid
  entries of ``cu_seqlens``: documents + 1) and ``max_seqlen`` (the longest
  document piece), both ``int64`` scalars.

The arrays have static shapes (a row holds at most ``L`` documents), so a ring
slot holds them; the padding of ``cu_seqlens`` repeats the total, so the padded
array describes the same documents followed by empty ones.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from zephon_stream.errors import ConfigError

IGNORE_INDEX = -100
"""The label of a target that must not count (PyTorch's and TorchTitan's ignore index)."""

CROSS_DOCUMENT_TARGETS = ("predict", "ignore")
PACKING_KEYS = ("segment_ids", "document_lengths", "cu_seqlens", "num_cu_seqlens", "max_seqlen")
# NOTE: the scalars lead (int64, 8 bytes each), then the int32 arrays.
_SCALAR_KEYS = ("num_cu_seqlens", "max_seqlen")
_ALIGN = 64
# NOTE: below this many document starts per row on average, writing each
# segment's ids is cheaper than a running sum over the whole step.
_SPARSE_STARTS_PER_ROW = 8


def _align(offset: int) -> int:
    return -(-offset // _ALIGN) * _ALIGN


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PackingSpec:
    """What a loader writes about documents, beside ``input``/``labels``/``positions``.

    Attributes:
        cross_document_targets: ``"predict"`` (the label of an input EOS is the
            next token, the next document's first) or ``"ignore"`` (it is -100).
        outputs: write ``segment_ids``, ``document_lengths``, ``cu_seqlens``,
            ``num_cu_seqlens`` and ``max_seqlen``.

    Raises:
        ConfigError: an unknown ``cross_document_targets`` or a non-bool ``outputs``.
    """

    cross_document_targets: str = "predict"
    outputs: bool = False

    def __post_init__(self) -> None:
        if self.cross_document_targets not in CROSS_DOCUMENT_TARGETS:
            raise ConfigError(
                f"cross_document_targets must be one of {CROSS_DOCUMENT_TARGETS} "
                f"(got {self.cross_document_targets!r})"
            )
        if not isinstance(self.outputs, bool):
            raise ConfigError(f"packing_outputs must be True or False (got {self.outputs!r})")

    @property
    def ignore(self) -> bool:
        """Whether input EOS labels are -100."""
        return self.cross_document_targets == "ignore"


def packing_shapes(rows: int, seq_len: int) -> dict[str, tuple[tuple[int, ...], str]]:
    """``key -> (shape, dtype)`` of each output for a step of ``rows`` x ``seq_len``."""
    return {
        "num_cu_seqlens": ((), "<i8"),
        "max_seqlen": ((), "<i8"),
        "cu_seqlens": ((rows * seq_len + 1,), "<i4"),
        "segment_ids": ((rows, seq_len), "<i4"),
        "document_lengths": ((rows, seq_len), "<i4"),
    }


def packing_offsets(start: int, rows: int, seq_len: int) -> dict[str, int]:
    """Byte offset of each output when the region starts at ``start``; ``"end"``: past the last."""
    out, offset = {}, _align(start)
    for key, (shape, dtype) in packing_shapes(rows, seq_len).items():
        out[key] = offset
        offset = _align(offset + int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize)
    out["end"] = offset
    return out


def packing_views(slab: np.ndarray, offsets: dict[str, int], rows: int, seq_len: int) -> dict[str, np.ndarray]:
    """Numpy views of the outputs within a slot's bytes (``offsets`` from :func:`packing_offsets`)."""
    views = {}
    for key, (shape, dtype) in packing_shapes(rows, seq_len).items():
        size = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        views[key] = slab[offsets[key] : offsets[key] + size].view(dtype).reshape(shape)
    return views


class PackingWriter:
    """Writes a step's labels under ``"ignore"`` and its document outputs, from its EOS hits.

    Args:
        spec: what to write.
        seq_len: ``L``.
        rows: rows per step.
    """

    def __init__(self, *, spec: PackingSpec, seq_len: int, rows: int) -> None:
        self.spec = spec
        self.seq_len = seq_len
        self.rows = rows
        self._row_starts = np.arange(rows, dtype=np.int64) * seq_len
        self._count = np.arange(rows * seq_len + 1, dtype=np.int64)
        # NOTE: per slot, what the last step written there left beyond its
        # own documents (``cu_seqlens`` entries, ``document_lengths`` cells),
        # so a step clears only those instead of the whole static arrays. A
        # slot this writer has not written yet is cleared whole.
        self._last: dict[int, tuple[int, np.ndarray]] = {}

    def write(
        self,
        hits: np.ndarray,
        *,
        row_width: int,
        labels: np.ndarray | None,
        outputs: dict[str, np.ndarray] | None,
        slot_index: int | None = None,
    ) -> None:
        """Apply the spec for one step.

        Args:
            hits: flat indices of the EOS tokens in a ``[rows, row_width]``
                array whose first ``L`` columns are the inputs (row-major order).
            row_width: ``L + 1`` for the slot's token windows, ``L`` for inputs.
            labels: ``int64 [rows, L]`` labels to mask under ``"ignore"``, or None.
            outputs: the views of :func:`packing_views` to fill, or None.
            slot_index: the ring slot the outputs belong to (for clearing what
                the last step there left); None clears the arrays whole.
        """
        seq_len = self.seq_len
        hit_rows, hit_cols = np.divmod(hits, row_width)
        if labels is not None and self.spec.ignore and hits.size:
            inputs = hit_cols < seq_len
            labels.reshape(-1)[hit_rows[inputs] * seq_len + hit_cols[inputs]] = IGNORE_INDEX
        if outputs is None:
            return
        # NOTE: an EOS on the last input (or on the label-only column) starts nothing in the row.
        inner = hit_cols < seq_len - 1
        start_rows, start_cols = hit_rows[inner], hit_cols[inner] + 1
        starts = np.concatenate((self._row_starts, start_rows * seq_len + start_cols))
        starts.sort()
        self._fill(starts, start_rows, start_cols, outputs, slot_index)

    def _fill(
        self,
        starts: np.ndarray,
        start_rows: np.ndarray,
        start_cols: np.ndarray,
        outputs: dict[str, np.ndarray],
        slot_index: int | None,
    ) -> None:
        seq_len, total = self.seq_len, self.rows * self.seq_len
        num_docs = starts.size
        cu, lengths_2d, segments = outputs["cu_seqlens"], outputs["document_lengths"], outputs["segment_ids"]
        flat_lengths = lengths_2d.reshape(-1)
        last = self._last.get(slot_index) if slot_index is not None else None
        if last is None:
            cu.fill(total)
            flat_lengths.fill(0)
        else:
            last_docs, last_cells = last
            cu[num_docs : last_docs + 1] = total
            flat_lengths[last_cells] = 0
        cu[:num_docs] = starts
        cu[num_docs] = total
        lengths = np.diff(cu[: num_docs + 1])
        doc_rows = starts // seq_len
        # NOTE: every row has a start at its first token, so a document's index
        # within its row is its index overall minus that of its row's first.
        first_of_row = np.searchsorted(starts, self._row_starts)
        index_in_row = self._count[:num_docs] - first_of_row[doc_rows]
        cells = doc_rows * seq_len + index_in_row
        flat_lengths[cells] = lengths
        outputs["num_cu_seqlens"][...] = num_docs + 1
        outputs["max_seqlen"][...] = lengths.max()
        if slot_index is not None:
            self._last[slot_index] = (num_docs, cells)
        if start_rows.size > _SPARSE_STARTS_PER_ROW * self.rows:
            segments.fill(0)
            segments[start_rows, start_cols] = 1
            np.cumsum(segments, axis=1, out=segments)
            return
        segments.fill(0)
        if start_rows.size:
            # NOTE: a document inside a row runs to the next start, which is
            # the next document of the row or the next row's first token.
            inner = starts % seq_len != 0
            ends = np.minimum(np.append(starts[1:], total), (doc_rows + 1) * seq_len)
            flat_segments = segments.reshape(-1)
            for start, end, index in zip(starts[inner].tolist(), ends[inner].tolist(), index_in_row[inner].tolist()):
                flat_segments[start:end] = index


# -- device side (torch tensors; torch is imported only here, the helper process never needs it) --


def ignore_eos_targets(labels, inputs, eos) -> None:
    """``labels[r, t] = -100`` where ``inputs[r, t]`` is row ``r``'s EOS id ``eos[r]`` (torch, in place)."""
    labels.masked_fill_(inputs == eos[:, None], IGNORE_INDEX)


def packing_tensors(raw, start: int, rows: int, seq_len: int) -> dict:
    """Torch views of the outputs within a slot's bytes on any device.

    Args:
        raw: ``uint8`` tensor holding the slot from its first byte.
        start: where the outputs' region starts (``SlotLayout.offsets()["packing"]``).
        rows, seq_len: the step's shape.
    """
    import torch

    dtypes = {"<i8": torch.int64, "<i4": torch.int32}
    offsets = packing_offsets(start, rows, seq_len)
    views = {}
    for key, (shape, dtype) in packing_shapes(rows, seq_len).items():
        size = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        views[key] = raw[offsets[key] : offsets[key] + size].view(dtypes[dtype]).view(shape)
    return views


def host_scalars(slot_packing: dict[str, np.ndarray]) -> dict:
    """``num_cu_seqlens`` and ``max_seqlen`` as CPU ``int64`` scalars holding no
    reference to the ring: kernels take them as host integers, so they stay on
    the CPU whatever the device."""
    import torch

    return {key: torch.tensor(int(slot_packing[key]), dtype=torch.int64) for key in _SCALAR_KEYS}
