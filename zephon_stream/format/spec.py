"""Constants and naming rules of the on-disk format (docs/FORMAT.md)."""

from __future__ import annotations

import numpy as np

FORMAT_NAME = "zephon-stream"
# 1.1 moved the per-shard, per-block and per-source arrays out of the
# manifest into index objects (docs/FORMAT.md, section 11); 1.0 still reads.
FORMAT_VERSION: tuple[int, int] = (1, 1)
INDEXED_VERSION: tuple[int, int] = (1, 1)
DOCINDEX_VERSION: tuple[int, int] = (1, 0)

DEFAULT_BLOCK_TOKENS = 2**20 + 1
DEFAULT_BLOCKS_PER_SHARD = 64
DEFAULT_ZSTD_LEVEL = 3
# A block must hold at least one sample of seq_len 1 (two tokens); the
# upper bound keeps one decoded block (4 GiB of uint32) allocatable.
MIN_BLOCK_TOKENS = 2
MAX_BLOCK_TOKENS = 2**30

MANIFEST_NAME = "manifest"
SHARDS_DIR = "shards"
INDEX_DIR = "index"
REJECTS_NAME = "rejects.jsonl"
SHARD_SUFFIX = ".zst"
INDEX_SUFFIX = ".idx"

DTYPE_NAMES = ("uint16", "uint32")
UINT16_VOCAB_LIMIT = 2**16
MAX_VOCAB_SIZE = 2**32


def token_dtype(vocab_size: int) -> np.dtype:
    """Token dtype for a vocabulary (special tokens included).

    Args:
        vocab_size: number of token ids; every id is in ``[0, vocab_size)``.

    Returns:
        ``<u2`` when every id fits in 16 bits, else ``<u4``.
    """
    if not 0 < vocab_size <= MAX_VOCAB_SIZE:
        raise ValueError(f"vocab_size {vocab_size} is outside [1, {MAX_VOCAB_SIZE}]")
    return np.dtype("<u2") if vocab_size <= UINT16_VOCAB_LIMIT else np.dtype("<u4")


def dtype_name(vocab_size: int) -> str:
    """The manifest's ``dtype`` string for a vocabulary: "uint16" or "uint32"."""
    return "uint16" if token_dtype(vocab_size).itemsize == 2 else "uint32"


def np_dtype(name: str) -> np.dtype:
    """The little-endian numpy dtype of a manifest ``dtype`` string."""
    if name == "uint16":
        return np.dtype("<u2")
    if name == "uint32":
        return np.dtype("<u4")
    raise ValueError(f"unknown token dtype {name!r} (expected one of {DTYPE_NAMES})")


def shard_name(index: int) -> str:
    """Path of shard ``index`` relative to the dataset root: ``shards/00000012.zst``."""
    return f"{SHARDS_DIR}/{index:08d}{SHARD_SUFFIX}"


def index_name(index: int) -> str:
    """Path of shard ``index``'s document index: ``shards/00000012.idx``."""
    return f"{SHARDS_DIR}/{index:08d}{INDEX_SUFFIX}"


def blocks_in(num_tokens: int, block_tokens: int) -> int:
    """Number of blocks a run of ``num_tokens`` tokens fills (the last may be short)."""
    return -(-num_tokens // block_tokens)
