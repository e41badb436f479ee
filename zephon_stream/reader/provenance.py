"""Provenance: which datasets, shards, blocks and source documents a step read.

Everything is derived from the manifests and the order configuration, as the
loader derives it: no log of the run is needed. Reading block tokens (for
``text``, and to lay out best-fit rows) and document-index sidecars goes
through ``DatasetReader``. Under ``packing="best_fit"`` a sample is a row of
pieces, each named by its document (``provenance_rows.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from zephon_stream.errors import ConfigError
from zephon_stream.plan import (
    GlobalOrder,
    OrderConfig,
    ScheduleOrder,
    SchedulePhase,
    StreamShape,
    rank_positions,
    step_positions,
)
from zephon_stream.plan.packing import PACKINGS
from zephon_stream.reader.dataset import DatasetReader
from zephon_stream.reader.provenance_rows import DocumentPart, LabelToken, PackedBlock, RowPiece, plain_fields


@dataclass(frozen=True, slots=True)
class SampleProvenance:
    """Where one sample of the global order came from.

    Attributes:
        position: global position of the sample.
        rank: rank that reads it (``None`` when no world size was given).
        stream: stream index in the mixture.
        dataset: URL of that stream's dataset.
        shard: shard index; ``shard_path`` its path in the dataset.
        block: global block id in the dataset; ``block_in_shard`` its index in the shard.
        sample: sample index in the block (under ``concat`` its tokens start
            at ``sample * seq_len``; under ``best_fit`` it is the block's row).
        token_start: global offset of the sample's first token in the dataset
            (``None`` under ``best_fit``: a row is not one stretch of tokens).
        num_tokens: tokens in the sample (``seq_len + 1``).
        documents: under ``concat``, the source documents the sample's tokens
            belong to (``DocumentPart``); under ``best_fit``, the row's pieces
            in row order (``RowPiece``), covering its inputs ``[0, seq_len)``.
        text: the decoded sample when asked for, else ``None`` (under
            ``best_fit``, the packed row as the loader delivers it).
        packing: how the block's rows are filled (``plan.PACKINGS``).
        label: under ``best_fit``, the row's last token (the label of its last
            input); ``None`` under ``concat``, where ``documents`` cover it.
    """

    position: int
    rank: int | None
    stream: int
    dataset: str
    shard: int
    shard_path: str
    block: int
    block_in_shard: int
    sample: int
    token_start: int | None
    num_tokens: int
    documents: tuple[DocumentPart | RowPiece, ...]
    text: str | None
    packing: str = "concat"
    label: LabelToken | None = None

    def to_dict(self) -> dict:
        """Plain values, for JSON (``packing`` and ``label`` only under ``best_fit``)."""
        out = {name: getattr(self, name) for name in self.__slots__}
        out["documents"] = [plain_fields(d) for d in self.documents]
        if self.packing == "concat":
            # Concat's objects are what scripts read before packings
            # existed (tests/data/format-1.0-which.json): keys are only added.
            del out["packing"], out["label"]
        else:
            out["label"] = plain_fields(self.label)
        return out


def shapes_of(readers: Sequence[DatasetReader]) -> list[StreamShape]:
    """One ``StreamShape`` per dataset, from its manifest."""
    return [
        StreamShape.from_counts(
            r.manifest.fingerprint, r.manifest.block_tokens, r.manifest.block_token_counts(), name=r.url
        )
        for r in readers
    ]


def order_for(readers: Sequence[DatasetReader], config: OrderConfig) -> GlobalOrder:
    """The global order over these datasets, as the loader builds it."""
    return GlobalOrder(shapes_of(readers), config)


def schedule_for(readers: Sequence[DatasetReader], phases: Sequence[SchedulePhase], seed: int) -> ScheduleOrder:
    """The scheduled order over these datasets (one per stream of the schedule)."""
    return ScheduleOrder(shapes_of(readers), list(phases), seed=seed)


def step_range(step: int, global_batch: int) -> tuple[int, int]:
    """Positions ``[start, end)`` of global step ``step`` at a constant global batch."""
    if step < 0 or global_batch < 1:
        raise ConfigError(f"step must be >= 0 and global batch >= 1, got {step} and {global_batch}")
    return step * global_batch, (step + 1) * global_batch


def provenance(
    readers: Sequence[DatasetReader],
    order: GlobalOrder,
    start: int,
    end: int,
    *,
    world_size: int | None = None,
    text: bool = False,
    packing: str = "concat",
) -> list[SampleProvenance]:
    """Where the samples at positions ``[start, end)`` came from.

    Args:
        readers: one open reader per stream, in mixture order.
        order: the order built over them (``order_for``).
        start: first position (the step's cursor).
        end: one past the last position.
        world_size: when given, ``[start, end)`` is one step read by that many
            ranks: samples are listed rank by rank, in each rank's order.
        text: decode each sample with its dataset's tokenizer.
        packing: the loader's ``packing``: under ``"best_fit"`` each sample
            is named by its row's pieces (reads each block the samples touch).

    Raises:
        ConfigError: an empty range, a world size that does not divide it, or
            an unknown packing.
    """
    if not 0 <= start < end:
        raise ConfigError(f"position range [{start}, {end}) is empty or negative")
    if len(readers) != len(order.shapes):
        raise ConfigError(f"{len(readers)} datasets but the order has {len(order.shapes)} streams")
    if world_size is None:
        positions, ranks = np.arange(start, end, dtype=np.int64), None
    else:
        batch = end - start
        if batch % world_size:
            raise ConfigError(f"world size {world_size} does not divide the global batch {batch}")
        positions = step_positions(start, batch, order.lanes)
        ranks = (np.arange(batch) // (batch // world_size)).tolist()
    stream, block, sample = order.sample_at(positions)
    seq_lens = [order.config.seq_len] * positions.size
    return _describe(readers, positions, stream, block, sample, seq_lens, ranks, text, packing)


def step_provenance(
    readers: Sequence[DatasetReader],
    order: ScheduleOrder,
    step: int,
    *,
    world_size: int | None = None,
    text: bool = False,
    packing: str = "concat",
) -> list[SampleProvenance]:
    """Where the samples of global step ``step`` of a schedule came from.

    With ``world_size`` the samples are listed rank by rank, in each rank's
    order; ``packing`` as in :func:`provenance`.

    Raises:
        ConfigError: a bad step, a world size that does not divide the
            phase's batch, or an unknown packing.
    """
    if len(readers) != len(order.shapes):
        raise ConfigError(f"{len(readers)} datasets but the schedule has {len(order.shapes)} streams")
    phase = order.phase_at_step(step)
    batch = phase.global_batch
    if world_size is not None and (world_size < 1 or batch % world_size):
        raise ConfigError(f"world size {world_size} does not divide the global batch {batch}")
    local = (step - phase.start_step) * batch
    positions = rank_positions(local, batch, 1, 0, phase.order.lanes) + phase.start_position
    ranks = None if world_size is None else (np.arange(batch) // (batch // world_size)).tolist()
    stream, block, sample = order.sample_at(positions)
    seq_lens = [phase.spec.seq_len] * positions.size
    return _describe(readers, positions, stream, block, sample, seq_lens, ranks, text, packing)


def range_provenance(
    readers: Sequence[DatasetReader],
    order: ScheduleOrder,
    start: int,
    end: int,
    *,
    text: bool = False,
    packing: str = "concat",
) -> list[SampleProvenance]:
    """Where the samples at positions ``[start, end)`` of a schedule came from, by position (``packing`` as in
    :func:`provenance`)."""
    if not 0 <= start < end:
        raise ConfigError(f"position range [{start}, {end}) is empty or negative")
    positions = np.arange(start, end, dtype=np.int64)
    stream, block, sample = order.sample_at(positions)
    seq_lens = [order.phase_at_position(p).spec.seq_len for p in positions.tolist()]
    return _describe(readers, positions, stream, block, sample, seq_lens, None, text, packing)


def _describe(
    readers: Sequence[DatasetReader],
    positions: np.ndarray,
    stream: np.ndarray,
    block: np.ndarray,
    sample: np.ndarray,
    seq_lens: list[int],
    ranks: list[int] | None,
    text: bool,
    packing: str,
) -> list[SampleProvenance]:
    if packing not in PACKINGS:
        raise ConfigError(f"packing must be one of {', '.join(map(repr, PACKINGS))} (got {packing!r})")
    addresses = list(zip(positions.tolist(), stream.tolist(), block.tolist(), sample.tolist(), seq_lens))
    out: list[SampleProvenance | None] = [None] * len(addresses)
    if packing == "concat":
        for k, address in enumerate(addresses):
            out[k] = _window_sample(readers, *address, None if ranks is None else ranks[k], text)
        return out
    # Samples are described block by block, so one block's tokens and
    # rows are held at a time however many samples share it.
    packed, packed_key = None, None
    for k in sorted(range(len(addresses)), key=lambda k: (addresses[k][1], addresses[k][2], addresses[k][4], k)):
        p, s, b, j, seq_len = addresses[k]
        if packed_key != (s, b, seq_len):
            packed, packed_key = PackedBlock.read(readers[s], b, seq_len, packing), (s, b, seq_len)
        out[k] = _row_sample(readers[s], packed, p, s, b, j, None if ranks is None else ranks[k], text, packing)
    return out


def _window_sample(
    readers: Sequence[DatasetReader], p: int, s: int, b: int, j: int, seq_len: int, rank: int | None, text: bool
) -> SampleProvenance:
    """A ``concat`` sample: the window ``[j * seq_len, j * seq_len + seq_len + 1)`` of block ``b``."""
    reader = readers[s]
    manifest = reader.manifest
    offset = j * seq_len
    base = manifest.token_offset_of_block(b)
    spans = reader.documents_of_block(b, offset, offset + seq_len + 1)
    first = base + offset
    parts = []
    for d in spans:
        start, end = max(d.token_start - first, 0), min(d.token_end - first, seq_len + 1)
        parts.append(
            DocumentPart(
                source=d.source,
                record=d.record,
                token_start=d.token_start,
                token_end=d.token_end,
                sample_token_start=start,
                sample_token_end=end,
                document_token_start=first + start - d.token_start,
                document_token_end=first + end - d.token_start,
            )
        )
    decoded = None
    if text:
        tokens = reader.read_block(b)[offset : offset + seq_len + 1]
        decoded = reader.decode_text(tokens)
    return _sample(
        reader, p, s, b, j, rank, token_start=first, num_tokens=seq_len + 1, documents=tuple(parts), text=decoded
    )


def _row_sample(
    reader: DatasetReader,
    packed: PackedBlock,
    p: int,
    s: int,
    b: int,
    j: int,
    rank: int | None,
    text: bool,
    packing: str,
) -> SampleProvenance:
    """A packed sample: row ``j`` of block ``b``, its pieces and its label."""
    decoded = reader.decode_text(packed.row_tokens(j)) if text else None
    return _sample(
        reader,
        p,
        s,
        b,
        j,
        rank,
        token_start=None,
        num_tokens=packed.rows.seq_len + 1,
        documents=tuple(packed.row_pieces(j)),
        text=decoded,
        packing=packing,
        label=packed.label(j),
    )


def _sample(reader: DatasetReader, p: int, s: int, b: int, j: int, rank: int | None, **rest) -> SampleProvenance:
    manifest = reader.manifest
    shard, in_shard = manifest.block_location(b)
    return SampleProvenance(
        position=p,
        rank=rank,
        stream=s,
        dataset=reader.url,
        shard=shard,
        shard_path=manifest.shards[shard].path,
        block=b,
        block_in_shard=in_shard,
        sample=j,
        **rest,
    )
