"""What one rank's producer needs to run, and the in-process way to run it.

A ``ProducerSpec`` is everything the pipeline needs, in plain picklable
values: the rank's layout of the order, the streams with the metadata the
consumer already read (so both sides read the same dataset, and the helper
reads no manifest twice: a 1.1 header and its pages read so far, a few KiB),
the storage options, the node's metadata cache, where to start, and the ring.
``ThreadProducer`` runs the pipeline on threads of the consumer's own process,
the debugging switch (``pipeline="threads"``); ``ProcessProducer`` in
loader/producer/process_producer.py runs it in a helper process. Both hand out ring slot
indices through the same two calls, ``get`` and ``close``; the consumer hands
slots back through the ring's ``returned`` flags.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from zephon_stream.loader.blocks.cache import BlockCache
from zephon_stream.loader.blocks.metadata import StreamMetadata
from zephon_stream.loader.blocks.streams import Stream, StreamSource
from zephon_stream.loader.planning.planner import Planner
from zephon_stream.loader.planning.rank_layout import RankLayout
from zephon_stream.loader.producer.pipeline import EndOfData, Pipeline, ReadyStep
from zephon_stream.loader.producer.stats import LoaderStats
from zephon_stream.loader.ring.shared_ring import SharedRing, SlotLayout


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ProducerSpec:
    """One run of the pipeline, from a cursor on.

    Attributes:
        layout: this rank's view of the order (holds the memory bound).
        streams: the user's streams, in order.
        metadata: each stream's metadata, as the consumer read it.
        storage_options: fsspec options; they travel to the helper over its
            private socket, never on a command line or in the environment.
        start: the global cursor of the first step.
        num_steps: steps to produce, or None for no end.
        seq_len: ``L``.
        prefetch_steps: steps assembled ahead of the consumer.
        num_fetch_threads: concurrent storage reads.
        num_decode_threads: concurrent zstd decodes.
        hash_data: compute each step's data sha256 (audit log).
        num_slots: slots in the ring.
        slot_layout: the ring's slot layout.
        start_step: the global step at ``start`` (in error messages).
        helper_nice: niceness the helper process adds to itself (ignored on threads).
        steps_per_slot: consecutive steps assembled into one slot and
            announced in one message.
        post_steps: a helper process posts its steps in the ring's header
            (loader/ring/step_board.py) instead of sending them over its socket.
    """

    layout: RankLayout
    streams: tuple[Stream, ...]
    metadata: tuple[StreamMetadata, ...]
    storage_options: dict[str, Any] | None
    start: int
    num_steps: int | None
    seq_len: int
    prefetch_steps: int
    num_fetch_threads: int
    num_decode_threads: int
    hash_data: bool
    num_slots: int
    slot_layout: SlotLayout
    start_step: int = 0
    helper_nice: int = 0
    steps_per_slot: int = 1
    post_steps: bool = False
    node_cache_root: str | None = None

    @property
    def slot_batch(self) -> int:
        """Global positions one slot covers: ``steps_per_slot`` global batches."""
        return self.layout.global_batch * self.steps_per_slot

    def __repr__(self) -> str:
        # Storage options may hold keys; they are never shown.
        return f"ProducerSpec(start={self.start}, num_steps={self.num_steps}, streams={len(self.streams)})"

    def open_sources(self) -> list[StreamSource]:
        """Open each stream's store with the metadata already read."""
        sources: list[StreamSource] = []
        node_cache = None
        if self.node_cache_root is not None:
            from zephon_stream.storage.node_cache import NodeCache

            # This process's own registration; it ends with the process.
            node_cache = NodeCache(self.node_cache_root)
        try:
            for index, (stream, metadata) in enumerate(zip(self.streams, self.metadata)):
                sources.append(
                    StreamSource(
                        index=index,
                        stream=stream,
                        storage_options=self.storage_options,
                        metadata=metadata,
                        node_cache=node_cache,
                    )
                )
        except BaseException:
            for source in sources:
                source.close()
            raise
        return sources


def start_pipeline(
    spec: ProducerSpec,
    *,
    sources: Sequence[StreamSource],
    ring: SharedRing,
    emit: Callable[[ReadyStep | EndOfData | BaseException], None] | None = None,
    own_stores: bool = True,
) -> Pipeline:
    """Start the pipeline ``spec`` describes, writing into ``ring`` (``emit``
    and ``own_stores``: see :class:`Pipeline`)."""
    layout, per_slot = spec.layout, spec.steps_per_slot
    if per_slot == 1:
        planner = layout.planner(start=spec.start, num_steps=spec.num_steps)
    else:
        end = None if spec.num_steps is None else spec.start + spec.num_steps * layout.global_batch

        def slice_slots(cursor: int, count: int) -> tuple[np.ndarray, ...]:
            # The planner's step is a slot's worth of consecutive steps,
            # their rows in step order. A run's last slot may hold fewer:
            # its rows past the run's end repeat its last step (their blocks
            # are in use already) and are never handed over.
            total = count * per_slot
            valid = total if end is None else min(total, (end - cursor) // layout.global_batch)
            arrays = layout.slice(cursor, valid)
            if valid < total:
                arrays = tuple(np.concatenate([a, np.repeat(a[-1:], total - valid, axis=0)]) for a in arrays)
            return tuple(a.reshape(count, -1) for a in arrays)

        planner = Planner(
            slice_fn=slice_slots,
            start=spec.start,
            global_batch=spec.slot_batch,
            num_steps=None if spec.num_steps is None else -(-spec.num_steps // per_slot),
            fetch_steps=-(-layout.fetch_steps // per_slot),
            retention_steps=-(-layout.retention_steps // per_slot) + 1,
        )
    return Pipeline(
        planner=planner,
        sources=sources,
        cache=BlockCache(capacity_bytes=layout.memory_bound.cache_bytes),
        ring=ring,
        stats=LoaderStats(),
        seq_len=spec.seq_len,
        prefetch_steps=spec.prefetch_steps,
        num_fetch_threads=spec.num_fetch_threads,
        num_decode_threads=spec.num_decode_threads,
        hash_data=spec.hash_data,
        emit=emit,
        own_stores=own_stores,
    )


class ThreadProducer:
    """The pipeline on threads of this process, over the consumer's open streams.

    Args:
        spec: what to produce.
        sources: the consumer's open streams (shared, not closed here).
        ring: the batch ring.
    """

    pid = None
    """No helper process."""

    def __init__(self, spec: ProducerSpec, *, sources: Sequence[StreamSource], ring: SharedRing) -> None:
        self._pipeline = start_pipeline(spec, sources=sources, ring=ring, own_stores=False)

    def get(self) -> ReadyStep | EndOfData:
        """The next ready step (raises the pipeline's error at the step it hit)."""
        return self._pipeline.get()

    def end_at(self, num_slots: int) -> None:
        """End the run after its first ``num_slots`` slots."""
        self._pipeline.end_at(num_slots)

    def close(self) -> None:
        """Stop every pipeline thread and wait for them."""
        self._pipeline.close()
