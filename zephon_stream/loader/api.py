"""``StreamingLoader``: one rank's batches of the global order, resumable anywhere.

The loader's whole state is the global cursor ``P`` (samples the consumers of
all ranks have received) plus the frozen order config; ``state_dict()`` is the
same on every rank and ``load_state_dict()`` seeks in O(1) at any world size.
Batches come from a pipeline (loader/pipeline.py) that runs ahead by
``prefetch_steps`` steps within a computed memory bound, in a helper process
(loader/process.py, loader/helper.py) that writes finished rows into a
shared-memory ring (loader/ring.py); this process only takes a slot and hands
its tensors over (loader/device.py).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from zephon_stream.errors import ConfigError
from zephon_stream.loader.audit import AuditLog, addresses_sha256
from zephon_stream.loader.device import CpuDelivery, CudaDelivery, make_delivery, resolve_device, ring_slots, ring_wide_keys
from zephon_stream.loader.layout import RankLayout
from zephon_stream.loader.memory import MIB, MemoryBound
from zephon_stream.loader.pipeline import EndOfData, hand_back, reset_returned
from zephon_stream.loader.process import ProcessProducer
from zephon_stream.loader.producer import ProducerSpec, ThreadProducer
from zephon_stream.loader.ring import SharedRing, SlotLayout
from zephon_stream.loader.stats import LoaderStats, read_counters
from zephon_stream.loader.streams import Stream, StreamSource, as_streams
from zephon_stream.plan import GlobalOrder, LoaderState

__all__ = ["PIPELINE_MODES", "Stream", "StreamingLoader"]

PIPELINE_MODES = ("process", "threads")
# NOTE: the helper process's own resident memory (interpreter, numpy,
# zstandard, fsspec and, for S3, s3fs/aiobotocore), measured on CPython 3.11
# at about 47 MiB reading local data and 85 MiB reading S3, cache and ring
# included (tests/test_loader_process.py checks it stays under this).
HELPER_PROCESS_BYTES = 128 * MIB


def _default_rank_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    if rank is not None and world_size is not None:
        return int(rank), int(world_size)
    if rank is not None or world_size is not None:
        raise ConfigError(f"pass both rank and world_size or neither (got rank={rank}, world_size={world_size})")
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


class StreamingLoader:
    """Streams one rank's share of every global batch from local or S3 datasets.

    Iterating yields dicts of ``int64`` tensors: ``input``, ``labels`` and
    ``positions`` of shape ``[local_batch_size, seq_len]`` and
    ``sample_positions`` (the global position of each row) of shape
    ``[local_batch_size]``.

    Args:
        streams: a dataset URL, a list of URLs, or ``Stream(url, weight=...)``s.
        seq_len: tokens per sample input ``L``.
        local_batch_size: rows per step on this rank.
        rank: this rank (default: torch.distributed's, else 0).
        world_size: ranks reading the global batch (default: torch.distributed's, else 1).
        seed: order seed.
        lanes: lanes ``C`` (default: the global batch; a loaded state's
            lanes win when this is left unset).
        window: window-shuffle samples (default 0: one block's samples; a
            loaded state's window wins when left unset).
        storage_options: fsspec options (credentials, endpoint); never shown.
        device: ``"cpu"`` (default) or ``"cuda[:i]"``: token ids cross to the
            device at their stored width from the pinned ring, on a side
            stream, and are widened there; CUDA falls back to CPU when absent.
        host_labels: with CUDA, deliver ``labels`` as a CPU ``int64`` tensor
            (TorchTitan's trainer counts valid labels on the CPU and moves
            them itself); the other tensors go to the device.
        pipeline: ``"process"`` (default): fetch, decode and assembly run in
            a helper process writing into a shared-memory ring, outside this
            interpreter; ``"threads"``: on threads of this process (debugging).
        helper_nice: niceness added to the helper process (default 10), so
            that on a core it shares with the trainer the trainer runs first
            and the helper works ahead in the time left over; 0 makes them
            equals (for a host whose cores are all busy with other work).
        prefetch_steps: batches assembled ahead of the consumer; blocks are
            fetched that many steps further ahead.
        max_memory_bytes: refuse configs whose memory bound exceeds this.
        num_fetch_threads: concurrent storage reads.
        num_decode_threads: concurrent zstd decodes.
        audit_log: path or URL of a JSON-lines audit log, written by rank 0.
        max_steps: stop after this many global steps (counted from cursor 0).

    Raises:
        ConfigError: an impossible config, or one over ``max_memory_bytes``.
    """

    def __init__(
        self,
        streams: str | Stream | Sequence[str | Stream],
        *,
        seq_len: int,
        local_batch_size: int,
        rank: int | None = None,
        world_size: int | None = None,
        seed: int = 0,
        lanes: int | None = None,
        window: int | None = None,
        storage_options: dict[str, Any] | None = None,
        device: str | torch.device | None = None,
        host_labels: bool = False,
        pipeline: str = "process",
        helper_nice: int = 10,
        prefetch_steps: int = 4,
        max_memory_bytes: int | None = None,
        num_fetch_threads: int = 8,
        num_decode_threads: int = 2,
        audit_log: str | None = None,
        max_steps: int | None = None,
    ) -> None:
        self.rank, self.world_size = _default_rank_world(rank, world_size)
        for name, value, low in (
            ("seq_len", seq_len, 1),
            ("local_batch_size", local_batch_size, 1),
            ("world_size", self.world_size, 1),
            ("prefetch_steps", prefetch_steps, 1),
            ("num_fetch_threads", num_fetch_threads, 1),
            ("num_decode_threads", num_decode_threads, 1),
        ):
            if not isinstance(value, int) or value < low:
                raise ConfigError(f"{name} must be an int >= {low} (got {value!r})")
        if not 0 <= self.rank < self.world_size:
            raise ConfigError(f"rank {self.rank} is outside world_size {self.world_size}")
        if max_steps is not None and max_steps < 0:
            raise ConfigError(f"max_steps must be >= 0 (got {max_steps})")
        if pipeline not in PIPELINE_MODES:
            raise ConfigError(f"pipeline must be one of {PIPELINE_MODES} (got {pipeline!r})")
        self.pipeline_mode = pipeline
        if not isinstance(helper_nice, int) or not 0 <= helper_nice <= 19:
            raise ConfigError(f"helper_nice must be an int in [0, 19] (got {helper_nice!r})")
        self.helper_nice = helper_nice
        self.seq_len = seq_len
        self.local_batch_size = local_batch_size
        self.global_batch_size = local_batch_size * self.world_size
        self.prefetch_steps = prefetch_steps
        self.num_fetch_threads = num_fetch_threads
        self.num_decode_threads = num_decode_threads
        self.max_steps = max_steps
        self.max_memory_bytes = max_memory_bytes
        self._explicit_lanes = lanes
        self._explicit_window = window
        self._seed = seed
        self._streams = as_streams(streams)
        self._storage_options = storage_options
        self._stats = LoaderStats()
        self._producer: ProcessProducer | ThreadProducer | None = None
        self._spare_helper: ProcessProducer | None = None
        self._audit: AuditLog | None = None
        self._ring: SharedRing | None = None
        self._closed = False
        self._sources: list[StreamSource] = []
        try:
            for index, stream in enumerate(self._streams):
                self._sources.append(StreamSource(index=index, stream=stream, storage_options=storage_options))
            self.device = resolve_device(device)
            host_keys = ("labels",) if host_labels and self.device.type == "cuda" else ()
            token_dtype = np.result_type(*(s.dtype for s in self._sources)).newbyteorder("<")
            self._ring = SharedRing.create(
                num_slots=ring_slots(self.device, prefetch_steps),
                layout=SlotLayout(
                    rows=local_batch_size,
                    seq_len=seq_len,
                    token_dtype=token_dtype.str,
                    wide_keys=ring_wide_keys(self.device, host_keys),
                ),
            )
            self._layout = self._make_layout(lanes=lanes, window=window)
            self._delivery = make_delivery(self.device, ring=self._ring, host_keys=host_keys)
            self._position = 0
            if audit_log is not None and self.rank == 0:
                self._audit = AuditLog(audit_log, header=self._audit_header(), storage_options=storage_options)
            if self.pipeline_mode == "process":
                # NOTE: started now, so that its interpreter loads while the
                # trainer builds its model; it gets its work at the first step.
                self._spare_helper = ProcessProducer()
        except BaseException:
            self.close()
            raise

    # -- configuration ---------------------------------------------------------

    def _make_layout(self, *, lanes: int | None, window: int | None) -> RankLayout:
        layout = RankLayout(
            sources=self._sources,
            seed=self._seed,
            seq_len=self.seq_len,
            lanes=self.global_batch_size if lanes is None else lanes,
            window=0 if window is None else window,
            weights=tuple(s.weight for s in self._streams),
            global_batch=self.global_batch_size,
            world_size=self.world_size,
            rank=self.rank,
            fetch_steps=self.prefetch_steps,
            num_fetch_threads=self.num_fetch_threads,
            num_decode_threads=self.num_decode_threads,
            ring_bytes=self._ring.nbytes,
            helper_bytes=HELPER_PROCESS_BYTES if self.pipeline_mode == "process" else 0,
        )
        layout.check_memory(self.max_memory_bytes)
        return layout

    @property
    def memory_bound_bytes(self) -> int:
        """The most host memory this loader's pipeline holds at once (bytes)."""
        return self._layout.memory_bound.total_bytes

    @property
    def memory_bound(self) -> MemoryBound:
        """The memory bound by part."""
        return self._layout.memory_bound

    @property
    def delivery(self) -> CpuDelivery | CudaDelivery:
        """The delivery that hands batches over (read-only; for inspection).

        On CUDA it holds the ring's pinned registration and the copy stream
        (``slots_pinned()``, ``copy_stream``).
        """
        return self._delivery

    @property
    def ring(self) -> SharedRing:
        """The batch ring shared with the producer (read-only; for inspection)."""
        assert self._ring is not None
        return self._ring

    @property
    def helper_pid(self) -> int | None:
        """The helper process's id while one runs, else None."""
        return self._producer.pid if self._producer is not None else None

    @property
    def manifests(self) -> list[tuple[str, Any]]:
        """``(url, Manifest)`` of each stream."""
        return [(s.url, s.manifest) for s in self._sources]

    @property
    def position(self) -> int:
        """The global cursor ``P``: samples all ranks' consumers have received."""
        return self._position

    @property
    def lanes(self) -> int:
        """Lanes ``C`` of the order in use."""
        return self._layout.order.lanes

    @property
    def order(self) -> GlobalOrder:
        """The global order this loader reads (for provenance and tests)."""
        return self._layout.order

    def progress(self) -> list[dict[str, Any]]:
        """Per-stream progress (epoch, samples consumed) at the current cursor."""
        return self._layout.order.progress(self._position)

    def _audit_header(self) -> dict[str, Any]:
        state = self._layout.order.state(0).to_dict()
        state.pop("position")
        return {"state": state, "urls": [s.url for s in self._sources]}

    # -- torch Stateful ----------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The global state (plain ints, strings and lists), equal on every rank."""
        return self._layout.order.state(self._position).to_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Seek to a saved state in O(1), at this loader's world size.

        Lanes and window left unset in the constructor are taken from the
        state; everything else must match.

        Raises:
            StateMismatchError: naming each field that differs, with both values.
            VersionError: a state version this code does not read.
        """
        state = LoaderState.from_dict(dict(state_dict))
        lanes = state.lanes if self._explicit_lanes is None else self._explicit_lanes
        window = state.window if self._explicit_window is None else self._explicit_window
        if (lanes, window) != (self._layout.order.lanes, self._layout.order.config.window):
            self._layout = self._make_layout(lanes=lanes, window=window)
        state.validate(self._layout.order.state(0))
        self._stop_producer()
        self._position = state.position

    # -- iteration -------------------------------------------------------------

    def __iter__(self) -> StreamingLoader:
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        if self._closed:
            raise RuntimeError("StreamingLoader is closed")
        if self._producer is None:
            self._producer = self._start_producer()
        for slot in self._delivery.reclaim():
            hand_back(self._ring, slot)
        started = time.perf_counter()
        ready = self._producer.get()
        if isinstance(ready, EndOfData):
            raise StopIteration
        batch = self._delivery.deliver(ready.slot)
        stall_s = time.perf_counter() - started
        assert ready.cursor == self._position, (ready.cursor, self._position)
        self._position += self.global_batch_size
        self._stats.record_step(samples=self.local_batch_size, stall_s=stall_s)
        if self._audit is not None:
            self._audit.append(self._audit_record(ready.cursor, ready.data_sha256))
        return batch

    def _audit_record(self, cursor: int, data_sha256: str) -> dict[str, Any]:
        order = self._layout.order
        positions = torch.arange(cursor, cursor + self.global_batch_size).numpy()
        return {
            "step": cursor // self.global_batch_size,
            "cursor": cursor,
            "addresses_sha256": addresses_sha256(positions, *order.sample_at(positions)),
            "data_sha256": data_sha256,
            "world_size": self.world_size,
            "local_batch_size": self.local_batch_size,
        }

    def _start_producer(self) -> ProcessProducer | ThreadProducer:
        num_steps = None
        if self.max_steps is not None:
            end = self.max_steps * self.global_batch_size
            num_steps = max(0, -(-(end - self._position) // self.global_batch_size))
        assert self._ring is not None
        spec = ProducerSpec(
            layout=self._layout,
            streams=tuple(self._streams),
            manifests=tuple(s.manifest for s in self._sources),
            storage_options=self._storage_options,
            start=self._position,
            num_steps=num_steps,
            seq_len=self.seq_len,
            prefetch_steps=self.prefetch_steps,
            num_fetch_threads=self.num_fetch_threads,
            num_decode_threads=self.num_decode_threads,
            hash_data=self._audit is not None,
            num_slots=self._ring.num_slots,
            slot_layout=self._ring.layout,
            helper_nice=self.helper_nice,
        )
        reset_returned(self._ring, self._delivery.settle())
        if self.pipeline_mode == "threads":
            return ThreadProducer(spec, sources=self._sources, ring=self._ring)
        producer, self._spare_helper = self._spare_helper or ProcessProducer(), None
        producer.start(spec, ring=self._ring)
        return producer

    def _stop_producer(self) -> None:
        if self._producer is not None:
            self._producer.close()
            self._producer = None

    # -- counters and shutdown ---------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counters since construction: steps, samples, stall time (the
        consumer waiting) and their per-step averages; and, from the producer
        since its last start or seek: bytes and blocks fetched and decoded,
        cache hits and misses, retries, fetch/decode/assemble time, and the
        block cache's current and peak bytes."""
        producer = read_counters(self._ring.counters) if self._ring is not None else {}
        producer.pop("producer_steps", None)
        snapshot = self._stats.snapshot(
            memory_bound_bytes=self.memory_bound_bytes if hasattr(self, "_layout") else 0,
            position=self._position if hasattr(self, "_position") else 0,
        )
        snapshot.update(producer)
        steps = max(1, snapshot["steps"])
        snapshot["bytes_fetched_per_step"] = snapshot.get("bytes_fetched", 0) / steps
        return snapshot

    def close(self) -> None:
        """Stop the helper process (or threads) and release stores, files,
        the ring and its pinned registration (idempotent). CPU batches the
        consumer still holds stay valid: they keep the ring's memory mapped
        until the last of them is dropped."""
        if self._closed:
            return
        self._closed = True
        self._stop_producer()
        if self._spare_helper is not None:
            self._spare_helper.close()
            self._spare_helper = None
        if self._audit is not None:
            self._audit.close()
            self._audit = None
        delivery = getattr(self, "_delivery", None)
        if delivery is not None:
            delivery.close()
        if self._ring is not None:
            self._ring.close()
        for source in self._sources:
            source.close()

    def __del__(self) -> None:
        # NOTE: a loader dropped without close() must not leave its helper or
        # threads running; they hold no reference back to it.
        try:
            self.close()
        except Exception:  # noqa: BLE001 - nothing useful to do at collection time
            pass

    def __enter__(self) -> StreamingLoader:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        urls = ", ".join(s.url for s in self._sources)
        return (
            f"StreamingLoader([{urls}], seq_len={self.seq_len}, local_batch_size={self.local_batch_size}, "
            f"rank={self.rank}, world_size={self.world_size}, position={getattr(self, '_position', 0)})"
        )
