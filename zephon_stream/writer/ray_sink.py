"""``ShardSink``: a Ray Data ``Datasink`` that writes a dataset from a Ray Dataset's rows.

Each write task converts the rows it is given into one part,
``OUTPUT/part-TTTTT/`` (``TTTTT``: the task's index in the write operator,
which a retried task keeps), committed by its own record as the engine's
units are (``unit_part.py``). The driver's ``on_write_complete`` then writes
one manifest over the parts in task-index order (``ray_commit.py``). Each
part's rows are one source, ``SOURCE_NAME/part-TTTTT``, its records numbered
by row from 0. The result is deterministic where the Dataset's order is:
set ``DataContext.get_current().execution_options.preserve_order = True``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from zephon_stream.errors import ConfigError
from zephon_stream.format.manifest import Manifest
from zephon_stream.format.spec import DEFAULT_BLOCK_TOKENS, DEFAULT_ZSTD_LEVEL
from zephon_stream.storage import open_store
from zephon_stream.writer.config import WriteConfig
from zephon_stream.writer.output import prepare_output
from zephon_stream.writer.pool import encode_chunk
from zephon_stream.writer.ray_commit import commit_units
from zephon_stream.writer.readers import Reject
from zephon_stream.writer.rejects import a_type
from zephon_stream.writer.token_check import RawDocuments
from zephon_stream.writer.tokenizers import Tokenizer, load_tokenizer
from zephon_stream.writer.unit_part import PartWriter, SourceCount, UnitRecord, UnitSpec, add_raw_documents

try:
    from ray.data import Datasink
except ImportError:  # The class is defined only where Ray is installed; zephon_stream.ray says how to get it
    Datasink = object  # type: ignore[assignment,misc]


def sink_part_name(task_index: int) -> str:
    """Folder of write task ``task_index``'s part: ``part-00003``."""
    return f"part-{task_index:05d}"


