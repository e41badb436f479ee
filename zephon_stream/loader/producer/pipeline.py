"""The producer: plans, fetches ahead, assembles steps in order into ring slots.

One thread drives the planner, issues block fetches in order of need within
the cache's byte budget, waits for the next step's blocks, assembles the step
into a free slot of the batch ring and emits the slot's index: into a queue
of ``prefetch_steps`` steps that ``get`` reads (in the consumer's process), or
straight to an ``emit`` function (the helper process sends it to the
trainer). The ring's free slots bound how far ahead it runs. An error (a
corrupt block, storage that stayed down) is emitted in place of the step
that needed the block, so the consumer raises it at that step and never
receives bad data. The pipeline runs in the loader's helper
process (loader/producer/helper_main.py) or, for debugging, in the consumer's process.
"""

from __future__ import annotations

import hashlib
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from zephon_stream.loader.blocks.cache import BlockCache, CacheClosedError
from zephon_stream.loader.blocks.fetcher import FetchDecodePool
from zephon_stream.loader.blocks.streams import StreamSource
from zephon_stream.loader.planning.planner import BlockKey, Planner
from zephon_stream.loader.producer.assembler import StepAssembler
from zephon_stream.loader.producer.stats import PIPELINE_KEYS, LoaderStats
from zephon_stream.loader.ring.free_slots import FreeSlots
from zephon_stream.loader.ring.shared_ring import SharedRing, Slot

_POLL_S = 0.1
# Steps planned per producer iteration while the retention horizon fills;
# small enough that the first batch is not delayed by planning far ahead.
_PLAN_CHUNK_STEPS = 512
# The first batch waits only for a few planned steps; the rest of the
# horizon is planned while its blocks decode.
_FIRST_PLAN_STEPS = 8
# The counters in the ring's header are written after each of the first
# steps, then at most every _PUBLISH_EVERY_S, and once more when the producer
# stops: at one small row a step, writing them every step cost a fifth of
# the producer's time. While the producer waits (for a block, or a ring ahead
# for a free slot) they are written every _PUBLISH_EVERY_S too: a helper's
# stores count the retries of reads made meanwhile (index pages, blocks
# ahead), and the trainer sees no count but what is written here.
_EAGER_PUBLISH_STEPS = 16
_PUBLISH_EVERY_S = 0.005


class ReadyStep(NamedTuple):
    """One assembled step, as queued for the consumer (a named tuple: made
    once a step in the trainer's thread, it costs half a frozen dataclass).

    Attributes:
        index: steps since the pipeline started.
        cursor: the global cursor before this step.
        slot: the ring slot holding the step.
        data_sha256: hash of this rank's rows, when requested, else "".
    """

    index: int
    cursor: int
    slot: int
    data_sha256: str


class EndOfData:
    """Queued after the last step of a finite run."""


def batch_sha256(sample_positions: np.ndarray, inputs: np.ndarray, labels: np.ndarray) -> str:
    """sha256 of a batch's positions, inputs and labels (int64, little-endian)."""
    digest = hashlib.sha256()
    for array in (sample_positions, inputs, labels):
        digest.update(np.ascontiguousarray(array, dtype="<i8").tobytes())
    return digest.hexdigest()


