"""The pool engine's run: one conversion on this process and its tokenizer pool.

In order: read the inputs on this process, record by record, in input order;
send chunks of texts to the tokenizer pool (results come back in submission
order, so the token stream is the same for any worker count); cut the stream
into blocks and shards, each shard written as it fills; then
``rejects.jsonl``; then, after checking that every record is accounted for
and that a token is there to commit (``empty.py``), the manifest, which
commits the dataset. Token inputs skip the pool: each batch of documents is
checked and framed with EOS on this process (``token_check.py``) and the
shard builder compresses on ``workers`` threads. ``write_dataset`` (api.py)
makes the readers and the store and starts it.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections import Counter
from typing import Any

import numpy as np

from zephon_stream.format.manifest import Manifest, SourceInfo
from zephon_stream.format.spec import MANIFEST_NAME, REJECTS_NAME, SHARDS_DIR, token_dtype
from zephon_stream.storage import LocalStore, Store, is_local_url, local_path
from zephon_stream.storage.local import TEMP_PREFIX
from zephon_stream.writer.config import WriteConfig
from zephon_stream.writer.empty import refuse_empty
from zephon_stream.writer.output import prepare_output
from zephon_stream.writer.pool import TokenizePool
from zephon_stream.writer.progress import Progress, WriteSummary
from zephon_stream.writer.readers import Reject
from zephon_stream.writer.shards import ShardBuilder, ShardLayout
from zephon_stream.writer.token_check import frame_documents
from zephon_stream.writer.tokenizers import Tokenizer

REJECTS_SPOOL_BYTES = 16 * 2**20


class PoolRun:
    """One conversion on this process and its tokenizer pool; the accounting lives here.

    ``execute()`` runs it and returns the ``WriteSummary``.
    """

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
