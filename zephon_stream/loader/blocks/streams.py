"""Streams: what the user names (a URL and a weight) and what the loader reads.

A ``Stream`` is a dataset URL with a mixture weight; ``as_streams`` reads the
other forms a user writes one in (``STREAM_FORMS``). A ``StreamSource`` is the
open dataset behind it: its store (one per loader, closed with it), metadata
(``metadata.py``), token dtype, EOS id and block byte ranges.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import math
import numbers
import os
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from zephon_stream.errors import ConfigError, ObjectMissingError
from zephon_stream.format.committed import no_dataset_error
from zephon_stream.format.spec import MANIFEST_NAME
from zephon_stream.loader.blocks.fetcher import BlockJob
from zephon_stream.loader.blocks.metadata import StreamMetadata
from zephon_stream.plan import StreamShape
from zephon_stream.plan.packing import packed_tokens
from zephon_stream.storage import open_store


@dataclasses.dataclass(frozen=True, slots=True)
class Stream:
    """One dataset of a mixture.

    Attributes:
        url: the dataset root (local folder, ``file://`` or ``s3://`` prefix).
        weight: its share of every global batch, relative to the other
            streams' weights.
    """

    url: str
    weight: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.url, str) or not self.url:
            raise ConfigError(f"Stream url must be a non-empty string (got {self.url!r})")
        if not _is_number(self.weight) or not (math.isfinite(self.weight) and self.weight > 0):
            raise ConfigError(f"Stream {self.url}: weight must be a finite number > 0 (got {self.weight!r})")


# What one stream may be given as (STREAM_FORMS); a list of them is a mixture.
StreamLike = str | os.PathLike | Stream | Mapping[str, Any] | tuple

STREAM_FORMS = (
    "a dataset URL or path ('./out/ds', 's3://bucket/ds'), one with its weight after the last ':' "
    "('./out/ds:2'), a Stream, a dict of a Stream's fields ({'url': './out/ds', 'weight': 2}), "
    "a (url, weight) pair, or a list of these"
)


def parse_stream_spec(spec: str) -> tuple[str, float]:
    """Split a ``"url"`` or ``"url:weight"`` stream entry.

    The text after the last ``:`` is a weight when it parses as a number (and
    must then be positive and finite); otherwise the whole entry is the URL,
    so ``s3://b/ds``, ``/data/ds`` and ``/data/run:v2`` need no weight. A
    dataset whose own path ends in ``:`` and a number is named by
    ``Stream(url)`` or a path object, which are never split.

    Returns:
        ``(url, weight)``; the weight defaults to 1.

    Raises:
        ConfigError: an empty URL, or a weight that is zero, negative or not finite.
    """
    text = spec.strip()
    url, sep, suffix = text.rpartition(":")
    weight = _float(suffix) if sep and not suffix.startswith("/") else None
    if weight is None:
        url, weight = text, 1.0
    elif not math.isfinite(weight) or weight <= 0:
        raise ConfigError(f"stream entry {spec!r}: weight must be a positive number (got {suffix!r})")
    if not url:
        raise ConfigError(f"stream entry {spec!r}: empty dataset URL")
    return url, weight


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _is_pair(value: Any) -> bool:
    return (
        isinstance(value, (tuple, list))
        and len(value) == 2
        and isinstance(value[0], (str, os.PathLike))
        and _is_number(value[1])
    )


def as_streams(streams: StreamLike | Sequence[StreamLike]) -> list[Stream]:
    """The Streams a user names: one stream or a list of them, each in any of ``STREAM_FORMS``.

    Raises:
        TypeError: something that is none of ``STREAM_FORMS`` (never read as a path).
        ConfigError: no stream, a dict with other keys than a Stream's fields,
            an empty URL or a weight that is not a finite number > 0.
    """
    if isinstance(streams, (str, os.PathLike, Stream, Mapping)) or _is_pair(streams):
        streams = [streams]
    elif not isinstance(streams, (list, tuple)):
        raise TypeError(f"streams: a {type(streams).__name__} is no stream; give {STREAM_FORMS}")
    out = [_as_stream(index, entry) for index, entry in enumerate(streams)]
    if not out:
        raise ConfigError("StreamingLoader needs at least one stream")
    return out


def _as_stream(index: int, entry: Any) -> Stream:
    if isinstance(entry, Stream):
        return entry
    if isinstance(entry, str):
        return Stream(*parse_stream_spec(entry))
    if isinstance(entry, os.PathLike):
        return Stream(os.fspath(entry))
    if isinstance(entry, Mapping):
        fields = [f.name for f in dataclasses.fields(Stream)]
        unknown = sorted(map(str, set(entry) - set(fields)))
        if unknown or "url" not in entry:
            raise ConfigError(
                f"stream {index}: a dict of a Stream's fields needs 'url' and may hold {fields} "
                f"(got keys {sorted(map(str, entry))})"
            )
        url = entry["url"]
        return Stream(
            os.fspath(url) if isinstance(url, os.PathLike) else url,
            **{name: entry[name] for name in fields if name != "url" and name in entry},
        )
    if _is_pair(entry):
        url, weight = entry
        return Stream(os.fspath(url), weight=weight)
    raise TypeError(f"stream {index}: a {type(entry).__name__} is no stream; give {STREAM_FORMS}")


# Metadata this process parsed, by store URL and manifest bytes. A
# loader or an evaluation pass built again over the same datasets
# (TorchTitan's validator builds its dataloader anew at each validation)
# reads each manifest again but parses and validates it once; the bytes must
# match, so a dataset written again at the same place is parsed again. A 1.0
# Manifest is immutable; a 1.1 header's pages are read as needed and kept.
_PARSED: OrderedDict[tuple[str, bytes], StreamMetadata] = OrderedDict()
_MAX_PARSED = 16


def read_manifest_bytes(store: Any, node_cache: Any = None) -> bytes:
    """The ``manifest`` object's bytes, through the node's cache when there is one.

    Raises:
        ObjectMissingError: no committed dataset in ``store``.
    """

    def fetch() -> bytes:
        try:
            return store.read(MANIFEST_NAME)
        except ObjectMissingError:
            raise no_dataset_error(store) from None

    if node_cache is None:
        return fetch()
    # Keyed by the store's URL: the fingerprint is inside the bytes.
    return node_cache.get(f"manifests/{hashlib.sha256(store.url.encode()).hexdigest()}", fetch)


def read_metadata(store: Any, node_cache: Any = None) -> StreamMetadata:
    """The metadata of the dataset in ``store``, parsed once per process for the same bytes."""
    data = read_manifest_bytes(store, node_cache)
    key = (store.url, data)
    metadata = _PARSED.get(key)
    if metadata is None:
        metadata = StreamMetadata.from_bytes(data, url=store.url, read=store.read)
        _PARSED[key] = metadata
        while len(_PARSED) > _MAX_PARSED:
            _PARSED.popitem(last=False)
    return metadata


class StreamSource:
    """An open stream: store, metadata and block arithmetic.

    Args:
        index: the stream's index in the mixture.
        stream: the user's Stream.
        storage_options: fsspec options (credentials, endpoint); never shown.
        metadata: the metadata, when already read (the helper process gets
            the consumer's); None reads it from the store.
        node_cache: the node's shared metadata cache, or None; through it the
            store also shares the node's request-rate limiter.
    """

    def __init__(
        self,
        *,
        index: int,
        stream: Stream,
        storage_options: dict[str, Any] | None,
        metadata: StreamMetadata | None = None,
        node_cache: Any = None,
    ) -> None:
        self.index = index
        self.stream = stream
        self.store = open_store(stream.url, storage_options)
        try:
            if node_cache is not None:
                # The node's ranks wait on one request-rate limiter per
                # store once it throttles (storage/limiter.py), the manifest's
                # read included.
                self.store.share_limiter(node_cache)
            shared = read_metadata(self.store, node_cache) if metadata is None else metadata
        except BaseException:
            self.store.close()
            raise
        # A copy of its own: the parsed one may serve another loader, on another store.
        self.metadata = copy.copy(shared).bind(self.store, node_cache)
        self.dtype = self.metadata.np_dtype
        self.eos_id = int(self.metadata.tokenizer.eos_id)
        self.shape = self.metadata.shape
        self.max_compressed_block_bytes = self.metadata.max_block_bytes

    @property
    def url(self) -> str:
        """The store's URL (free of secrets)."""
        return self.store.url

    @property
    def fingerprint(self) -> str:
        """The dataset fingerprint from the manifest."""
        return self.metadata.fingerprint

    @property
    def manifest(self) -> StreamMetadata:
        """The dataset's metadata (header fields, block look-ups; ``.manifest`` for every entry)."""
        return self.metadata

    def decoded_bytes(self, block_id: int, *, packed_seq_len: int = 0) -> int:
        """Bytes one block takes in the cache: decoded, or as its packed rows at ``packed_seq_len``."""
        return self._kept_bytes(self.metadata.block_num_tokens(block_id), packed_seq_len)

    def full_block_bytes(self, packed_seq_len: int = 0) -> int:
        """``decoded_bytes`` of a full block (the largest)."""
        return self._kept_bytes(self.metadata.block_tokens, packed_seq_len)

    def _kept_bytes(self, num_tokens: int, packed_seq_len: int) -> int:
        if packed_seq_len:
            num_tokens = max(num_tokens, packed_tokens(num_tokens, packed_seq_len))
        return num_tokens * self.dtype.itemsize

    def locate(self, block_ids: Any) -> None:
        """Read, in one round, where the frames of these blocks lie."""
        self.metadata.locate(block_ids)

    def job(self, key: tuple[int, int], *, packed_seq_len: int = 0) -> BlockJob:
        """The fetch-and-decode job of block ``key = (stream, block_id)``; with
        ``packed_seq_len``, the block is kept as its best-fit rows at that seq_len."""
        assert key[0] == self.index
        block_id = key[1]
        frame = self.metadata.frame(block_id)
        self.metadata.forget(block_id)
        path, start, end = frame.path, frame.start, frame.end
        return BlockJob(
            key=key,
            store=self.store,
            path=path,
            start=start,
            end=end,
            num_tokens=frame.num_tokens,
            dtype=self.dtype,
            packed_seq_len=packed_seq_len,
            eos_id=self.eos_id,
            where=(
                f"shard {self.url}/{path} block {frame.block_in_shard} "
                f"(dataset block {block_id}, bytes [{start}, {end}))"
            ),
        )

    def close(self) -> None:
        """Close the store (connections, file handles)."""
        self.metadata.close()
        self.store.close()


def open_node_cache(setting: str | bool | None) -> Any:
    """The node's metadata cache for a loader's ``node_cache`` argument, or None."""
    if setting is False:
        return None
    from zephon_stream.storage.node_cache import NodeCache, node_cache_root

    root = node_cache_root(explicit=None if setting in (None, True) else str(setting))
    return None if root is None else NodeCache(root)


def open_sources(
    streams: Sequence[Stream], storage_options: dict[str, Any] | None, node_cache: Any = None
) -> list[StreamSource]:
    """Open every stream (its store and metadata), in order; none is left open on an error."""
    sources: list[StreamSource] = []
    try:
        for index, stream in enumerate(streams):
            sources.append(
                StreamSource(index=index, stream=stream, storage_options=storage_options, node_cache=node_cache)
            )
    except BaseException:
        for source in sources:
            source.close()
        raise
    return sources


def stream_shapes(sources: Sequence[StreamSource]) -> list[StreamShape]:
    """The plan's shape of each open stream."""
    return [s.shape for s in sources]
