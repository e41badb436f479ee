"""Block arithmetic of a manifest: global block ids to shards, byte ranges and token offsets.

``BlockArithmetic`` is a base of ``manifest.Manifest``; it reads only the
manifest's ``shards``, ``num_blocks``, ``block_tokens`` and ``fingerprint``.
The arrays it caches are shared by every caller and read-only.
"""

from __future__ import annotations

from functools import cached_property

import numpy as np

from zephon_stream.format.entries import ShardInfo

__all__ = ["BlockArithmetic"]


def _frozen(array: np.ndarray) -> np.ndarray:
    # Cached arrays are shared by every caller; make accidental writes fail.
    array.flags.writeable = False
    return array


class BlockArithmetic:
    """Where each global block lies (mixed into ``Manifest``)."""

    # What the arithmetic reads, from the manifest's fields.
    shards: tuple[ShardInfo, ...]
    num_blocks: int
    block_tokens: int
    fingerprint: str

    @cached_property
    def shard_first_block(self) -> np.ndarray:
        """Global id of each shard's first block, plus the total at the end (int64, read-only)."""
        counts = np.fromiter((s.num_blocks for s in self.shards), dtype=np.int64, count=len(self.shards))
        return _frozen(np.concatenate([np.zeros(1, np.int64), np.cumsum(counts)]))

    @cached_property
    def shard_token_offsets(self) -> np.ndarray:
        """Global token offset of each shard's first token, plus the total at the end (int64, read-only)."""
        counts = np.fromiter((s.num_tokens for s in self.shards), dtype=np.int64, count=len(self.shards))
        return _frozen(np.concatenate([np.zeros(1, np.int64), np.cumsum(counts)]))

    def block_token_counts(self) -> np.ndarray:
        """Tokens in each block, by global block id (int64, read-only, cached: no copy per call)."""
        return self._block_token_counts

    @cached_property
    def _block_token_counts(self) -> np.ndarray:
        counts = np.full(self.num_blocks, self.block_tokens, dtype=np.int64)
        last_blocks = self.shard_first_block[1:] - 1
        last_sizes = np.fromiter(
            (s.num_tokens - (s.num_blocks - 1) * self.block_tokens for s in self.shards),
            dtype=np.int64,
            count=len(self.shards),
        )
        counts[last_blocks] = last_sizes
        return _frozen(counts)

    @cached_property
    def block_token_starts(self) -> np.ndarray:
        """Global token offset of each block, plus ``num_tokens`` at the end (int64, read-only)."""
        return _frozen(np.concatenate([np.zeros(1, np.int64), np.cumsum(self._block_token_counts)]))

    def _check_block_id(self, block_id: int) -> int:
        block_id = int(block_id)
        if not 0 <= block_id < self.num_blocks:
            raise IndexError(
                f"block id {block_id} is outside [0, {self.num_blocks}) for dataset {self.fingerprint[:12]}"
            )
        return block_id

    def block_location(self, block_id: int) -> tuple[int, int]:
        """``(shard_index, block_in_shard)`` of a global block id."""
        block_id = self._check_block_id(block_id)
        shard = int(np.searchsorted(self.shard_first_block, block_id, side="right")) - 1
        return shard, block_id - int(self.shard_first_block[shard])

    def block_byte_range(self, block_id: int) -> tuple[str, int, int]:
        """``(shard_path, start, end)``: the block's frame, bytes ``[start, end)`` of the shard."""
        shard, local = self.block_location(block_id)
        info = self.shards[shard]
        return info.path, info.block_offsets[local], info.block_offsets[local + 1]

    def block_num_tokens(self, block_id: int) -> int:
        """Tokens in one block."""
        return int(self._block_token_counts[self._check_block_id(block_id)])

    def token_offset_of_block(self, block_id: int) -> int:
        """Global token offset of a block's first token."""
        shard, local = self.block_location(block_id)
        return int(self.shard_token_offsets[shard]) + local * self.block_tokens

    def block_where(self, block_id: int) -> str:
        """Names a block for error messages: ``shard shards/00000003.zst block 7 (bytes 123..456)``."""
        shard, local = self.block_location(block_id)
        info = self.shards[shard]
        return f"shard {info.path} block {local} (bytes {info.block_offsets[local]}..{info.block_offsets[local + 1]})"
