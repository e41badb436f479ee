"""The shape of one stream: how many tokens each block holds, stored compactly."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from zephon_stream.errors import ConfigError


@dataclass(frozen=True, slots=True, eq=False)
class StreamShape:
    """Per-block token counts of one dataset, in memory independent of its size.

    Every block holds ``block_tokens`` tokens except a few short ones (the last
    block of each shard in a merged dataset, the very last block otherwise);
    only those are listed.

    Attributes:
        fingerprint: the dataset fingerprint from its manifest.
        block_tokens: tokens in a full block.
        num_blocks: blocks in the dataset.
        short_ids: sorted ids of the blocks holding fewer than ``block_tokens``.
        short_counts: token counts of those blocks, each in ``[1, block_tokens)``.
        name: what messages call the stream (its dataset's URL); empty: the
            fingerprint. Not part of its identity.
    """

    fingerprint: str
    block_tokens: int
    num_blocks: int
    short_ids: np.ndarray
    short_counts: np.ndarray
    name: str = ""

    def __post_init__(self) -> None:
        ids = np.array(self.short_ids, dtype=np.int64).reshape(-1)
        counts = np.array(self.short_counts, dtype=np.int64).reshape(-1)
        ids.setflags(write=False)
        counts.setflags(write=False)
        object.__setattr__(self, "short_ids", ids)
        object.__setattr__(self, "short_counts", counts)
        where = f"stream {self.label!r}"
        if self.block_tokens < 2:
            raise ConfigError(f"{where}: block_tokens must be >= 2, got {self.block_tokens}")
        if self.num_blocks < 0:
            raise ConfigError(f"{where}: num_blocks must be >= 0, got {self.num_blocks}")
        if ids.shape != counts.shape:
            raise ConfigError(f"{where}: {ids.size} short block ids but {counts.size} short block counts")
        if ids.size:
            if np.any(np.diff(ids) <= 0):
                raise ConfigError(f"{where}: short block ids are not strictly increasing")
            if ids[0] < 0 or ids[-1] >= self.num_blocks:
                raise ConfigError(
                    f"{where}: short block ids must lie in [0, {self.num_blocks}), got {int(ids[0])}..{int(ids[-1])}"
                )
            bad = np.flatnonzero((counts < 1) | (counts >= self.block_tokens))
            if bad.size:
                k = int(bad[0])
                raise ConfigError(
                    f"{where} block {int(ids[k])}: short block must hold 1..{self.block_tokens - 1}"
                    f" tokens, got {int(counts[k])}"
                )

    @classmethod
    def from_counts(
        cls, fingerprint: str, block_tokens: int, counts: np.ndarray | list[int], *, name: str = ""
    ) -> StreamShape:
        """Build the compact form from every block's token count.

        Raises:
            ConfigError: a block holds 0 tokens or more than ``block_tokens``.
        """
        counts = np.asarray(counts, dtype=np.int64).reshape(-1)
        over = np.flatnonzero((counts < 1) | (counts > block_tokens))
        if over.size:
            k = int(over[0])
            raise ConfigError(
                f"stream {name or fingerprint!r} block {k}: holds {int(counts[k])} tokens, expected 1..{block_tokens}"
            )
        short = np.flatnonzero(counts < block_tokens)
        return cls(
            fingerprint=fingerprint,
            block_tokens=int(block_tokens),
            num_blocks=int(counts.size),
            short_ids=short,
            short_counts=counts[short],
            name=name,
        )

    @property
    def label(self) -> str:
        """The stream in messages: its name (the dataset's URL), else its fingerprint."""
        return self.name or self.fingerprint

    def no_samples_reason(self, seq_len: int) -> str | None:
        """Why the stream holds no sample of ``seq_len``, with what to do; None when it holds one."""
        if self.num_blocks == 0:
            return (
                "the dataset holds no tokens (every input record was rejected, or there was none: see "
                "its rejects.jsonl); write it again from inputs that hold documents, or leave it out"
            )
        if self.stream_samples(seq_len) > 0:
            return None
        longest = self.block_tokens if self.num_full_blocks else int(self.short_counts.max())
        if longest < 2:
            return "every block holds a single token, and a sample needs two at least"
        return (
            f"its longest block holds {longest} tokens, fewer than the {seq_len + 1} a sample of seq_len "
            f"{seq_len} needs; use a seq_len of at most {longest - 1}"
        )

    @property
    def num_full_blocks(self) -> int:
        """Blocks holding exactly ``block_tokens`` tokens."""
        return self.num_blocks - int(self.short_ids.size)

    @property
    def num_tokens(self) -> int:
        """Tokens in the dataset."""
        return self.num_full_blocks * self.block_tokens + int(self.short_counts.sum())

    def block_token_counts(self, block_ids: np.ndarray) -> np.ndarray:
        """Token counts of the given blocks (``int64``, shaped like ``block_ids``)."""
        block_ids = np.asarray(block_ids, dtype=np.int64)
        out = np.full(block_ids.shape, self.block_tokens, dtype=np.int64)
        if self.short_ids.size:
            k = np.searchsorted(self.short_ids, block_ids)
            k = np.minimum(k, self.short_ids.size - 1)
            hit = self.short_ids[k] == block_ids
            out[hit] = self.short_counts[k[hit]]
        return out

    def samples_per_full_block(self, seq_len: int) -> int:
        """Samples of ``seq_len + 1`` tokens in a full block: ``(block_tokens - 1) // seq_len``."""
        return (self.block_tokens - 1) // seq_len

    def short_block_samples(self, seq_len: int) -> np.ndarray:
        """Samples in each short block, in ``short_ids`` order."""
        return np.maximum(self.short_counts - 1, 0) // seq_len

    def stream_samples(self, seq_len: int) -> int:
        """Samples in one pass over every block (before any lane cut)."""
        return self.num_full_blocks * self.samples_per_full_block(seq_len) + int(
            self.short_block_samples(seq_len).sum()
        )

    def epoch_samples(self, seq_len: int) -> int:
        """Old name of ``stream_samples``."""
        return self.stream_samples(seq_len)
