"""Document-index sidecar codec and document lookup across shards.

Each shard ``shards/NNNNNNNN.zst`` has a sidecar ``shards/NNNNNNNN.idx``
listing the documents that START in that shard: their shard-local token
offset and where they came from (source, record number). A document may run
on into later shards; the tokens at the head of a shard before its first
start belong to the last document started in an earlier shard.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import msgpack
import numpy as np

from zephon_stream.errors import FormatError
from zephon_stream.format.fields import FieldReader, unpack_map
from zephon_stream.format.spec import DOCINDEX_VERSION

_STARTS = np.dtype("<u8")
_SOURCE = np.dtype("<u4")
_RECORD = np.dtype("<u8")


@dataclass(frozen=True, eq=False, kw_only=True)
class DocIndex:
    """Documents starting in one shard (arrays are read-only, one entry per document)."""

    doc_starts: np.ndarray  # <u8, shard-local token offsets, strictly increasing
    doc_source: np.ndarray  # <u4, indexes into ``sources``
    doc_record: np.ndarray  # <u8, record number within that source
    sources: tuple[str, ...]
    version: tuple[int, int] = DOCINDEX_VERSION

    @property
    def num_documents(self) -> int:
        """Documents starting in this shard."""
        return len(self.doc_starts)

    @classmethod
    def build(
        cls,
        *,
        doc_starts: Sequence[int] | np.ndarray,
        doc_source: Sequence[int] | np.ndarray,
        doc_record: Sequence[int] | np.ndarray,
        sources: Sequence[str],
    ) -> DocIndex:
        """Build and validate an index from plain sequences of non-negative integers."""
        arrays = {}
        for key, values, dtype in (
            ("doc_starts", doc_starts, _STARTS),
            ("doc_source", doc_source, _SOURCE),
            ("doc_record", doc_record, _RECORD),
        ):
            given = np.asarray(values)
            if given.size and (
                given.dtype.kind not in "iu" or int(given.min()) < 0 or int(given.max()) > np.iinfo(dtype).max
            ):
                raise FormatError(f"document index: {key} must hold integers in [0, {np.iinfo(dtype).max}]")
            arrays[key] = given.astype(dtype)
        index = cls(**arrays, sources=tuple(sources))
        index.validate(where="document index")
        return index

    def to_bytes(self) -> bytes:
        """Canonical msgpack bytes of the sidecar."""
        self.validate(where="document index")
        return msgpack.packb(
            {
                "version": list(self.version),
                "num_documents": self.num_documents,
                "doc_starts": np.ascontiguousarray(self.doc_starts, dtype=_STARTS).tobytes(),
                "doc_source": np.ascontiguousarray(self.doc_source, dtype=_SOURCE).tobytes(),
                "doc_record": np.ascontiguousarray(self.doc_record, dtype=_RECORD).tobytes(),
                "sources": list(self.sources),
            },
            use_bin_type=True,
        )

    @classmethod
    def from_bytes(cls, data: bytes, *, where: str, shard_num_tokens: int | None = None) -> DocIndex:
        """Decode and validate sidecar bytes.

        Args:
            data: the sidecar object.
            where: names the object in errors.
            shard_num_tokens: when given, every start must be below it.

        Raises:
            FormatError: malformed or inconsistent sidecar, or an unknown
                major version.
        """
        fields = FieldReader(unpack_map(data, where=where, error=FormatError), where=where, error=FormatError)
        major, minor = fields.version("version")
        if major != DOCINDEX_VERSION[0]:
            raise FormatError(
                f"{where}: document index version {major}.{minor} has unknown major version {major} "
                f"(this reader supports {DOCINDEX_VERSION[0]}.x)"
            )
        num_documents = fields.uint("num_documents")
        arrays = {}
        for key, dtype in (("doc_starts", _STARTS), ("doc_source", _SOURCE), ("doc_record", _RECORD)):
            raw = fields.binary(key)
            if len(raw) != num_documents * dtype.itemsize:
                raise fields.fail(
                    key,
                    f"{len(raw)} bytes, expected {num_documents * dtype.itemsize} ({num_documents} x {dtype.itemsize})",
                )
            arrays[key] = np.frombuffer(raw, dtype=dtype)
        sources = fields.array("sources")
        for i, path in enumerate(sources):
            if not isinstance(path, str) or not path:
                raise fields.fail("sources", f"entry {i} is {path!r:.80}, expected a non-empty string")
        index = cls(**arrays, sources=tuple(sources), version=(major, minor))
        index.validate(where=where, shard_num_tokens=shard_num_tokens)
        return index

    def validate(self, *, where: str, shard_num_tokens: int | None = None) -> None:
        """Raise FormatError unless the arrays agree in length and range."""
        n = len(self.doc_starts)
        if len(self.doc_source) != n or len(self.doc_record) != n:
            raise FormatError(
                f"{where}: array lengths differ (doc_starts {n}, doc_source {len(self.doc_source)}, "
                f"doc_record {len(self.doc_record)})"
            )
        if n == 0:
            return
        starts = self.doc_starts
        if n > 1:
            bad = np.flatnonzero(starts[1:] <= starts[:-1])
            if len(bad):
                j = int(bad[0]) + 1
                raise FormatError(
                    f"{where}: doc_starts[{j}] = {int(starts[j])} does not increase past "
                    f"doc_starts[{j - 1}] = {int(starts[j - 1])}"
                )
        if shard_num_tokens is not None and int(starts[-1]) >= shard_num_tokens:
            raise FormatError(
                f"{where}: doc_starts[{n - 1}] = {int(starts[-1])} is past the shard's {shard_num_tokens} tokens"
            )
        worst = int(self.doc_source.max())
        if worst >= len(self.sources):
            j = int(np.argmax(self.doc_source))
            raise FormatError(f"{where}: doc_source[{j}] = {worst} is outside the {len(self.sources)} sources")


@dataclass(frozen=True)
class DocumentSpan:
    """One document located in the dataset's global token stream."""

    source: str
    record: int
    token_start: int  # global offset of its first token
    token_end: int  # global offset one past its EOS
    shard_index: int  # shard it starts in
    shard_offset: int  # offset of its first token in that shard


