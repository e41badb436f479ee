"""What a loader knows of one dataset: its header, and each block's frame when a step needs it.

For a dataset of format 1.1 a loader reads the manifest (a small header: the
stream's shape, totals, the tokenizer) and then, for the blocks its own steps
touch, one page of the ``blocks`` index object (the block's frame record) and
one of the ``shards`` object's ``path`` column, each checked against digests
the manifest vouches for (``format/index_tables.py``). What a rank reads at
start so grows with its share of a step, not with the dataset. A dataset of
format 1.0 holds all of it in its manifest, as before.

Pages come through the node's shared cache when there is one
(``storage/node_cache.py``): one rank of a node fetches a page, the others
read it from the node. The helper process receives the header and the pages
already read (a few KiB), never the whole manifest.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

import numpy as np

from zephon_stream.errors import IndexObjectError
from zephon_stream.format.fields import check_relative_path
from zephon_stream.format.header import FRAME_DTYPE, DatasetHeader, decode_header, is_indexed, read_header_map
from zephon_stream.format.index_tables import ColumnInfo, TableInfo
from zephon_stream.format.manifest import Manifest
from zephon_stream.format.spec import np_dtype
from zephon_stream.plan import StreamShape

# 4 KiB pages: 4096 of them (16 MiB) cover a rank's blocks for a long
# while; a page evicted is read again if a later step needs it.
_MAX_PAGES = 4096
_MAX_CONCURRENT_READS = 8


@dataclasses.dataclass(frozen=True, slots=True)
class Frame:
    """Where one block's zstd frame lies: shard path, byte range and block in shard."""

    path: str
    start: int
    end: int
    block_in_shard: int
    num_tokens: int


