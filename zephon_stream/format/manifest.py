"""The dataset manifest: msgpack codec, validation and block arithmetic.

Its entries (``TokenizerInfo``, ``ShardInfo``, ``SourceInfo``) live in
``entries.py``, re-exported here where the format's users import them from;
its consistency rules live in ``validation.py``, which ``validate()`` calls;
its block arithmetic (block ids to shards, byte ranges and token offsets) in
``block_arithmetic.py``, a base of ``Manifest``.

The manifest is written last; its presence commits the dataset. Every field
is checked on load, with both values named on a mismatch (docs/FORMAT.md,
"Validation").
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import msgpack
import numpy as np

from zephon_stream.errors import ManifestError, ObjectMissingError, VersionError
from zephon_stream.format.block_arithmetic import BlockArithmetic
from zephon_stream.format.committed import no_dataset_error
from zephon_stream.format.entries import ShardInfo, SourceInfo, TokenizerInfo, entries_unchecked, max_frame_bytes
from zephon_stream.format.fields import FieldReader, check_relative_path, unpack_map
from zephon_stream.format.fingerprint import FINGERPRINT_HEADER, compute_fingerprint  # noqa: F401 (re-exported)
from zephon_stream.format.header import (
    check_header_against,
    dataset_root,
    decode_header,
    encode_objects,
    full_entries,
    is_indexed,
)
from zephon_stream.format.spec import (
    FORMAT_NAME,
    FORMAT_VERSION,
    INDEXED_VERSION,
    MANIFEST_NAME,
    REJECTS_NAME,
    dtype_name,
    np_dtype,
)
from zephon_stream.format.validation import validate_manifest

__all__ = ["FINGERPRINT_HEADER", "Manifest", "ShardInfo", "SourceInfo", "TokenizerInfo", "compute_fingerprint"]


@dataclass(frozen=True, kw_only=True)
class Manifest(BlockArithmetic):
    """A committed dataset: its token layout, shards, sources and fingerprint.

    Build one with :meth:`create` (totals and fingerprint computed) or decode
    one with :meth:`from_bytes` / :meth:`load`. Construction validates.
    """

    dtype: str
    tokenizer: TokenizerInfo
    block_tokens: int
    blocks_per_shard: int
    num_tokens: int
    num_blocks: int
    num_documents: int
    num_rejected: int
    compressed_bytes: int
    shards: tuple[ShardInfo, ...]
    sources: tuple[SourceInfo, ...]
    fingerprint: str
    rejects_path: str = REJECTS_NAME
    version: tuple[int, int] = FORMAT_VERSION

    def __post_init__(self) -> None:
        object.__setattr__(self, "shards", tuple(self.shards))
        object.__setattr__(self, "sources", tuple(self.sources))
        object.__setattr__(self, "version", tuple(self.version))
        self.validate()

    @classmethod
    def create(
        cls,
        *,
        tokenizer: TokenizerInfo,
        block_tokens: int,
        blocks_per_shard: int,
        shards: Iterable[ShardInfo],
        sources: Iterable[SourceInfo],
        rejects_path: str = REJECTS_NAME,
        version: tuple[int, int] = FORMAT_VERSION,
    ) -> Manifest:
        """Build a manifest, deriving dtype, totals and fingerprint (``version``: the layout it is written in)."""
        shards = tuple(shards)
        sources = tuple(sources)
        try:
            dtype = dtype_name(tokenizer.vocab_size)
        except (TypeError, ValueError):
            dtype = "uint32"  # Validation then names the bad vocab_size.
        return cls(
            dtype=dtype,
            tokenizer=tokenizer,
            block_tokens=block_tokens,
            blocks_per_shard=blocks_per_shard,
            num_tokens=sum(s.num_tokens for s in shards),
            num_blocks=sum(s.num_blocks for s in shards),
            num_documents=sum(s.num_documents for s in shards),
            num_rejected=sum(s.num_rejected for s in sources),
            compressed_bytes=sum(s.num_bytes for s in shards),
            shards=shards,
            sources=sources,
            fingerprint=compute_fingerprint(
                dtype=dtype,
                tokenizer_fingerprint=tokenizer.fingerprint,
                block_tokens=block_tokens,
                shards=[(s.num_tokens, s.sha256) for s in shards],
            ),
            rejects_path=rejects_path,
            version=version,
        )

    # -- codec -------------------------------------------------------------

    def to_obj(self) -> dict[str, Any]:
        """The manifest in the layout of format 1.0 (every entry inline), keys in canonical order."""
        return {
            "format": FORMAT_NAME,
            "version": list(self.version),
            "dtype": self.dtype,
            "tokenizer": self.tokenizer.to_obj(),
            "block_tokens": self.block_tokens,
            "blocks_per_shard": self.blocks_per_shard,
            "num_tokens": self.num_tokens,
            "num_blocks": self.num_blocks,
            "num_documents": self.num_documents,
            "num_rejected": self.num_rejected,
            "compressed_bytes": self.compressed_bytes,
            "shards": [s.to_obj() for s in self.shards],
            "sources": [s.to_obj() for s in self.sources],
            "rejects_path": self.rejects_path,
            "fingerprint": self.fingerprint,
        }

    def to_bytes(self) -> bytes:
        """The ``manifest`` object's canonical bytes: the same manifest always gives the same bytes.

        From format 1.1 on, these name index objects (see :meth:`objects`),
        which must be written before them.
        """
        return self.objects()[MANIFEST_NAME]

    def objects(self) -> dict[str, bytes]:
        """Every object the manifest commits, by path, in write order: ``manifest`` last."""
        return dict(self._objects)

    @cached_property
    def _objects(self) -> dict[str, bytes]:
        if self.version < INDEXED_VERSION:
            return {MANIFEST_NAME: msgpack.packb(self.to_obj(), use_bin_type=True)}
        return encode_objects(self)

    def write(self, store: Any) -> None:
        """Write the manifest's objects to ``store``, each atomically, the ``manifest`` itself last (the commit)."""
        for path, data in self.objects().items():
            store.write_atomic(path, data)

    @classmethod
    def from_bytes(
        cls, data: bytes, *, where: str = MANIFEST_NAME, read: Callable[[str], bytes] | None = None
    ) -> Manifest:
        """Decode and validate manifest bytes.

        A 1.1 manifest names index objects: ``read(path)`` fetches one whole
        (``Manifest.read`` passes the store's), checked against its digests.

        Raises:
            VersionError: unknown major version.
            PathEscapeError: an object path outside the dataset root.
            ManifestError: anything else malformed or inconsistent.
        """
        # Decoding makes a few objects per shard and source; with the
        # collector on, its passes over the growing heap cost more than the
        # decoding itself (about half the time for 16 Ki shards). Nothing
        # built here forms a cycle.
        collecting = gc.isenabled()
        gc.disable()
        try:
            return cls._from_bytes(data, where=where, read=read)
        finally:
            if collecting:
                gc.enable()

    @classmethod
    def _from_bytes(cls, data: bytes, *, where: str, read: Callable[[str], bytes] | None) -> Manifest:
        fields = FieldReader(unpack_map(data, where=where), where=where)
        name = fields.get("format")
        if name != FORMAT_NAME:
            raise ManifestError(f"{where}: field 'format' is {name!r:.80}, expected {FORMAT_NAME!r}")
        major, minor = fields.version("version")
        if major != FORMAT_VERSION[0]:
            raise VersionError(
                f"{where}: format version {major}.{minor} has unknown major version {major} "
                f"(this reader supports {FORMAT_VERSION[0]}.x, up to {FORMAT_VERSION[0]}.{FORMAT_VERSION[1]})"
            )
        if is_indexed(fields.obj, (major, minor)):
            return cls._from_header(fields, major=major, minor=minor, where=where, read=read)
        shards = fields.array("shards")
        sources = fields.array("sources")

        def build(shard_infos: Iterable[ShardInfo], source_infos: Iterable[SourceInfo]) -> Manifest:
            return cls(
                version=(major, minor),
                dtype=fields.string("dtype"),
                tokenizer=TokenizerInfo.from_obj(fields.get("tokenizer"), where=where),
                block_tokens=fields.uint("block_tokens"),
                blocks_per_shard=fields.uint("blocks_per_shard"),
                num_tokens=fields.uint("num_tokens"),
                num_blocks=fields.uint("num_blocks"),
                num_documents=fields.uint("num_documents"),
                num_rejected=fields.uint("num_rejected"),
                compressed_bytes=fields.uint("compressed_bytes"),
                shards=shard_infos,
                sources=source_infos,
                rejects_path=check_relative_path(fields.get("rejects_path"), field="rejects_path", where=where),
                fingerprint=fields.hex_digest("fingerprint"),
            )

        entries = entries_unchecked(shards, sources)
        if entries is not None:
            # Entries of the expected shape skip the field-by-field reads
            # (tens of thousands of shards and sources at scale): validation
            # checks every value in bulk. Anything it refuses is decoded again
            # below, field by field, so the error reads as it always has.
            try:
                return build(*entries)
            except ManifestError:
                pass
        try:
            return build(
                [ShardInfo.from_obj(s, where=f"{where}: shards[{i}]") for i, s in enumerate(shards)],
                [SourceInfo.from_obj(s, where=f"{where}: sources[{i}]") for i, s in enumerate(sources)],
            )
        except ManifestError as exc:
            # Construction-time checks do not know where the bytes came from.
            if str(exc).startswith(where):
                raise
            raise type(exc)(f"{where}: {exc}") from None

    @classmethod
    def _from_header(
        cls, fields: FieldReader, *, major: int, minor: int, where: str, read: Callable[[str], bytes] | None
    ) -> Manifest:
        header = decode_header(fields, major=major, minor=minor, where=where)
        if read is None:
            raise ManifestError(
                f"{where}: format {major}.{minor} names index objects; read it with Manifest.read(store)"
            )
        shards, sources = full_entries(header, read, root=dataset_root(where))
        try:
            manifest = cls(
                version=(major, minor),
                dtype=header.dtype,
                tokenizer=header.tokenizer,
                block_tokens=header.block_tokens,
                blocks_per_shard=header.blocks_per_shard,
                num_tokens=header.num_tokens,
                num_blocks=header.num_blocks,
                num_documents=header.num_documents,
                num_rejected=header.num_rejected,
                compressed_bytes=header.compressed_bytes,
                shards=shards,
                sources=sources,
                rejects_path=header.rejects_path,
                fingerprint=header.fingerprint,
            )
        except ManifestError as exc:
            raise type(exc)(f"{where}: {exc}") from None
        check_header_against(header, manifest, where=where)
        return manifest

    @cached_property
    def max_block_bytes(self) -> int:
        """The largest compressed block (zstd frame) of the dataset, in bytes."""
        return max_frame_bytes(self.shards)

    @classmethod
    def read(cls, store: Any) -> Manifest:
        """Read and validate the manifest of the dataset in ``store``.

        Raises:
            ObjectMissingError: the store holds no committed dataset.
        """
        where = f"{store.url.rstrip('/')}/{MANIFEST_NAME}"
        try:
            data = store.read(MANIFEST_NAME)
        except ObjectMissingError:
            raise no_dataset_error(store) from None
        return cls.from_bytes(data, where=f"manifest {where}", read=store.read)

    @classmethod
    def load(cls, url: str, storage_options: dict[str, Any] | None = None) -> Manifest:
        """Load the manifest of the dataset at ``url`` (local folder or ``s3://``)."""
        from zephon_stream.storage import open_store

        return cls.read(open_store(url, storage_options))

    # -- validation --------------------------------------------------------

    def validate(self) -> None:
        """Check every field and every derived total; raise ManifestError if any is off."""
        validate_manifest(self)

    # -- shape ------------------------------------------------------------

    @property
    def num_shards(self) -> int:
        """Number of shards."""
        return len(self.shards)

    @property
    def np_dtype(self) -> np.dtype:
        """The little-endian numpy dtype of the tokens."""
        return np_dtype(self.dtype)

    def summary(self) -> dict[str, Any]:
        """Headline figures as plain JSON-ready values (what ``inspect --json`` prints)."""
        raw_bytes = self.num_tokens * self.np_dtype.itemsize
        return {
            "format": FORMAT_NAME,
            "version": f"{self.version[0]}.{self.version[1]}",
            "num_shards": self.num_shards,
            "num_blocks": self.num_blocks,
            "num_tokens": self.num_tokens,
            "num_documents": self.num_documents,
            "num_rejected": self.num_rejected,
            "num_sources": len(self.sources),
            "compressed_bytes": self.compressed_bytes,
            "raw_bytes": raw_bytes,
            "compression_ratio": raw_bytes / self.compressed_bytes if self.compressed_bytes else None,
            "bytes_per_token": self.compressed_bytes / self.num_tokens if self.num_tokens else None,
            "dtype": self.dtype,
            "block_tokens": self.block_tokens,
            "blocks_per_shard": self.blocks_per_shard,
            "fingerprint": self.fingerprint,
            "tokenizer": self.tokenizer.to_obj(),
        }
