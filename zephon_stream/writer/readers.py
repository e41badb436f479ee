"""Corpus readers: one input file in, its records out, each a text or a reject.

Formats, chosen by suffix after an optional ``.gz`` / ``.zst``:

- text (``.txt``, ``.text``, ``.md``, ``.py``): the whole file is one document
  (record 0), or with ``lines=True`` each line is one (record = line number);
- ``.jsonl`` / ``.ndjson``: one JSON object a line, its ``text_field`` holds the
  document (record = line number, 0-based);
- ``.parquet`` (needs pyarrow): the ``text_field`` column (record = row number).

A record that cannot become a document is a ``Reject`` with a reason from
``REJECT_REASONS``; a file that cannot be read at all raises ``InputError``
naming the input and the offset reached. Nothing is skipped silently.
"""

from __future__ import annotations

import gzip
import io
import json
import zlib
from collections.abc import Iterator, Mapping
from typing import Any, BinaryIO

import zstandard

from zephon_stream.errors import InputError, ZephonError
from zephon_stream.storage import open_input
from zephon_stream.writer.rejects import (  # noqa: F401 (Reject re-exported)
    REJECT_REASONS,
    Reject,
    a_type,
    bad_json_detail,
)

TEXT_SUFFIXES = (".txt", ".text", ".md", ".py")
JSONL_SUFFIXES = (".jsonl", ".ndjson")
PARQUET_SUFFIXES = (".parquet",)
INPUT_FORMATS = ("txt", "jsonl", "parquet")
LINE_BUFFER_BYTES = 1 << 20
PARQUET_BATCH_ROWS = 1024


def _without_terminator(line: bytes) -> bytes:
    """A line without its ``\n`` or ``\r\n``."""
    body = line[:-1] if line.endswith(b"\n") else line
    return body[:-1] if body.endswith(b"\r") else body


def input_format(url: str, *, override: str | None = None) -> tuple[str, str | None]:
    """``(format, compression)`` of an input, from its name unless ``override`` is set.

    Raises:
        InputError: a name whose suffix says neither.
    """
    name = url.rsplit("/", 1)[-1].lower()
    compression = None
    for suffix, kind in ((".gz", "gzip"), (".zst", "zstd")):
        if name.endswith(suffix):
            compression, name = kind, name[: -len(suffix)]
    if override is not None:
        if override not in INPUT_FORMATS:
            raise InputError(f"input format {override!r} is unknown (expected one of {', '.join(INPUT_FORMATS)})")
        return override, compression
    for suffixes, kind in ((TEXT_SUFFIXES, "txt"), (JSONL_SUFFIXES, "jsonl"), (PARQUET_SUFFIXES, "parquet")):
        if name.endswith(suffixes):
            return kind, compression
    known = ", ".join(TEXT_SUFFIXES + JSONL_SUFFIXES + PARQUET_SUFFIXES)
    raise InputError(
        f"input {url}: unknown file type (expected one of {known}, optionally .gz or .zst; "
        "or name the format with --input-format)"
    )