class Pipeline:
    """Planner -> fetch/decode pool -> cache -> assembler -> bounded queue.

    Args:
        planner: the rank's plan, starting at the loader's cursor.
        sources: one per stream, indexed like the plan's stream ids.
        cache: decoded blocks, its capacity the memory bound's cache part.
        ring: the batch ring the steps are written into; its ``returned``
            flags say which slots may be filled.
        stats: shared counters.
        seq_len: ``L``.
        prefetch_steps: batches queued ahead of the consumer.
        num_fetch_threads: concurrent storage reads.
        num_decode_threads: concurrent decodes.
        hash_data: compute ``ReadyStep.data_sha256`` (for the audit log).
        emit: where each ready step, the end or an error goes, from the
            producer thread; None queues them for :meth:`get`.
        own_stores: whether ``sources``' stores are this run's alone (a
            helper process's) and their retries, throttling answers and
            errors are published
            with its counters; the consumer's own stores, shared by every
            run on threads, are counted whole by the consumer instead.
    """

    def __init__(
        self,
        *,
        planner: Planner,
        sources: Sequence[StreamSource],
        cache: BlockCache,
        ring: SharedRing,
        stats: LoaderStats,
        seq_len: int,
        prefetch_steps: int,
        num_fetch_threads: int,
        num_decode_threads: int,
        hash_data: bool = False,
        emit: Callable[[ReadyStep | EndOfData | BaseException], None] | None = None,
        own_stores: bool = True,
    ) -> None:
        self._planner = planner
        self._own_stores = own_stores
        self._sources = list(sources)
        self._eos_ids = np.array([s.eos_id for s in self._sources], dtype=np.int64)
        self._token_dtype = np.result_type(*(s.dtype for s in self._sources))
        self._assembler: StepAssembler | None = None  # sized by the first step's rows
        self._cache = cache
        self._ring = ring
        # Woken with about half the queued steps still to go; see FreeSlots.
        self._free_slots = FreeSlots(ring, wake_after=max(1, prefetch_steps // 2))
        self._slots = ring.producer_slots()
        self._stats = stats
        self._seq_len = seq_len
        # Under best fit a block is kept as its packed rows (plan/packing.py).
        self._packed_seq_len = seq_len if ring.layout.packing.best_fit else 0
        self._hash_data = hash_data
        self._stop = threading.Event()
        self._end_steps: int | None = None  # set by end_at from the consumer's thread
        self._published_at = 0.0
        self._steps_done = 0
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max(1, prefetch_steps))
        self._emit = emit
        self._pool = FetchDecodePool(
            cache=cache,
            stats=stats,
            num_fetch_threads=num_fetch_threads,
            num_decode_threads=num_decode_threads,
        )
        # The stores' counts before this run (a helper's stores are
        # opened for it: none yet).
        self._store_base = self._store_counts()
        self._first_need: dict[BlockKey, int] = {}
        # The producer's own references to blocks it has already waited
        # for, released with the cache entry; spares a locked lookup per row.
        self._resident: dict[BlockKey, np.ndarray] = {}
        self._thread = threading.Thread(target=self._run, name="zephon-assemble", daemon=True)
        self._thread.start()

    @property
    def cache(self) -> BlockCache:
        """The block cache (for its byte counters)."""
        return self._cache

    # -- producer thread ------------------------------------------------------

    def _run(self) -> None:
        chunk = _FIRST_PLAN_STEPS
        try:
            while not self._stop.is_set():
                if self._end_steps is not None:
                    self._planner.limit(self._end_steps)
                if self._planner.finished():
                    self._publish_counters(self._steps_done)
                    self._put(EndOfData())
                    return
                self._planner.extend(chunk)
                chunk = _PLAN_CHUNK_STEPS
                self._issue_fetches()
                ready = self._assemble_next()
                if ready is None:
                    return
                if not self._put(ready):
                    return
                for key in self._planner.advance():
                    self._cache.drop(key)
                    self._first_need.pop(key, None)
                    self._resident.pop(key, None)
        except CacheClosedError:
            pass
        except BaseException as exc:  # noqa: BLE001 - raised again in the consumer
            self._put(exc)
        finally:
            self._publish_counters(self._steps_done)

    def _issue_fetches(self) -> None:
        next_index = self._planner.next_index
        first_need = self._first_need
        self._locate_ahead()
        for index, keys in self._planner.fetch_ahead():
            for key in keys:
                if key in first_need:  # Issued and not released; no cache lock needed
                    continue
                source = self._sources[key[0]]
                nbytes = source.decoded_bytes(key[1], packed_seq_len=self._packed_seq_len)
                if not self._cache.try_reserve(key, nbytes, force=index == next_index):
                    return
                first_need[key] = index
                self._stats.add(cache_misses=1)
                self._pool.submit(source.job(key, packed_seq_len=self._packed_seq_len))
            self._planner.fetched_through(index)

    def _locate_ahead(self) -> None:
        """Learn where the horizon's new blocks lie, one round of index reads per stream (format 1.1)."""
        first_need = self._first_need
        wanted: dict[int, list[int]] = {}
        for _, keys in self._planner.fetch_ahead():
            for key in keys:
                if key not in first_need:
                    wanted.setdefault(key[0], []).append(key[1])
        for stream, block_ids in wanted.items():
            self._sources[stream].locate(block_ids)

    def _wait_block(self, key: BlockKey) -> np.ndarray:
        while True:
            try:
                return self._cache.get(key, timeout_s=_POLL_S)
            except TimeoutError:
                if self._stop.is_set():
                    raise CacheClosedError("pipeline stopped") from None
                self._publish_while_waiting()

    def _assemble_next(self) -> ReadyStep | None:
        plan = self._planner.next_step()
        resident = self._resident
        new_keys = [key for key in plan.unique_keys if key not in resident]
        for key in new_keys:
            resident[key] = self._wait_block(key)
        index = self._free_slots.acquire(self._stop, idle=self._publish_while_waiting)
        if index is None:
            return None
        started = time.perf_counter()
        slot = self._slots[index]
        blocks = [resident[key] for key in plan.keys]
        if self._assembler is None:
            self._assembler = StepAssembler(seq_len=self._seq_len, packing=self._ring.layout.packing)
        eos = self._eos_ids[plan.streams] if len(self._eos_ids) > 1 else int(self._eos_ids[0])
        # One thread assembles the whole step: handing half the rows to
        # a helper thread measured slower here (2 cores shared with decoding).
        self._assembler.assemble(blocks, plan.samples, eos, slot)
        slot.sample_positions[:] = plan.positions
        digest = self._digest(slot) if self._hash_data else ""
        hits = len(plan.keys) - (sum(plan.keys.count(key) for key in new_keys) if new_keys else 0)
        self._stats.add(cache_hits=hits, assemble_s=time.perf_counter() - started)
        self._steps_done = plan.index + 1
        now = time.perf_counter()
        if plan.index < _EAGER_PUBLISH_STEPS or now - self._published_at >= _PUBLISH_EVERY_S:
            self._publish_counters(self._steps_done)
            self._published_at = now
        return ReadyStep(index=plan.index, cursor=plan.cursor, slot=index, data_sha256=digest)

    def _digest(self, slot: Slot) -> str:
        tokens = slot.tokens.astype(np.int64)
        return batch_sha256(slot.sample_positions, tokens[:, :-1], tokens[:, 1:])

    def _publish_while_waiting(self) -> None:
        now = time.perf_counter()
        if now - self._published_at >= _PUBLISH_EVERY_S:
            self._publish_counters(self._steps_done)
            self._published_at = now

    def _publish_counters(self, steps: int) -> None:
        # Often, so keep it to one read of each lock (PRODUCER_KEYS order).
        values = self._stats.values(PIPELINE_KEYS)
        stores = tuple(now - base for now, base in zip(self._store_counts(), self._store_base))
        resident, peak, forced = self._cache.counters()
        values += (*stores, resident, peak, self._cache.capacity_bytes, forced, steps)
        self._ring.counters[: len(values)] = values

    def _store_counts(self) -> tuple[float, ...]:
        """The stores' ``(retries, throttled, throttle_waits, throttle_wait_s, errors)``, in PRODUCER_KEYS order."""
        totals = [0.0] * 5
        if not self._own_stores:
            # Runs on threads overlap (a run started ahead, one being
            # retired) over the same stores; each publishing the stores'
            # counts would count one retry in every run that saw it.
            return tuple(totals)
        for source in self._sources:
            store = source.store.stats()
            for i, key in enumerate(("retries", "throttled", "throttle_waits", "throttle_wait_ms", "errors")):
                totals[i] += store[key] / 1000.0 if key == "throttle_wait_ms" else store[key]
        return tuple(totals)

    def _put(self, item: Any) -> bool:
        if self._emit is not None:
            # No queue and no second thread: the ring's free slots
            # already bound how far ahead the producer runs.
            self._emit(item)
            return not self._stop.is_set()
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    # -- consumer side --------------------------------------------------------

    def end_at(self, num_steps: int) -> None:
        """End the run after its first ``num_steps`` steps (another producer
        takes over from there); steps past it may already be queued."""
        self._end_steps = num_steps

    def get(self) -> ReadyStep | EndOfData:
        """The next step, waiting for it; re-raises a pipeline error in this thread.

        Returns:
            A ReadyStep, or EndOfData once a finite run is over.
        """
        assert self._emit is None, "this pipeline emits its steps"
        while True:
            try:
                item = self._queue.get(timeout=_POLL_S)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    raise RuntimeError("the loader's producer thread stopped without a result") from None
        if isinstance(item, BaseException):
            self._queue.put(item)  # Keep raising on later calls, too
            raise item
        if isinstance(item, EndOfData):
            self._queue.put(item)
        return item

    def close(self) -> None:
        """Stop the producer, the fetch and decode threads; wait for all of them.

        The ring belongs to the caller, which may reuse it.
        """
        self._stop.set()
        self._cache.close()
        self._drain()  # A producer blocked on a full queue sees the stop now, not at its next poll
        self._thread.join()
        self._pool.close()
        self._drain()

    def _drain(self) -> None:
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
