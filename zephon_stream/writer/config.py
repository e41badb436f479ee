"""``WriteConfig``: the settings of one conversion, checked in one place."""

from __future__ import annotations

from dataclasses import dataclass, replace

from zephon_stream.errors import ConfigError
from zephon_stream.format.spec import (
    DEFAULT_BLOCK_TOKENS,
    DEFAULT_BLOCKS_PER_SHARD,
    DEFAULT_ZSTD_LEVEL,
    MAX_BLOCK_TOKENS,
    MIN_BLOCK_TOKENS,
)

DEFAULT_CHUNK_CHARS = 256 * 1024
# Starting N spawned tokenizer processes costs 0.5-1 s on an idle
# machine (seconds on a busy one), about what a BPE tokenizer takes for a few
# MB on one core: below this size the writer tokenizes in its own process.
DEFAULT_POOL_MIN_INPUT_BYTES = 4 * 2**20
# A Ray work unit of 64 MiB is about a minute of one core for a BPE
# tokenizer: long enough that a task's overhead is noise, short enough that a
# retried task repeats little.
DEFAULT_UNIT_BYTES = 64 * 2**20
# Shards of about 64 Mi tokens whatever the block size: 128 MiB of uint16
# before compression, typically 40-130 MB after it, depending on the tokenizer.
DEFAULT_SHARD_TOKENS = DEFAULT_BLOCKS_PER_SHARD * DEFAULT_BLOCK_TOKENS


def default_blocks_per_shard(block_tokens: int) -> int:
    """Blocks a shard so that it holds about ``DEFAULT_SHARD_TOKENS`` tokens."""
    return max(1, -(-DEFAULT_SHARD_TOKENS // block_tokens))


@dataclass(frozen=True, slots=True, kw_only=True)
class WriteConfig:
    """Settings of one conversion.

    Attributes:
        text_field: JSONL key / parquet column holding the text.
        lines: in text files, one document per line instead of per file.
        input_format: ``txt``, ``jsonl`` or ``parquet`` for every input,
            instead of guessing from the file name; ``tokens`` for inputs
            that hold token ids (kinds still from the file names).
        workers: tokenizer processes (1: tokenize in this process); for
            token inputs, threads compressing blocks.
        block_tokens: tokens per block.
        blocks_per_shard: blocks per shard (default: shards of ~64 Mi tokens).
        zstd_level: zstd level of each block.
        chunk_chars: characters of text sent to a worker at a time.
        overwrite: replace a dataset already committed at the output.
        tokens_field: Parquet / JSONL / ``datasets`` column of token ids.
        token_dtype: dtype of raw ``.bin`` token arrays (``uint16``/``uint32``).
        append_eos: token inputs: end each document that lacks EOS with one.
        pool_min_input_bytes: uncompressed local text inputs (not .gz/.zst,
            not Parquet) totalling less than this are tokenized in this
            process whatever ``workers`` says, and so is any input of the
            ``bytes`` tokenizer; 0 starts the worker processes for any input
            and tokenizer.
        allow_empty: commit a dataset that holds no tokens (every record
            rejected, or no record) instead of refusing it.
    """

    text_field: str = "text"
    lines: bool = False
    input_format: str | None = None
    workers: int = 1
    block_tokens: int = DEFAULT_BLOCK_TOKENS
    blocks_per_shard: int | None = None
    zstd_level: int = DEFAULT_ZSTD_LEVEL
    chunk_chars: int = DEFAULT_CHUNK_CHARS
    overwrite: bool = False
    tokens_field: str = "input_ids"
    token_dtype: str | None = None
    append_eos: bool = False
    pool_min_input_bytes: int = DEFAULT_POOL_MIN_INPUT_BYTES
    allow_empty: bool = False

    @property
    def tokens(self) -> bool:
        """Whether the inputs hold token ids instead of text."""
        return self.input_format == "tokens"

    def resolved(self) -> WriteConfig:
        """This config checked, with ``blocks_per_shard`` filled in.

        Raises:
            ConfigError: a setting out of range (named, with its bounds).
        """
        if not MIN_BLOCK_TOKENS <= self.block_tokens <= MAX_BLOCK_TOKENS:
            raise ConfigError(f"block_tokens {self.block_tokens} is outside [{MIN_BLOCK_TOKENS}, {MAX_BLOCK_TOKENS}]")
        blocks_per_shard = self.blocks_per_shard or default_blocks_per_shard(self.block_tokens)
        if blocks_per_shard < 1:
            raise ConfigError(f"blocks_per_shard {blocks_per_shard} must be at least 1")
        if self.workers < 1:
            raise ConfigError(f"workers {self.workers} must be at least 1")
        if not 1 <= self.zstd_level <= 22:
            raise ConfigError(f"zstd_level {self.zstd_level} is outside [1, 22]")
        if self.pool_min_input_bytes < 0:
            raise ConfigError(f"pool_min_input_bytes {self.pool_min_input_bytes} must not be negative")
        if self.chunk_chars < 1:
            raise ConfigError(f"chunk_chars {self.chunk_chars} must be at least 1")
        if not self.text_field:
            raise ConfigError("text_field must not be empty")
        if self.token_dtype is not None and self.token_dtype not in ("uint16", "uint32"):
            raise ConfigError(f"token_dtype {self.token_dtype!r} is not one of uint16, uint32")
        if not self.tokens and (self.append_eos or self.token_dtype is not None):
            raise ConfigError("append_eos and token_dtype apply to token inputs only (input_format='tokens')")
        return replace(self, blocks_per_shard=blocks_per_shard)
