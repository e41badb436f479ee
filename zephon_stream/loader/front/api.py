"""``StreamingLoader``: one rank's batches of the global order, resumable anywhere.

The loader's whole state is the global cursor ``P`` (samples the consumers of
all ranks have received) plus the frozen order config; ``state_dict()`` is the
same on every rank and ``load_state_dict()`` seeks in O(1) at any world size.
Batches come from a pipeline (loader/producer/pipeline.py) that runs ahead by
``prefetch_steps`` steps within a computed memory bound, in a helper process
(loader/producer/process_producer.py, loader/producer/helper_main.py) that writes finished rows into a
shared-memory ring (loader/ring/shared_ring.py); this process only takes a slot and hands
its tensors over (loader/delivery/device.py).

Here: construction and shutdown. The steps (the cursor, where each producer
run starts and ends, the audit records) are ``steps.py``; what the loader shows
of itself (shapes, cursor, memory bound, counters) is ``introspection.py``; its
state out and the seek in are ``checkpointing.py``; all three are bases of
``StreamingLoader``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from zephon_stream.loader.blocks.streams import (
    Stream,
    StreamLike,
    StreamSource,
    as_streams,
    open_node_cache,
    open_sources,
)
from zephon_stream.loader.delivery.device import resolve_device
from zephon_stream.loader.front.args import PIPELINE_MODES, check_loader_args, resolve_rank_world
from zephon_stream.loader.front.audit import AuditLog
from zephon_stream.loader.front.checkpointing import LoaderCheckpointing
from zephon_stream.loader.front.introspection import LoaderIntrospection
from zephon_stream.loader.front.steps import LoaderSteps
from zephon_stream.loader.planning.memory import MIB
from zephon_stream.loader.planning.rank_layout import RankLayout
from zephon_stream.loader.planning.schedule import Phase, build_schedule
from zephon_stream.loader.producer.stats import LoaderStats
from zephon_stream.loader.ring.row_documents import PackingSpec
from zephon_stream.loader.runs.feed import BatchFeed
from zephon_stream.loader.runs.phase_layouts import LayoutBook
from zephon_stream.plan import ScheduleOrder

__all__ = ["PIPELINE_MODES", "Phase", "Stream", "StreamingLoader"]

# The helper process's own resident memory (interpreter, numpy,
# zstandard, fsspec and, for S3, s3fs/aiobotocore), measured on CPython 3.11
# at about 47 MiB reading local data and 85 MiB reading S3, cache and ring
# included (tests/test_loader_process.py checks it stays under this).
HELPER_PROCESS_BYTES = 128 * MIB


class StreamingLoader(LoaderSteps, LoaderIntrospection, LoaderCheckpointing):
    """Streams one rank's share of every global batch from local or S3 datasets.

    Iterating yields dicts of ``int64`` tensors: ``input``, ``labels`` and
    ``positions`` of shape ``[local_batch_size, seq_len]`` (``batch_layout="tokens"``:
    1-D, the rows end to end) and ``sample_positions`` (the global position of
    each row) of shape ``[local_batch_size]``. With ``packing_outputs`` also ``segment_ids``,
    ``document_lengths`` (``int32 [local_batch_size, seq_len]``),
    ``cu_seqlens`` (``int32 [local_batch_size * seq_len + 1]``) and the
    CPU scalars ``num_cu_seqlens`` and ``max_seqlen`` (docs/PACKING.md).

    With a ``schedule`` (a list of ``Phase``s, docs/ORDER.md "Schedules")
    each phase brings its own global batch, seq_len, lanes, window and
    weights from its start step on; a rank's rows per step are the phase's
    global batch over the world size, so the batch's shape changes at a
    phase boundary. Without one the loader reads the one-phase schedule of
    its arguments, exactly as it always has.

    Args:
        streams: one stream or a list (a mixture), each a URL or path, ``"url:weight"``, a
            ``Stream``, its fields as a dict or a ``(url, weight)`` pair; else a ``TypeError``.
        seq_len: tokens per sample input ``L`` (without a schedule).
        local_batch_size: rows per step on this rank (without a schedule).
        schedule: phases (``Phase`` or dicts of its fields), the first at step
            0; a phase without weights reads the streams' weights. Then
            ``seq_len``, ``local_batch_size``, ``lanes`` and ``window`` are
            the phases' and may not be passed.
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
            them itself); the other tensors go to the device. They view pinned
            memory, and ``labels.to(device, non_blocking=True)`` is safe: the
            memory is refilled only after the current stream has run past it.
        batch_layout: ``"rows"`` (default) or ``"tokens"``: ``input``, ``labels`` and
            ``positions`` 1-D ``[local_batch_size * seq_len]`` (TorchTitan main's
            form), views made once per ring slot; other keys keep their shapes.
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
        audit_log: path or URL of a JSON-lines audit log, written by rank 0;
            its ``step`` counts from 0, as ``step`` does.
        max_steps: stop after this many global steps (counted from cursor 0).
        max_epochs: stop at the step where stream ``epochs_stream`` has read
            this many whole epochs.
        epochs_stream: the stream ``max_epochs`` counts (default 0).
        end_after_phase: stop at the end of this phase of the schedule.
        cross_document_targets: the label of each input EOS (whose next token
            starts another document): ``"predict"`` (default: that token, the
            plain shifted window) or ``"ignore"`` (-100, as TorchTitan's own
            loader trains). Order and state are the same under both.
        packing_outputs: also deliver each document's extent for packed
            attention kernels (segment ids, ``cu_seqlens``, ``max_seqlen``,
            document lengths); docs/PACKING.md.
        packing: how a block's rows are filled: ``"concat"`` (default:
            windows of the token stream) or ``"best_fit"`` (its documents
            whole, packed by best-fit decreasing; the order, the rows per
            block and resume at any world size are unchanged; the state
            records it); docs/PACKING.md.
        node_cache: where the ranks of one node share the datasets'
            metadata (the manifest, index pages) so that one of them reads
            it from the store: a folder, False for none, or None for the
            default ($ZEPHON_NODE_CACHE, else a private folder under /dev/shm
            when its launcher runs several ranks a node: storage/node_ranks.py).
            Removed by the node's last loader to close.

    Raises:
        ConfigError: an impossible config, or one over ``max_memory_bytes``
            (with a schedule: in any phase this world size can read; a phase
            whose global batch it does not divide is refused when the cursor
            reaches it, naming the phase).
    """

    def __init__(
        self,
        streams: StreamLike | Sequence[StreamLike],
        *,
        seq_len: int | None = None,
        local_batch_size: int | None = None,
        schedule: Sequence[Phase | dict[str, Any]] | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        seed: int = 0,
        lanes: int | None = None,
        window: int | None = None,
        storage_options: dict[str, Any] | None = None,
        device: str | torch.device | None = None,
        host_labels: bool = False,
        batch_layout: str = "rows",
        pipeline: str = "process",
        helper_nice: int = 10,
        prefetch_steps: int = 4,
        max_memory_bytes: int | None = None,
        num_fetch_threads: int = 8,
        num_decode_threads: int = 2,
        audit_log: str | None = None,
        max_steps: int | None = None,
        max_epochs: int | None = None,
        epochs_stream: int = 0,
        end_after_phase: int | None = None,
        cross_document_targets: str = "predict",
        packing_outputs: bool = False,
        packing: str = "concat",
        node_cache: str | bool | None = None,
    ) -> None:
        self.rank, self.world_size = resolve_rank_world(rank, world_size)
        check_loader_args(
            rank=self.rank,
            world_size=self.world_size,
            scheduled=schedule is not None,
            pipeline=pipeline,
            batch_layout=batch_layout,
            seq_len=seq_len,
            local_batch_size=local_batch_size,
            lanes=lanes,
            window=window,
            prefetch_steps=prefetch_steps,
            num_fetch_threads=num_fetch_threads,
            num_decode_threads=num_decode_threads,
            max_steps=max_steps,
            max_epochs=max_epochs,
            epochs_stream=epochs_stream,
            end_after_phase=end_after_phase,
            helper_nice=helper_nice,
        )
        self.pipeline_mode = pipeline
        self.batch_layout = batch_layout
        self.helper_nice = helper_nice
        self.seq_len = seq_len
        self.local_batch_size = local_batch_size
        self.global_batch_size = local_batch_size * self.world_size if schedule is None else None
        self.prefetch_steps = prefetch_steps
        self.num_fetch_threads = num_fetch_threads
        self.num_decode_threads = num_decode_threads
        self.max_steps = max_steps
        self._ends = {
            "max_steps": max_steps,
            "max_epochs": max_epochs,
            "epochs_stream": epochs_stream,
            "end_after_phase": end_after_phase,
        }
        self.max_memory_bytes = max_memory_bytes
        self._explicit_lanes = lanes
        self._explicit_window = window
        self._seed = seed
        self._streams = as_streams(streams)
        self._storage_options = storage_options
        self._stats = LoaderStats()
        self._audit: AuditLog | None = None
        self._feed: BatchFeed | None = None
        self._layout: RankLayout | None = None
        self._schedule: ScheduleOrder | None = None
        self._closed = False
        self._sources: list[StreamSource] = []
        self._node_cache = None
        self._position = 0
        self._end_for: RankLayout | None = None
        self._end_position: int | None = None
        self._steady_until: float = 0  # The cursor the short way to a step stops at
        try:
            self.packing = PackingSpec(
                cross_document_targets=cross_document_targets, outputs=packing_outputs, rows=packing
            )
            # Construction reads straight through, each stage handing
            # its output on: streams -> phases -> layouts -> ring, delivery
            # and helper (the feed).
            self._node_cache = open_node_cache(node_cache)
            self._sources = open_sources(self._streams, storage_options, self._node_cache)
            self._schedule = build_schedule(schedule, self._streams, self._sources, seed=seed, ends=self._ends)
            self.device = resolve_device(device)
            self._book = LayoutBook(
                sources=self._sources,
                weights=tuple(s.weight for s in self._streams),
                seed=seed,
                world_size=self.world_size,
                rank=self.rank,
                device=self.device,
                host_keys=("labels",) if host_labels and self.device.type == "cuda" else (),
                token_dtype=np.result_type(*(s.dtype for s in self._sources)).newbyteorder("<").str,
                prefetch_steps=prefetch_steps,
                num_fetch_threads=num_fetch_threads,
                num_decode_threads=num_decode_threads,
                helper_bytes=HELPER_PROCESS_BYTES if pipeline == "process" else 0,
                handover=pipeline == "process" or self._schedule is not None,
                share_slots=audit_log is None or self.rank != 0,
                batch_layout=batch_layout,
                schedule=self._schedule,
                packing=self.packing,
            )
            first = self._book.first_layout(
                seq_len=seq_len,
                global_batch=self.global_batch_size,
                lanes=lanes,
                window=window,
                max_memory_bytes=max_memory_bytes,
            )
            if first is not None:
                self._use_layout(first)
            self._book.begin_history(0, first.global_batch if first else self._schedule.phases[0].global_batch)
            self._feed = BatchFeed(
                book=self._book,
                streams=self._streams,
                storage_options=storage_options,
                pipeline_mode=pipeline,
                helper_nice=helper_nice,
                first_layout=first,
                node_cache_root=None if self._node_cache is None else self._node_cache.root,
            )
            if audit_log is not None and self.rank == 0:
                self._audit = AuditLog(audit_log, header=self._audit_header(), storage_options=storage_options)
        except BaseException:
            self.close()
            raise

    # -- configuration ---------------------------------------------------------

    def _use_layout(self, layout: RankLayout) -> None:
        """Read ``layout`` from now on (with a schedule: a phase's), with its shapes."""
        self._layout = layout
        self.global_batch_size = layout.global_batch
        self.local_batch_size = layout.global_batch // self.world_size
        self.seq_len = layout.order.config.seq_len

    def _enter_phase(self, index: int) -> None:
        """Read phase ``index`` from now on."""
        self._use_layout(self._book.for_phase(index))

    def _audit_header(self) -> dict[str, Any]:
        state = self._book.state(0, self._layout)
        state.pop("position")
        return {"state": state, "urls": [s.url for s in self._sources]}

    # -- shutdown ----------------------------------------------------------------

    def close(self) -> None:
        """Stop the helper process (or threads) and release stores, files,
        the ring and its pinned registration (idempotent). CPU batches the
        consumer still holds stay valid: they keep the ring's memory mapped
        until the last of them is dropped."""
        if self._closed:
            return
        self._closed = True
        if self._feed is not None:
            self._feed.close()
        if self._audit is not None:
            self._audit.close()
            self._audit = None
        for source in self._sources:
            source.close()
        node_cache, self._node_cache = getattr(self, "_node_cache", None), None
        if node_cache is not None:
            node_cache.close()

    def __del__(self) -> None:
        # A loader dropped without close() must not leave its helper or
        # threads running; they hold no reference back to it.
        try:
            self.close()
        except Exception:  # noqa: BLE001 - nothing useful to do at collection time
            pass

    def __iter__(self) -> StreamingLoader:
        return self

    def __enter__(self) -> StreamingLoader:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()
