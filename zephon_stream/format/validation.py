"""Consistency rules of a manifest (docs/FORMAT.md, "Validation").

Field types are checked when decoding; this module checks what the values
must agree on: sizes, block layout, totals, uniqueness and the fingerprint.
Each failure names the field and both values.
"""

from __future__ import annotations

import itertools
import operator
import re
from typing import Any, Protocol

import numpy as np

from zephon_stream.errors import ManifestError, VersionError
from zephon_stream.format.entries import ShardInfo, SourceInfo, TokenizerInfo
from zephon_stream.format.fields import HEX64, MAX_PATH_CHARS, MAX_UINT64, check_relative_path
from zephon_stream.format.fingerprint import compute_fingerprint
from zephon_stream.format.spec import (
    DTYPE_NAMES,
    FORMAT_VERSION,
    MAX_BLOCK_TOKENS,
    MAX_VOCAB_SIZE,
    MIN_BLOCK_TOKENS,
    blocks_in,
    dtype_name,
)


class ManifestFields(Protocol):
    """The fields of a manifest these rules read (``manifest.Manifest`` has them).

    The rules name the fields they check and nothing else of the
    manifest, so this module sits below ``manifest.py``, which calls it.
    """

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
    shards: tuple[ShardInfo, ...]
    sources: tuple[SourceInfo, ...]
    fingerprint: str
    rejects_path: str


def _uint(name: str, value: Any, *, minimum: int = 0, maximum: int = MAX_UINT64) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ManifestError(f"{name}: expected an integer, got {type(value).__name__}")
    if not minimum <= value <= maximum:
        raise ManifestError(f"{name}: value {value} is outside [{minimum}, {maximum}]")
    return value


def _text(name: str, value: Any, *, allow_empty: bool = False) -> str:
    if not isinstance(value, str) or (not value and not allow_empty):
        raise ManifestError(f"{name}: expected a non-empty string, got {value!r:.80}")
    return value


def _hex64(name: str, value: Any) -> str:
    if not isinstance(value, str) or not HEX64.fullmatch(value):
        raise ManifestError(f"{name}: expected 64 lowercase hex digits (sha256), got {value!r:.80}")
    return value


def _total(name: str, declared: int, actual: int, what: str) -> None:
    if declared != actual:
        raise ManifestError(f"{name}: declared {declared}, but {what} is {actual}")


def validate_tokenizer(tok: TokenizerInfo, dtype: str) -> None:
    _text("tokenizer.kind", tok.kind)
    _text("tokenizer.name", tok.name, allow_empty=True)
    _text("tokenizer.fingerprint", tok.fingerprint)
    vocab = _uint("tokenizer.vocab_size", tok.vocab_size, minimum=1, maximum=MAX_VOCAB_SIZE)
    _uint("tokenizer.eos_id", tok.eos_id, maximum=vocab - 1)
    if tok.bos_id is not None:
        _uint("tokenizer.bos_id", tok.bos_id, maximum=vocab - 1)
    expected = dtype_name(vocab)
    if dtype != expected:
        raise ManifestError(f"dtype: declared {dtype!r}, but vocab_size {vocab} requires {expected!r}")


