"""The shard builder: a token stream in, compressed shards and their document
indexes out, each written to the store as soon as it is full.

Tokens arrive in input order, a batch of whole documents at a time. They are
cut into blocks of ``block_tokens``; each full block is compressed on a small
thread pool (zstd releases the GIL) while the next one fills; every
``blocks_per_shard`` blocks make a shard, written with its sidecar by one
background thread so the token stream never waits on storage. Order is kept
throughout, so the bytes depend only on the tokens.

Memory: one block being filled, at most ``max_pending_blocks`` blocks waiting
for compression, the compressed frames of the shard being filled, and at
most one shard being hashed and written.
"""

from __future__ import annotations

import hashlib
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from zephon_stream.format.block import encode_block
from zephon_stream.format.docindex import DocIndex
from zephon_stream.format.manifest import ShardInfo
from zephon_stream.format.spec import DEFAULT_ZSTD_LEVEL, index_name, shard_name
from zephon_stream.storage import Store


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardLayout:
    """How the token stream is cut.

    Attributes:
        dtype: token dtype (``<u2`` or ``<u4``).
        block_tokens: tokens in every block but the last.
        blocks_per_shard: blocks in every shard but the last.
        zstd_level: compression level of each block.
        compress_threads: threads compressing blocks.
        borrow_input: compress whole blocks straight from the arrays given to
            ``add`` (no copy); they must never change afterwards, and each
            stays alive while any of its blocks waits for compression, so
            use it where arrays hold several blocks (token inputs' windows).
    """

    dtype: np.dtype
    block_tokens: int
    blocks_per_shard: int
    zstd_level: int = DEFAULT_ZSTD_LEVEL
    compress_threads: int = 2
    borrow_input: bool = False


