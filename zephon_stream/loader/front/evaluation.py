"""``EvalLoader``: one rank's rows of an evaluation pass over held-out datasets.

The order is the plan's ``EvalOrder`` (docs/ORDER.md, "Evaluation"): no
shuffle, every sample exactly once per pass over all ranks, the last step
padded to the global batch. Padding rows hold a real sample (so they are read
like any other) with ``labels = -100`` and ``mask = False``: they must not
count in the metrics. A padding row is one document (``positions`` 0 to
``L - 1``, and one segment in the document outputs), so no real token's
attention reaches it whatever mask is built from the batch.

The pass runs the same fetch/decode/cache/assemble pipeline as training,
on threads of this process rather than a helper: a held-out set is small and
read now and then, and the helper's start-up would cost more than it saves.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from zephon_stream.errors import ConfigError
from zephon_stream.loader.blocks.cache import BlockCache
from zephon_stream.loader.blocks.streams import StreamLike, StreamSource, as_streams, stream_shapes
from zephon_stream.loader.front.args import resolve_rank_world
from zephon_stream.loader.planning.planner import Planner
from zephon_stream.loader.producer.pipeline import EndOfData, Pipeline
from zephon_stream.loader.producer.stats import LoaderStats
from zephon_stream.loader.ring.free_slots import hand_back, reset_returned
from zephon_stream.loader.ring.row_documents import IGNORE_INDEX, PackingSpec, PackingWriter
from zephon_stream.loader.ring.shared_ring import WIDE_KEYS, SharedRing, SlotLayout
from zephon_stream.plan import EvalOrder


class EvalLoader:
    """Iterating gives one pass: ``ceil(N / global_batch)`` steps on every rank.

    Each batch is a dict of ``input``, ``labels``, ``positions``
    (``int64 [local_batch_size, seq_len]``), ``sample_positions`` (the
    evaluation index of each row, ``>= num_samples`` on padding) and ``mask``
    (``bool [local_batch_size]``, False on padding rows, whose labels are all
    ``-100``). With ``packing_outputs``, the document outputs of
    ``StreamingLoader`` too (docs/PACKING.md), a padding row being one
    segment. Iterating again starts a new pass, reading the same rows.

    Args:
        streams: the held-out dataset URL(s) or ``Stream``s (weights are ignored).
        seq_len: tokens per sample input.
        local_batch_size: rows per step on this rank.
        rank, world_size: this rank (default: torch.distributed's, else 0 of 1).
        storage_options: fsspec options; never shown.
        prefetch_steps: steps assembled ahead of the consumer.
        num_fetch_threads, num_decode_threads: concurrent reads and decodes.
        cross_document_targets: ``"predict"`` (default) or ``"ignore"`` (the
            label of each input EOS is -100), as for ``StreamingLoader``.
        packing_outputs: also deliver segment ids, ``cu_seqlens``,
            ``max_seqlen`` and document lengths.
        packing: ``"concat"`` (default) or ``"best_fit"`` (rows of whole
            documents), as for ``StreamingLoader``; an evaluation compared
            with a training loss reads the rows that training reads.

    Raises:
        ConfigError: a bad size, or datasets without a sample of ``seq_len``.
    """

    def __init__(
        self,
        streams: StreamLike | Sequence[StreamLike],
        *,
        seq_len: int,
        local_batch_size: int,
        rank: int | None = None,
        world_size: int | None = None,
        storage_options: dict[str, Any] | None = None,
        prefetch_steps: int = 2,
        num_fetch_threads: int = 4,
        num_decode_threads: int = 2,
        cross_document_targets: str = "predict",
        packing_outputs: bool = False,
        packing: str = "concat",
    ) -> None:
        self.rank, self.world_size = resolve_rank_world(rank, world_size)
        for name, value in (
            ("seq_len", seq_len),
            ("local_batch_size", local_batch_size),
            ("prefetch_steps", prefetch_steps),
        ):
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be an int >= 1 (got {value!r})")
        self.seq_len = seq_len
        self.local_batch_size = local_batch_size
        self.global_batch_size = local_batch_size * self.world_size
        self._sizes = (prefetch_steps, num_fetch_threads, num_decode_threads)
        self._sources: list[StreamSource] = []
        self._ring: SharedRing | None = None
        self.packing = PackingSpec(cross_document_targets=cross_document_targets, outputs=packing_outputs, rows=packing)
        try:
            for index, stream in enumerate(as_streams(streams)):
                self._sources.append(StreamSource(index=index, stream=stream, storage_options=storage_options))
            self.order = EvalOrder(stream_shapes(self._sources), seq_len)
            token_dtype = np.result_type(*(s.dtype for s in self._sources)).newbyteorder("<").str
            self._ring = SharedRing.create(
                num_slots=prefetch_steps + 2,
                layout=SlotLayout(
                    rows=local_batch_size,
                    seq_len=seq_len,
                    token_dtype=token_dtype,
                    wide_keys=WIDE_KEYS,
                    packing=self.packing,
                ),
            )
        except BaseException:
            self.close()
            raise

    @property
    def manifests(self) -> list[tuple[str, Any]]:
        """``(url, metadata)`` of each held-out dataset: its manifest's fields (``tokenizer``,
        ``fingerprint``, ...), block look-ups, and ``.manifest`` for every entry."""
        return [(s.url, s.manifest) for s in self._sources]

    @property
    def num_samples(self) -> int:
        """Samples in one pass (over all ranks, padding excluded)."""
        return self.order.num_samples

    @property
    def num_steps(self) -> int:
        """Steps of one pass, the same on every rank."""
        return self.order.num_steps(self.global_batch_size)

    def _slice(self, cursor: int, steps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        first = cursor // self.global_batch_size
        pieces = [
            self.order.rank_slice(first + k, self.global_batch_size, self.world_size, self.rank) for k in range(steps)
        ]
        return tuple(np.stack([getattr(p, name) for p in pieces]) for name in ("indices", "stream", "block", "sample"))

    def _pipeline(self) -> Pipeline:
        prefetch_steps, num_fetch_threads, num_decode_threads = self._sizes
        planner = Planner(
            slice_fn=self._slice,
            start=0,
            global_batch=self.global_batch_size,
            num_steps=self.num_steps,
            fetch_steps=prefetch_steps,
            retention_steps=prefetch_steps + 1,
        )
        # A rank's rows of a step are consecutive samples, so a step
        # touches at most rows / samples-per-block + 2 blocks.
        spb = max(1, min(s.manifest.block_tokens - 1 for s in self._sources) // self.seq_len)
        blocks = (self.local_batch_size // spb + 2) * (prefetch_steps + 2) + num_fetch_threads + num_decode_threads
        block_bytes = max(s.full_block_bytes(self.seq_len if self.packing.best_fit else 0) for s in self._sources)
        assert self._ring is not None
        reset_returned(self._ring, ())
        return Pipeline(
            planner=planner,
            sources=self._sources,
            cache=BlockCache(capacity_bytes=blocks * block_bytes),
            ring=self._ring,
            stats=LoaderStats(),
            seq_len=self.seq_len,
            prefetch_steps=prefetch_steps,
            num_fetch_threads=num_fetch_threads,
            num_decode_threads=num_decode_threads,
        )

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        if self._ring is None:
            raise RuntimeError("EvalLoader is closed")
        pipeline = self._pipeline()
        try:
            while True:
                ready = pipeline.get()
                if isinstance(ready, EndOfData):
                    return
                slot = self._ring.slot(ready.slot)
                arrays = {**slot.wide, "sample_positions": slot.sample_positions, **slot.packing}
                batch = {key: torch.from_numpy(array.copy()) for key, array in arrays.items()}
                eos = slot.eos.copy()
                del slot, arrays
                hand_back(self._ring, ready.slot)
                mask = batch["sample_positions"] < self.num_samples
                if not mask.all():
                    self._pad_rows(batch, ~mask, eos)
                batch["mask"] = mask
                yield batch
        finally:
            pipeline.close()

    def _pad_rows(self, batch: dict[str, torch.Tensor], padding: torch.Tensor, eos: np.ndarray) -> None:
        """Make the ``padding`` rows count for nothing: labels -100, each row one document."""
        batch["labels"][padding] = IGNORE_INDEX
        batch["positions"][padding] = torch.arange(self.seq_len, dtype=torch.int64)
        if self.packing.outputs:
            inputs = batch["input"].numpy()
            hits = np.flatnonzero(inputs == eos[:, None])
            hits = hits[~padding.numpy()[hits // self.seq_len]]
            writer = PackingWriter(spec=self.packing, seq_len=self.seq_len, rows=self.local_batch_size)
            outputs = {
                key: batch[key].numpy()
                for key in ("segment_ids", "document_lengths", "cu_seqlens", "num_cu_seqlens", "max_seqlen")
            }
            writer.write(hits, row_width=self.seq_len, labels=None, outputs=outputs)

    def close(self) -> None:
        """Release the ring and the stores (idempotent)."""
        if self._ring is not None:
            self._ring.close()
            self._ring = None
        for source in self._sources:
            source.close()
        self._sources = []

    def __enter__(self) -> EvalLoader:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()
