"""Work units: the inputs of a conversion cut into pieces of bounded size.

A unit is a run of consecutive pieces of the input order, named by its place
in that order (``index``), never by who converts it or when, so that a retried
or rerun conversion of unit ``k`` writes the same objects. Pieces:

- a whole input: small files (grouped with their neighbours up to
  ``unit_bytes``), any compressed stream (one unit: a gzip or zstd stream is
  read from its start), a whole-file text document, and token inputs;
- a run of Parquet row groups of a large Parquet file;
- a byte range of a large uncompressed JSONL (or ``lines`` text) file, cut
  just after a newline, its records numbered from the lines before it.

Record numbers (``first_record``) need the newlines before each range; they
are counted by ``count_lines``, a batch function the caller may run in
parallel (the Ray engine runs one task per range).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from zephon_stream.errors import ConfigError, InputError
from zephon_stream.storage import is_local_url, local_path, open_input, open_store
from zephon_stream.writer.config import DEFAULT_UNIT_BYTES, WriteConfig
from zephon_stream.writer.readers import input_format

# A unit of thousands of tiny files is still one task; more would make
# its commit record and its retry large for no gain in parallelism.
MAX_FILES_PER_UNIT = 4096
_SCAN_BYTES = 1 << 16
_COUNT_BYTES = 8 << 20

LineCounter = Callable[[Sequence[tuple[str, int, int]]], list[int]]


@dataclass(frozen=True, slots=True, kw_only=True)
class InputPiece:
    """One input, or one part of it, read by one unit.

    Attributes:
        url: the input.
        num_bytes: stored bytes this piece covers (progress, unit sizes).
        byte_range: ``(start, end)`` of a split line input, else None.
        row_groups: ``(first, end)`` of a split Parquet file, else None.
        first_record: the record number of the piece's first record.
        modified_ns: a local input's modification time when the units were
            cut (part of the unit's key: a file rewritten at the same size
            is not taken for the one a kept part was written from).
    """

    url: str
    num_bytes: int
    byte_range: tuple[int, int] | None = None
    row_groups: tuple[int, int] | None = None
    first_record: int = 0
    modified_ns: int | None = None

    def to_obj(self) -> list[Any]:
        return [self.url, self.num_bytes, self.byte_range, self.row_groups, self.first_record, self.modified_ns]


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkUnit:
    """A run of pieces converted into one part.

    Attributes:
        index: the unit's place in the input order (0-based).
        pieces: its pieces, in input order.
    """

    index: int
    pieces: tuple[InputPiece, ...]

    @property
    def num_bytes(self) -> int:
        return sum(p.num_bytes for p in self.pieces)


def unit_key(unit: WorkUnit, settings: Mapping[str, Any]) -> str:
    """Digest of what a unit's part depends on: its pieces and the run's settings.

    A part is reused by a rerun only when its commit record holds this key.
    """
    data = msgpack.packb([[p.to_obj() for p in unit.pieces], sorted(settings.items())], use_bin_type=True)
    return hashlib.sha256(data).hexdigest()


def input_size(url: str, storage_options: Mapping[str, Any] | None) -> tuple[int, int | None]:
    """Stored size of one input, in bytes, and a local file's modification time (ns; None for objects).

    Raises:
        InputError: the input does not exist.
    """
    if is_local_url(url):
        try:
            stat = os.stat(local_path(url))
        except FileNotFoundError:
            raise InputError(f"input {local_path(url)}: no such file") from None
        return stat.st_size, stat.st_mtime_ns
    parent, _, name = url.rstrip("/").rpartition("/")
    with open_store(parent, storage_options) as store:
        try:
            return store.size(name), None
        except FileNotFoundError:
            raise InputError(f"input {url}: no such object") from None


def count_lines(
    requests: Sequence[tuple[str, int, int]], storage_options: Mapping[str, Any] | None = None
) -> list[int]:
    """Newlines in each ``(url, start, end)`` byte range, in this process."""
    return [count_newlines(url, start, end, storage_options) for url, start, end in requests]


def count_newlines(url: str, start: int, end: int, storage_options: Mapping[str, Any] | None) -> int:
    """Newline bytes in ``[start, end)`` of one input."""
    count = 0
    with open_input(url, storage_options) as raw:
        raw.seek(start)
        left = end - start
        while left > 0:
            data = raw.read(min(left, _COUNT_BYTES))
            if not data:
                raise InputError(f"input {url}: ends at byte {end - left}, before byte {end} (changed while read?)")
            count += data.count(b"\n")
            left -= len(data)
    return count


def _line_cuts(url: str, size: int, unit_bytes: int, storage_options: Mapping[str, Any] | None) -> list[int]:
    """Offsets just after a newline near each multiple of ``unit_bytes``, then ``size``."""
    cuts = [0]
    with open_input(url, storage_options) as raw:
        target = unit_bytes
        while target < size:
            raw.seek(target - 1)
            offset = target - 1
            while True:
                data = raw.read(_SCAN_BYTES)
                if not data:
                    offset = size
                    break
                found = data.find(b"\n")
                if found >= 0:
                    offset += found + 1
                    break
                offset += len(data)
            if offset >= size:
                break
            cuts.append(offset)
            target = max(offset, target) + unit_bytes
    cuts.append(size)
    return cuts


def _row_group_runs(
    url: str, unit_bytes: int, storage_options: Mapping[str, Any] | None
) -> list[tuple[int, int, int, int]]:
    """``(first_group, end_group, first_row, bytes)`` runs of a Parquet file's row groups."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise InputError(f"input {url}: reading parquet needs pyarrow (pip install 'zephon-stream[parquet]')") from None
    with open_input(url, storage_options) as raw:
        try:
            meta = pq.ParquetFile(raw).metadata
        except Exception as exc:  # pyarrow raises several types for a file that is not parquet
            raise InputError(f"input {url}: not a readable parquet file: {exc}") from None
    runs: list[tuple[int, int, int, int]] = []
    first, first_row, row, run_bytes = 0, 0, 0, 0
    for group in range(meta.num_row_groups):
        info = meta.row_group(group)
        stored = sum(info.column(c).total_compressed_size for c in range(info.num_columns))
        if group > first and run_bytes + stored > unit_bytes:
            runs.append((first, group, first_row, run_bytes))
            first, first_row, run_bytes = group, row, 0
        run_bytes += stored
        row += info.num_rows
    runs.append((first, meta.num_row_groups, first_row, run_bytes))
    return runs


