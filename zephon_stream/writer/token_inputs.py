"""Pre-tokenized inputs: token ids in the formats teams already hold, read as
batches of documents (``RawDocuments``) in bounded memory.

Kinds, chosen by name (docs/FORMAT.md, appendix A):

- ``X.npy``: a 1-D integer (or integral float) array, dtype from its header;
- ``X.bin`` without ``X.idx``: a flat array of ``token_dtype`` (uint16/uint32);
- for both, documents end at each EOS id, or at the boundaries in
  ``X.offsets.npy`` when that file exists (a 1-D integer array: 0, each
  document's end, ..., the token count);
- ``X.bin`` with ``X.idx``: a Megatron-LM / NeMo indexed dataset, documents
  from the index (``megatron.py``);
- ``.parquet`` and ``.jsonl`` / ``.ndjson`` (optionally ``.gz``/``.zst``): a
  column or key holding a list of ids per record;
- a folder written by ``datasets.Dataset.save_to_disk`` (needs ``datasets``).

Record numbers: the document number in flat and indexed sources, the row or
line number otherwise. Only one window of tokens (and one document, when a
document is larger) is held at a time.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

from zephon_stream.errors import InputError
from zephon_stream.storage import expand_inputs, is_local_url, local_path, open_input, open_store
from zephon_stream.writer.megatron import INDEX_HEADER_BYTES, iter_document_bounds, parse_index_header
from zephon_stream.writer.readers import JSONL_SUFFIXES, Reject, SourceReader
from zephon_stream.writer.token_check import RawDocuments

WINDOW_TOKENS = 1 << 22
ROW_BATCH = 1024
OFFSETS_SUFFIX = ".offsets.npy"
FLAT_DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
TOKEN_SUFFIXES = (".npy", ".bin", ".idx", ".parquet", *JSONL_SUFFIXES)
DATASETS_MARKERS = ("state.json", "dataset_info.json")


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


def _exists(url: str, storage_options: Mapping[str, Any] | None) -> bool:
    if is_local_url(url):
        return os.path.isfile(local_path(url))
    parent, _, name = url.rstrip("/").rpartition("/")
    with open_store(parent, storage_options) as store:
        return store.exists(name)


def _is_datasets_dir(url: str, storage_options: Mapping[str, Any] | None) -> bool:
    if is_local_url(url) and not os.path.isdir(local_path(url)):
        return False
    if not is_local_url(url) and any(c in url for c in "*?["):
        return False
    return all(_exists(url.rstrip("/") + "/" + marker, storage_options) for marker in DATASETS_MARKERS)


def token_input_urls(
    patterns: Iterable[str | os.PathLike[str]], storage_options: Mapping[str, Any] | None = None
) -> list[str]:
    """Expand token input patterns into the inputs to read, in order.

    A ``datasets`` folder stays one input; companion files (``X.idx`` of a
    listed ``X.bin``, ``X.offsets.npy``) are not inputs of their own; a lone
    ``X.idx`` stands for ``X.bin``.
    """
    urls: list[str] = []
    for raw in patterns:
        pattern = os.fspath(raw)
        if _is_datasets_dir(pattern, storage_options):
            urls.append(pattern.rstrip("/"))
        else:
            urls.extend(expand_inputs([pattern], storage_options))
    listed = set(urls)
    out: list[str] = []
    for url in urls:
        if url.endswith(OFFSETS_SUFFIX) or (url.endswith(".idx") and url[:-4] + ".bin" in listed):
            continue
        url = url[:-4] + ".bin" if url.endswith(".idx") else url
        if url not in out:
            out.append(url)
    return out


def _read_exact(f: BinaryIO, url: str, offset: int, count: int, dtype: np.dtype) -> np.ndarray:
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


def _npy_layout(f: BinaryIO, url: str) -> tuple[np.dtype, int, int]:
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


class TokenSource:
    """One pre-tokenized input; iterating yields ``RawDocuments`` batches in record order.

    Args:
        url: the input (file, object URL or ``datasets`` folder).
        config: field, dtype and EOS settings.
        storage_options: fsspec/s3fs options.

    Raises:
        InputError: a name of no known kind, or missing settings for it.
    """

    def __init__(self, url: str, *, config: TokenInputConfig, storage_options: Mapping[str, Any] | None = None):
        self.url = url
        self.config = config
        self._options = storage_options
        self.bytes_read = 0
        self.final_bytes_read = 0
        name = url.rsplit("/", 1)[-1].lower()
        stem = name.removesuffix(".gz").removesuffix(".zst")
        if name.endswith(".npy"):
            self.kind = "npy"
        elif name.endswith(".bin"):
            self.kind = "megatron" if _exists(url[:-4] + ".idx", storage_options) else "bin"
            if self.kind == "bin" and config.token_dtype not in FLAT_DTYPES:
                raise InputError(
                    f"input {url}: a raw .bin token file needs its dtype: --token-dtype uint16|uint32 "
                    f"(got {config.token_dtype!r}); a Megatron dataset also needs {url.rsplit('/', 1)[-1][:-4]}.idx"
                )
        elif name.endswith(".parquet"):
            self.kind = "parquet"
        elif stem.endswith(JSONL_SUFFIXES):
            self.kind = "jsonl"
        elif _is_datasets_dir(url, storage_options):
            self.kind = "datasets"
        else:
            raise InputError(
                f"input {url}: not a token input (expected {', '.join(TOKEN_SUFFIXES)}, .jsonl.gz/.zst, "
                "or a folder saved by datasets.Dataset.save_to_disk)"
            )
        if self.kind in ("parquet", "jsonl", "datasets") and not config.tokens_field:
            raise InputError(f"input {url}: name the column of token ids with --tokens-field")

    def __iter__(self) -> Iterator[RawDocuments]:
        reader = {
            "npy": self._flat, "bin": self._flat, "megatron": self._megatron,
            "parquet": self._parquet, "jsonl": self._jsonl, "datasets": self._datasets,
        }[self.kind]  # fmt: skip
        yield from reader()
        self.final_bytes_read = self.bytes_read

    @property
    def total_bytes(self) -> int | None:
        """Stored size of a local file input (None otherwise)."""
        if is_local_url(self.url) and os.path.isfile(local_path(self.url)):
            return os.path.getsize(local_path(self.url))
        return None

    # -- flat arrays and indexed datasets --------------------------------------

    def _flat(self) -> Iterator[RawDocuments]:
        with open_input(self.url, self._options) as f:
            if self.kind == "npy":
                dtype, data_offset, count = _npy_layout(f, self.url)
            else:
                dtype, data_offset = FLAT_DTYPES[self.config.token_dtype or ""], 0
                size = f.seek(0, os.SEEK_END)
                if size % dtype.itemsize:
                    raise InputError(f"input {self.url}: {size} bytes is not a whole number of {dtype} tokens")
                count = size // dtype.itemsize
            stem = self.url[: -len(".npy")] if self.kind == "npy" else self.url[: -len(".bin")]
            offsets_url = stem + OFFSETS_SUFFIX
            if _exists(offsets_url, self._options):
                bounds = self._offsets_bounds(offsets_url, count)
                yield from self._by_bounds(f, data_offset, dtype, bounds, count)
            else:
                yield from self._by_eos(f, data_offset, dtype, count, offsets_url)

    def _offsets_bounds(self, url: str, count: int) -> Iterator[tuple[int, np.ndarray]]:
        with open_input(url, self._options) as f:
            dtype, data_offset, entries = _npy_layout(f, url)
            if dtype.kind not in "iu" or entries < 1:
                raise InputError(f"offsets {url}: {entries} x {dtype}, expected at least one integer boundary")
            first, previous = 0, 0
            while True:
                take = min(self.config.window_tokens, entries - first)
                chunk = _read_exact(f, url, data_offset + first * dtype.itemsize, take, dtype).astype(np.int64)
                steps = np.diff(chunk, prepend=previous)
                bad = np.flatnonzero((steps < 0) | (chunk > count) | (chunk < 0))
                if (first == 0 and chunk[0] != 0) or len(bad):
                    i = 0 if first == 0 and chunk[0] != 0 else int(bad[0])
                    raise InputError(
                        f"offsets {url} entry {first + i}: {int(chunk[i])}, expected a boundary between "
                        f"{previous if i == 0 else int(chunk[i - 1])} and {count} (0 first, never decreasing)"
                    )
                if first + take == entries and chunk[-1] != count:
                    raise InputError(f"offsets {url} entry {entries - 1}: last boundary {int(chunk[-1])}, expected the token count {count}")
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
            yield from self._by_bounds(data, 0, header.dtype, iter_document_bounds(read, header), count)

    def _by_bounds(
        self, f: BinaryIO, data_offset: int, dtype: np.dtype, bounds_iter: Iterator[tuple[int, np.ndarray]], count: int
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
                tokens = _read_exact(f, self.url, data_offset + start * dtype.itemsize, stop - start, dtype)
                self.bytes_read = data_offset + stop * dtype.itemsize
                yield RawDocuments(
                    source=self.url, tokens=tokens, lengths=np.diff(bounds[i : j + 1]),
                    records=np.arange(first + i, first + j, dtype=np.int64), offsets=bounds[i:j],
                    num_records=j - i,
                )  # fmt: skip
            end = int(bounds[-1])
        if end != count:
            raise InputError(f"input {self.url}: the documents end at token {end}, but the file holds {count} tokens")

    def _by_eos(self, f: BinaryIO, data_offset: int, dtype: np.dtype, count: int, offsets_url: str) -> Iterator[RawDocuments]:
        eos = self.config.eos_id
        carry = np.zeros(0, dtype)
        carry_start, record, pos = 0, 0, 0
        while pos < count:
            take = min(self.config.window_tokens, count - pos)
            # NOTE: the window is read in right after the carried partial document: one copy, not two.
            block = np.empty(len(carry) + take, dtype)
            block[: len(carry)] = carry
            _read_into(f, self.url, data_offset + pos * dtype.itemsize, block[len(carry) :])
            pos += take
            self.bytes_read = data_offset + pos * dtype.itemsize
            ends = np.flatnonzero(block == eos) + 1
            if not len(ends):
                carry = block
                continue
            lengths = np.diff(ends, prepend=0)
            yield RawDocuments(
                source=self.url, tokens=block[: ends[-1]], lengths=lengths,
                records=np.arange(record, record + len(ends), dtype=np.int64),
                offsets=carry_start + ends - lengths, num_records=len(ends),
            )  # fmt: skip
            record += len(ends)
            carry, carry_start = block[ends[-1] :].copy(), carry_start + int(ends[-1])
        if len(carry):
            if record == 0:
                raise InputError(
                    f"input {self.url}: no document boundary: none of its {count} tokens is the EOS id {eos} "
                    f"and there is no offsets file {offsets_url.rsplit('/', 1)[-1]}"
                )
            # NOTE: the tail has no EOS: check_documents rejects it, or appends EOS with --append-eos.
            yield RawDocuments(
                source=self.url, tokens=carry, lengths=np.array([len(carry)], np.int64),
                records=np.array([record], np.int64), offsets=np.array([carry_start], np.int64), num_records=1,
                split_at_eos=True,
            )  # fmt: skip

    # -- columns of id lists -------------------------------------------------

    def _parquet(self) -> Iterator[RawDocuments]:
        import pyarrow as pa
        import pyarrow.parquet as pq

        with open_input(self.url, self._options) as raw:
            try:
                parquet = pq.ParquetFile(raw)
            except (pa.ArrowException, OSError) as exc:
                raise InputError(f"input {self.url}: not a readable parquet file: {exc}") from None
            self._check_column(parquet.schema_arrow)
            row = 0
            for batch in parquet.iter_batches(batch_size=ROW_BATCH, columns=[self.config.tokens_field]):
                yield self._list_batch(batch.column(0), row)
                row += batch.num_rows
                self.bytes_read = raw.tell()

    def _datasets(self) -> Iterator[RawDocuments]:
        try:
            import datasets
        except ImportError:
            raise InputError(
                f"input {self.url}: reading a datasets folder needs the datasets package: "
                "pip install 'zephon-stream[datasets]'"
            ) from None
        loaded = datasets.load_from_disk(self.url, storage_options=dict(self._options or {}) or None)
        if not isinstance(loaded, datasets.Dataset):
            raise InputError(f"input {self.url}: a DatasetDict ({', '.join(loaded)}); give one split's folder")
        self._check_column(loaded.data.schema)
        row = 0
        for table in loaded.select_columns([self.config.tokens_field]).with_format("arrow").iter(batch_size=ROW_BATCH):
            yield self._list_batch(table.column(0).combine_chunks(), row)
            row += table.num_rows
        self.bytes_read = sum(os.path.getsize(c["filename"]) for c in loaded.cache_files if os.path.isfile(c["filename"]))

    def _check_column(self, schema: Any) -> None:
        import pyarrow as pa

        field = self.config.tokens_field
        if field not in schema.names:
            raise InputError(f"input {self.url}: no column {field!r} (columns: {', '.join(schema.names)}); pick one with --tokens-field")
        kind = schema.field(field).type
        is_list = pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)
        values = kind.value_type if is_list else None
        if values is None or not (pa.types.is_integer(values) or pa.types.is_floating(values)):
            raise InputError(f"input {self.url}: column {field!r} is {kind}, expected a list of integer token ids")

    def _list_batch(self, column: Any, first_row: int) -> RawDocuments:
        import pyarrow.compute as pc

        rows = np.arange(first_row, first_row + len(column), dtype=np.int64)
        valid = column.is_valid().to_numpy(zero_copy_only=False)
        lengths = pc.list_value_length(column).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        # NOTE: flatten() skips null rows; a null inside a list reads as NaN, a non-integer.
        values = column.flatten().to_numpy(zero_copy_only=False)
        rejects = [
            Reject(self.url, int(r), "missing_field", f"null in column {self.config.tokens_field!r}") for r in rows[~valid]
        ]
        return RawDocuments(
            source=self.url, tokens=values, lengths=lengths[valid], records=rows[valid], rejects=rejects,
            num_records=len(column),
        )  # fmt: skip

    def _jsonl(self) -> Iterator[RawDocuments]:
        reader = SourceReader(
            self.url, text_field=self.config.tokens_field, input_format_override="jsonl",
            storage_options=self._options, raw_values=True,
        )  # fmt: skip
        arrays: list[np.ndarray] = []
        records: list[int] = []
        rejects: list[Reject] = []
        tokens = 0
        for record, value in reader:
            ids = value if isinstance(value, Reject) else _json_ids(value, self.url, record, self.config.tokens_field)
            if isinstance(ids, Reject):
                rejects.append(ids)
            else:
                arrays.append(ids)
                records.append(record)
                tokens += len(ids)
            if tokens >= self.config.window_tokens or len(records) + len(rejects) >= 16 * ROW_BATCH:
                yield self._json_batch(arrays, records, rejects)
                arrays, records, rejects, tokens = [], [], [], 0
                self.bytes_read = reader.bytes_read
        if records or rejects:
            yield self._json_batch(arrays, records, rejects)
        self.bytes_read = reader.final_bytes_read

    def _json_batch(self, arrays: list[np.ndarray], records: list[int], rejects: list[Reject]) -> RawDocuments:
        values = np.concatenate(arrays) if arrays else np.zeros(0, np.int64)
        return RawDocuments(
            source=self.url, tokens=values, lengths=np.array([len(a) for a in arrays], np.int64),
            records=np.array(records, np.int64), rejects=rejects, num_records=len(records) + len(rejects),
        )  # fmt: skip


def _json_ids(value: Any, url: str, record: int, field: str) -> np.ndarray | Reject:
    """A JSON value as an array of ids, or the reject that says why it is not one."""
    if not isinstance(value, list):
        return Reject(url, record, "not_token_list", f"field {field!r} holds a {type(value).__name__}, not a list of ids")
    for at, item in enumerate(value):
        if type(item) is not int and type(item) is not float:
            return Reject(url, record, "bad_token", f"token {at} of the document: {item!r} is not an integer")
    try:
        return np.array(value, dtype=np.float64 if any(type(v) is float for v in value) else np.int64)
    except OverflowError:
        return Reject(url, record, "bad_token", "an id does not fit in 64 bits")
