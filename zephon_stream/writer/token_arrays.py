"""Flat token arrays (``.npy``, raw ``.bin``, with EOS ids or an offsets
file) and Megatron-LM / NeMo indexed datasets, read as ``RawDocuments`` a
window of tokens at a time (docs/FORMAT.md, appendix A).

Local files are read through read-only mappings of one window at a time, so
the tokens reach the shard builder without a copy; remote ones in ranges.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

from zephon_stream.errors import InputError
from zephon_stream.storage import is_local_url, local_path, open_input, open_store
from zephon_stream.writer.megatron import INDEX_HEADER_BYTES, iter_document_bounds, parse_index_header
from zephon_stream.writer.token_check import RawDocuments

WINDOW_TOKENS = 1 << 22
MAX_DOCUMENT_TOKENS = 1 << 30
OFFSETS_SUFFIX = ".offsets.npy"
FLAT_DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenInputConfig:
    """How to read pre-tokenized inputs.

    Attributes:
        tokens_field: Parquet / JSONL / ``datasets`` column holding the ids.
        token_dtype: dtype of raw ``.bin`` flat arrays (``uint16``/``uint32``).
        eos_id: where flat arrays without an offsets file are cut.
        window_tokens: tokens read at a time from flat and indexed sources.
    """

    tokens_field: str = "input_ids"
    token_dtype: str | None = None
    eos_id: int
    window_tokens: int = WINDOW_TOKENS


def exists(url: str, storage_options: Mapping[str, Any] | None) -> bool:
    if is_local_url(url):
        return os.path.isfile(local_path(url))
    parent, _, name = url.rstrip("/").rpartition("/")
    with open_store(parent, storage_options) as store:
        return store.exists(name)


def read_exact(f: BinaryIO, url: str, offset: int, count: int, dtype: np.dtype) -> np.ndarray:
    out = np.empty(count, dtype=dtype)
    _read_into(f, url, offset, out)
    return out


def _read_into(f: BinaryIO, url: str, offset: int, out: np.ndarray) -> None:
    f.seek(offset)
    view = memoryview(out).cast("B")
    got = 0
    while got < len(view):
        n = f.readinto(view[got:])  # type: ignore[attr-defined]
        if not n:
            raise InputError(f"input {url} byte {offset}: needed {out.nbytes} bytes, the file ends after {got}")
        got += n


class TokenArea:
    """Tokens ``[start, stop)`` of a file's data: for a local file, a view of a
    read-only mapping of just that range (no copy; unmapped when the last view
    goes), otherwise read into a fresh array."""

    def __init__(self, f: BinaryIO, url: str, data_offset: int, dtype: np.dtype) -> None:
        self.f, self.url, self.data_offset, self.dtype = f, url, data_offset, dtype
        # Sizes were checked against the header first; a file truncated
        # by someone else while this runs would fault, as any mapped read does.
        self.mapped = is_local_url(url)

    def tokens(self, start: int, stop: int) -> np.ndarray:
        if stop <= start:
            return np.zeros(0, self.dtype)
        if not self.mapped:
            return read_exact(
                self.f, self.url, self.data_offset + start * self.dtype.itemsize, stop - start, self.dtype
            )
        first = self.data_offset + start * self.dtype.itemsize
        base = first - first % mmap.ALLOCATIONGRANULARITY
        end = self.data_offset + stop * self.dtype.itemsize
        mapping = mmap.mmap(self.f.fileno(), end - base, offset=base, access=mmap.ACCESS_READ)
        return np.frombuffer(mapping, dtype=self.dtype, count=stop - start, offset=first - base)


def npy_layout(f: BinaryIO, url: str) -> tuple[np.dtype, int, int]:
    """``(dtype, data offset, length)`` of a 1-D ``.npy`` file."""
    fmt = np.lib.format
    try:
        version = fmt.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = fmt.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = fmt.read_array_header_2_0(f)
        else:
            raise ValueError(f"npy format version {version} (expected 1.0 or 2.0)")
    except ValueError as exc:
        raise InputError(f"input {url}: not a readable .npy file: {exc}") from None
    if len(shape) != 1:
        raise InputError(f"input {url}: array of shape {shape}, expected 1-D token ids")
    if dtype.fields is not None or dtype.kind not in "iuf":
        raise InputError(f"input {url}: dtype {dtype}, expected integer (or integral float) token ids")
    offset = f.tell()
    size = f.seek(0, os.SEEK_END)
    if size < offset + shape[0] * dtype.itemsize:
        raise InputError(
            f"input {url}: header says {shape[0]} x {dtype} ({shape[0] * dtype.itemsize} bytes from byte {offset}), "
            f"the file has {size} bytes"
        )
    return dtype, offset, int(shape[0])


def _groups(bounds: np.ndarray, max_tokens: int) -> Iterator[tuple[int, int]]:
    """Runs ``[i, j)`` of documents (``bounds[i]..bounds[j]``) of at most ``max_tokens``, or one document."""
    i, last = 0, len(bounds) - 1
    while i < last:
        j = int(np.searchsorted(bounds, bounds[i] + max_tokens, side="right")) - 1
        j = min(max(j, i + 1), last)
        yield i, j
        i = j


class ArraySource:
    """Documents of one flat array (``kind`` ``npy`` or ``bin``) or Megatron
    dataset (``megatron``, given its ``.bin``), in document order.

    Attributes:
        bytes_read: how far into the token data reading has got.
    """

    def __init__(self, url: str, *, kind: str, config: TokenInputConfig, storage_options: Mapping[str, Any] | None):
        self.url, self.kind, self.config, self._options = url, kind, config, storage_options
        self.bytes_read = 0

    def __iter__(self) -> Iterator[RawDocuments]:
        return self._megatron() if self.kind == "megatron" else self._flat()

    def _flat(self) -> Iterator[RawDocuments]:
        with open_input(self.url, self._options) as f:
            if self.kind == "npy":
                dtype, data_offset, count = npy_layout(f, self.url)
            else:
                dtype, data_offset = FLAT_DTYPES[self.config.token_dtype or ""], 0
                size = f.seek(0, os.SEEK_END)
                if size % dtype.itemsize:
                    raise InputError(f"input {self.url}: {size} bytes is not a whole number of {dtype} tokens")
                count = size // dtype.itemsize
            stem = self.url[: -len(".npy")] if self.kind == "npy" else self.url[: -len(".bin")]
            offsets_url = stem + OFFSETS_SUFFIX
            area = TokenArea(f, self.url, data_offset, dtype)
            if exists(offsets_url, self._options):
                yield from self._by_bounds(area, self._offsets_bounds(offsets_url, count), count)
            else:
                yield from self._by_eos(area, count, offsets_url)

    def _offsets_bounds(self, url: str, count: int) -> Iterator[tuple[int, np.ndarray]]:
        with open_input(url, self._options) as f:
            dtype, data_offset, entries = npy_layout(f, url)
            if dtype.kind not in "iu" or entries < 1:
                raise InputError(f"offsets {url}: {entries} x {dtype}, expected at least one integer boundary")
            first, previous = 0, 0
            while True:
                take = min(self.config.window_tokens, entries - first)
                chunk = read_exact(f, url, data_offset + first * dtype.itemsize, take, dtype).astype(np.int64)
                steps = np.diff(chunk, prepend=previous)
                bad = np.flatnonzero((steps < 0) | (chunk > count) | (chunk < 0))
                if (first == 0 and chunk[0] != 0) or len(bad):
                    i = 0 if first == 0 and chunk[0] != 0 else int(bad[0])
                    raise InputError(
                        f"offsets {url} entry {first + i}: {int(chunk[i])}, expected a boundary between "
                        f"{previous if i == 0 else int(chunk[i - 1])} and {count} (0 first, never decreasing)"
                    )
                if first + take == entries and chunk[-1] != count:
                    raise InputError(
                        f"offsets {url} entry {entries - 1}: last boundary {int(chunk[-1])}, "
                        f"expected the token count {count}"
                    )
                yield first, chunk
                previous = int(chunk[-1])
                if first + take == entries:
                    return
                first += take - 1

    def _megatron(self) -> Iterator[RawDocuments]:
        idx_url = self.url[:-4] + ".idx"
        with open_input(idx_url, self._options) as idx, open_input(self.url, self._options) as data:
            idx_size = idx.seek(0, os.SEEK_END)
            idx.seek(0)
            header = parse_index_header(idx.read(INDEX_HEADER_BYTES), size=idx_size, name=idx_url)

            def read(start: int, end: int) -> bytes:
                idx.seek(start)
                return idx.read(end - start)

            bin_size = data.seek(0, os.SEEK_END)
            if bin_size % header.dtype.itemsize:
                raise InputError(f"input {self.url}: {bin_size} bytes is not a whole number of {header.dtype} tokens")
            count = bin_size // header.dtype.itemsize
            area = TokenArea(data, self.url, 0, header.dtype)
            yield from self._by_bounds(area, iter_document_bounds(read, header), count)

    def _by_bounds(
        self, area: TokenArea, bounds_iter: Iterator[tuple[int, np.ndarray]], count: int
    ) -> Iterator[RawDocuments]:
        end = 0
        for first, bounds in bounds_iter:
            if int(bounds[-1]) > count:
                raise InputError(
                    f"input {self.url}: documents up to {first + len(bounds) - 1} need {int(bounds[-1])} tokens, "
                    f"the file holds {count}"
                )
            for i, j in _groups(bounds, self.config.window_tokens):
                start, stop = int(bounds[i]), int(bounds[j])
                tokens = area.tokens(start, stop)
                self.bytes_read = area.data_offset + stop * area.dtype.itemsize
                yield RawDocuments(
                    source=self.url,
                    tokens=tokens,
                    lengths=np.diff(bounds[i : j + 1]),
                    records=np.arange(first + i, first + j, dtype=np.int64),
                    offsets=bounds[i:j],
                    num_records=j - i,
                )
            end = int(bounds[-1])
        if end != count:
            raise InputError(f"input {self.url}: the documents end at token {end}, but the file holds {count} tokens")

    def _by_eos(self, area: TokenArea, count: int, offsets_url: str) -> Iterator[RawDocuments]:
        eos = self.config.eos_id
        carry = np.zeros(0, area.dtype)  # Read (not mapped) inputs keep the partial document here
        start, record, pos = 0, 0, 0  # start: where the partial document begins
        while pos < count:
            take = min(self.config.window_tokens, count - pos)
            if area.mapped:
                block = area.tokens(start, pos + take)
            else:
                block = np.empty(len(carry) + take, area.dtype)
                block[: len(carry)] = carry
                block[len(carry) :] = area.tokens(pos, pos + take)
            scanned, pos = pos - start, pos + take
            self.bytes_read = area.data_offset + pos * area.dtype.itemsize
            ends = np.flatnonzero(block[scanned:] == eos) + scanned + 1
            if not len(ends):
                if len(block) > MAX_DOCUMENT_TOKENS:
                    raise InputError(
                        f"input {self.url}: no EOS id {eos} in the {len(block)} tokens from token {start} "
                        f"(a document may hold at most {MAX_DOCUMENT_TOKENS}); "
                        f"give the boundaries in {offsets_url.rsplit('/', 1)[-1]}"
                    )
                carry = block if not area.mapped else carry
                continue
            lengths = np.diff(ends, prepend=0)
            yield RawDocuments(
                source=self.url,
                tokens=block[: ends[-1]],
                lengths=lengths,
                records=np.arange(record, record + len(ends), dtype=np.int64),
                offsets=start + ends - lengths,
                num_records=len(ends),
            )
            record += len(ends)
            start += int(ends[-1])
            carry = block[ends[-1] :].copy() if not area.mapped else carry
        if start < count:
            if record == 0:
                raise InputError(
                    f"input {self.url}: no document boundary: none of its {count} tokens is the EOS id {eos} "
                    f"and there is no offsets file {offsets_url.rsplit('/', 1)[-1]}"
                )
            tail = area.tokens(start, count) if area.mapped else carry
            # The tail has no EOS: frame_documents rejects it, or appends EOS with --append-eos.
            yield RawDocuments(
                source=self.url,
                tokens=tail,
                lengths=np.array([len(tail)], np.int64),
                records=np.array([record], np.int64),
                offsets=np.array([start], np.int64),
                num_records=1,
                split_at_eos=True,
            )

    # -- columns of id lists -------------------------------------------------
