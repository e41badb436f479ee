"""Fetch and decode threads: exact block byte ranges in, decoded blocks out.

Fetch threads call ``store.read_range`` (retries and timeouts live in the
store) and hand the compressed frame to decode threads through a short queue,
so compressed bytes in flight stay bounded. zstd releases the GIL, so threads
decode in parallel. Results, or the error that stopped them, land in the
block cache; the assembler raises the error when it reaches that block.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections.abc import Hashable
from typing import Any

import numpy as np

from zephon_stream.format.block import decode_block
from zephon_stream.loader.cache import BlockCache
from zephon_stream.loader.stats import LoaderStats

_POLL_S = 0.05


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class BlockJob:
    """One block to fetch and decode.

    Attributes:
        key: the cache key, ``(stream_index, block_id)``.
        store: the stream's store (``read_range`` is thread-safe).
        path: the shard path relative to the store root.
        start: first byte of the frame in the shard.
        end: one past the last byte.
        num_tokens: tokens the block holds (from the manifest).
        dtype: the token dtype.
        where: names the object and block in errors.
    """

    key: Hashable
    store: Any
    path: str
    start: int
    end: int
    num_tokens: int
    dtype: np.dtype
    where: str


class FetchDecodePool:
    """Threads that turn BlockJobs into decoded blocks in a BlockCache.

    Args:
        cache: where results and errors go; a job whose entry was dropped
            before it ran is skipped.
        stats: counters for bytes fetched, blocks decoded and time spent.
        num_fetch_threads: concurrent ``read_range`` calls.
        num_decode_threads: concurrent zstd decodes; also the depth of the
            queue between fetch and decode.
        name: thread name prefix.
    """

    def __init__(
        self,
        *,
        cache: BlockCache,
        stats: LoaderStats,
        num_fetch_threads: int,
        num_decode_threads: int,
        name: str = "zephon",
    ) -> None:
        assert num_fetch_threads >= 1 and num_decode_threads >= 1
        self._cache = cache
        self._stats = stats
        self._closing = threading.Event()
        self._fetch_queue: queue.SimpleQueue[BlockJob | None] = queue.SimpleQueue()
        self._decode_queue: queue.Queue[tuple[BlockJob, bytes] | None] = queue.Queue(maxsize=num_decode_threads)
        self._fetchers = [
            threading.Thread(target=self._fetch_loop, name=f"{name}-fetch-{i}", daemon=True)
            for i in range(num_fetch_threads)
        ]
        self._decoders = [
            threading.Thread(target=self._decode_loop, name=f"{name}-decode-{i}", daemon=True)
            for i in range(num_decode_threads)
        ]
        for thread in self._fetchers + self._decoders:
            thread.start()

    def submit(self, job: BlockJob) -> None:
        """Queue a job; its cache entry must already be reserved."""
        assert not self._closing.is_set(), "submit after close"
        self._fetch_queue.put(job)

    def _fetch_loop(self) -> None:
        while True:
            job = self._fetch_queue.get()
            if job is None or self._closing.is_set():
                return
            if job.key not in self._cache:
                continue
            started = time.perf_counter()
            try:
                data = job.store.read_range(job.path, job.start, job.end)
            except BaseException as exc:  # noqa: BLE001 - handed to the consumer
                self._cache.fail(job.key, exc)
                continue
            self._stats.add(bytes_fetched=len(data), blocks_fetched=1, fetch_s=time.perf_counter() - started)
            while not self._closing.is_set():
                try:
                    self._decode_queue.put((job, data), timeout=_POLL_S)
                    break
                except queue.Full:
                    continue

    def _decode_loop(self) -> None:
        while True:
            try:
                item = self._decode_queue.get(timeout=_POLL_S)
            except queue.Empty:
                if self._closing.is_set():
                    return
                continue
            if item is None or self._closing.is_set():
                return
            job, data = item
            if job.key not in self._cache:
                continue
            started = time.perf_counter()
            try:
                tokens = decode_block(data, num_tokens=job.num_tokens, dtype=job.dtype, where=job.where)
            except BaseException as exc:  # noqa: BLE001 - handed to the consumer
                self._cache.fail(job.key, exc)
                continue
            del data
            self._stats.add(blocks_decoded=1, decode_s=time.perf_counter() - started)
            self._cache.fill(job.key, tokens)

    def close(self) -> None:
        """Stop every thread and wait for them; queued jobs are discarded.

        A ``read_range`` already in progress finishes (within the store's
        retry bounds) before its thread exits.
        """
        self._closing.set()
        for _ in self._fetchers:
            self._fetch_queue.put(None)
        for _ in self._decoders:
            try:
                self._decode_queue.put_nowait(None)  # NOTE: wakes an idle decoder now, not at its next poll
            except queue.Full:
                break  # NOTE: a decoder takes the queued item, sees the close and returns
        for thread in self._fetchers + self._decoders:
            thread.join()