class StreamMetadata:
    """One dataset's metadata as a loader needs it (either format version).

    Args:
        url: the dataset root, for messages (no secrets).
        manifest: a 1.0 manifest (every entry at hand), or None.
        header_bytes: the bytes of a 1.1 manifest, or None.
    """

    def __init__(self, *, url: str, manifest: Manifest | None = None, header_bytes: bytes | None = None) -> None:
        assert (manifest is None) != (header_bytes is None)
        self.url = url.rstrip("/")
        self._manifest = manifest
        self._header_bytes = header_bytes
        self._header: DatasetHeader | None = None
        if header_bytes is not None:
            where = f"manifest {self.url}/manifest"
            fields = read_header_map(header_bytes, where=where)
            major, minor = fields.version("version")
            self._header = decode_header(fields, major=major, minor=minor, where=where)
        self._lock = threading.Lock()
        # The producer locates blocks on its thread; an evaluation or a
        # which-like look-up may do so on the consumer's.
        self._locate_lock = threading.RLock()
        self._pages: OrderedDict[tuple[str, str, int], bytes] = OrderedDict()
        self._frames: dict[int, Frame] = {}
        self._store: Any = None
        self._node_cache: Any = None
        self.shape = self._shape()

    @classmethod
    def from_bytes(cls, data: bytes, *, url: str, read: Any) -> StreamMetadata:
        """The metadata of manifest bytes: a 1.1 header as it is, a 1.0 manifest parsed whole."""
        where = f"manifest {url.rstrip('/')}/manifest"
        fields = read_header_map(data, where=where)
        version = fields.version("version") if "version" in fields.obj else (0, 0)
        if fields.obj.get("format") == "zephon-stream" and version[0] == 1 and is_indexed(fields.obj, version):
            return cls(url=url, header_bytes=data)
        return cls(url=url, manifest=Manifest.from_bytes(data, where=where, read=read))

    def bind(self, store: Any, node_cache: Any = None) -> StreamMetadata:
        """Read pages through ``store`` (rooted at the dataset), sharing them through ``node_cache`` if given."""
        self._store = store
        self._node_cache = node_cache
        return self

    def __getstate__(self) -> dict[str, Any]:
        # What crosses to the helper process: the 1.1 header and the
        # pages read so far, or a 1.0 manifest; never a store.
        with self._lock:
            pages = OrderedDict(self._pages)
        return {"url": self.url, "manifest": self._manifest, "header_bytes": self._header_bytes, "pages": pages}

    def __copy__(self) -> StreamMetadata:
        """A copy for another store: the parsed header or manifest shared, pages and locks its own."""
        other = object.__new__(StreamMetadata)
        other.__dict__.update(self.__dict__)
        other._lock, other._locate_lock = threading.Lock(), threading.RLock()
        other._pages, other._frames = OrderedDict(self._pages), {}
        other._store = other._node_cache = None
        return other

    @property
    def parsed(self) -> Any:
        """The decoded header (1.1) or manifest (1.0), shared by copies: parsed and validated once."""
        return self._fields

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(url=state["url"], manifest=state["manifest"], header_bytes=state["header_bytes"])
        self._pages.update(state["pages"])

    # -- the header -----------------------------------------------------------

    @property
    def indexed(self) -> bool:
        """Whether the dataset keeps its entries in index objects (format 1.1 and later)."""
        return self._header is not None

    @property
    def _fields(self) -> Any:
        return self._header if self._header is not None else self._manifest

    @property
    def version(self) -> tuple[int, int]:
        return self._fields.version

    @property
    def fingerprint(self) -> str:
        return self._fields.fingerprint

    @property
    def tokenizer(self) -> Any:
        return self._fields.tokenizer

    @property
    def dtype(self) -> str:
        return self._fields.dtype

    @property
    def np_dtype(self) -> np.dtype:
        return np_dtype(self.dtype)

    @property
    def block_tokens(self) -> int:
        return self._fields.block_tokens

    @property
    def num_blocks(self) -> int:
        return self._fields.num_blocks

    @property
    def num_tokens(self) -> int:
        return self._fields.num_tokens

    @property
    def num_shards(self) -> int:
        return self._fields.num_shards

    @property
    def max_block_bytes(self) -> int:
        """The largest compressed block of the dataset."""
        return self._fields.max_block_bytes

    def _shape(self) -> StreamShape:
        if self._header is not None:
            h = self._header
            return StreamShape(
                fingerprint=h.fingerprint,
                block_tokens=h.block_tokens,
                num_blocks=h.num_blocks,
                short_ids=h.short_ids,
                short_counts=h.short_counts,
                name=self.url,
            )
        m = self._manifest
        return StreamShape.from_counts(m.fingerprint, m.block_tokens, m.block_token_counts(), name=self.url)

    def block_num_tokens(self, block_id: int) -> int:
        """Tokens in one block."""
        return int(self.shape.block_token_counts(np.array([block_id]))[0])

    @property
    def manifest(self) -> Manifest:
        """The full manifest: at hand for 1.0; for 1.1 every index object is read whole (``verify``'s way)."""
        if self._manifest is None:
            data = self._header_bytes
            self._manifest = Manifest.from_bytes(data, where=f"manifest {self.url}/manifest", read=self._store.read)
        return self._manifest

    # -- frames -----------------------------------------------------------------

    def frame(self, block_id: int) -> Frame:
        """Where block ``block_id``'s frame lies (reads its index pages if not yet read)."""
        block_id = int(block_id)
        with self._locate_lock:
            frame = self._frames.get(block_id)
            if frame is None:
                self._locate([block_id])
                frame = self._frames[block_id]
            return frame

    def forget(self, block_id: int) -> None:
        """Drop a block's frame once it was fetched (pages stay in the page cache)."""
        self._frames.pop(int(block_id), None)

    def locate(self, block_ids: Iterable[int]) -> None:
        """Learn the frames of these blocks, reading the index pages they need in one round of concurrent reads."""
        with self._locate_lock:
            self._locate(block_ids)

    def _locate(self, block_ids: Iterable[int]) -> None:
        wanted = [int(b) for b in block_ids if int(b) not in self._frames]
        if not wanted:
            return
        for block_id in wanted:
            if not 0 <= block_id < self.num_blocks:
                raise IndexError(f"block id {block_id} is outside [0, {self.num_blocks}) for dataset {self.url}")
        if self._header is None:
            m = self._manifest
            for block_id in wanted:
                path, start, end = m.block_byte_range(block_id)
                in_shard = m.block_location(block_id)[1]
                self._frames[block_id] = Frame(path, start, end, in_shard, m.block_num_tokens(block_id))
            return
        blocks = self._header.blocks
        frames_column = blocks.column("frames")
        rows = {b: self._rows(blocks, frames_column, b, b) for b in wanted}
        self._read_pages([key for pages in rows.values() for key in pages])
        records = {b: self._record(blocks, frames_column, b) for b in wanted}
        shards = self._header.shards
        path_column = shards.column("path")
        self._read_pages(
            [key for r in records.values() for key in self._rows(shards, path_column, int(r["shard"]), int(r["shard"]))]
        )
        for block_id, record in records.items():
            path = self._shard_path(int(record["shard"]))
            self._frames[block_id] = Frame(
                path, int(record["start"]), int(record["end"]), int(record["block"]), int(record["tokens"])
            )

    def _where(self, table: TableInfo) -> str:
        return f"index object {self.url}/{table.path}"

    def _rows(self, table: TableInfo, column: ColumnInfo, first: int, last: int) -> list[tuple[str, str, int]]:
        """Page keys (digest pages first) that rows ``first..last`` of ``column`` need."""
        keys = []
        for page in table.pages_of_rows(column, first, last):
            keys.append((table.path, "", table.digest_page_of(column, page)))
            keys.append((table.path, column.name, page))
        return keys

    def _record(self, table: TableInfo, column: ColumnInfo, row: int) -> np.void:
        record = np.frombuffer(self._row_bytes(table, column, row), dtype=FRAME_DTYPE)[0]
        where = (
            f"{self._where(table)}: row {row} (bytes [{column.offset + row * column.width}, "
            f"{column.offset + (row + 1) * column.width}))"
        )
        h = self._header
        expected_tokens = self.block_num_tokens(row)
        start, end = int(record["start"]), int(record["end"])
        problem = None
        if int(record["tokens"]) != expected_tokens:
            problem = f"holds {int(record['tokens'])} tokens, the manifest's shape says {expected_tokens}"
        elif not start < end or end - start > h.max_block_bytes:
            problem = f"frame bytes [{start}, {end}) are empty or larger than max_block_bytes {h.max_block_bytes}"
        elif int(record["shard"]) >= h.num_shards or int(record["block"]) >= h.blocks_per_shard:
            problem = (
                f"shard {int(record['shard'])} block {int(record['block'])} is outside {h.num_shards} shards "
                f"of {h.blocks_per_shard} blocks"
            )
        if problem is not None:
            raise IndexObjectError(f"{where}: {problem}")
        return record

    def _shard_path(self, shard: int) -> str:
        table = self._header.shards
        column = table.column("path")
        raw = self._row_bytes(table, column, shard).rstrip(b"\x00")
        where = f"{self._where(table)}: column 'path' row {shard}"
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise IndexObjectError(f"{where}: not UTF-8") from None
        return check_relative_path(text, field="path", where=where)

    def _row_bytes(self, table: TableInfo, column: ColumnInfo, row: int) -> bytes:
        start = row * column.width
        pieces = []
        for page in table.pages_of_rows(column, row, row):
            data = self._pages[(table.path, column.name, page)]
            base = page * table.page_bytes
            pieces.append(data[max(start - base, 0) : start + column.width - base])
        return b"".join(pieces)

    def _read_pages(self, keys: list[tuple[str, str, int]]) -> None:
        """Fetch the pages not yet held in one round, then check digest pages, then the column pages they vouch for."""
        keys = list(dict.fromkeys(keys))
        # Which digest page vouches for a column page follows from the
        # page's index, so both are read at once (one round trip, not two)
        # and checked in order once all have come.
        fetched = self._fetch([k for k in keys if k not in self._pages])
        for key, data in fetched:
            if key[1] == "":
                self._pages[key] = self._verify_digest_page(key, data)
        for key, data in fetched:
            if key[1] != "":
                self._pages[key] = self._verify_column_page(key, data)
        for key in keys:
            self._pages.move_to_end(key)
        while len(self._pages) > _MAX_PAGES:
            self._pages.popitem(last=False)

    def _table(self, path: str) -> TableInfo:
        h = self._header
        return h.blocks if path == h.blocks.path else h.shards

    def _verify_digest_page(self, key: tuple[str, str, int], data: bytes) -> bytes:
        table = self._table(key[0])
        return table.checked_digest_page(key[2], data, where=self._where(table))

    def _verify_column_page(self, key: tuple[str, str, int], data: bytes) -> bytes:
        table = self._table(key[0])
        column = table.column(key[1])
        digest_index = table.digest_page_of(column, key[2])
        expected = table.expected_page_digest(column, key[2], self._pages[(key[0], "", digest_index)], digest_index)
        return table.checked_page(column, key[2], data, expected, where=self._where(table))

    def _byte_range(self, key: tuple[str, str, int]) -> tuple[int, int]:
        table = self._table(key[0])
        if key[1] == "":
            return table.digest_page_range(key[2])
        return table.page_range(table.column(key[1]), key[2])

    def _fetch(self, keys: list[tuple[str, str, int]]) -> list[tuple[tuple[str, str, int], bytes]]:
        """The bytes of these pages, read concurrently (through the node's cache when there is one), unchecked."""
        if not keys:
            return []
        if self._store is None:
            raise RuntimeError(f"dataset {self.url}: metadata not bound to a store")

        def one(key: tuple[str, str, int]) -> tuple[tuple[str, str, int], bytes]:
            start, end = self._byte_range(key)

            def fetch() -> bytes:
                return self._store.read_range(key[0], start, end)

            if self._node_cache is None:
                return key, fetch()
            # The caller checks what the node holds as it checks what
            # the store sent: another process wrote it.
            return key, self._node_cache.get(f"{self.fingerprint}/{key[0]}/{key[1] or '_digests'}/{key[2]}", fetch)

        if len(keys) == 1:
            return [one(keys[0])]
        # Readers for this round only: rounds come once a horizon of
        # steps, not per step, and no thread stays behind between them (the
        # trainer's process runs none once the helper process serves).
        with concurrent.futures.ThreadPoolExecutor(
            min(len(keys), _MAX_CONCURRENT_READS), thread_name_prefix="zs-index"
        ) as pool:
            return list(pool.map(one, keys))

    def close(self) -> None:
        """Let go of the store and the node's cache (their owner closes them); pages read stay."""
        self._store = self._node_cache = None