class ShardBuilder:
    """Cuts documents' tokens into blocks and shards and writes them to ``store``.

    Args:
        store: where ``shards/`` goes.
        layout: block and shard sizes, dtype and compression.
        sources: every input's name; documents refer to them by index.
    """

    def __init__(self, *, store: Store, layout: ShardLayout, sources: list[str]) -> None:
        self._store = store
        self._layout = layout
        self._sources = sources
        self._compress = ThreadPoolExecutor(max_workers=layout.compress_threads, thread_name_prefix="zs-compress")
        self._upload = ThreadPoolExecutor(max_workers=1, thread_name_prefix="zs-shard-write")
        self._upload_pending: Future[None] | None = None
        self._max_pending_blocks = 2 * layout.compress_threads + 2
        self._block = np.empty(layout.block_tokens, dtype=layout.dtype)
        self._block_fill = 0
        self._frames: list[Future[bytes]] = []
        # Blocks submitted and not yet compressed, across shard boundaries too.
        self._in_flight: deque[Future[bytes]] = deque()
        self._shard_start = 0  # global token offset of the shard being filled
        self._tokens_total = 0
        self._shards_sealed = 0
        self._doc_starts: list[np.ndarray] = []
        self._doc_sources: list[np.ndarray] = []
        self._doc_records: list[np.ndarray] = []
        self.shards: list[ShardInfo] = []

    @property
    def num_tokens(self) -> int:
        """Tokens added so far."""
        return self._tokens_total

    def add(self, tokens: np.ndarray, lengths: np.ndarray, sources: np.ndarray, records: np.ndarray) -> None:
        """Append whole documents.

        Args:
            tokens: their tokens, concatenated (already of the layout's dtype).
            lengths: tokens of each document (EOS included).
            sources: index into ``sources`` of each document.
            records: record number of each document within its source.
        """
        assert tokens.dtype == self._layout.dtype and len(tokens) == int(lengths.sum())
        if len(lengths) == 0:
            return
        starts = self._tokens_total + np.concatenate([np.zeros(1, np.int64), np.cumsum(lengths[:-1])])
        self._doc_starts.append(starts.astype(np.int64))
        self._doc_sources.append(np.asarray(sources, dtype=np.int64))
        self._doc_records.append(np.asarray(records, dtype=np.int64))
        pos = 0
        block_tokens = self._layout.block_tokens
        while pos < len(tokens):
            if self._layout.borrow_input and self._block_fill == 0 and len(tokens) - pos >= block_tokens:
                # A whole block lies contiguous in the input: compress that view, no copy.
                self._tokens_total += block_tokens
                self._seal_block(tokens[pos : pos + block_tokens])
                pos += block_tokens
                continue
            take = min(len(tokens) - pos, block_tokens - self._block_fill)
            self._block[self._block_fill : self._block_fill + take] = tokens[pos : pos + take]
            self._block_fill += take
            self._tokens_total += take
            pos += take
            if self._block_fill == block_tokens:
                self._seal_block(self._block)
                self._block = np.empty(block_tokens, dtype=self._layout.dtype)
                self._block_fill = 0

    def end_input(self) -> None:
        """No more documents: queue the short last block and shard, without waiting.

        The caller can do its own closing work (``rejects.jsonl``) while they
        are compressed and written, then wait in ``finish``.
        """
        if self._block_fill:
            self._seal_block(self._block[: self._block_fill])
            self._block_fill = 0
        if self._frames:
            self._seal_shard()

    def finish(self) -> list[ShardInfo]:
        """Write the short last block and shard; wait for every write. Returns all shards."""
        try:
            self.end_input()
            self._wait_upload()
        finally:
            self.close()
        return self.shards

    def close(self) -> None:
        """Stop the threads (also on error: nothing more is written)."""
        self._compress.shutdown(wait=True, cancel_futures=True)
        self._upload.shutdown(wait=True, cancel_futures=True)

    # -- blocks and shards ---------------------------------------------------

    def _seal_block(self, block: np.ndarray) -> None:
        """Queue ``block`` for compression; the caller never writes into it again."""
        future = self._compress.submit(encode_block, block, level=self._layout.zstd_level)
        self._frames.append(future)
        self._in_flight.append(future)
        # Keep at most a few raw blocks alive: wait for the oldest frames.
        while len(self._in_flight) > self._max_pending_blocks:
            self._in_flight.popleft().result()
        if len(self._frames) == self._layout.blocks_per_shard:
            self._seal_shard()

    def _seal_shard(self) -> None:
        frames, self._frames = self._frames, []
        shard_index, shard_tokens = self._shards_sealed, self._tokens_total - self._shard_start
        self._shards_sealed += 1
        index_bytes, num_documents = self._take_docindex(self._tokens_total)
        self._shard_start = self._tokens_total
        # One shard in flight: waiting here bounds memory to ~2 shards.
        # Its frames are awaited on the writing thread, so compression of the
        # next shard's blocks goes on meanwhile (no drained pipeline per shard).
        self._wait_upload()
        self._upload_pending = self._upload.submit(
            self._write_shard, shard_index, shard_tokens, frames, index_bytes, num_documents
        )

    def _write_shard(
        self,
        shard_index: int,
        shard_tokens: int,
        frames: list[Future[bytes]],
        index_bytes: bytes,
        num_documents: int,
    ) -> None:
        # The sidecar is complete already: writing it first overlaps its
        # write (and fsync) with the compression of the shard's last blocks.
        self._store.write_atomic(index_name(shard_index), index_bytes)
        digest = hashlib.sha256()
        resolved = []
        for future in frames:
            frame = future.result()
            # Hashed as each frame lands, so a shard's end waits on one frame's hash, not the shard's.
            digest.update(frame)
            resolved.append(frame)
        frames.clear()
        offsets = np.concatenate([np.zeros(1, np.int64), np.cumsum([len(f) for f in resolved])])
        data = b"".join(resolved)
        resolved.clear()
        info = ShardInfo(
            path=shard_name(shard_index),
            num_tokens=shard_tokens,
            num_bytes=len(data),
            sha256=digest.hexdigest(),
            block_offsets=tuple(int(o) for o in offsets),
            index_path=index_name(shard_index),
            index_sha256=hashlib.sha256(index_bytes).hexdigest(),
            num_documents=num_documents,
        )
        self._store.write_atomic(info.path, data)
        self.shards.append(info)

    def _wait_upload(self) -> None:
        if self._upload_pending is not None:
            pending, self._upload_pending = self._upload_pending, None
            pending.result()

    def _take_docindex(self, shard_end: int) -> tuple[bytes, int]:
        """Sidecar bytes for the documents starting before ``shard_end``; keeps the rest."""
        starts = np.concatenate(self._doc_starts) if self._doc_starts else np.zeros(0, np.int64)
        sources = np.concatenate(self._doc_sources) if self._doc_sources else np.zeros(0, np.int64)
        records = np.concatenate(self._doc_records) if self._doc_records else np.zeros(0, np.int64)
        cut = int(np.searchsorted(starts, shard_end, side="left"))
        self._doc_starts, self._doc_sources, self._doc_records = [starts[cut:]], [sources[cut:]], [records[cut:]]
        used, local_sources = np.unique(sources[:cut], return_inverse=True)
        index = DocIndex.build(
            doc_starts=starts[:cut] - self._shard_start,
            doc_source=local_sources.reshape(-1),
            doc_record=records[:cut],
            sources=[self._sources[int(i)] for i in used],
        )
        return index.to_bytes(), cut
