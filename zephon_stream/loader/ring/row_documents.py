"""The documents of packed rows as attention kernels see them: cross-document targets and document boundaries.

A row packs several documents (a window of the token stream, or under
``packing="best_fit"`` whole documents and pieces of cut ones, plan/packing.py);
a document ends with (owns) its EOS and the next one starts on the token
after it, or at the row's first token. From the same EOS scan that makes
``positions`` (loader/producer/assembler.py) this module writes, per step:

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
from zephon_stream.plan.packing import PACKINGS

IGNORE_INDEX = -100
"""The label of a target that must not count (PyTorch's and TorchTitan's ignore index)."""

CROSS_DOCUMENT_TARGETS = ("predict", "ignore")
PACKING_KEYS = ("segment_ids", "document_lengths", "cu_seqlens", "num_cu_seqlens", "max_seqlen")
# The scalars lead (int64, 8 bytes each), then the int32 arrays.
_SCALAR_KEYS = ("num_cu_seqlens", "max_seqlen")
_ALIGN = 64
# Below this many document starts per row on average, writing each
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
        rows: how a block's rows are filled (``plan/packing.py``):
            ``"concat"``, windows of the token stream, or ``"best_fit"``,
            the block's documents packed whole by best-fit decreasing.

    Raises:
        ConfigError: an unknown ``cross_document_targets`` or ``rows``, or a non-bool ``outputs``.
    """

    cross_document_targets: str = "predict"
    outputs: bool = False
    rows: str = "concat"

    def __post_init__(self) -> None:
        if self.rows not in PACKINGS:
            raise ConfigError(f"packing must be one of {', '.join(map(repr, PACKINGS))} (got {self.rows!r})")
        if self.cross_document_targets not in CROSS_DOCUMENT_TARGETS:
            raise ConfigError(
                f"cross_document_targets must be one of {CROSS_DOCUMENT_TARGETS} (got {self.cross_document_targets!r})"
            )
        if not isinstance(self.outputs, bool):
            raise ConfigError(f"packing_outputs must be True or False (got {self.outputs!r})")

    @property
    def ignore(self) -> bool:
        """Whether input EOS labels are -100."""
        return self.cross_document_targets == "ignore"

    @property
    def best_fit(self) -> bool:
        """Whether rows hold whole documents packed by best fit (blocks are packed as they are decoded)."""
        return self.rows == "best_fit"


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

    A step of sparse documents (a few starts per row, the common case) is
    written row by row, touching only the rows that hold a document start and
    those that held one the last time the slot was filled: every other row is
    one document of ``L`` tokens, which the slot already says. A dense step
    is written with whole-array numpy calls.

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
        self._row_start_list = self._row_starts.tolist()
        self._one_document = np.zeros(seq_len, np.int32)
        self._one_document[0] = seq_len
        self._count = np.arange(rows * seq_len + 1, dtype=np.int64)
        # Per slot: (documents in the step, {row: (documents in it, first
        # inner start)} for the rows holding more than one), or None after a
        # dense step. A slot
        # not in here is cleared whole: another writer (an earlier run of the
        # producer) may have filled it.
        self._last: dict[int, tuple[int, dict[int, tuple[int, int]] | None]] = {}

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
        if hits.size > _SPARSE_STARTS_PER_ROW * self.rows:
            self._write_dense(hits, row_width, labels, outputs, slot_index)
            return
        cells = [divmod(hit, row_width) for hit in hits.tolist()]
        if labels is not None and self.spec.ignore:
            flat_labels = labels.reshape(-1)
            for row, col in cells:
                if col < seq_len:
                    flat_labels[row * seq_len + col] = IGNORE_INDEX
        if outputs is None:
            return
        # An EOS on the last input (or on the label-only column) starts
        # nothing in the row; flat hits come in row-major order.
        inner: dict[int, list[int]] = {}
        for row, col in cells:
            if col < seq_len - 1:
                inner.setdefault(row, []).append(col + 1)
        last = self._last.get(slot_index) if slot_index is not None else None
        if last is None or last[1] is None:
            self._reset(outputs)
            last_rows: dict[int, tuple[int, int]] = {}
            last_docs = self.rows
        else:
            last_docs, last_rows = last
        segments, lengths = outputs["segment_ids"], outputs["document_lengths"]
        for row, (count, first) in last_rows.items():
            if row not in inner:
                segments[row, first:] = 0
                lengths[row, :count] = self._one_document[:count]
        max_seqlen = seq_len if len(inner) < self.rows else 0
        rows_now = {}
        for row, cols in inner.items():
            bounds = [0, *cols, seq_len]
            pieces = [end - start for start, end in zip(bounds, bounds[1:])]
            count = max(len(pieces), last_rows.get(row, (0, 0))[0])
            lengths[row, :count] = pieces + [0] * (count - len(pieces))
            if row in last_rows and last_rows[row][1] < cols[0]:
                segments[row, last_rows[row][1] : cols[0]] = 0
            for index, (start, end) in enumerate(zip(cols, bounds[2:]), 1):
                segments[row, start:end] = index
            max_seqlen = max(max_seqlen, *pieces)
            rows_now[row] = (len(pieces), cols[0])
        num_docs = self.rows + sum(len(cols) for cols in inner.values())
        cu = outputs["cu_seqlens"]
        if inner or last_rows:
            starts = sorted(self._row_start_list + [row * seq_len + col for row, cols in inner.items() for col in cols])
            cu[:num_docs] = starts
            cu[num_docs : last_docs + 1] = self.rows * seq_len
        outputs["num_cu_seqlens"][...] = num_docs + 1
        outputs["max_seqlen"][...] = max_seqlen
        if slot_index is not None:
            self._last[slot_index] = (num_docs, rows_now)

    def _reset(self, outputs: dict[str, np.ndarray]) -> None:
        """Every row one document of ``L`` tokens."""
        total = self.rows * self.seq_len
        cu = outputs["cu_seqlens"]
        cu.fill(total)
        cu[: self.rows] = self._row_starts
        outputs["document_lengths"].fill(0)
        outputs["document_lengths"][:, 0] = self.seq_len
        outputs["segment_ids"].fill(0)

    def _write_dense(self, hits, row_width, labels, outputs, slot_index) -> None:
        seq_len, total = self.seq_len, self.rows * self.seq_len
        hit_rows, hit_cols = np.divmod(hits, row_width)
        if labels is not None and self.spec.ignore:
            inputs = hit_cols < seq_len
            labels.reshape(-1)[hit_rows[inputs] * seq_len + hit_cols[inputs]] = IGNORE_INDEX
        if outputs is None:
            return
        inner = hit_cols < seq_len - 1
        start_rows, start_cols = hit_rows[inner], hit_cols[inner] + 1
        starts = np.concatenate((self._row_starts, start_rows * seq_len + start_cols))
        starts.sort()
        num_docs = starts.size
        lengths = np.diff(np.append(starts, total))
        doc_rows = starts // seq_len
        # Every row has a start at its first token, so a document's index
        # within its row is its index overall minus that of its row's first.
        first_of_row = np.searchsorted(starts, self._row_starts)
        cu = outputs["cu_seqlens"]
        cu.fill(total)
        cu[:num_docs] = starts
        flat_lengths = outputs["document_lengths"].reshape(-1)
        flat_lengths.fill(0)
        flat_lengths[doc_rows * seq_len + self._count[:num_docs] - first_of_row[doc_rows]] = lengths
        segments = outputs["segment_ids"]
        segments.fill(0)
        segments[start_rows, start_cols] = 1
        np.cumsum(segments, axis=1, out=segments)
        outputs["num_cu_seqlens"][...] = num_docs + 1
        outputs["max_seqlen"][...] = lengths.max()
        if slot_index is not None:
            self._last[slot_index] = (num_docs, None)


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