class ShardSink(Datasink):  # type: ignore[misc,valid-type]
    """Write a Ray Dataset's text (or token-id) column as a zephon-stream dataset.

    ``ds.write_datasink(ShardSink(output, tokenizer="hf:tokenizer.json"))``.

    Args:
        output: the dataset root (local folder or ``s3://``, ``gs://``, ``az://`` URL).
        tokenizer: ``bytes``, ``hf:PATH_OR_URL``, ``tiktoken:NAME_OR_PATH`` or a loaded ``Tokenizer``.
        text_column: the column of documents' text.
        tokens_column: instead of text, a column of token-id lists (ids of
            ``tokenizer``, each document ending with EOS unless ``append_eos``).
        block_tokens: tokens per block.
        blocks_per_shard: blocks per shard (default: shards of ~64 Mi tokens).
        zstd_level: zstd level of each block.
        storage_options: fsspec options for the output and tokenizer file.
        overwrite: replace a dataset already committed at ``output``.
        eos_token: end-of-document token of an ``hf:``/``tiktoken:`` tokenizer.
        bos_token: start-of-document token (text only).
        append_eos: token ids: end each document that lacks EOS with one.
        source_name: the prefix of each part's source name.

    After the write, ``manifest`` holds the committed manifest (on the driver).
    """

    def __init__(
        self,
        output: str,
        *,
        tokenizer: str | Tokenizer,
        text_column: str = "text",
        tokens_column: str | None = None,
        block_tokens: int = DEFAULT_BLOCK_TOKENS,
        blocks_per_shard: int | None = None,
        zstd_level: int = DEFAULT_ZSTD_LEVEL,
        storage_options: Mapping[str, Any] | None = None,
        overwrite: bool = False,
        eos_token: str | None = None,
        bos_token: str | None = None,
        append_eos: bool = False,
        source_name: str = "ray-dataset",
    ) -> None:
        if Datasink is object:
            raise ConfigError("ShardSink needs Ray Data: pip install 'zephon-stream[ray]'")
        config = WriteConfig(
            text_field=tokens_column or text_column,
            input_format="tokens" if tokens_column else None,
            block_tokens=block_tokens,
            blocks_per_shard=blocks_per_shard,
            zstd_level=zstd_level,
            overwrite=overwrite,
            tokens_field=tokens_column or "input_ids",
            append_eos=append_eos,
        ).resolved()
        if tokens_column and bos_token is not None:
            raise ConfigError("token ids are written as they are: no BOS is added (drop bos_token)")
        if isinstance(tokenizer, str):
            tokenizer = load_tokenizer(
                tokenizer, eos_token=eos_token, bos_token=bos_token, storage_options=storage_options
            )
        self.spec = UnitSpec(output=str(output), config=config, tokenizer=tokenizer, storage_options=storage_options)
        self.column = tokens_column or text_column
        self.source_name = source_name
        self.manifest: Manifest | None = None

    def get_name(self) -> str:
        return "ZephonShards"

    def on_write_start(self, schema: Any = None) -> None:
        if schema is not None and self.column not in schema.names:
            raise ConfigError(
                f"ShardSink: the dataset has no column {self.column!r} (columns: {', '.join(schema.names)})"
            )
        with open_store(self.spec.output, self.spec.storage_options) as store:
            prepare_output(store, overwrite=self.spec.config.overwrite)

    def write(self, blocks: Iterable[Any], ctx: Any) -> UnitRecord:
        from ray.data.block import BlockAccessor

        name = sink_part_name(ctx.task_idx)
        source = f"{self.source_name}/{name}"
        writer = PartWriter(spec=self.spec, name=name, key=name, sources=[source])
        try:
            row = documents = rejected = 0
            for block in blocks:
                column = BlockAccessor.for_block(block).to_arrow().column(self.column).combine_chunks()
                if self.spec.config.tokens:
                    r, d, j = add_raw_documents(writer, 0, _token_rows(column, source, self.column, row))
                else:
                    r, d, j = self._text_rows(writer, column.to_pylist(), source, row)
                row, documents, rejected = row + r, documents + d, rejected + j
            count = SourceCount(path=source, num_records=row, num_documents=documents, num_rejected=rejected)
            return writer.commit([count], 0)
        finally:
            writer.close()

    def _text_rows(self, writer: PartWriter, values: list[Any], source: str, first_row: int) -> tuple[int, int, int]:
        texts, records = [], []
        for number, value in enumerate(values, start=first_row):
            reason = None
            if value is None:
                reason, detail = "missing_field", f"no value in column {self.column!r}"
            elif not isinstance(value, str):
                reason, detail = "not_string", f"column {self.column!r} holds {a_type(value)}, not a string"
            elif not value:
                reason, detail = "empty", f"column {self.column!r} is empty"
            if reason is not None:
                writer.reject(Reject(source, number, reason, detail))
                continue
            texts.append(value)
            records.append(number)
        if texts:
            tokens, lengths = encode_chunk(self.spec.tokenizer, texts, writer.dtype)
            writer.builder.add(tokens, lengths, np.zeros(len(lengths), np.int64), np.asarray(records, np.int64))
        return len(values), len(texts), len(values) - len(texts)

    def on_write_complete(self, write_result: Any) -> None:
        records = sorted(write_result.write_returns, key=lambda r: int(r.name.rsplit("-", 1)[1]))
        config = self.spec.config
        assert config.blocks_per_shard is not None
        with open_store(self.spec.output, self.spec.storage_options) as store:
            self.manifest, _ = commit_units(
                store,
                [r.name for r in records],
                tokenizer=self.spec.tokenizer.identity(),
                block_tokens=config.block_tokens,
                blocks_per_shard=config.blocks_per_shard,
            )


def _token_rows(column: Any, source: str, name: str, first_row: int) -> RawDocuments:
    import pyarrow.compute as pc

    rows = np.arange(first_row, first_row + len(column), dtype=np.int64)
    valid = column.is_valid().to_numpy(zero_copy_only=False)
    lengths = pc.list_value_length(column).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    values = column.flatten().to_numpy(zero_copy_only=False)
    rejects = [Reject(source, int(r), "missing_field", f"null in column {name!r}") for r in rows[~valid]]
    return RawDocuments(
        source=source,
        tokens=values,
        lengths=lengths[valid],
        records=rows[valid],
        rejects=rejects,
        num_records=len(column),
    )
