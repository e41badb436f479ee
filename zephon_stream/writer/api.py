"""``write_dataset``: raw text (or token ids) in, a committed dataset out.

Here: the arguments checked, the tokenizer loaded, the inputs expanded and
sorted, and the engine picked: the pool engine's run (``pool_run.py``) on
this process and its tokenizer pool, or the Ray engine (``ray_engine.py``).
The manifest, written last, commits the dataset: a pool run killed at any
point leaves no manifest, and rerunning it writes the same bytes.

With ``input_format="tokens"`` the inputs already hold token ids
(``token_inputs.py``): they skip the tokenizer pool; each batch of documents
is checked against the vocabulary and framed with EOS (``token_check.py``) on
this process, vectorised, and the shard builder compresses on ``workers``
threads. Accounting, rejects, shards and manifest are the same as for text.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from zephon_stream.errors import ConfigError
from zephon_stream.format.spec import DEFAULT_BLOCK_TOKENS, DEFAULT_ZSTD_LEVEL
from zephon_stream.storage import expand_inputs, open_store
from zephon_stream.writer.config import DEFAULT_POOL_MIN_INPUT_BYTES, DEFAULT_UNIT_BYTES, WriteConfig
from zephon_stream.writer.pool_run import PoolRun
from zephon_stream.writer.progress import WriteSummary
from zephon_stream.writer.ray_engine import check_engine, write_with_ray
from zephon_stream.writer.readers import SourceReader
from zephon_stream.writer.token_inputs import TokenInputConfig, TokenSource, token_input_urls
from zephon_stream.writer.tokenizers import Tokenizer, load_tokenizer


def write_dataset(
    inputs: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    output: str | os.PathLike[str],
    *,
    tokenizer: str | Tokenizer,
    text_field: str = "text",
    lines: bool = False,
    workers: int = 1,
    block_tokens: int = DEFAULT_BLOCK_TOKENS,
    blocks_per_shard: int | None = None,
    storage_options: Mapping[str, Any] | None = None,
    progress: bool | None = None,
    eos_token: str | None = None,
    bos_token: str | None = None,
    input_format: str | None = None,
    zstd_level: int = DEFAULT_ZSTD_LEVEL,
    overwrite: bool = False,
    tokens_field: str = "input_ids",
    token_dtype: str | None = None,
    append_eos: bool = False,
    pool_min_input_bytes: int = DEFAULT_POOL_MIN_INPUT_BYTES,
    allow_empty: bool = False,
    engine: str = "pool",
    ray_address: str | None = None,
    ray_workers: int | None = None,
    unit_bytes: int = DEFAULT_UNIT_BYTES,
) -> WriteSummary:
    """Tokenize raw text (or take token ids) into a dataset of zstd token shards with a manifest.

    Args:
        inputs: paths, folders, globs (``**`` included) or ``s3://`` URLs/globs;
            expanded and sorted per pattern.
        output: a local folder or ``s3://bucket/prefix``.
        tokenizer: ``bytes``, ``hf:PATH_OR_URL``, ``tiktoken:NAME_OR_PATH``,
            or a loaded ``Tokenizer``.
        text_field: JSONL key / parquet column holding the text.
        lines: one document per line of a text file.
        workers: tokenizer processes; the output is the same for any number.
            None start for the ``bytes`` tokenizer, nor for uncompressed
            local inputs under ``pool_min_input_bytes``: those tokenize in
            this process.
        block_tokens: tokens per block.
        blocks_per_shard: blocks per shard (default: shards of ~64 Mi tokens).
        storage_options: fsspec/s3fs options for inputs, output and tokenizer
            file (default: the standard AWS variables).
        progress: show a progress bar (default: only on a terminal).
        eos_token: end-of-document token of an ``hf:``/``tiktoken:`` tokenizer.
        bos_token: start-of-document token (default: none).
        input_format: ``txt``/``jsonl``/``parquet`` for every input, or
            ``tokens``: the inputs hold ids of ``tokenizer`` (``.npy``, raw
            ``.bin``, Megatron ``.bin``+``.idx``, Parquet/JSONL id lists, a
            ``datasets`` folder; see docs/FORMAT.md appendix A).
        zstd_level: zstd level of each block.
        overwrite: replace a dataset already committed at ``output``.
        tokens_field: token inputs: column / key holding each record's ids.
        token_dtype: token inputs: dtype of raw ``.bin`` arrays.
        append_eos: token inputs: end each document that lacks EOS with one
            (without it, such a document is rejected, and a source where no
            document ends with EOS is an error).
        pool_min_input_bytes: uncompressed local text inputs (not .gz/.zst,
            not Parquet) totalling less than this tokenize in this process
            (default 4 MiB); 0 starts the ``workers`` processes for any
            input and tokenizer.
        allow_empty: commit a dataset that holds no tokens; without it such
            a run writes ``rejects.jsonl`` but no manifest, and raises.
        engine: ``pool`` (this process and its tokenizer pool) or ``ray``:
            work units of about ``unit_bytes`` as Ray tasks, ``ray_workers``
            at once (default: the cluster's CPUs), on the cluster at
            ``ray_address`` or a local instance; the same dataset, parts
            below ``output`` (docs/WRITING.md, "On a Ray cluster").

    Returns:
        The run's ``WriteSummary``.

    Raises:
        InputError: an input that is missing, of unknown type or unreadable.
        EmptyDatasetError: no token to commit (every record rejected, or
            none), without ``allow_empty``; an ``InputError``.
        TokenizerError: a tokenizer that cannot be loaded.
        ConfigError: bad sizes, or a dataset already at ``output``.
    """
    config = WriteConfig(
        text_field=text_field,
        lines=lines,
        input_format=input_format,
        workers=workers,
        block_tokens=block_tokens,
        blocks_per_shard=blocks_per_shard,
        zstd_level=zstd_level,
        overwrite=overwrite,
        tokens_field=tokens_field,
        token_dtype=token_dtype,
        append_eos=append_eos,
        pool_min_input_bytes=pool_min_input_bytes,
        allow_empty=allow_empty,
    ).resolved()
    check_engine(engine, address=ray_address, workers=ray_workers)
    if config.tokens and bos_token is not None:
        raise ConfigError("token inputs are written as they are: no BOS is added (drop --bos-token)")
    tok = tokenizer
    if isinstance(tokenizer, str):
        tok = load_tokenizer(tokenizer, eos_token=eos_token, bos_token=bos_token, storage_options=storage_options)
    assert isinstance(tok, Tokenizer)
    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    if engine == "ray":
        urls = (
            token_input_urls(list(inputs), storage_options)
            if config.tokens
            else expand_inputs(list(inputs), storage_options)
        )
        with open_store(output, storage_options) as out:
            return write_with_ray(
                urls,
                out,
                config=config,
                tokenizer=tok,
                storage_options=storage_options,
                progress=progress,
                address=ray_address,
                workers=ray_workers,
                unit_bytes=unit_bytes,
            )
    readers: list[Any]
    if config.tokens:
        token_config = TokenInputConfig(tokens_field=tokens_field, token_dtype=token_dtype, eos_id=tok.eos_id)
        readers = [
            TokenSource(url, config=token_config, storage_options=storage_options)
            for url in token_input_urls(list(inputs), storage_options)
        ]
    else:
        readers = _text_readers(expand_inputs(list(inputs), storage_options), config, storage_options)
    store = open_store(output, storage_options)
    try:
        return PoolRun(config=config, tokenizer=tok, readers=readers, store=store, progress=progress).execute()
    finally:
        store.close()


def _text_readers(urls: list[str], config: WriteConfig, storage_options: Mapping[str, Any] | None) -> list[Any]:
    return [
        SourceReader(
            url,
            text_field=config.text_field,
            lines=config.lines,
            input_format_override=config.input_format,
            storage_options=storage_options,
        )
        for url in urls
    ]
