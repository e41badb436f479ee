"""Megatron-LM / NeMo indexed datasets (``PREFIX.bin`` + ``PREFIX.idx``), read
as documents of token ids, streamed in bounded windows.

The ``.idx`` layout (``MMapIndexedDataset``, version 1; docs/FORMAT.md,
appendix A), all little-endian:

====================  ==========================================================
magic                 9 bytes ``MMIDIDX\\x00\\x00``
version               uint64, 1
dtype code            uint8: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64,
                      6 float64, 7 float32, 8 uint16
sequence count S      uint64
document count D      uint64 (entries of the document index: documents + 1)
sequence lengths      int32[S], tokens of each sequence
sequence pointers     int64[S], byte offset of each sequence in ``.bin``
document index        int64[D], first sequence of each document; starts at 0,
                      never decreases, ends at S
====================  ==========================================================

Nothing is allocated from a count before the file size has confirmed it, and
the arrays are read a window at a time, so a hostile or huge index costs
bounded memory. The sequences must lie back to back from byte 0 of ``.bin``
(as Megatron's builder writes them); anything else is refused by name.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from zephon_stream.errors import InputError

INDEX_MAGIC = b"MMIDIDX\x00\x00"
INDEX_VERSION = 1
INDEX_HEADER_BYTES = len(INDEX_MAGIC) + 8 + 1 + 8 + 8
INDEX_DTYPES = {
    1: np.dtype("u1"),
    2: np.dtype("i1"),
    3: np.dtype("<i2"),
    4: np.dtype("<i4"),
    5: np.dtype("<i8"),
    6: np.dtype("<f8"),
    7: np.dtype("<f4"),
    8: np.dtype("<u2"),
}
# Entries of the index arrays read at a time (sequence lengths and
# pointers: 12 bytes each; document index: 8 bytes each).
INDEX_WINDOW = 1 << 20

ReadRange = Callable[[int, int], bytes]


@dataclass(frozen=True, slots=True, kw_only=True)
class IndexHeader:
    """The fixed part of an ``.idx`` file.

    Attributes:
        name: the ``.idx`` file, for messages.
        version: the format version (1).
        dtype: token dtype of the ``.bin`` file.
        num_sequences: sequence count S.
        num_document_entries: document-index entries D (documents + 1).
    """

    name: str
    version: int
    dtype: np.dtype
    num_sequences: int
    num_document_entries: int

    @property
    def num_documents(self) -> int:
        return self.num_document_entries - 1

    @property
    def lengths_offset(self) -> int:
        return INDEX_HEADER_BYTES

    @property
    def pointers_offset(self) -> int:
        return INDEX_HEADER_BYTES + 4 * self.num_sequences

    @property
    def documents_offset(self) -> int:
        return INDEX_HEADER_BYTES + 12 * self.num_sequences

    @property
    def expected_size(self) -> int:
        return self.documents_offset + 8 * self.num_document_entries


def parse_index_header(head: bytes, *, size: int, name: str) -> IndexHeader:
    """Read and check the header of an ``.idx`` file of ``size`` bytes.

    Args:
        head: the file's first bytes (at least ``INDEX_HEADER_BYTES`` unless
            the file is shorter).
        size: the file's size in bytes.
        name: the file, for messages.

    Raises:
        InputError: wrong magic, unknown version or dtype code, or counts that
            do not match the file size (each named with both values).
    """
    if size < INDEX_HEADER_BYTES or len(head) < INDEX_HEADER_BYTES:
        raise InputError(
            f"index {name}: {min(size, len(head))} bytes, shorter than the {INDEX_HEADER_BYTES}-byte header"
        )
    if head[: len(INDEX_MAGIC)] != INDEX_MAGIC:
        raise InputError(
            f"index {name} byte 0: magic {head[: len(INDEX_MAGIC)]!r}, expected {INDEX_MAGIC!r} "
            "(not a Megatron MMapIndexedDataset index)"
        )
    version, code, num_sequences, num_entries = struct.unpack_from("<QBQQ", head, len(INDEX_MAGIC))
    if version != INDEX_VERSION:
        raise InputError(f"index {name} byte 9: version {version}, expected {INDEX_VERSION}")
    if code not in INDEX_DTYPES:
        raise InputError(f"index {name} byte 17: dtype code {code}, expected one of {sorted(INDEX_DTYPES)}")
    header = IndexHeader(
        name=name,
        version=version,
        dtype=INDEX_DTYPES[code],
        num_sequences=num_sequences,
        num_document_entries=num_entries,
    )
    if num_entries < 1:
        raise InputError(f"index {name} byte 26: document count 0, expected at least 1 (the index starts with 0)")
    # Python integers, so a hostile count cannot overflow; checked before any allocation.
    if header.expected_size != size:
        extra = (
            " (a multimodal index with sequence modes is not supported)"
            if size == header.expected_size + num_sequences
            else ""
        )
        raise InputError(
            f"index {name}: {num_sequences} sequences and {num_entries} document entries need "
            f"{header.expected_size} bytes, the file has {size}{extra}"
        )
    return header


def _read_array(read: ReadRange, offset: int, count: int, dtype: str, *, name: str, what: str) -> np.ndarray:
    nbytes = count * np.dtype(dtype).itemsize
    data = read(offset, offset + nbytes)
    if len(data) != nbytes:
        raise InputError(f"index {name} byte {offset}: {what} needs {nbytes} bytes, read {len(data)}")
    return np.frombuffer(data, dtype=dtype)


class _SequenceCursor:
    """Token offsets of sequence boundaries, a window of sequences at a time,
    checking lengths and pointers as it goes."""

    def __init__(self, read: ReadRange, header: IndexHeader, window: int) -> None:
        self._read = read
        self._header = header
        self._window = window
        self._first = 0  # first sequence of the window
        self._offsets = np.zeros(1, np.int64)  # token offset of sequences _first .. _first + len - 1

    def _advance(self) -> None:
        h = self._header
        first = self._first + len(self._offsets) - 1
        count = min(self._window, h.num_sequences - first)
        assert count > 0
        lengths = _read_array(
            self._read, h.lengths_offset + 4 * first, count, "<i4", name=h.name, what=f"lengths of sequences {first}.."
        )
        pointers = _read_array(
            self._read,
            h.pointers_offset + 8 * first,
            count,
            "<i8",
            name=h.name,
            what=f"pointers of sequences {first}..",
        )
        negative = np.flatnonzero(lengths < 0)
        if len(negative):
            i = int(negative[0])
            raise InputError(
                f"index {h.name} byte {h.lengths_offset + 4 * (first + i)}: sequence {first + i} has length "
                f"{int(lengths[i])}, expected >= 0"
            )
        base = int(self._offsets[-1])
        offsets = base + np.concatenate([np.zeros(1, np.int64), np.cumsum(lengths, dtype=np.int64)])
        expected = offsets[:-1] * h.dtype.itemsize
        wrong = np.flatnonzero(pointers != expected)
        if len(wrong):
            i = int(wrong[0])
            raise InputError(
                f"index {h.name} byte {h.pointers_offset + 8 * (first + i)}: sequence {first + i} pointer "
                f"{int(pointers[i])}, expected {int(expected[i])} (sequences must lie back to back in .bin)"
            )
        self._first = first
        self._offsets = offsets

    def offsets_of(self, sequences: np.ndarray) -> np.ndarray:
        """Token offsets of the start of each of ``sequences`` (sorted, in [0, S])."""
        out = np.empty(len(sequences), np.int64)
        done = 0
        while done < len(sequences):
            last = self._first + len(self._offsets) - 1
            upto = int(np.searchsorted(sequences, last, side="right"))
            if upto > done:
                out[done:upto] = self._offsets[sequences[done:upto] - self._first]
                done = upto
            if done < len(sequences):
                self._advance()
        return out


def iter_document_bounds(
    read: ReadRange, header: IndexHeader, *, window: int = INDEX_WINDOW
) -> Iterator[tuple[int, np.ndarray]]:
    """Documents' token boundaries, a window of documents at a time.

    Yields:
        ``(first_document, bounds)``: ``bounds[k]`` is the token offset where
        document ``first_document + k`` starts; the last entry is where the
        window's last document ends (so ``len(bounds) - 1`` documents).

    Raises:
        InputError: a document index that does not start at 0, decreases, or
            does not end at the sequence count; a negative length; a pointer
            that is not where the lengths say.
    """
    h = header
    cursor = _SequenceCursor(read, h, window)
    previous = 0
    first = 0
    while first < h.num_documents:
        count = min(window, h.num_documents - first) + 1  # One overlap entry: a document's end
        entries = _read_array(
            read, h.documents_offset + 8 * first, count, "<i8", name=h.name, what=f"document index {first}.."
        )
        if first == 0 and entries[0] != 0:
            raise InputError(
                f"index {h.name} byte {h.documents_offset}: document index starts at {int(entries[0])}, expected 0"
            )
        steps = np.diff(entries, prepend=previous)
        bad = np.flatnonzero((steps < 0) | (entries > h.num_sequences))
        if len(bad):
            i = int(bad[0])
            raise InputError(
                f"index {h.name} byte {h.documents_offset + 8 * (first + i)}: document index entry {first + i} is "
                f"{int(entries[i])}, expected between "
                f"{previous if i == 0 else int(entries[i - 1])} and {h.num_sequences}"
            )
        if first + count == h.num_document_entries and entries[-1] != h.num_sequences:
            raise InputError(
                f"index {h.name} byte {h.documents_offset + 8 * (first + count - 1)}: document index ends at "
                f"{int(entries[-1])}, expected the sequence count {h.num_sequences}"
            )
        yield first, cursor.offsets_of(entries)
        previous = int(entries[-1])
        first += count - 1
    if h.num_documents == 0:
        entry = _read_array(read, h.documents_offset, 1, "<i8", name=h.name, what="document index 0")
        if int(entry[0]) != 0 or h.num_sequences != 0:
            raise InputError(
                f"index {h.name}: no documents, but document index entry 0 is {int(entry[0])} and "
                f"{h.num_sequences} sequences (expected 0 and 0)"
            )


def total_tokens(read: ReadRange, header: IndexHeader, *, window: int = INDEX_WINDOW) -> int:
    """Tokens the index says ``.bin`` holds (every sequence, checked), for tests and tools."""
    cursor = _SequenceCursor(read, header, window)
    return int(cursor.offsets_of(np.array([header.num_sequences], np.int64))[0])
