"""Fetches and decode threads: exact block byte ranges in, decoded blocks out.

A store with an event loop (s3fs, gcsfs, adlfs: ``store.event_loop()``) has
its blocks read as coroutines on that loop, at most ``num_fetch_threads`` at
once; other stores (local files) are read by that many threads calling
``store.read_range``. Either way retries and timeouts live in the store, and
the compressed frame goes to decode threads through a short queue, so
compressed bytes in flight stay bounded. zstd releases the GIL, so threads
decode in parallel. Under ``packing="best_fit"`` the decode thread also
packs the block's documents into its rows (``plan/packing.py``), and the
cache keeps the packed rows instead of the tokens. Results, or the error that stopped them, land in the
block cache; the assembler raises the error when it reaches that block.

Why coroutines and not threads for network stores: these clients run
every request on one loop thread anyway, and a thread blocked in each
request's synchronous wrapper only added hand-offs and lock traffic to the
interpreter the assembler shares (measured on SeaweedFS: 3.0-3.7 ms of CPU a
ranged GET from 8 threads, 2.4-3.1 ms as coroutines).
"""

from __future__ import annotations

import asyncio
import dataclasses
import queue
import threading
import time
from collections.abc import Hashable
from typing import Any, Protocol

import numpy as np

from zephon_stream.format.block import decode_block
from zephon_stream.loader.blocks.cache import BlockCache
from zephon_stream.plan.packing import best_fit_rows, packed_rows

_POLL_S = 0.05
# How often a fetched frame retries the full decode queue; the loop
# must not block on it, since every other fetch runs on the same loop.
_HANDOFF_POLL_S = 0.001
_CLOSE_TIMEOUT_S = 30.0


