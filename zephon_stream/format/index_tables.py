"""Index tables: fixed-width columns in one object, read by page, every page digested.

A table object (docs/FORMAT.md, section 11) holds ``rows`` entries of a few
columns, each column contiguous and fixed-width, then the digest of every
page of every column. The manifest names the object with its sha256 and holds
the digests of the digest region's own pages, so a reader that fetches one
page of one column (a few KiB, by range) checks it against a digest it has
checked in turn: two reads per page, whatever the dataset's size, and never
an unchecked byte. ``verify`` reads whole objects and checks the sha256 too.

Pure code: bytes in, bytes out. The reading with a store and a cache is the
loader's (``loader/blocks/metadata.py``).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from zephon_stream.errors import IndexObjectError, ManifestError
from zephon_stream.format.fields import MAX_UINT64, FieldReader, check_relative_path

PAGE_DIGEST_BYTES = 16
DEFAULT_PAGE_BYTES = 4096
MIN_PAGE_BYTES = 64
MAX_PAGE_BYTES = 2**24
# numpy type strings a column may have: little-endian unsigned integers,
# fixed-width byte strings (paths, padded with NUL) and raw digests (|V32).
_TYPE_KINDS = ("<u", "|S", "|V")


def page_digest(data: bytes | memoryview) -> bytes:
    """The 16-byte digest of one page: BLAKE2b with a 16-byte output, no key."""
    return hashlib.blake2b(data, digest_size=PAGE_DIGEST_BYTES).digest()


def _pages(num_bytes: int, page_bytes: int) -> int:
    return -(-num_bytes // page_bytes)


@dataclasses.dataclass(frozen=True, slots=True)
class ColumnInfo:
    """One column of a table: its name, numpy type string and byte offset in the object."""

    name: str
    type: str
    offset: int

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.type)

    @property
    def width(self) -> int:
        return self.dtype.itemsize


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class TableInfo:
    """What the manifest says of one table object (docs/FORMAT.md, 11.2).

    Attributes:
        path: the object, relative to the dataset root.
        num_bytes: its size.
        sha256: SHA-256 of the whole object.
        rows: entries in every column.
        page_bytes: the page size of the columns and of the digest region.
        columns: the columns in object order.
        digests_offset: where the page digests begin (each column's pages in turn).
        digest_pages: the digests of the digest region's pages, concatenated.
    """

    path: str
    num_bytes: int
    sha256: str
    rows: int
    page_bytes: int
    columns: tuple[ColumnInfo, ...]
    digests_offset: int
    digest_pages: bytes

    def column(self, name: str) -> ColumnInfo:
        for column in self.columns:
            if column.name == name:
                return column
        raise KeyError(name)

    def column_pages(self, column: ColumnInfo) -> int:
        return _pages(self.rows * column.width, self.page_bytes)

    def first_digest(self, column: ColumnInfo) -> int:
        """Index of the column's first page digest in the digest region."""
        index = 0
        for other in self.columns:
            if other == column:
                return index
            index += self.column_pages(other)
        raise KeyError(column.name)

    @property
    def num_digests(self) -> int:
        return sum(self.column_pages(c) for c in self.columns)

    def page_range(self, column: ColumnInfo, page: int) -> tuple[int, int]:
        """Bytes ``[start, end)`` of page ``page`` of ``column`` in the object."""
        end_of_column = column.offset + self.rows * column.width
        start = column.offset + page * self.page_bytes
        return start, min(start + self.page_bytes, end_of_column)

    def digest_page_range(self, page: int) -> tuple[int, int]:
        """Bytes ``[start, end)`` of page ``page`` of the digest region."""
        start = self.digests_offset + page * self.page_bytes
        return start, min(start + self.page_bytes, self.num_bytes)

    def pages_of_rows(self, column: ColumnInfo, first: int, last: int) -> range:
        """Pages of ``column`` holding rows ``first`` to ``last`` (inclusive)."""
        return range(first * column.width // self.page_bytes, ((last + 1) * column.width - 1) // self.page_bytes + 1)

    # -- codec ---------------------------------------------------------------

    def to_obj(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "num_bytes": self.num_bytes,
            "sha256": self.sha256,
            "rows": self.rows,
            "page_bytes": self.page_bytes,
            "columns": [{"name": c.name, "type": c.type, "offset": c.offset} for c in self.columns],
            "digests_offset": self.digests_offset,
            "digest_pages": self.digest_pages,
        }

    @classmethod
    def from_obj(cls, obj: Any, *, where: str, expected: Mapping[str, str]) -> TableInfo:
        """Decode and check a table's entry; ``expected`` maps each column a reader needs to its type."""
        fields = FieldReader(obj, where=where)
        page_bytes = fields.uint("page_bytes", minimum=MIN_PAGE_BYTES, maximum=MAX_PAGE_BYTES)
        rows = fields.uint("rows")
        num_bytes = fields.uint("num_bytes")
        columns = []
        for i, entry in enumerate(fields.array("columns")):
            col = FieldReader(entry, where=f"{where}: columns[{i}]")
            type_ = col.string("type")
            if not type_.startswith(_TYPE_KINDS):
                raise col.fail("type", f"{type_[:40]!r} is not a little-endian unsigned, byte-string or raw type")
            try:
                width = np.dtype(type_).itemsize
            except TypeError:
                raise col.fail("type", f"{type_[:40]!r} is not a numpy type string") from None
            if width < 1:
                raise col.fail("type", f"{type_[:40]!r} has no width")
            columns.append(ColumnInfo(name=col.string("name"), type=type_, offset=col.uint("offset")))
        info = cls(
            path=check_relative_path(fields.get("path"), field="path", where=where),
            num_bytes=num_bytes,
            sha256=fields.hex_digest("sha256"),
            rows=rows,
            page_bytes=page_bytes,
            columns=tuple(columns),
            digests_offset=fields.uint("digests_offset"),
            digest_pages=fields.binary("digest_pages"),
        )
        info.check(where=where, expected=expected)
        return info

    def check(self, *, where: str, expected: Mapping[str, str]) -> None:
        """The layout rules of 11.2: columns back to back from 0, then the digests, then the end."""
        names = [c.name for c in self.columns]
        if len(set(names)) != len(names):
            raise ManifestError(f"{where}: a column name appears twice in {names}")
        for name, type_ in expected.items():
            found = next((c for c in self.columns if c.name == name), None)
            if found is None:
                raise ManifestError(f"{where}: missing column {name!r}")
            if found.type != type_:
                raise ManifestError(f"{where}: column {name!r} has type {found.type!r}, expected {type_!r}")
        offset = 0
        for column in self.columns:
            if column.offset != offset:
                raise ManifestError(
                    f"{where}: column {column.name!r} starts at byte {column.offset}, expected {offset}"
                )
            offset += self.rows * column.width
            if offset > MAX_UINT64:
                raise ManifestError(f"{where}: {self.rows} rows overflow the object")
        if self.digests_offset != offset:
            raise ManifestError(f"{where}: field 'digests_offset' is {self.digests_offset}, expected {offset}")
        digest_bytes = self.num_digests * PAGE_DIGEST_BYTES
        if self.num_bytes != offset + digest_bytes:
            raise ManifestError(
                f"{where}: field 'num_bytes' is {self.num_bytes}, but {self.rows} rows and their "
                f"{self.num_digests} page digests make {offset + digest_bytes}"
            )
        expected_digests = _pages(digest_bytes, self.page_bytes) * PAGE_DIGEST_BYTES
        if len(self.digest_pages) != expected_digests:
            raise ManifestError(
                f"{where}: field 'digest_pages' holds {len(self.digest_pages)} bytes, expected {expected_digests}"
            )

    # -- checking what was read ----------------------------------------------

    def checked_digest_page(self, page: int, data: bytes, *, where: str) -> bytes:
        """A page of the digest region, checked against the manifest's digest of it."""
        start, end = self.digest_page_range(page)
        _check_length(data, start, end, where=where)
        expected = self.digest_pages[page * PAGE_DIGEST_BYTES : (page + 1) * PAGE_DIGEST_BYTES]
        return _check_digest(data, expected, start, end, what="digest page", where=where)

    def expected_page_digest(self, column: ColumnInfo, page: int, digest_page: bytes, digest_page_index: int) -> bytes:
        """The digest of one column page, out of the (checked) digest page that holds it."""
        entry = self.first_digest(column) + page
        at = entry * PAGE_DIGEST_BYTES - digest_page_index * self.page_bytes
        return bytes(digest_page[at : at + PAGE_DIGEST_BYTES])

    def digest_page_of(self, column: ColumnInfo, page: int) -> int:
        """Index of the digest page holding the digest of ``column``'s page ``page``."""
        return (self.first_digest(column) + page) * PAGE_DIGEST_BYTES // self.page_bytes

    def checked_page(self, column: ColumnInfo, page: int, data: bytes, expected: bytes, *, where: str) -> bytes:
        """A page of a column, checked against its digest."""
        start, end = self.page_range(column, page)
        _check_length(data, start, end, where=where)
        return _check_digest(data, expected, start, end, what=f"column {column.name!r} page {page}", where=where)


def _check_length(data: bytes, start: int, end: int, *, where: str) -> None:
    if len(data) != end - start:
        raise IndexObjectError(
            f"{where}: bytes [{start}, {end}) gave {len(data)} bytes, expected {end - start} (truncated)"
        )


def _check_digest(data: bytes, expected: bytes, start: int, end: int, *, what: str, where: str) -> bytes:
    got = page_digest(data)
    if got != expected:
        raise IndexObjectError(
            f"{where}: {what} (bytes [{start}, {end})): digest mismatch (expected {expected.hex()}, got {got.hex()})"
        )
    return data


def encode_table(
    path: str, columns: Sequence[tuple[str, np.ndarray]], *, page_bytes: int = DEFAULT_PAGE_BYTES
) -> tuple[bytes, TableInfo]:
    """A table object of the given columns (equal lengths) and its manifest entry."""
    rows = len(columns[0][1]) if columns else 0
    parts: list[bytes] = []
    infos: list[ColumnInfo] = []
    offset = 0
    digests: list[bytes] = []
    for name, values in columns:
        values = np.ascontiguousarray(values)
        assert len(values) == rows, f"column {name}: {len(values)} rows, expected {rows}"
        data = values.tobytes()
        infos.append(ColumnInfo(name=name, type=values.dtype.str, offset=offset))
        digests.extend(page_digest(data[i : i + page_bytes]) for i in range(0, len(data), page_bytes))
        parts.append(data)
        offset += len(data)
    region = b"".join(digests)
    digest_pages = b"".join(page_digest(region[i : i + page_bytes]) for i in range(0, len(region), page_bytes))
    body = b"".join(parts) + region
    info = TableInfo(
        path=path,
        num_bytes=len(body),
        sha256=hashlib.sha256(body).hexdigest(),
        rows=rows,
        page_bytes=page_bytes,
        columns=tuple(infos),
        digests_offset=offset,
        digest_pages=digest_pages,
    )
    return body, info


def decode_table(info: TableInfo, data: bytes, *, where: str) -> dict[str, np.ndarray]:
    """Every column of a whole table object, after its sha256 and every page digest are checked."""
    if len(data) != info.num_bytes:
        raise IndexObjectError(
            f"{where}: holds {len(data)} bytes, the manifest says {info.num_bytes} (truncated or replaced)"
        )
    view = memoryview(data)
    for page in range(_pages(info.num_bytes - info.digests_offset, info.page_bytes)):
        start, end = info.digest_page_range(page)
        info.checked_digest_page(page, view[start:end], where=where)
    region = view[info.digests_offset :]
    out = {}
    for column in info.columns:
        first = info.first_digest(column)
        for page in range(info.column_pages(column)):
            start, end = info.page_range(column, page)
            k = (first + page) * PAGE_DIGEST_BYTES
            info.checked_page(column, page, view[start:end], bytes(region[k : k + PAGE_DIGEST_BYTES]), where=where)
        out[column.name] = np.frombuffer(data, dtype=column.dtype, count=info.rows, offset=column.offset)
    # After the pages, so that a damaged page is named with its bytes.
    digest = hashlib.sha256(data).hexdigest()
    if digest != info.sha256:
        raise IndexObjectError(f"{where}: sha256 mismatch (expected {info.sha256}, got {digest})")
    return out