class DocumentLocator:
    """Finds the documents covering token ranges, across shard boundaries.

    Args:
        shard_num_tokens: tokens in each shard, in manifest order.
        load_index: returns the decoded sidecar of a shard index; results are
            cached here, so it is called at most once per shard.
    """

    def __init__(self, shard_num_tokens: Sequence[int], load_index: Callable[[int], DocIndex]) -> None:
        counts = np.asarray(list(shard_num_tokens), dtype=np.int64)
        self._offsets = np.concatenate([np.zeros(1, np.int64), np.cumsum(counts)])
        self._load_index = load_index
        self._cache: dict[int, DocIndex] = {}

    @property
    def num_tokens(self) -> int:
        return int(self._offsets[-1])

    def index(self, shard: int) -> DocIndex:
        """The (cached) sidecar of one shard."""
        cached = self._cache.get(shard)
        if cached is None:
            cached = self._cache[shard] = self._load_index(shard)
        return cached

    def _span(self, shard: int, i: int, end: int) -> DocumentSpan:
        index = self.index(shard)
        local = int(index.doc_starts[i])
        return DocumentSpan(
            source=index.sources[int(index.doc_source[i])],
            record=int(index.doc_record[i]),
            token_start=int(self._offsets[shard]) + local,
            token_end=end,
            shard_index=shard,
            shard_offset=local,
        )

    def _next_start(self, shard: int, i: int) -> tuple[int, int] | None:
        """The (shard, i) of the first document start after document i of shard."""
        i += 1
        while shard < len(self._offsets) - 1:
            if i < self.index(shard).num_documents:
                return shard, i
            shard, i = shard + 1, 0
        return None

    def _global_start(self, at: tuple[int, int] | None) -> int:
        if at is None:
            return self.num_tokens
        return int(self._offsets[at[0]]) + int(self.index(at[0]).doc_starts[at[1]])

    def documents(self, token_start: int, token_end: int) -> list[DocumentSpan]:
        """Documents overlapping global tokens ``[token_start, token_end)``, in order.

        Raises:
            IndexError: the range is empty or outside the dataset.
            FormatError: no document starts at or before ``token_start``.
        """
        if not 0 <= token_start < token_end <= self.num_tokens:
            raise IndexError(f"token range [{token_start}, {token_end}) is outside [0, {self.num_tokens}) or empty")
        shard = int(np.searchsorted(self._offsets, token_start, side="right")) - 1
        local = token_start - int(self._offsets[shard])
        i = int(np.searchsorted(self.index(shard).doc_starts, local, side="right")) - 1
        # A document that began in an earlier shard owns this shard's head.
        while i < 0:
            shard -= 1
            if shard < 0:
                raise FormatError(
                    f"document index: no document starts at or before global token {token_start} "
                    "(the first shard's index must start a document at offset 0)"
                )
            i = self.index(shard).num_documents - 1
        spans = []
        at: tuple[int, int] | None = (shard, i)
        while at is not None and self._global_start(at) < token_end:
            following = self._next_start(*at)
            spans.append(self._span(at[0], at[1], self._global_start(following)))
            at = following
        return spans

    def documents_in_shard(self, shard: int, start: int, end: int) -> list[DocumentSpan]:
        """Documents overlapping shard-local tokens ``[start, end)`` of one shard."""
        size = int(self._offsets[shard + 1] - self._offsets[shard])
        if not 0 <= start < end <= size:
            raise IndexError(f"shard {shard}: token range [{start}, {end}) is outside [0, {size}) or empty")
        base = int(self._offsets[shard])
        return self.documents(base + start, base + end)