def validate_shard(i: int, shard: ShardInfo, *, block_tokens: int, blocks_per_shard: int) -> None:
    name = f"shards[{i}]"
    check_relative_path(shard.path, field="path", where=name)
    check_relative_path(shard.index_path, field="index_path", where=name)
    name = f"shards[{i}] ({shard.path})"
    num_tokens = _uint(f"{name}.num_tokens", shard.num_tokens, minimum=1)
    num_bytes = _uint(f"{name}.num_bytes", shard.num_bytes, minimum=1)
    _hex64(f"{name}.sha256", shard.sha256)
    _hex64(f"{name}.index_sha256", shard.index_sha256)
    _uint(f"{name}.num_documents", shard.num_documents)
    offsets = shard.block_offsets
    if not isinstance(offsets, tuple):
        raise ManifestError(f"{name}.block_offsets: expected a tuple of integers, got {type(offsets).__name__}")
    expected_blocks = blocks_in(num_tokens, block_tokens)
    if len(offsets) != expected_blocks + 1:
        raise ManifestError(
            f"{name}.block_offsets: has {len(offsets)} entries, but {num_tokens} tokens in blocks of "
            f"{block_tokens} make {expected_blocks} blocks ({expected_blocks + 1} offsets)"
        )
    if expected_blocks > blocks_per_shard:
        raise ManifestError(
            f"{name}: {expected_blocks} blocks ({num_tokens} tokens), more than blocks_per_shard {blocks_per_shard}"
        )
    # Builtin passes first; the per-entry loop runs only to word an error.
    if set(map(type, offsets)) != {int} or not all(map(operator.lt, offsets, offsets[1:])):
        previous = -1
        for j, value in enumerate(offsets):
            _uint(f"{name}.block_offsets[{j}]", value)
            if value <= previous:
                raise ManifestError(
                    f"{name}.block_offsets[{j}]: {value} does not increase past block_offsets[{j - 1}] = {previous}"
                )
            previous = value
    if offsets[0] != 0:
        raise ManifestError(f"{name}.block_offsets[0]: is {offsets[0]}, expected 0")
    if offsets[-1] != num_bytes:
        raise ManifestError(f"{name}.block_offsets[-1]: is {offsets[-1]}, expected num_bytes {num_bytes}")


def validate_source(i: int, source: SourceInfo) -> None:
    name = f"sources[{i}]"
    _text(f"{name}.path", source.path)
    records = _uint(f"{name}.num_records", source.num_records)
    docs = _uint(f"{name}.num_documents", source.num_documents)
    rejected = _uint(f"{name}.num_rejected", source.num_rejected)
    if records != docs + rejected:
        raise ManifestError(
            f"{name} ({source.path}): num_records {records} != num_documents {docs} + num_rejected {rejected}"
        )


# The paths check_relative_path accepts, as one pattern (for the bulk check).
_CLEAN_PATH = re.compile(r"(?:(?!\.\.?(?:/|\Z))[^/:\\\x00-\x1f\x7f]+)(?:/(?!\.\.?(?:/|\Z))[^/:\\\x00-\x1f\x7f]+)*")


def _all_uints(values: list[Any], *, minimum: int = 0) -> bool:
    return not values or (set(map(type, values)) == {int} and min(values) >= minimum and max(values) <= MAX_UINT64)


def _all_clean_paths(paths: list[Any]) -> bool:
    return not paths or (
        set(map(type, paths)) == {str}
        and max(map(len, paths)) <= MAX_PATH_CHARS
        and all(map(_CLEAN_PATH.fullmatch, paths))
    )


def _all_hex64(values: list[Any]) -> bool:
    return not values or (set(map(type, values)) == {str} and all(map(HEX64.fullmatch, values)))


def _shards_pass(m: ManifestFields) -> bool:
    """Whether every shard passes :func:`validate_shard` and the path uniqueness rule, checked in bulk.

    A manifest of a million blocks has tens of thousands of shards; this
    checks them column by column in C loops, and the per-shard checks run only
    when it fails, to word the error.
    """
    shards = m.shards
    if not shards:
        return True
    paths, index_paths = [s.path for s in shards], [s.index_path for s in shards]
    tokens, nbytes = [s.num_tokens for s in shards], [s.num_bytes for s in shards]
    offsets = [s.block_offsets for s in shards]
    if not (
        _all_clean_paths(paths)
        and _all_clean_paths(index_paths)
        and len({*paths, *index_paths, m.rejects_path}) == 2 * len(shards) + 1
        and _all_uints(tokens, minimum=1)
        and _all_uints(nbytes, minimum=1)
        and _all_uints([s.num_documents for s in shards])
        and _all_hex64([s.sha256 for s in shards])
        and _all_hex64([s.index_sha256 for s in shards])
        and set(map(type, offsets)) == {tuple}
    ):
        return False
    counts = np.fromiter(map(len, offsets), dtype=np.int64, count=len(offsets))
    try:
        expected = np.array([blocks_in(t, m.block_tokens) for t in tokens], dtype=np.int64)
    except OverflowError:
        return False
    if not (np.array_equal(counts, expected + 1) and int(expected.max()) <= m.blocks_per_shard):
        return False
    if set(map(type, itertools.chain.from_iterable(offsets))) != {int}:
        return False
    try:
        flat = np.fromiter(itertools.chain.from_iterable(offsets), dtype=np.int64, count=int(counts.sum()))
        sizes = np.array(nbytes, dtype=np.int64)
    except OverflowError:
        return False
    ends = np.cumsum(counts)
    starts = ends - counts
    increasing = np.diff(flat) > 0
    increasing[ends[:-1] - 1] = True  # One shard's last offset and the next one's first
    return bool(increasing.all() and (flat[starts] == 0).all() and (flat[ends - 1] == sizes).all())


