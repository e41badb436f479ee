"""The manifest of format 1.1: a small header naming the dataset's index objects.

A 1.1 manifest (docs/FORMAT.md, section 11) carries the dataset-wide fields
of 1.0 and, instead of the per-shard and per-source arrays, the compact shape
of the token stream (every short block) and three index objects written
beside it: ``blocks`` (one fixed-width frame record per block), ``shards``
(fixed-width columns, one row per shard) and ``sources`` (msgpack, what
only ``verify``, ``inspect`` and ``which`` read). A loader reads the header
and then only the pages of the index objects its blocks need.

``DatasetHeader`` is the decoded header; ``encode_objects`` writes a full
``Manifest`` in this form; ``full_entries`` rebuilds the 1.0 entries from the
index objects for the readers that need all of them.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np

from zephon_stream.errors import IndexObjectError, ManifestError, VersionError
from zephon_stream.format.entries import ShardInfo, SourceInfo, TokenizerInfo
from zephon_stream.format.fields import FieldReader, check_relative_path, unpack_map
from zephon_stream.format.index_tables import DEFAULT_PAGE_BYTES, TableInfo, decode_table, encode_table
from zephon_stream.format.spec import (
    DTYPE_NAMES,
    FORMAT_NAME,
    FORMAT_VERSION,
    INDEX_DIR,
    INDEXED_VERSION,
    MANIFEST_NAME,
    MAX_BLOCK_TOKENS,
    MIN_BLOCK_TOKENS,
    dtype_name,
)

# One frame record a block: where its zstd frame lies, in which shard,
# which block of that shard, and how many tokens it holds (checked against the
# header's shape when read). One record, not five columns: a loader needs all
# of it at once, so one page read answers a block.
FRAME_DTYPE = np.dtype([("start", "<u8"), ("end", "<u8"), ("shard", "<u4"), ("block", "<u4"), ("tokens", "<u4")])
FRAME_TYPE = f"|V{FRAME_DTYPE.itemsize}"
BLOCK_COLUMNS = {"frames": FRAME_TYPE}
# The shard table's path columns are as wide as the dataset's longest
# path (NUL-padded), so their type is checked by kind, not by width.
SHARD_NUMBER_COLUMNS = {
    "num_tokens": "<u8",
    "num_bytes": "<u8",
    "num_documents": "<u8",
    "first_block": "<u8",
    "sha256": "|V32",
    "index_sha256": "|V32",
}
SHARD_PATH_COLUMNS = ("path", "index_path")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ObjectInfo:
    """An index object read whole: its path, size and SHA-256."""

    path: str
    num_bytes: int
    sha256: str

    def to_obj(self) -> dict[str, Any]:
        return {"path": self.path, "num_bytes": self.num_bytes, "sha256": self.sha256}

    @classmethod
    def from_obj(cls, obj: Any, *, where: str) -> ObjectInfo:
        fields = FieldReader(obj, where=where)
        return cls(
            path=check_relative_path(fields.get("path"), field="path", where=where),
            num_bytes=fields.uint("num_bytes"),
            sha256=fields.hex_digest("sha256"),
        )

    def checked(self, data: bytes, *, where: str) -> bytes:
        if len(data) != self.num_bytes:
            raise IndexObjectError(
                f"{where}: holds {len(data)} bytes, the manifest says {self.num_bytes} (truncated or replaced)"
            )
        digest = hashlib.sha256(data).hexdigest()
        if digest != self.sha256:
            raise IndexObjectError(f"{where}: sha256 mismatch (expected {self.sha256}, got {digest})")
        return data


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class DatasetHeader:
    """A decoded 1.1 manifest: everything but the per-shard, per-block and per-source entries."""

    version: tuple[int, int]
    dtype: str
    tokenizer: TokenizerInfo
    block_tokens: int
    blocks_per_shard: int
    num_tokens: int
    num_blocks: int
    num_documents: int
    num_rejected: int
    compressed_bytes: int
    num_shards: int
    num_sources: int
    max_block_bytes: int
    short_ids: np.ndarray
    short_counts: np.ndarray
    blocks: TableInfo
    shards: TableInfo
    sources: ObjectInfo
    rejects_path: str
    fingerprint: str

    def check(self, where: str) -> None:
        """The rules of 11.4 that the header alone decides: the compact form agrees with its totals."""

        def fail(message: str) -> ManifestError:
            return ManifestError(f"{where}: {message}")

        if self.dtype not in DTYPE_NAMES:
            raise fail(f"field 'dtype': {self.dtype!r:.80} is not one of {DTYPE_NAMES}")
        if self.dtype != dtype_name(self.tokenizer.vocab_size):
            raise fail(
                f"dtype: declared {self.dtype!r}, but vocab_size {self.tokenizer.vocab_size} requires "
                f"{dtype_name(self.tokenizer.vocab_size)!r}"
            )
        ids, counts = self.short_ids, self.short_counts
        if ids.size and (np.any(np.diff(ids.astype(np.int64)) <= 0) or int(ids[-1]) >= self.num_blocks):
            raise fail(f"field 'short_blocks': ids must increase strictly and lie below num_blocks {self.num_blocks}")
        if counts.size and (int(counts.min()) < 1 or int(counts.max()) >= self.block_tokens):
            raise fail(f"field 'short_blocks': counts must lie in [1, {self.block_tokens})")
        tokens = (self.num_blocks - ids.size) * self.block_tokens + int(counts.astype(np.int64).sum())
        if tokens != self.num_tokens:
            raise fail(f"num_tokens: declared {self.num_tokens}, but the blocks and their short_blocks hold {tokens}")
        if not self.num_shards <= self.num_blocks <= self.num_shards * self.blocks_per_shard:
            raise fail(
                f"num_blocks {self.num_blocks} cannot fill {self.num_shards} shards of at most "
                f"{self.blocks_per_shard} blocks"
            )
        if self.blocks.rows != self.num_blocks:
            raise fail(f"index 'blocks': {self.blocks.rows} rows, but num_blocks is {self.num_blocks}")
        if self.shards.rows != self.num_shards:
            raise fail(f"index 'shards': {self.shards.rows} rows, but num_shards is {self.num_shards}")
        if self.num_blocks and not 1 <= self.max_block_bytes <= self.compressed_bytes:
            raise fail(
                f"field 'max_block_bytes' is {self.max_block_bytes}, outside [1, compressed_bytes "
                f"{self.compressed_bytes}]"
            )
        paths = [self.blocks.path, self.shards.path, self.sources.path, self.rejects_path]
        if len(set(paths)) != len(paths):
            raise fail(f"index objects and rejects_path must be distinct objects, got {paths}")


def encode_objects(m: Any, *, page_bytes: int = DEFAULT_PAGE_BYTES) -> dict[str, bytes]:
    """The index objects and the 1.1 manifest of a full manifest, in write order (manifest last)."""
    shards = m.shards
    blocks_per = np.fromiter((s.num_blocks for s in shards), dtype=np.int64, count=len(shards))
    first_block = np.concatenate([np.zeros(1, np.int64), np.cumsum(blocks_per)])
    frames = np.zeros(m.num_blocks, dtype=FRAME_DTYPE)
    offsets = np.fromiter(
        (o for s in shards for o in s.block_offsets), dtype=np.uint64, count=int(blocks_per.sum()) + len(shards)
    )
    ends = np.cumsum(blocks_per + 1)
    is_start = np.ones(offsets.size, dtype=bool)
    is_start[ends - 1] = False  # A shard's last offset ends its last block and starts none
    is_end = np.ones(offsets.size, dtype=bool)
    is_end[ends - blocks_per - 1] = False
    frames["start"] = offsets[is_start]
    frames["end"] = offsets[is_end]
    shard_of = np.repeat(np.arange(len(shards), dtype=np.uint32), blocks_per)
    frames["shard"] = shard_of
    frames["block"] = np.arange(m.num_blocks, dtype=np.int64) - first_block[:-1][shard_of]
    frames["tokens"] = m.block_token_counts()
    blocks_body, blocks_info = _named_table("blocks", [("frames", frames.view(FRAME_TYPE))], page_bytes)

    def path_column(values: list[str]) -> np.ndarray:
        encoded = [v.encode("utf-8") for v in values]
        return np.array(encoded, dtype=f"S{max(map(len, encoded), default=1)}")

    def digest_column(values: list[str]) -> np.ndarray:
        return np.frombuffer(b"".join(bytes.fromhex(v) for v in values), dtype="V32") if values else np.zeros(0, "V32")

    columns = [
        ("path", path_column([s.path for s in shards])),
        ("index_path", path_column([s.index_path for s in shards])),
        ("num_tokens", np.array([s.num_tokens for s in shards], dtype="<u8")),
        ("num_bytes", np.array([s.num_bytes for s in shards], dtype="<u8")),
        ("num_documents", np.array([s.num_documents for s in shards], dtype="<u8")),
        ("first_block", first_block[:-1].astype("<u8")),
        ("sha256", digest_column([s.sha256 for s in shards])),
        ("index_sha256", digest_column([s.index_sha256 for s in shards])),
    ]
    shards_body, shards_info = _named_table("shards", columns, page_bytes)
    sources_body = msgpack.packb([s.to_obj() for s in m.sources], use_bin_type=True)
    sources_info = ObjectInfo(
        path=_content_path("sources", sources_body),
        num_bytes=len(sources_body),
        sha256=hashlib.sha256(sources_body).hexdigest(),
    )
    counts = m.block_token_counts()
    short = np.flatnonzero(counts < m.block_tokens)
    sizes = (frames["end"] - frames["start"]) if m.num_blocks else np.zeros(0, np.uint64)
    header = {
        "format": FORMAT_NAME,
        "version": list(FORMAT_VERSION),
        "dtype": m.dtype,
        "tokenizer": m.tokenizer.to_obj(),
        "block_tokens": m.block_tokens,
        "blocks_per_shard": m.blocks_per_shard,
        "num_tokens": m.num_tokens,
        "num_blocks": m.num_blocks,
        "num_documents": m.num_documents,
        "num_rejected": m.num_rejected,
        "compressed_bytes": m.compressed_bytes,
        "num_shards": len(shards),
        "num_sources": len(m.sources),
        "max_block_bytes": int(sizes.max()) if sizes.size else 0,
        "short_blocks": {"ids": short.astype("<u8").tobytes(), "counts": counts[short].astype("<u4").tobytes()},
        "index": {"blocks": blocks_info.to_obj(), "shards": shards_info.to_obj(), "sources": sources_info.to_obj()},
        "rejects_path": m.rejects_path,
        "fingerprint": m.fingerprint,
    }
    return {
        blocks_info.path: blocks_body,
        shards_info.path: shards_body,
        sources_info.path: sources_body,
        MANIFEST_NAME: msgpack.packb(header, use_bin_type=True),
    }


def _content_path(name: str, body: bytes) -> str:
    # Named by their content: a new manifest (a reindex, a rewrite) never
    # overwrites the index objects that a committed one names.
    return f"{INDEX_DIR}/{name}-{hashlib.sha256(body).hexdigest()[:16]}"


def _named_table(name: str, columns: list, page_bytes: int) -> tuple[bytes, TableInfo]:
    body, info = encode_table("", columns, page_bytes=page_bytes)
    return body, dataclasses.replace(info, path=_content_path(name, body))


def decode_header(fields: FieldReader, *, major: int, minor: int, where: str) -> DatasetHeader:
    """The header of a 1.1 (or later 1.x) manifest, whose ``format`` and ``version`` are already read."""
    if (major, minor) < (1, 1):
        raise VersionError(f"{where}: format {major}.{minor} has no index objects")
    short = FieldReader(fields.get("short_blocks"), where=f"{where}: short_blocks")
    ids_bytes, counts_bytes = short.binary("ids"), short.binary("counts")
    if len(ids_bytes) % 8 or len(counts_bytes) % 4 or len(ids_bytes) // 8 != len(counts_bytes) // 4:
        raise short.fail(
            "ids",
            f"{len(ids_bytes)} bytes of ids and {len(counts_bytes)} bytes of counts do not pair "
            "(8 and 4 bytes an entry)",
        )
    index = FieldReader(fields.get("index"), where=f"{where}: index")
    shard_types = dict(SHARD_NUMBER_COLUMNS)
    shards = TableInfo.from_obj(index.get("shards"), where=f"{where}: index.shards", expected=shard_types)
    for name in SHARD_PATH_COLUMNS:
        column = next((c for c in shards.columns if c.name == name), None)
        if column is None or not column.type.startswith("|S"):
            raise ManifestError(f"{where}: index.shards: column {name!r} missing or not a byte string")
    header = DatasetHeader(
        version=(major, minor),
        dtype=fields.string("dtype"),
        tokenizer=TokenizerInfo.from_obj(fields.get("tokenizer"), where=where),
        block_tokens=fields.uint("block_tokens", minimum=MIN_BLOCK_TOKENS, maximum=MAX_BLOCK_TOKENS),
        blocks_per_shard=fields.uint("blocks_per_shard", minimum=1, maximum=2**32),
        num_tokens=fields.uint("num_tokens"),
        num_blocks=fields.uint("num_blocks"),
        num_documents=fields.uint("num_documents"),
        num_rejected=fields.uint("num_rejected"),
        compressed_bytes=fields.uint("compressed_bytes"),
        num_shards=fields.uint("num_shards"),
        num_sources=fields.uint("num_sources"),
        max_block_bytes=fields.uint("max_block_bytes"),
        short_ids=_frozen(np.frombuffer(ids_bytes, dtype="<u8").astype(np.int64)),
        short_counts=_frozen(np.frombuffer(counts_bytes, dtype="<u4").astype(np.int64)),
        blocks=TableInfo.from_obj(index.get("blocks"), where=f"{where}: index.blocks", expected=BLOCK_COLUMNS),
        shards=shards,
        sources=ObjectInfo.from_obj(index.get("sources"), where=f"{where}: index.sources"),
        rejects_path=check_relative_path(fields.get("rejects_path"), field="rejects_path", where=where),
        fingerprint=fields.hex_digest("fingerprint"),
    )
    header.check(where)
    return header


def _frozen(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


def _text(values: np.ndarray, *, what: str, where: str) -> list[str]:
    out = []
    for i, raw in enumerate(values.tolist()):
        try:
            out.append(raw.decode("utf-8"))
        except UnicodeDecodeError:
            raise IndexObjectError(f"{where}: {what} of row {i} is not UTF-8") from None
    return out


def full_entries(
    header: DatasetHeader, read: Callable[[str], bytes], *, root: str = ""
) -> tuple[list[ShardInfo], list[SourceInfo]]:
    """Every shard and source entry, from whole index objects (``read(path)`` fetches one), every digest checked.

    ``root`` (the dataset's URL and a ``/``) starts the objects' names in errors.
    """
    blocks_where = f"index object {root}{header.blocks.path}"
    shards_where = f"index object {root}{header.shards.path}"
    sources_where = f"index object {root}{header.sources.path}"
    blocks = decode_table(header.blocks, read(header.blocks.path), where=blocks_where)
    frames = blocks["frames"].view(FRAME_DTYPE)
    table = decode_table(header.shards, read(header.shards.path), where=shards_where)
    paths = _text(table["path"], what="path", where=shards_where)
    index_paths = _text(table["index_path"], what="index_path", where=shards_where)
    first = table["first_block"].astype(np.int64)
    bounds = np.append(first, header.num_blocks)
    if first.size and (first[0] != 0 or np.any(np.diff(bounds) < 1)):
        raise IndexObjectError(f"{shards_where}: column 'first_block' does not split the blocks into shards")
    shards = []
    for i, path in enumerate(paths):
        rows = frames[bounds[i] : bounds[i + 1]]
        if np.any(rows["shard"] != i) or np.any(rows["block"] != np.arange(rows.size)):
            raise IndexObjectError(
                f"{blocks_where}: rows {bounds[i]}..{bounds[i + 1] - 1} do not all "
                f"name shard {i} and its blocks in order"
            )
        if rows.size > 1 and np.any(rows["start"][1:] != rows["end"][:-1]):
            raise IndexObjectError(f"{blocks_where}: the frames of shard {i} ({path}) are not back to back")
        shards.append(
            ShardInfo(
                path=path,
                num_tokens=int(table["num_tokens"][i]),
                num_bytes=int(table["num_bytes"][i]),
                sha256=bytes(table["sha256"][i]).hex(),
                block_offsets=(int(rows["start"][0]), *rows["end"].tolist()),
                index_path=index_paths[i],
                index_sha256=bytes(table["index_sha256"][i]).hex(),
                num_documents=int(table["num_documents"][i]),
            )
        )
    data = header.sources.checked(read(header.sources.path), where=sources_where)
    try:
        objs = msgpack.unpackb(
            data,
            raw=False,
            max_bin_len=len(data),
            max_str_len=len(data),
            max_array_len=len(data),
            max_map_len=len(data),
        )
    except Exception as exc:  # msgpack raises many unrelated types on bad input.
        raise IndexObjectError(f"{sources_where}: not valid msgpack ({type(exc).__name__})") from None
    if not isinstance(objs, list) or len(objs) != header.num_sources:
        raise IndexObjectError(f"{sources_where}: expected an array of {header.num_sources} sources")
    sources = [SourceInfo.from_obj(o, where=f"{sources_where}: sources[{i}]") for i, o in enumerate(objs)]
    return shards, sources


def read_header_map(data: bytes, *, where: str) -> FieldReader:
    """The top-level map of a manifest, as fields."""
    return FieldReader(unpack_map(data, where=where), where=where)


def is_indexed(obj: dict[str, Any], version: tuple[int, int]) -> bool:
    """Whether a decoded manifest map is of the indexed layout (1.1 on, with an ``index`` key).

    Decided by the key, not the minor alone: a 1.0-layout manifest
    with a higher minor (optional keys added) still reads as 1.0.
    """
    return version >= INDEXED_VERSION and "index" in obj


def check_header_against(header: DatasetHeader, manifest: Any, *, where: str) -> None:
    """Refuse a 1.1 header whose compact fields differ from what its index objects give."""
    counts = manifest.block_token_counts()
    short = np.flatnonzero(counts < manifest.block_tokens)
    derived = {
        "num_shards": (header.num_shards, manifest.num_shards),
        "num_sources": (header.num_sources, len(manifest.sources)),
        "max_block_bytes": (header.max_block_bytes, manifest.max_block_bytes),
    }
    for name, (declared, actual) in derived.items():
        if declared != actual:
            raise ManifestError(f"{where}: {name}: declared {declared}, but the index objects give {actual}")
    if not (np.array_equal(header.short_ids, short) and np.array_equal(header.short_counts, counts[short])):
        raise ManifestError(f"{where}: short_blocks differ from the block sizes the index objects give")


def dataset_root(where: str) -> str:
    """The dataset's URL and a ``/``, out of a manifest's name in messages (``manifest URL/manifest``); else ""."""
    suffix = "/manifest"
    if where.startswith("manifest ") and where.endswith(suffix):
        return where[len("manifest ") : -len("manifest")]
    return ""
