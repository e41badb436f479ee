"""Random access to a committed dataset: blocks, token ranges, documents, text.

``DatasetReader`` pairs a validated manifest with the store it came from;
``inspect``, ``verify`` and provenance (``which``) read through it. The loader
has its own pipelined fetcher; this is the simple, synchronous path.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from zephon_stream.errors import ConfigError, FormatError
from zephon_stream.format.block import decode_block
from zephon_stream.format.docindex import DocIndex, DocumentLocator, DocumentSpan
from zephon_stream.format.manifest import Manifest

if TYPE_CHECKING:
    from zephon_stream.storage import Store
    from zephon_stream.writer.tokenizers import Tokenizer


class DatasetReader:
    """A committed dataset opened for reading.

    Args:
        manifest: the dataset's validated manifest.
        store: the store rooted at the dataset (where ``manifest`` lives).
    """

    def __init__(self, manifest: Manifest, store: Store) -> None:
        self.manifest = manifest
        self.store = store
        self._locator: DocumentLocator | None = None
        self._tokenizer: Tokenizer | None = None

    @classmethod
    def open(cls, url: str, storage_options: Mapping[str, Any] | None = None) -> DatasetReader:
        """Open the dataset at ``url`` (a local folder or ``s3://bucket/prefix``).

        Raises:
            ObjectMissingError: no committed dataset (no manifest) at ``url``.
            ManifestError: the manifest is malformed or inconsistent.
        """
        from zephon_stream.storage import open_store

        store = open_store(url, storage_options)
        return cls(Manifest.read(store), store)

    @property
    def url(self) -> str:
        """The dataset's root URL (no secrets)."""
        return self.store.url

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> DatasetReader:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    # -- tokens -------------------------------------------------------------

    def read_block_frame(self, block_id: int) -> bytes:
        """The raw zstd frame of one block, as stored."""
        path, start, end = self.manifest.block_byte_range(block_id)
        return self.store.read_range(path, start, end)

    def read_block(self, block_id: int) -> np.ndarray:
        """Tokens of one block (read-only, the manifest's dtype).

        Raises:
            CorruptBlockError / TruncatedObjectError / ObjectMissingError:
                naming the shard, the block and its byte range.
        """
        frame = self.read_block_frame(block_id)
        return decode_block(
            frame,
            num_tokens=self.manifest.block_num_tokens(block_id),
            dtype=self.manifest.np_dtype,
            where=self.manifest.block_where(block_id),
        )

    def read_tokens(self, token_start: int, token_end: int) -> np.ndarray:
        """Global tokens ``[token_start, token_end)``, across blocks and shards."""
        m = self.manifest
        if not 0 <= token_start <= token_end <= m.num_tokens:
            raise IndexError(f"token range [{token_start}, {token_end}) is outside [0, {m.num_tokens}]")
        if token_start == token_end:
            return np.empty(0, dtype=m.np_dtype)
        block_starts = m.block_token_starts
        first = int(np.searchsorted(block_starts, token_start, side="right")) - 1
        last = int(np.searchsorted(block_starts, token_end - 1, side="right")) - 1
        pieces = []
        for block_id in range(first, last + 1):
            tokens = self.read_block(block_id)
            base = int(block_starts[block_id])
            pieces.append(tokens[max(token_start - base, 0) : token_end - base])
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)

    # -- documents ----------------------------------------------------------

    def read_doc_index(self, shard_index: int) -> DocIndex:
        """The document-index sidecar of one shard, checked against its sha256.

        Raises:
            FormatError: digest mismatch, malformed sidecar or wrong document count.
        """
        shard = self.manifest.shards[shard_index]
        data = self.store.read(shard.index_path)
        digest = hashlib.sha256(data).hexdigest()
        if digest != shard.index_sha256:
            raise FormatError(
                f"document index {shard.index_path}: sha256 mismatch (expected {shard.index_sha256}, got {digest})"
            )
        index = DocIndex.from_bytes(data, where=f"document index {shard.index_path}", shard_num_tokens=shard.num_tokens)
        if index.num_documents != shard.num_documents:
            raise FormatError(
                f"document index {shard.index_path}: {index.num_documents} documents, "
                f"manifest says {shard.num_documents}"
            )
        return index

    @property
    def locator(self) -> DocumentLocator:
        """Finds documents by token range (sidecars are read on demand and cached)."""
        if self._locator is None:
            self._locator = DocumentLocator([s.num_tokens for s in self.manifest.shards], self.read_doc_index)
        return self._locator

    def documents(self, token_start: int, token_end: int) -> list[DocumentSpan]:
        """Documents overlapping global tokens ``[token_start, token_end)``, in stream order."""
        return self.locator.documents(token_start, token_end)

    def documents_of_block(self, block_id: int, start: int = 0, end: int | None = None) -> list[DocumentSpan]:
        """Documents overlapping tokens ``[start, end)`` of one block (default: all of it)."""
        size = self.manifest.block_num_tokens(block_id)
        end = size if end is None else end
        if not 0 <= start < end <= size:
            raise IndexError(f"block {block_id}: token range [{start}, {end}) is outside [0, {size}) or empty")
        base = self.manifest.token_offset_of_block(block_id)
        return self.documents(base + start, base + end)

    def document_tokens(self, span: DocumentSpan) -> np.ndarray:
        """All tokens of one document (BOS if any, text, EOS)."""
        return self.read_tokens(span.token_start, span.token_end)

    # -- text ---------------------------------------------------------------

    def tokenizer(self, spec: str | None = None, storage_options: Mapping[str, Any] | None = None) -> Tokenizer:
        """The tokenizer the dataset was written with, checked against its fingerprint.

        Args:
            spec: where to load it from if the manifest's name no longer
                points at it (``hf:/path/tokenizer.json``...).
            storage_options: options for reading an ``hf:`` file from S3.

        Raises:
            TokenizerError: it cannot be loaded or is not the same tokenizer.
        """
        if self._tokenizer is None or spec is not None:
            from zephon_stream.writer.tokenizers import tokenizer_from_manifest

            self._tokenizer = tokenizer_from_manifest(
                self.manifest.tokenizer, spec=spec, storage_options=dict(storage_options or {}) or None
            )
        return self._tokenizer

    def decode_text(self, tokens: np.ndarray, tokenizer: Any | None = None) -> str:
        """Text of a run of tokens, with the given tokenizer or the dataset's own."""
        tok = tokenizer if tokenizer is not None else self.tokenizer()
        if not hasattr(tok, "decode"):
            raise ConfigError(f"tokenizer {tok!r} has no decode() method")
        return tok.decode(np.asarray(tokens))


def read_block(
    url_or_manifest: str | Manifest,
    block_id: int,
    *,
    store: Store | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> np.ndarray:
    """Tokens of one block of a dataset.

    Args:
        url_or_manifest: the dataset URL, or an already loaded manifest.
        block_id: global block id (blocks numbered across shards in manifest order).
        store: the dataset's store; required with a manifest, optional with a URL.
        storage_options: fsspec/s3fs options when opening ``url``.

    Returns:
        A read-only 1-D array of the block's tokens.
    """
    if isinstance(url_or_manifest, Manifest):
        if store is None:
            raise ConfigError("read_block: a manifest needs the store it came from (store=...)")
        return DatasetReader(url_or_manifest, store).read_block(block_id)
    if store is None:
        with DatasetReader.open(url_or_manifest, storage_options) as reader:
            return reader.read_block(block_id)
    return DatasetReader(Manifest.read(store), store).read_block(block_id)