class SourceReader:
    """Reads one input's records in order.

    Iterating yields ``(record, text)`` for a document and ``(record, Reject)``
    for a record that is not one. With ``raw_values`` (JSONL only), a
    record's field value comes back as JSON decoded it, unchecked (a missing
    or null field is still a ``missing_field`` reject). ``bytes_read`` is how far into the stored
    (possibly compressed) file reading has got, for progress.
    """

    def __init__(
        self,
        url: str,
        *,
        text_field: str = "text",
        lines: bool = False,
        input_format_override: str | None = None,
        storage_options: Mapping[str, Any] | None = None,
        raw_values: bool = False,
        byte_range: tuple[int, int] | None = None,
        row_groups: tuple[int, int] | None = None,
        first_record: int = 0,
    ) -> None:
        self.url = url
        self.text_field = text_field
        self.lines = lines
        self.raw_values = raw_values
        self.format, self.compression = input_format(url, override=input_format_override)
        if self.format == "parquet" and self.compression is not None:
            raise InputError(f"input {url}: parquet compresses itself; a .gz/.zst parquet file is not supported")
        by_lines = self.compression is None and (lines or self.format == "jsonl")
        if (byte_range is not None and not by_lines) or (row_groups is not None and self.format != "parquet"):
            raise InputError(
                f"input {url}: only uncompressed line inputs split by byte range, only parquet by row group"
            )
        self.byte_range = byte_range
        self.row_groups = row_groups
        self.first_record = first_record
        self._storage_options = storage_options
        self._raw: BinaryIO | None = None
        self.final_bytes_read = 0

    @property
    def bytes_read(self) -> int:
        """Bytes of the stored file read so far."""
        if self._raw is None or self._raw.closed:
            return 0
        return self._raw.tell() - (self.byte_range[0] if self.byte_range else 0)

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        self._raw = open_input(self.url, self._storage_options)
        try:
            if self.format == "parquet":
                yield from self._parquet(self._raw)
                return
            if self.byte_range is not None:
                start, end = self.byte_range
                self._raw.seek(start)
                stream = _CountingStream(_Bounded(self._raw, end - start), offset=start)
            else:
                stream = self._decompressed(self._raw)
            try:
                if self.format == "jsonl":
                    yield from self._jsonl(stream)
                elif self.lines:
                    yield from self._text_lines(stream)
                else:
                    yield from self._text_whole(stream)
            except ZephonError:
                raise  # storage failures after retries name the object and range already
            except (OSError, EOFError, zlib.error, zstandard.ZstdError) as exc:
                raise self._corrupt(exc, stream) from None
        finally:
            self.final_bytes_read = self.bytes_read
            self._raw.close()

    # -- byte streams -------------------------------------------------------

    def _decompressed(self, raw: BinaryIO) -> _CountingStream:
        if self.compression == "gzip":
            inner: BinaryIO = gzip.GzipFile(fileobj=raw, mode="rb")
        elif self.compression == "zstd":
            inner = _ZstdFrames(raw)
        else:
            inner = raw
        return _CountingStream(inner)

    def _corrupt(self, exc: BaseException, stream: _CountingStream) -> InputError:
        what = {"gzip": "gzip data", "zstd": "zstd data"}.get(self.compression or "", "data")
        return InputError(
            f"input {self.url}: cannot read {what} at decompressed byte {stream.offset} "
            f"(stored byte {self.bytes_read}): {type(exc).__name__}: {exc}"
        )

    # -- formats --------------------------------------------------------------

    def _text_whole(self, stream: _CountingStream) -> Iterator[tuple[int, str | Reject]]:
        data = stream.read_all()
        yield 0, self._decode(data, 0, 0)

    def _text_lines(self, stream: _CountingStream) -> Iterator[tuple[int, str | Reject]]:
        for number, (offset, line) in enumerate(stream.lines(), start=self.first_record):
            yield number, self._decode(_without_terminator(line), number, offset)

    def _jsonl(self, stream: _CountingStream) -> Iterator[tuple[int, str | Reject]]:
        field = self.text_field
        for number, (offset, line) in enumerate(stream.lines(), start=self.first_record):
            try:
                # Without its newline, a string left open says so, not "Invalid control character".
                decoded = _without_terminator(line).decode("utf-8")
            except UnicodeDecodeError as exc:
                yield number, self._reject(number, "undecodable", f"invalid UTF-8 at byte {offset + exc.start}")
                continue
            if number == 0 and decoded.startswith("\ufeff"):
                decoded = decoded[1:]  # A UTF-8 byte-order mark is not JSON
            # `record` is the line's 0-based index; a detail names the
            # line as editors (and `sed -n Np`) count it, from 1.
            line_number = number + 1
            try:
                obj = json.loads(decoded)
            except json.JSONDecodeError as exc:
                yield number, self._reject(number, "bad_json", bad_json_detail(exc, line_number=line_number))
                continue
            if not isinstance(obj, dict):
                kind = type(obj).__name__
                yield number, self._reject(number, "bad_json", f"line {line_number}: a JSON {kind}, not an object")
                continue
            value = obj.get(field, _MISSING)
            if self.raw_values:
                missing = value is _MISSING or value is None
                yield (
                    number,
                    self._reject(number, "missing_field", f"no value in field {field!r}") if missing else value,
                )
                continue
            yield number, self._check_value(value, number, offset, escaped=b"\\u" in line)

    def _parquet(self, raw: BinaryIO) -> Iterator[tuple[int, str | Reject]]:
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            raise InputError(
                f"input {self.url}: reading parquet needs pyarrow; install it with "
                "pip install 'zephon-stream[parquet]' (or pip install pyarrow)"
            ) from None
        try:
            parquet = pq.ParquetFile(raw)
        except (pa.ArrowException, OSError) as exc:
            raise InputError(f"input {self.url}: not a readable parquet file: {exc}") from None
        schema = parquet.schema_arrow
        if self.text_field not in schema.names:
            raise InputError(
                f"input {self.url}: no column {self.text_field!r} (columns: {', '.join(schema.names)}); "
                "pick one with --text-field"
            )
        column_type = schema.field(self.text_field).type
        is_text = pa.types.is_string(column_type) or pa.types.is_large_string(column_type)
        is_binary = pa.types.is_binary(column_type) or pa.types.is_large_binary(column_type)
        if not (is_text or is_binary):
            raise InputError(f"input {self.url}: column {self.text_field!r} is {column_type}, expected a string column")
        row = self.first_record
        groups = None if self.row_groups is None else list(range(*self.row_groups))
        try:
            for batch in parquet.iter_batches(
                batch_size=PARQUET_BATCH_ROWS, columns=[self.text_field], row_groups=groups
            ):
                for value in batch.column(0).to_pylist():
                    if isinstance(value, bytes):
                        yield row, self._decode(value, row, None)
                    else:
                        yield row, self._check_value(_MISSING if value is None else value, row, None, escaped=False)
                    row += 1
        except (pa.ArrowException, OSError) as exc:
            raise InputError(f"input {self.url}: cannot read parquet row {row}: {exc}") from None

    # -- records --------------------------------------------------------------

    def _reject(self, record: int, reason: str, detail: str) -> Reject:
        return Reject(self.url, record, reason, detail)

    def _decode(self, data: bytes, record: int, offset: int | None) -> str | Reject:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            where = f"byte {offset + exc.start}" if offset is not None else f"byte {exc.start} of the value"
            return self._reject(record, "undecodable", f"invalid UTF-8 at {where}")
        if not text:
            return self._reject(record, "empty", "empty text")
        return text

    def _check_value(self, value: Any, record: int, offset: int | None, *, escaped: bool) -> str | Reject:
        if value is _MISSING or value is None:
            return self._reject(record, "missing_field", f"no value in field {self.text_field!r}")
        if not isinstance(value, str):
            return self._reject(record, "not_string", f"field {self.text_field!r} holds {a_type(value)}, not a string")
        if not value:
            return self._reject(record, "empty", f"field {self.text_field!r} is empty")
        if escaped:
            # A JSON \ud800 escape decodes to a lone surrogate, which no
            # UTF-8 tokenizer can take; only lines with \u escapes can hold one.
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                where = f"line byte {offset}" if offset is not None else "the value"
                return self._reject(
                    record, "undecodable", f"lone surrogate at character {exc.start} of the text (record at {where})"
                )
        return value


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


