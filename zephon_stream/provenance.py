"""Provenance: which datasets, shards, blocks and source documents a step read.

Everything is derived from the manifests and the order configuration, as the
loader derives it: no log of the run is needed. Reading block tokens (for
``text``) and document-index sidecars goes through ``DatasetReader``.
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
from zephon_stream.reader import DatasetReader


@dataclass(frozen=True, slots=True)
class DocumentPart:
    """The part of one source document inside a sample.

    Attributes:
        source: input file or URL the document came from.
        record: record number of the document within that source.
        token_start: first token of the document in the dataset's token stream.
        token_end: one past its last token (its EOS).
        sample_token_start: first token of the document inside the sample (0-based).
        sample_token_end: one past its last token inside the sample.
        document_token_start: the same first token, counted from the
            document's first token (0 when the sample holds its start).
        document_token_end: one past the same last token, counted the same
            way (``token_end - token_start`` when the sample holds its end).
    """

    source: str
    record: int
    token_start: int
    token_end: int
    sample_token_start: int
    sample_token_end: int
    document_token_start: int
    document_token_end: int

    @property
    def num_tokens(self) -> int:
        """Tokens of the whole document, its EOS included."""
        return self.token_end - self.token_start


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
        sample: sample index in the block; its tokens start at ``sample * seq_len``.
        token_start: global offset of the sample's first token in the dataset.
        num_tokens: tokens in the sample (``seq_len + 1``).
        documents: the source documents the sample's tokens belong to.
        text: the decoded sample when asked for, else ``None``.
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
    token_start: int
    num_tokens: int
    documents: tuple[DocumentPart, ...]
    text: str | None

    def to_dict(self) -> dict:
        """Plain values, for JSON."""
        out = {name: getattr(self, name) for name in self.__slots__}
        out["documents"] = [{name: getattr(d, name) for name in d.__slots__} for d in self.documents]
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


def schedule_for(
    readers: Sequence[DatasetReader], phases: Sequence[SchedulePhase], seed: int
) -> ScheduleOrder:
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

    Raises:
        ConfigError: an empty range, or a world size that does not divide it.
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
    return _describe(readers, positions, stream, block, sample, seq_lens, ranks, text)


def step_provenance(
    readers: Sequence[DatasetReader],
    order: ScheduleOrder,
    step: int,
    *,
    world_size: int | None = None,
    text: bool = False,
) -> list[SampleProvenance]:
    """Where the samples of global step ``step`` of a schedule came from.

    With ``world_size`` the samples are listed rank by rank, in each rank's order.

    Raises:
        ConfigError: a bad step, or a world size that does not divide the phase's batch.
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
    return _describe(readers, positions, stream, block, sample, seq_lens, ranks, text)


def range_provenance(
    readers: Sequence[DatasetReader], order: ScheduleOrder, start: int, end: int, *, text: bool = False
) -> list[SampleProvenance]:
    """Where the samples at positions ``[start, end)`` of a schedule came from, by position."""
    if not 0 <= start < end:
        raise ConfigError(f"position range [{start}, {end}) is empty or negative")
    positions = np.arange(start, end, dtype=np.int64)
    stream, block, sample = order.sample_at(positions)
    seq_lens = [order.phase_at_position(p).spec.seq_len for p in positions.tolist()]
    return _describe(readers, positions, stream, block, sample, seq_lens, None, text)


def _describe(
    readers: Sequence[DatasetReader],
    positions: np.ndarray,
    stream: np.ndarray,
    block: np.ndarray,
    sample: np.ndarray,
    seq_lens: list[int],
    ranks: list[int] | None,
    text: bool,
) -> list[SampleProvenance]:
    out = []
    for k, (p, s, b, j) in enumerate(
        zip(positions.tolist(), stream.tolist(), block.tolist(), sample.tolist())
    ):
        seq_len = seq_lens[k]
        reader = readers[s]
        manifest = reader.manifest
        shard, in_shard = manifest.block_location(b)
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
        out.append(
            SampleProvenance(
                position=p,
                rank=None if ranks is None else ranks[k],
                stream=s,
                dataset=reader.url,
                shard=shard,
                shard_path=manifest.shards[shard].path,
                block=b,
                block_in_shard=in_shard,
                sample=j,
                token_start=first,
                num_tokens=seq_len + 1,
                documents=tuple(parts),
                text=decoded,
            )
        )
    return out
