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
from typing import Any

import numpy as np

from zephon_stream.errors import InputError
from zephon_stream.storage import expand_inputs, is_local_url, local_path, open_input
from zephon_stream.storage.redact import redact_url
from zephon_stream.writer.readers import JSONL_SUFFIXES, Reject, SourceReader
from zephon_stream.writer.rejects import a_type
from zephon_stream.writer.token_arrays import FLAT_DTYPES, OFFSETS_SUFFIX, ArraySource, TokenInputConfig, exists
from zephon_stream.writer.token_check import RawDocuments

ROW_BATCH = 1024
TOKEN_SUFFIXES = (".npy", ".bin", ".idx", ".parquet", *JSONL_SUFFIXES)
DATASETS_MARKERS = ("state.json", "dataset_info.json")


def _is_datasets_dir(url: str, storage_options: Mapping[str, Any] | None) -> bool:
    if is_local_url(url) and not os.path.isdir(local_path(url)):
        return False
    if not is_local_url(url) and any(c in url for c in "*?["):
        return False
    return all(exists(url.rstrip("/") + "/" + marker, storage_options) for marker in DATASETS_MARKERS)


def token_input_urls(
    patterns: Iterable[str | os.PathLike[str]], storage_options: Mapping[str, Any] | None = None
) -> list[str]:
    """Expand token input patterns into the inputs to read, in order.

    A ``datasets`` folder stays one input; companion files (``X.idx`` of a
    listed ``X.bin``, ``X.offsets.npy``) are not inputs of their own; a lone
    ``X.idx`` stands for ``X.bin``; a Megatron prefix ``X`` (what Megatron's
    ``--data-path`` names) that matches no file stands for ``X.bin`` when
    ``X.bin`` and ``X.idx`` both exist.

    Raises:
        InputError: a pattern that matches nothing, or a prefix with only one
            of its ``.bin`` and ``.idx``.
    """
    urls: list[str] = []
    for raw in patterns:
        pattern = os.fspath(raw)
        if _is_datasets_dir(pattern, storage_options):
            urls.append(pattern.rstrip("/"))
            continue
        try:
            urls.extend(expand_inputs([pattern], storage_options))
        except InputError as exc:
            prefix = _megatron_prefix(pattern, storage_options)
            if prefix is None:
                if any(c in pattern for c in "*?[") or pattern.lower().endswith(TOKEN_SUFFIXES):
                    raise
                name = redact_url(pattern)
                raise InputError(f"{exc}, and no {name}.bin or {name}.idx for a Megatron prefix") from None
            urls.append(prefix)
    listed = set(urls)
    out: list[str] = []
    for url in urls:
        if url.endswith(OFFSETS_SUFFIX) or (url.endswith(".idx") and url[:-4] + ".bin" in listed):
            continue
        url = url[:-4] + ".bin" if url.endswith(".idx") else url
        if url not in out:
            out.append(url)
    return out


def _megatron_prefix(pattern: str, storage_options: Mapping[str, Any] | None) -> str | None:
    """``PREFIX.bin`` when ``pattern`` is a Megatron prefix with both files, None when it has neither."""
    if any(c in pattern for c in "*?[") or pattern.endswith("/"):
        return None
    have = {suffix: exists(pattern + suffix, storage_options) for suffix in (".bin", ".idx")}
    if not any(have.values()):
        return None
    if not all(have.values()):
        found, missing = (".bin", ".idx") if have[".bin"] else (".idx", ".bin")
        name = redact_url(pattern)
        raise InputError(
            f"input {name}: a Megatron dataset prefix needs {name}.bin and {name}.idx; "
            f"{name}{found} exists but {name}{missing} does not"
        )
    return pattern + ".bin"


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
            self.kind = "megatron" if exists(url[:-4] + ".idx", storage_options) else "bin"
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
        if self.kind in ("npy", "bin", "megatron"):
            arrays = ArraySource(self.url, kind=self.kind, config=self.config, storage_options=self._options)
            for batch in arrays:
                self.bytes_read = arrays.bytes_read
                yield batch
        else:
            yield from {"parquet": self._parquet, "jsonl": self._jsonl, "datasets": self._datasets}[self.kind]()
        self.final_bytes_read = self.bytes_read

    @property
    def total_bytes(self) -> int | None:
        """Stored size of a local file input (None otherwise)."""
        if is_local_url(self.url) and os.path.isfile(local_path(self.url)):
            return os.path.getsize(local_path(self.url))
        return None

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
            for batch in parquet.iter_batches(
                batch_size=ROW_BATCH, columns=[self.config.tokens_field], use_threads=False
            ):
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
        self.bytes_read = sum(
            os.path.getsize(c["filename"]) for c in loaded.cache_files if os.path.isfile(c["filename"])
        )

    def _check_column(self, schema: Any) -> None:
        import pyarrow as pa

        field = self.config.tokens_field
        if field not in schema.names:
            raise InputError(
                f"input {self.url}: no column {field!r} (columns: {', '.join(schema.names)}); "
                "pick one with --tokens-field"
            )
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
        # flatten() skips null rows; a null inside a list reads as NaN, a non-integer.
        values = column.flatten().to_numpy(zero_copy_only=False)
        rejects = [
            Reject(self.url, int(r), "missing_field", f"null in column {self.config.tokens_field!r}")
            for r in rows[~valid]
        ]
        return RawDocuments(
            source=self.url,
            tokens=values,
            lengths=lengths[valid],
            records=rows[valid],
            rejects=rejects,
            num_records=len(column),
        )

    def _jsonl(self) -> Iterator[RawDocuments]:
        reader = SourceReader(
            self.url,
            text_field=self.config.tokens_field,
            input_format_override="jsonl",
            storage_options=self._options,
            raw_values=True,
        )
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
            source=self.url,
            tokens=values,
            lengths=np.array([len(a) for a in arrays], np.int64),
            records=np.array(records, np.int64),
            rejects=rejects,
            num_records=len(records) + len(rejects),
        )


def _json_ids(value: Any, url: str, record: int, field: str) -> np.ndarray | Reject:
    """A JSON value as an array of ids, or the reject that says why it is not one."""
    if not isinstance(value, list):
        return Reject(url, record, "not_token_list", f"field {field!r} holds {a_type(value)}, not a list of ids")
    for at, item in enumerate(value):
        if type(item) is not int and type(item) is not float:
            return Reject(url, record, "bad_token", f"token {at} of the document: {item!r} is not an integer")
    try:
        return np.array(value, dtype=np.float64 if any(type(v) is float for v in value) else np.int64)
    except OverflowError:
        return Reject(url, record, "bad_token", "an id does not fit in 64 bits")