_MISSING = _Missing()


class TruncatedInput(EOFError):
    """A compressed input that ends inside a frame."""


class _ZstdFrames(io.RawIOBase):
    """Decompresses concatenated zstd frames, and notices a truncated last frame
    (zstandard's stream reader ends quietly there)."""

    def __init__(self, raw: BinaryIO) -> None:
        super().__init__()
        self._raw = raw
        self._dctx = zstandard.ZstdDecompressor()
        self._dobj = self._dctx.decompressobj()
        self._in_frame = False
        self._out = b""
        self._pos = 0
        self._eof = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        while self._pos == len(self._out) and not self._eof:
            self._fill()
        n = min(len(view), len(self._out) - self._pos)
        view[:n] = self._out[self._pos : self._pos + n]
        self._pos += n
        return n

    def _fill(self) -> None:
        data = self._raw.read(LINE_BUFFER_BYTES)
        if not data:
            if self._in_frame:
                raise TruncatedInput("zstd stream ends inside a frame")
            self._eof = True
            return
        out = []
        while data:
            self._in_frame = True
            out.append(self._dobj.decompress(data))
            if not self._dobj.eof:
                break
            data = self._dobj.unused_data
            self._dobj = self._dctx.decompressobj()
            self._in_frame = False
        self._out = b"".join(out)
        self._pos = 0


class _Bounded(io.RawIOBase):
    """The next ``size`` bytes of ``raw``, then end of file."""

    def __init__(self, raw: BinaryIO, size: int) -> None:
        super().__init__()
        self._raw = raw
        self._left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self._raw.read(min(len(view), self._left)) if self._left > 0 else b""
        view[: len(data)] = data
        self._left -= len(data)
        return len(data)


class _CountingStream:
    """A decompressed byte stream that knows its offset, read by lines or whole."""

    def __init__(self, inner: BinaryIO, *, offset: int = 0) -> None:
        self._buffered = (
            io.BufferedReader(inner, buffer_size=LINE_BUFFER_BYTES)
            if not isinstance(inner, io.BufferedReader)
            else inner
        )
        self.offset = offset

    def lines(self) -> Iterator[tuple[int, bytes]]:
        for line in self._buffered:
            start = self.offset
            self.offset += len(line)
            yield start, line

    def read_all(self) -> bytes:
        chunks = []
        while chunk := self._buffered.read(LINE_BUFFER_BYTES):
            chunks.append(chunk)
            self.offset += len(chunk)
        return b"".join(chunks)
