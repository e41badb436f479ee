"""The entries of a manifest: its tokenizer, each shard and each source.

Plain frozen records with their msgpack maps (``to_obj`` / ``from_obj``,
field types checked on decoding); ``validation.py`` checks what their values
must agree on and ``manifest.py`` holds the dataset-wide record.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from zephon_stream.format.fields import FieldReader
from zephon_stream.format.spec import MAX_VOCAB_SIZE


@dataclass(frozen=True, kw_only=True)
class TokenizerInfo:
    """Identity of the tokenizer that produced the tokens."""

    kind: str
    name: str
    vocab_size: int
    eos_id: int
    bos_id: int | None
    fingerprint: str

    def to_obj(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "vocab_size": self.vocab_size,
            "eos_id": self.eos_id,
            "bos_id": self.bos_id,
            "fingerprint": self.fingerprint,
        }

    @classmethod
    def from_obj(cls, obj: Any, *, where: str) -> TokenizerInfo:
        fields = FieldReader(obj, where=f"{where}: tokenizer")
        return cls(
            kind=fields.string("kind"),
            name=fields.string("name", allow_empty=True),
            vocab_size=fields.uint("vocab_size", minimum=1, maximum=MAX_VOCAB_SIZE),
            eos_id=fields.uint("eos_id", maximum=MAX_VOCAB_SIZE - 1),
            bos_id=fields.optional_uint("bos_id", maximum=MAX_VOCAB_SIZE - 1),
            fingerprint=fields.string("fingerprint"),
        )


@dataclass(frozen=True, kw_only=True)
class ShardInfo:
    """One shard object and its document-index sidecar."""

    path: str
    num_tokens: int
    num_bytes: int
    sha256: str
    block_offsets: tuple[int, ...]
    index_path: str
    index_sha256: str
    num_documents: int

    @property
    def num_blocks(self) -> int:
        """Blocks in this shard."""
        return len(self.block_offsets) - 1

    def to_obj(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "num_tokens": self.num_tokens,
            "num_bytes": self.num_bytes,
            "sha256": self.sha256,
            "block_offsets": list(self.block_offsets),
            "index_path": self.index_path,
            "index_sha256": self.index_sha256,
            "num_documents": self.num_documents,
        }

    @classmethod
    def from_obj(cls, obj: Any, *, where: str) -> ShardInfo:
        fields = FieldReader(obj, where=where)
        offsets = fields.array("block_offsets")
        return cls(
            path=fields.get("path"),
            num_tokens=fields.uint("num_tokens", minimum=1),
            num_bytes=fields.uint("num_bytes", minimum=1),
            sha256=fields.hex_digest("sha256"),
            block_offsets=tuple(offsets),
            index_path=fields.get("index_path"),
            index_sha256=fields.hex_digest("index_sha256"),
            num_documents=fields.uint("num_documents"),
        )


@dataclass(frozen=True, kw_only=True)
class SourceInfo:
    """One input source and how its records were accounted for."""

    path: str
    num_records: int
    num_documents: int
    num_rejected: int

    def to_obj(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "num_records": self.num_records,
            "num_documents": self.num_documents,
            "num_rejected": self.num_rejected,
        }

    @classmethod
    def from_obj(cls, obj: Any, *, where: str) -> SourceInfo:
        fields = FieldReader(obj, where=where)
        return cls(
            path=fields.string("path"),
            num_records=fields.uint("num_records"),
            num_documents=fields.uint("num_documents"),
            num_rejected=fields.uint("num_rejected"),
        )


_SHARD_KEYS = frozenset(
    ("path", "num_tokens", "num_bytes", "sha256", "block_offsets", "index_path", "index_sha256", "num_documents")
)
_SOURCE_KEYS = frozenset(("path", "num_records", "num_documents", "num_rejected"))


def entries_unchecked(shards: list[Any], sources: list[Any]) -> tuple[list[ShardInfo], list[SourceInfo]] | None:
    """Shard and source entries built without per-field checks, when every map has exactly the
    expected keys (and block offsets are arrays); None otherwise. Their values are for validation to check."""
    if not all(type(s) is dict and s.keys() == _SHARD_KEYS and type(s["block_offsets"]) is list for s in shards):
        return None
    if not all(type(s) is dict and s.keys() == _SOURCE_KEYS for s in sources):
        return None
    # New maps, not the decoded ones: a refused manifest is decoded again from those.
    shard_infos = [_unchecked(ShardInfo, {**s, "block_offsets": tuple(s["block_offsets"])}) for s in shards]
    return shard_infos, [_unchecked(SourceInfo, dict(s)) for s in sources]


def _unchecked(cls: type[Any], fields: dict[str, Any]) -> Any:
    # A frozen dataclass's __init__ sets each field through
    # object.__setattr__; taking the decoded map as the instance's __dict__
    # builds the same object several times faster (a map per shard and source).
    obj = object.__new__(cls)
    object.__setattr__(obj, "__dict__", fields)
    return obj


def max_frame_bytes(shards: Sequence[ShardInfo]) -> int:
    """The largest block frame over every shard at once (tens of thousands at scale), in bytes; 0 for none."""
    offsets = [s.block_offsets for s in shards]
    counts = np.fromiter(map(len, offsets), dtype=np.int64, count=len(offsets))
    flat = np.fromiter(itertools.chain.from_iterable(offsets), dtype=np.int64, count=int(counts.sum()))
    sizes = np.diff(flat)
    sizes[np.cumsum(counts)[:-1] - 1] = 0  # From one shard's end to the next one's start
    return int(sizes.max()) if sizes.size else 0