class FetchCounters(Protocol):
    """What the pool counts into (``loader/producer/stats.py`` ``LoaderStats``).

    Named here so that reading blocks does not import the producer's
    counters: ``blocks/`` sits below ``producer/`` (tests/test_import_graph.py).
    """

    def add(self, **deltas: float) -> None: ...


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
        packed_seq_len: keep the block as its best-fit rows at this seq_len
            (``plan/packing.py``: ``[R, L + 1]``) instead of its tokens; 0: don't.
        eos_id: the stream's EOS id (for the packing).
    """

    key: Hashable
    store: Any
    path: str
    start: int
    end: int
    num_tokens: int
    dtype: np.dtype
    where: str
    packed_seq_len: int = 0
    eos_id: int = 0


class FetchDecodePool:
    """Threads that turn BlockJobs into decoded blocks in a BlockCache.

    Args:
        cache: where results and errors go; a job whose entry was dropped
            before it ran is skipped.
        stats: counters for bytes fetched, blocks decoded and time spent.
        num_fetch_threads: concurrent reads (coroutines on a store's event
            loop, else threads calling ``read_range``).
        num_decode_threads: concurrent zstd decodes; also the depth of the
            queue between fetch and decode.
        name: thread name prefix.
    """

    def __init__(
        self,
        *,
        cache: BlockCache,
        stats: FetchCounters,
        num_fetch_threads: int,
        num_decode_threads: int,
        name: str = "zephon",
    ) -> None:
        assert num_fetch_threads >= 1 and num_decode_threads >= 1
        self._cache = cache
        self._stats = stats
        self._closing = threading.Event()
        self._name = name
        self._num_fetches = num_fetch_threads
        self._fetch_queue: queue.SimpleQueue[BlockJob | None] = queue.SimpleQueue()
        self._decode_queue: queue.Queue[tuple[BlockJob, bytes] | None] = queue.Queue(maxsize=num_decode_threads)
        self._fetchers: list[threading.Thread] = []  # Started for the first store without a loop
        self._loops: dict[int, asyncio.AbstractEventLoop | None] = {}
        # Per loop, touched only on that loop's thread.
        self._slots: dict[asyncio.AbstractEventLoop, asyncio.Semaphore] = {}
        self._tasks: dict[asyncio.AbstractEventLoop, set[asyncio.Task[None]]] = {}
        self._pending_lock = threading.Lock()
        self._pending: dict[asyncio.AbstractEventLoop, list[BlockJob]] = {}
        self._decoders = [
            threading.Thread(target=self._decode_loop, name=f"{name}-decode-{i}", daemon=True)
            for i in range(num_decode_threads)
        ]
        for thread in self._decoders:
            thread.start()

    def submit(self, job: BlockJob) -> None:
        """Start a job; its cache entry must already be reserved."""
        assert not self._closing.is_set(), "submit after close"
        loop = self._loop_of(job.store)
        if loop is not None:
            # One wake-up of the loop for the jobs submitted before it
            # runs: each wake-up is a write to the loop's pipe and a hand-over
            # of the interpreter lock between this thread and the loop's.
            with self._pending_lock:
                pending = self._pending.setdefault(loop, [])
                pending.append(job)
                if len(pending) > 1:
                    return
            loop.call_soon_threadsafe(self._start_tasks, loop)
            return
        if not self._fetchers:
            self._fetchers = [
                threading.Thread(target=self._fetch_loop, name=f"{self._name}-fetch-{i}", daemon=True)
                for i in range(self._num_fetches)
            ]
            for thread in self._fetchers:
                thread.start()
        self._fetch_queue.put(job)

    def _loop_of(self, store: Any) -> asyncio.AbstractEventLoop | None:
        try:
            return self._loops[id(store)]
        except KeyError:
            loop = self._loops[id(store)] = store.event_loop()
            return loop

    # -- on a store's event loop ------------------------------------------------

    def _start_tasks(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._pending_lock:
            jobs = self._pending.pop(loop, [])
        if self._closing.is_set():
            return
        tasks = self._tasks.setdefault(loop, set())
        for job in jobs:
            task = loop.create_task(self._fetch_async(loop, job))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    async def _fetch_async(self, loop: asyncio.AbstractEventLoop, job: BlockJob) -> None:
        slots = self._slots.get(loop)
        if slots is None:
            slots = self._slots[loop] = asyncio.Semaphore(self._num_fetches)
        async with slots:
            if self._closing.is_set() or job.key not in self._cache:
                return
            started = time.perf_counter()
            try:
                data = await job.store.read_range_async(job.path, job.start, job.end)
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # noqa: BLE001 - handed to the consumer
                self._cache.fail(job.key, exc)
                return
            self._stats.add(bytes_fetched=len(data), blocks_fetched=1, fetch_s=time.perf_counter() - started)
            # The frame keeps its fetch slot until a decoder takes it, so
            # compressed bytes in flight stay within the memory bound.
            while not self._closing.is_set():
                try:
                    self._decode_queue.put_nowait((job, data))
                    return
                except queue.Full:
                    await asyncio.sleep(_HANDOFF_POLL_S)

    async def _cancel_tasks(self, loop: asyncio.AbstractEventLoop) -> None:
        tasks = list(self._tasks.get(loop, ()))
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- threads -----------------------------------------------------------------

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
            decoded = time.perf_counter()
            self._stats.add(blocks_decoded=1, decode_s=decoded - started)
            if job.packed_seq_len:
                # Each decode thread packs its own block: the first step
                # of a run needs a block per lane, and packing them in turn
                # measured 1.4-1.7x the windows' first batch against 1.27x.
                # The memory bound counts one block being packed per thread.
                tokens = packed_rows(tokens, best_fit_rows(tokens, job.packed_seq_len, job.eos_id))
                self._stats.add(pack_s=time.perf_counter() - decoded)
            self._cache.fill(job.key, tokens)

    def close(self) -> None:
        """Stop every fetch and thread and wait for them; queued jobs are discarded.

        Fetches on an event loop are cancelled; a ``read_range`` already in
        progress on a fetch thread finishes (within the store's retry bounds)
        before its thread exits.
        """
        self._closing.set()
        for loop in {loop for loop in self._loops.values() if loop is not None}:
            if loop.is_closed():
                continue
            # Runs after every _start_tasks already queued on the loop.
            done = asyncio.run_coroutine_threadsafe(self._cancel_tasks(loop), loop)
            try:
                done.result(timeout=_CLOSE_TIMEOUT_S)
            except BaseException:  # noqa: BLE001 - closing; the loop is stuck or gone
                done.cancel()
        for _ in self._fetchers:
            self._fetch_queue.put(None)
        for _ in self._decoders:
            try:
                self._decode_queue.put_nowait(None)  # Wakes an idle decoder now, not at its next poll
            except queue.Full:
                break  # A decoder takes the queued item, sees the close and returns
        for thread in self._fetchers + self._decoders:
            thread.join()
