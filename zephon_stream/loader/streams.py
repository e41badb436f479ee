"""Streams: what the user names (a URL and a weight) and what the loader reads.

A ``Stream`` is a dataset URL with a mixture weight. A ``StreamSource`` is the
open dataset behind it: its store (one per loader, closed with it), manifest,
token dtype, EOS id and block byte ranges.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

from zephon_stream.errors import ConfigError, ObjectMissingError
from zephon_stream.format.manifest import Manifest
from zephon_stream.format.spec import MANIFEST_NAME
from zephon_stream.loader.fetcher import BlockJob
from zephon_stream.plan import StreamShape
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
        if not self.weight > 0:
            raise ConfigError(f"Stream {self.url}: weight must be > 0 (got {self.weight})")


def as_streams(streams: str | Stream | Sequence[str | Stream]) -> list[Stream]:
    """Normalise a URL, a Stream, or a list of either into Streams."""
    if isinstance(streams, (str, Stream)):
        streams = [streams]
    out = [s if isinstance(s, Stream) else Stream(str(s)) for s in streams]
    if not out:
        raise ConfigError("StreamingLoader needs at least one stream")
    return out


# NOTE: manifests this process parsed, by store URL and bytes. A loader or an
# evaluation pass built again over the same datasets (TorchTitan's validator
# builds its dataloader anew at each validation) reads each manifest again
# but parses and validates it once; the bytes must match, so a dataset
# written again at the same place is parsed again. A Manifest is immutable.
_PARSED_MANIFESTS: OrderedDict[tuple[str, bytes], Manifest] = OrderedDict()
_MAX_PARSED_MANIFESTS = 16


def read_manifest(store: Any) -> Manifest:
    """The manifest of the dataset in ``store`` (see ``Manifest.read``),
    parsed once per process for the same bytes."""
    try:
        data = store.read(MANIFEST_NAME)
    except ObjectMissingError:
        return Manifest.read(store)  # NOTE: raises the error naming the dataset that is not there
    key = (store.url, data)
    manifest = _PARSED_MANIFESTS.get(key)
    if manifest is None:
        manifest = Manifest.from_bytes(data, where=f"manifest {store.url.rstrip('/')}/{MANIFEST_NAME}")
        _PARSED_MANIFESTS[key] = manifest
        while len(_PARSED_MANIFESTS) > _MAX_PARSED_MANIFESTS:
            _PARSED_MANIFESTS.popitem(last=False)
    return manifest


def _max_frame_bytes(manifest: Manifest) -> int:
    """The largest compressed block of the dataset, over every shard at once (tens of thousands at scale)."""
    offsets = [s.block_offsets for s in manifest.shards]
    counts = np.fromiter(map(len, offsets), dtype=np.int64, count=len(offsets))
    flat = np.fromiter(itertools.chain.from_iterable(offsets), dtype=np.int64, count=int(counts.sum()))
    sizes = np.diff(flat)
    sizes[np.cumsum(counts)[:-1] - 1] = 0  # NOTE: from one shard's end to the next one's start
    return int(sizes.max()) if sizes.size else 0


class StreamSource:
    """An open stream: store, manifest and block arithmetic.

    Args:
        index: the stream's index in the mixture.
        stream: the user's Stream.
        storage_options: fsspec options (credentials, endpoint); never shown.
        manifest: the manifest, when already read (the helper process gets
            the consumer's); None reads it from the store.
    """

    def __init__(
        self, *, index: int, stream: Stream, storage_options: dict[str, Any] | None, manifest: Manifest | None = None
    ) -> None:
        self.index = index
        self.stream = stream
        self.store = open_store(stream.url, storage_options)
        try:
            self.manifest = read_manifest(self.store) if manifest is None else manifest
        except BaseException:
            self.store.close()
            raise
        self.dtype = self.manifest.np_dtype
        self.eos_id = int(self.manifest.tokenizer.eos_id)
        self._token_counts = self.manifest.block_token_counts()
        self.max_compressed_block_bytes = _max_frame_bytes(self.manifest)

    @property
    def url(self) -> str:
        """The store's URL (free of secrets)."""
        return self.store.url

    @property
    def fingerprint(self) -> str:
        """The dataset fingerprint from the manifest."""
        return self.manifest.fingerprint

    @property
    def block_token_counts(self) -> np.ndarray:
        """Tokens per block, by block id."""
        return self._token_counts

    @property
    def full_block_bytes(self) -> int:
        """Decoded bytes of a full block."""
        return self.manifest.block_tokens * self.dtype.itemsize

    def decoded_bytes(self, block_id: int) -> int:
        """Decoded bytes of one block."""
        return int(self._token_counts[block_id]) * self.dtype.itemsize

    def job(self, key: tuple[int, int]) -> BlockJob:
        """The fetch-and-decode job of block ``key = (stream, block_id)``."""
        assert key[0] == self.index
        block_id = key[1]
        path, start, end = self.manifest.block_byte_range(block_id)
        _, in_shard = self.manifest.block_location(block_id)
        return BlockJob(
            key=key,
            store=self.store,
            path=path,
            start=start,
            end=end,
            num_tokens=int(self._token_counts[block_id]),
            dtype=self.dtype,
            where=f"shard {self.url}/{path} block {in_shard} (dataset block {block_id}, bytes [{start}, {end}))",
        )

    def close(self) -> None:
        """Close the store (connections, file handles)."""
        self.store.close()


def open_sources(streams: Sequence[Stream], storage_options: dict[str, Any] | None) -> list[StreamSource]:
    """Open every stream (its store and manifest), in order; none is left open on an error."""
    sources: list[StreamSource] = []
    try:
        for index, stream in enumerate(streams):
            sources.append(StreamSource(index=index, stream=stream, storage_options=storage_options))
    except BaseException:
        for source in sources:
            source.close()
        raise
    return sources


def stream_shapes(sources: Sequence[StreamSource]) -> list[StreamShape]:
    """The plan's shape of each open stream."""
    return [StreamShape.from_counts(s.fingerprint, s.manifest.block_tokens, s.block_token_counts) for s in sources]
