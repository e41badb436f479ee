"""``write_dataset``: raw text (or token ids) in, a committed dataset out.

The run, in order: expand and sort the inputs; read them on this process,
record by record, in input order; send chunks of texts to the tokenizer pool
(results come back in submission order, so the token stream is the same for
any worker count); cut the stream into blocks and shards, each shard written
as it fills; then ``rejects.jsonl``; then, after checking that every record
is accounted for and that a token is there to commit (``empty.py``), the
manifest, which commits the dataset. A run killed at
any point leaves no manifest, and rerunning it writes the same bytes.

With ``input_format="tokens"`` the inputs already hold token ids
(``token_inputs.py``): they skip the tokenizer pool; each batch of documents
is checked against the vocabulary and framed with EOS (``token_check.py``) on
this process, vectorised, and the shard builder compresses on ``workers``
threads. Accounting, rejects, shards and manifest are the same as for text.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from zephon_stream.errors import ConfigError
from zephon_stream.format.manifest import Manifest, SourceInfo
from zephon_stream.format.spec import (
    DEFAULT_BLOCK_TOKENS,
    DEFAULT_ZSTD_LEVEL,
    MANIFEST_NAME,
    REJECTS_NAME,
    SHARDS_DIR,
    token_dtype,
)
from zephon_stream.storage import LocalStore, Store, expand_inputs, is_local_url, local_path, open_store
from zephon_stream.storage.local import TEMP_PREFIX
from zephon_stream.writer.config import DEFAULT_POOL_MIN_INPUT_BYTES, DEFAULT_UNIT_BYTES, WriteConfig
from zephon_stream.writer.empty import refuse_empty
from zephon_stream.writer.output import prepare_output
from zephon_stream.writer.pool import TokenizePool
from zephon_stream.writer.progress import Progress, WriteSummary
from zephon_stream.writer.ray_engine import check_engine, write_with_ray
from zephon_stream.writer.readers import Reject, SourceReader
from zephon_stream.writer.shards import ShardBuilder, ShardLayout
from zephon_stream.writer.token_check import frame_documents
from zephon_stream.writer.token_inputs import TokenInputConfig, TokenSource, token_input_urls
from zephon_stream.writer.tokenizers import Tokenizer, load_tokenizer

REJECTS_SPOOL_BYTES = 16 * 2**20


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
        return _Run(config=config, tokenizer=tok, readers=readers, store=store, progress=progress).execute()
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


class _Run:
    """One conversion; the accounting lives here."""

    def __init__(
        self,
        *,
        config: WriteConfig,
        tokenizer: Tokenizer,
        readers: list[Any],
        store: Store,
        progress: bool | None,
    ) -> None:
        assert config.blocks_per_shard is not None
        self.config = config
        self.tokenizer = tokenizer
        self.readers = readers
        self.store = store
        self.dtype = token_dtype(tokenizer.vocab_size)
        self.records = [0] * len(readers)
        self.documents = [0] * len(readers)
        # Rejects go to a spooled file (memory up to 16 MiB, then disk) so
        # a corpus with millions of them does not grow memory while it runs.
        self.rejects = tempfile.SpooledTemporaryFile(max_size=REJECTS_SPOOL_BYTES)
        self.num_rejects = 0
        self.reject_counts: Counter[str] = Counter()
        self.rejected = [0] * len(readers)
        self.bytes_done = 0
        self.show_progress = progress

    def execute(self) -> WriteSummary:
        start = time.monotonic()
        prepare_output(self.store, overwrite=self.config.overwrite)
        total_bytes = _total_size(self.readers)
        self.progress = Progress(enabled=self.show_progress, total_bytes=total_bytes)
        processes = 0 if self.config.tokens else self._tokenizer_processes(total_bytes)
        self.builder = ShardBuilder(
            store=self.store,
            layout=ShardLayout(
                dtype=self.dtype,
                block_tokens=self.config.block_tokens,
                blocks_per_shard=self.config.blocks_per_shard,
                zstd_level=self.config.zstd_level,
                # Token inputs skip the tokenizer pool, so --workers buys compression threads.
                compress_threads=self.config.workers if self.config.tokens else 2,
                borrow_input=self.config.tokens,
            ),
            sources=[r.url for r in self.readers],
        )
        try:
            if self.config.tokens:
                self._stream_tokens()
            else:
                with TokenizePool(
                    tokenizer=self.tokenizer,
                    dtype=self.dtype,
                    workers=max(processes, 1),
                    max_in_flight=2 * max(processes, 1) + 2,
                ) as pool:
                    self._stream(pool)
            # rejects.jsonl is written while the last blocks compress and
            # the last shard is written, not after them.
            self.builder.end_input()
            self.rejects.seek(0)
            self.store.write_atomic(REJECTS_NAME, self.rejects.read())
            shards = self.builder.finish()
        finally:
            self.builder.close()
            self.progress.close()
            self.rejects.close()
        self._remove_stale({name for s in shards for name in (s.path, s.index_path)})
        records_in, written = sum(self.records), sum(self.documents)
        assert records_in == written + self.num_rejects, (records_in, written, self.num_rejects)
        refuse_empty(
            output=self.store.url,
            num_tokens=self.builder.num_tokens,
            allow_empty=self.config.allow_empty,
            records_in=records_in,
            num_inputs=len(self.readers),
            rejected=self.reject_counts,
            rejects_path=REJECTS_NAME,
        )
        manifest = Manifest.create(
            tokenizer=self.tokenizer.identity(),
            block_tokens=self.config.block_tokens,
            blocks_per_shard=self.config.blocks_per_shard,
            shards=shards,
            sources=[
                SourceInfo(path=r.url, num_records=n, num_documents=d, num_rejected=j)
                for r, n, d, j in zip(self.readers, self.records, self.documents, self.rejected)
            ],
        )
        assert manifest.num_tokens == self.builder.num_tokens
        manifest.write(self.store)
        return WriteSummary.of(
            manifest,
            rejected=self.reject_counts,
            output=self.store.url,
            records_in=records_in,
            records_written=written,
            input_bytes=self.bytes_done,
            seconds=time.monotonic() - start,
            tokenizer_processes=processes,
        )

    def _tokenizer_processes(self, total_bytes: int | None) -> int:
        """Worker processes to tokenize with; 0 tokenizes in this process.

        Spawning them (an interpreter and the tokenizer's imports each) is a
        fixed cost that only a large enough input pays back; the output is
        the same either way.
        """
        workers, floor_bytes = self.config.workers, self.config.pool_min_input_bytes
        if workers <= 1:
            return 0
        if floor_bytes and not self.tokenizer.worth_processes:
            return 0
        # Compressed files and Parquet expand by a factor unknown before reading.
        plain = all(r.compression is None and r.format != "parquet" for r in self.readers)
        if plain and total_bytes is not None and total_bytes < floor_bytes:
            return 0
        return workers

    def _remove_stale(self, keep: set[str]) -> None:
        for path in self.store.list(SHARDS_DIR + "/"):
            if path not in keep:
                self.store.delete(path)
        if isinstance(self.store, LocalStore):
            # A killed run can leave a half-written temporary file, which
            # the store never lists; nothing else writes into this folder now.
            root = self.store.root
            leftovers = [*(root / SHARDS_DIR).glob(TEMP_PREFIX + "*")]
            for name in (REJECTS_NAME, MANIFEST_NAME):
                leftovers += root.glob(f"{TEMP_PREFIX}{name}.*")
            for leftover in leftovers:
                leftover.unlink(missing_ok=True)

    def _stream(self, pool: TokenizePool) -> None:
        texts: list[str] = []
        sources: list[int] = []
        records: list[int] = []
        chars = 0
        for index, reader in enumerate(self.readers):
            for record, item in reader:
                self.records[index] += 1
                if isinstance(item, Reject):
                    self._reject(index, item)
                    continue
                self.documents[index] += 1
                texts.append(item)
                sources.append(index)
                records.append(record)
                chars += len(item)
                if chars >= self.config.chunk_chars:
                    self._submit(pool, texts, sources, records, self.bytes_done + reader.bytes_read)
                    texts, sources, records, chars = [], [], [], 0
            self.bytes_done += reader.final_bytes_read
            self.progress.update(bytes_read=self.bytes_done, tokens=self.builder.num_tokens)
        if texts:
            self._submit(pool, texts, sources, records, self.bytes_done)
        while len(pool):
            self._take(pool)

    def _reject(self, index: int, item: Reject) -> None:
        self.rejects.write(item.to_json().encode("utf-8") + b"\n")
        self.num_rejects += 1
        self.reject_counts[item.reason] += 1
        self.rejected[index] += 1

    def _stream_tokens(self) -> None:
        for index, source in enumerate(self.readers):
            for raw in source:
                framed = frame_documents(
                    raw,
                    vocab_size=self.tokenizer.vocab_size,
                    eos_id=self.tokenizer.eos_id,
                    append_eos=self.config.append_eos,
                    dtype=self.dtype,
                )
                self.records[index] += raw.num_records
                for reject in framed.rejects:
                    self._reject(index, reject)
                self.documents[index] += len(framed.lengths)
                sources = np.full(len(framed.lengths), index, dtype=np.int64)
                self.builder.add(framed.tokens, framed.lengths, sources, framed.records)
                self.progress.update(bytes_read=self.bytes_done + source.bytes_read, tokens=self.builder.num_tokens)
            self.bytes_done += source.final_bytes_read

    def _submit(
        self, pool: TokenizePool, texts: list[str], sources: list[int], records: list[int], bytes_read: int
    ) -> None:
        while pool.full:
            self._take(pool)
        tag = (np.asarray(sources, dtype=np.int64), np.asarray(records, dtype=np.int64), bytes_read)
        pool.submit(texts, tag)

    def _take(self, pool: TokenizePool) -> None:
        tokens, lengths, (sources, records, bytes_read) = pool.take()
        assert len(lengths) == len(sources)
        self.builder.add(tokens, lengths, sources, records)
        self.progress.update(bytes_read=bytes_read, tokens=self.builder.num_tokens)


def _total_size(readers: list[Any]) -> int | None:
    """Total stored size of local inputs; None when any is remote (no ETA)."""
    total = 0
    for reader in readers:
        if not is_local_url(reader.url) or not os.path.isfile(local_path(reader.url)):
            return None
        total += os.path.getsize(local_path(reader.url))
    return total