def cut_units(
    urls: Sequence[str],
    *,
    config: WriteConfig,
    unit_bytes: int = DEFAULT_UNIT_BYTES,
    storage_options: Mapping[str, Any] | None = None,
    line_counter: LineCounter | None = None,
) -> list[WorkUnit]:
    """Cut the expanded inputs into work units, in input order.

    Args:
        urls: the inputs, expanded and in order (for token inputs, as
            ``token_input_urls`` gives them: each one whole unit).
        config: the run's settings (format, ``lines``).
        unit_bytes: the stored bytes a unit aims at.
        storage_options: fsspec options for the inputs.
        line_counter: counts newlines of ``(url, start, end)`` ranges
            (default: here, one after another).

    Raises:
        ConfigError: unit_bytes below 1.
        InputError: a missing or unreadable input.
    """
    if unit_bytes < 1:
        raise ConfigError(f"unit_bytes {unit_bytes} must be at least 1")
    pieces: list[tuple[InputPiece, bool]] = []  # (piece, may share a unit with neighbours)
    ranges: list[tuple[int, str, int]] = []  # (position in pieces, url, start) of ranges after a file's first
    for url in urls:
        if config.tokens:
            pieces.append((InputPiece(url=url, num_bytes=0), False))
            continue
        size, modified_ns = input_size(url, storage_options)
        fmt, compression = input_format(url, override=config.input_format)
        splittable = compression is None and (fmt == "jsonl" or (fmt == "txt" and config.lines))
        if size > unit_bytes and fmt == "parquet" and compression is None:
            for first, end, first_row, stored in _row_group_runs(url, unit_bytes, storage_options):
                piece = InputPiece(
                    url=url, num_bytes=stored, row_groups=(first, end), first_record=first_row, modified_ns=modified_ns
                )
                pieces.append((piece, False))
        elif size > unit_bytes and splittable:
            cuts = _line_cuts(url, size, unit_bytes, storage_options)
            for start, end in zip(cuts[:-1], cuts[1:]):
                if start > 0:
                    ranges.append((len(pieces), url, start))
                piece = InputPiece(url=url, num_bytes=end - start, byte_range=(start, end), modified_ns=modified_ns)
                pieces.append((piece, False))
        else:
            piece = InputPiece(url=url, num_bytes=size, modified_ns=modified_ns)
            pieces.append((piece, size <= unit_bytes and compression is None))
    if ranges:
        counter = line_counter or (lambda requests: count_lines(requests, storage_options))
        # Each range's first record is the newlines before it: count the
        # stretches between cuts once, then sum them along each file.
        stretches = _stretches([(url, start) for _, url, start in ranges])
        totals = _prefix_per_file(stretches, counter(stretches))
        for (position, _, _), first_record in zip(ranges, totals):
            piece, shared = pieces[position]
            pieces[position] = (_with_first_record(piece, first_record), shared)
    return _group(pieces, unit_bytes)


def _stretches(cuts: list[tuple[str, int]]) -> list[tuple[str, int, int]]:
    """``(url, cut)`` in file order turned into ``(url, previous cut or 0, cut)``."""
    out, previous = [], {}
    for url, end in cuts:
        out.append((url, previous.get(url, 0), end))
        previous[url] = end
    return out


def _prefix_per_file(ranges: list[tuple[str, int, int]], counts: list[int]) -> list[int]:
    totals, running = [], {}
    for (url, _, _), count in zip(ranges, counts):
        running[url] = running.get(url, 0) + count
        totals.append(running[url])
    return totals


def _with_first_record(piece: InputPiece, first_record: int) -> InputPiece:
    return InputPiece(
        url=piece.url,
        num_bytes=piece.num_bytes,
        byte_range=piece.byte_range,
        row_groups=piece.row_groups,
        first_record=first_record,
        modified_ns=piece.modified_ns,
    )


def _group(pieces: list[tuple[InputPiece, bool]], unit_bytes: int) -> list[WorkUnit]:
    units: list[WorkUnit] = []
    run: list[InputPiece] = []
    run_bytes = 0

    def close_run() -> None:
        nonlocal run, run_bytes
        if run:
            units.append(WorkUnit(index=len(units), pieces=tuple(run)))
            run, run_bytes = [], 0

    for piece, shared in pieces:
        if not shared:
            close_run()
            units.append(WorkUnit(index=len(units), pieces=(piece,)))
            continue
        if run and (run_bytes + piece.num_bytes > unit_bytes or len(run) >= MAX_FILES_PER_UNIT):
            close_run()
        run.append(piece)
        run_bytes += piece.num_bytes
    close_run()
    return units