def _sources_pass(m: ManifestFields) -> bool:
    """Whether every source passes :func:`validate_source`, checked in bulk (see :func:`_shards_pass`)."""
    sources = m.sources
    paths = [s.path for s in sources]
    records, docs, rejected = (
        [getattr(s, f) for s in sources] for f in ("num_records", "num_documents", "num_rejected")
    )
    return (
        (not paths or (set(map(type, paths)) == {str} and all(paths)))
        and _all_uints(records)
        and _all_uints(docs)
        and _all_uints(rejected)
        and list(map(operator.add, docs, rejected)) == records
    )


def validate_manifest(m: ManifestFields) -> None:
    """Raise ManifestError (or a subclass) unless ``m`` is internally consistent."""
    version = m.version
    if len(version) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in version):
        raise ManifestError(f"version: expected (major, minor) integers, got {version!r:.80}")
    if version[0] != FORMAT_VERSION[0]:
        raise VersionError(f"version: major {version[0]} is not the supported major {FORMAT_VERSION[0]}")
    if m.dtype not in DTYPE_NAMES:
        raise ManifestError(f"dtype: {m.dtype!r:.80} is not one of {DTYPE_NAMES}")
    validate_tokenizer(m.tokenizer, m.dtype)
    block_tokens = _uint("block_tokens", m.block_tokens, minimum=MIN_BLOCK_TOKENS, maximum=MAX_BLOCK_TOKENS)
    blocks_per_shard = _uint("blocks_per_shard", m.blocks_per_shard, minimum=1, maximum=2**32)
    for name in ("num_tokens", "num_blocks", "num_documents", "num_rejected", "compressed_bytes"):
        _uint(name, getattr(m, name))
    check_relative_path(m.rejects_path, field="rejects_path", where="manifest")
    _hex64("fingerprint", m.fingerprint)

    if not _shards_pass(m):
        seen: dict[str, str] = {}
        for i, shard in enumerate(m.shards):
            validate_shard(i, shard, block_tokens=block_tokens, blocks_per_shard=blocks_per_shard)
            for field, path in (("path", shard.path), ("index_path", shard.index_path)):
                if path in seen or path == m.rejects_path:
                    raise ManifestError(
                        f"shards[{i}].{field}: path {path!r} is also used by {seen.get(path, 'rejects_path')}"
                    )
                seen[path] = f"shards[{i}].{field}"
    tokens = sum(s.num_tokens for s in m.shards)
    blocks = sum(len(s.block_offsets) for s in m.shards) - len(m.shards)
    documents = sum(s.num_documents for s in m.shards)
    compressed = sum(s.num_bytes for s in m.shards)
    _total("num_tokens", m.num_tokens, tokens, "the sum over shards")
    _total("num_blocks", m.num_blocks, blocks, "the sum over shards")
    _total("num_documents", m.num_documents, documents, "the sum over shards")
    _total("compressed_bytes", m.compressed_bytes, compressed, "the sum of shard num_bytes")

    if not _sources_pass(m):
        for i, source in enumerate(m.sources):
            validate_source(i, source)
    source_docs = sum(s.num_documents for s in m.sources)
    rejected = sum(s.num_rejected for s in m.sources)
    _total("num_documents", m.num_documents, source_docs, "the sum over sources")
    _total("num_rejected", m.num_rejected, rejected, "the sum over sources")

    expected = compute_fingerprint(
        dtype=m.dtype,
        tokenizer_fingerprint=m.tokenizer.fingerprint,
        block_tokens=block_tokens,
        shards=[(s.num_tokens, s.sha256) for s in m.shards],
        format_major=version[0],
    )
    if m.fingerprint != expected:
        raise ManifestError(f"fingerprint: declared {m.fingerprint}, but the content gives {expected}")
