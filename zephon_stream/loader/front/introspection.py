"""What a ``StreamingLoader`` shows of itself: shapes, cursor, order,
schedule, memory bound, counters and the parts behind it (for inspection).

``LoaderIntrospection`` is a base of ``api.StreamingLoader``; it only reads
the attributes the loader's construction and steps set.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from zephon_stream.loader.delivery.device import CpuDelivery, CudaDelivery
from zephon_stream.loader.planning.memory import MemoryBound
from zephon_stream.loader.ring.shared_ring import SharedRing
from zephon_stream.plan import GlobalOrder, ScheduleOrder

if TYPE_CHECKING:
    from zephon_stream.loader.blocks.streams import StreamSource
    from zephon_stream.loader.planning.rank_layout import RankLayout
    from zephon_stream.loader.producer.stats import LoaderStats
    from zephon_stream.loader.runs.feed import BatchFeed
    from zephon_stream.loader.runs.phase_layouts import LayoutBook

__all__ = ["LoaderIntrospection"]


class LoaderIntrospection:
    """The loader's read-only views and counters (mixed into ``StreamingLoader``)."""

    # What these views read, set by ``StreamingLoader``'s construction and steps.
    rank: int
    world_size: int
    seq_len: int | None
    local_batch_size: int | None
    _book: LayoutBook
    _feed: BatchFeed | None
    _layout: RankLayout | None
    _schedule: ScheduleOrder | None
    _sources: list[StreamSource]
    _stats: LoaderStats
    _position: int

    @property
    def memory_bound_bytes(self) -> int:
        """The most host memory this loader's pipeline holds at once (bytes)."""
        return self.memory_bound.total_bytes

    @property
    def memory_bound(self) -> MemoryBound:
        """The memory bound by part (with a schedule: of the phase that needs the most)."""
        if self._schedule is None:
            return self._layout.memory_bound
        return self._book.largest_bound()

    @property
    def delivery(self) -> CpuDelivery | CudaDelivery:
        """The delivery that hands batches over (read-only; for inspection).

        On CUDA it holds the ring's pinned registration and the copy stream
        (``slots_pinned()``, ``copy_stream``).
        """
        return self._feed.delivery

    @property
    def ring(self) -> SharedRing:
        """The batch ring shared with the producer (read-only; for inspection)."""
        assert self._feed.ring is not None
        return self._feed.ring

    @property
    def helper_pid(self) -> int | None:
        """The helper process's id while one runs, else None."""
        producer = self._feed.producer if self._feed is not None else None
        return producer.pid if producer is not None else None

    @property
    def manifests(self) -> list[tuple[str, Any]]:
        """``(url, metadata)`` of each stream: its manifest's fields (``tokenizer``,
        ``fingerprint``, ...), block look-ups, and ``.manifest`` for every entry."""
        return [(s.url, s.manifest) for s in self._sources]

    @property
    def position(self) -> int:
        """The global cursor ``P``: samples all ranks' consumers have received."""
        return self._position

    @property
    def lanes(self) -> int:
        """Lanes ``C`` of the order in use (with a schedule: of the current phase)."""
        return self.order.lanes

    @property
    def order(self) -> GlobalOrder:
        """The global order this loader reads (with a schedule: the current
        phase's; see ``schedule``) (for provenance and tests)."""
        return self._book.order_at(self._position, self._layout)

    @property
    def schedule(self) -> ScheduleOrder | None:
        """The schedule's order (plan layer), or None without a schedule."""
        return self._schedule

    @property
    def phase(self) -> int:
        """The phase the next step belongs to (0 without a schedule)."""
        return 0 if self._schedule is None else self._schedule.phase_at_position(self._position).index

    @property
    def step(self) -> int:
        """The global step the next batch belongs to, counted from 0: the
        number of steps consumed before it (the audit log's ``step``, what
        ``zephon-stream which --step`` takes)."""
        return self._book.step_of(self._position, self._layout)

    def progress(self) -> list[dict[str, Any]]:
        """Per-stream progress (phase, epoch, samples consumed) at the current cursor."""
        return self._book.progress(self._position, self._layout)

    def stats(self) -> dict[str, Any]:
        """Counters of the whole run since construction, across phase
        boundaries, seeks and helper restarts: steps, samples, stall time
        (the consumer waiting) and their per-step averages; bytes and blocks
        fetched and decoded, cache hits and misses, retries, throttling
        answers (``throttled``, apart from ``retries``), the attempts that
        waited for their turn from the store's request-rate limiter and for
        how long (``throttle_waits``, ``throttle_wait_s``), fetch/decode/assemble
        time; and the block cache's current bytes, capacity and the
        peak any producer run held."""
        producer = self._feed.counters() if self._feed is not None else {}
        producer.pop("producer_steps", None)
        snapshot = self._stats.snapshot(
            memory_bound_bytes=self.memory_bound_bytes if self._layout is not None else 0,
            position=self._position if hasattr(self, "_position") else 0,
        )
        snapshot.update(producer)
        steps = max(1, snapshot["steps"])
        snapshot["bytes_fetched_per_step"] = snapshot.get("bytes_fetched", 0) / steps
        return snapshot

    def __repr__(self) -> str:
        urls = ", ".join(s.url for s in self._sources)
        phases = "" if self._schedule is None else f", phases={len(self._schedule.phases)}"
        return (
            f"StreamingLoader([{urls}], seq_len={self.seq_len}, local_batch_size={self.local_batch_size}{phases}, "
            f"rank={self.rank}, world_size={self.world_size}, position={self._position})"
        )
