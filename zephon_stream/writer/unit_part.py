"""One work unit converted into its part folder, with a commit record last.

A part, ``OUTPUT/NAME/``, holds ``shards/`` (shards and document-index
sidecars, named by their place in the part), ``rejects.jsonl`` when the unit
rejected records, and ``unit-commit``: a small msgpack record naming the
part's shards with their sizes and digests, the unit's per-source accounting
and its key (``units.unit_key``). The record is written last; a unit is
complete only when it exists and holds the run's key.

Every name depends on the unit's place in the input order alone, and the bytes
on its inputs and settings alone, so an attempt that is retried or rerun
writes the same objects over whatever an attempt killed midway left: a shard
it had written is rewritten with the same bytes, and a temporary file it left
is removed before the record names anything.
"""

from __future__ import annotations

import tempfile
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

from zephon_stream.errors import ManifestError, ObjectMissingError
from zephon_stream.format.manifest import ShardInfo
from zephon_stream.format.spec import REJECTS_NAME, SHARDS_DIR, token_dtype
from zephon_stream.storage import LocalStore, Store, join_url, open_store
from zephon_stream.storage.local import TEMP_PREFIX
from zephon_stream.writer.config import WriteConfig
from zephon_stream.writer.pool import TokenizePool
from zephon_stream.writer.readers import Reject, SourceReader
from zephon_stream.writer.shards import ShardBuilder, ShardLayout
from zephon_stream.writer.token_check import RawDocuments, frame_documents
from zephon_stream.writer.token_inputs import TokenInputConfig, TokenSource
from zephon_stream.writer.tokenizers import Tokenizer
from zephon_stream.writer.units import WorkUnit

UNIT_RECORD_NAME = "unit-commit"
UNIT_RECORD_FORMAT = "zephon-stream-unit"
UNIT_RECORD_VERSION = 1
# Chunks of text queued for the tokenizer thread, as write_dataset(workers=1) queues them.
TOKENIZE_IN_FLIGHT = 4


@dataclass(frozen=True, slots=True, kw_only=True)
class SourceCount:
    """What one unit read of one input."""

    path: str
    num_records: int
    num_documents: int
    num_rejected: int


@dataclass(frozen=True, slots=True, kw_only=True)
class UnitRecord:
    """A unit's commit record: its part's shards and its accounting.

    Attributes:
        name: the part folder, relative to the output.
        key: ``unit_key`` of the unit and settings that wrote it.
        shards: the part's shards, paths relative to the part.
        sources: per input piece, in input order.
        rejected: reject counts by reason.
        num_tokens: tokens written.
        input_bytes: stored input bytes read.
    """

    name: str
    key: str
    shards: tuple[ShardInfo, ...]
    sources: tuple[SourceCount, ...]
    rejected: dict[str, int] = field(default_factory=dict)
    num_tokens: int = 0
    input_bytes: int = 0

    @property
    def num_rejected(self) -> int:
        return sum(self.rejected.values())

    @property
    def num_records(self) -> int:
        return sum(s.num_records for s in self.sources)

    def to_bytes(self) -> bytes:
        return msgpack.packb(
            {
                "format": UNIT_RECORD_FORMAT,
                "version": UNIT_RECORD_VERSION,
                "name": self.name,
                "key": self.key,
                "shards": [s.to_obj() for s in self.shards],
                "sources": [[s.path, s.num_records, s.num_documents, s.num_rejected] for s in self.sources],
                "rejected": dict(sorted(self.rejected.items())),
                "num_tokens": self.num_tokens,
                "input_bytes": self.input_bytes,
            },
            use_bin_type=True,
        )

    @classmethod
    def from_bytes(cls, data: bytes, *, where: str) -> UnitRecord:
        """Decode a record.

        Raises:
            ManifestError: bytes that are not a unit record of this version.
        """
        try:
            obj = msgpack.unpackb(data, raw=False)
            if obj.get("format") != UNIT_RECORD_FORMAT or obj.get("version") != UNIT_RECORD_VERSION:
                raise ManifestError(
                    f"{where}: not a unit record of version {UNIT_RECORD_VERSION} "
                    f"(format {obj.get('format')!r}, version {obj.get('version')!r})"
                )
            return cls(
                name=obj["name"],
                key=obj["key"],
                shards=tuple(ShardInfo.from_obj(s, where=f"{where}: shards[{i}]") for i, s in enumerate(obj["shards"])),
                sources=tuple(
                    SourceCount(path=p, num_records=r, num_documents=d, num_rejected=j) for p, r, d, j in obj["sources"]
                ),
                rejected=dict(obj["rejected"]),
                num_tokens=obj["num_tokens"],
                input_bytes=obj["input_bytes"],
            )
        except ManifestError:
            raise
        except (ValueError, TypeError, KeyError, AttributeError, msgpack.UnpackException) as exc:
            raise ManifestError(f"{where}: unreadable unit record: {type(exc).__name__}: {exc}") from None


@dataclass(frozen=True, slots=True, kw_only=True)
class UnitSpec:
    """What every unit of one run shares (sent to each task once).

    Attributes:
        output: the dataset root; parts go below it.
        config: the run's resolved settings.
        tokenizer: the loaded tokenizer.
        storage_options: fsspec options for inputs and output.
    """

    output: str
    config: WriteConfig
    tokenizer: Tokenizer
    storage_options: Mapping[str, Any] | None = None

    def settings(self) -> dict[str, Any]:
        """What a part's bytes depend on besides its inputs (part of each unit's key)."""
        c = self.config
        return {
            "tokenizer": self.tokenizer.identity().fingerprint,
            "eos": self.tokenizer.eos_id,
            "bos": self.tokenizer.bos_id,
            "block_tokens": c.block_tokens,
            "blocks_per_shard": c.blocks_per_shard,
            "zstd_level": c.zstd_level,
            "text_field": c.text_field,
            "lines": c.lines,
            "input_format": c.input_format,
            "tokens_field": c.tokens_field,
            "token_dtype": c.token_dtype,
            "append_eos": c.append_eos,
        }


def read_unit_record(store: Store, name: str) -> UnitRecord | None:
    """The commit record of part ``name``, or None when there is none."""
    try:
        data = store.read(f"{name}/{UNIT_RECORD_NAME}")
    except ObjectMissingError:
        return None
    return UnitRecord.from_bytes(data, where=f"{store.url.rstrip('/')}/{name}/{UNIT_RECORD_NAME}")


class PartWriter:
    """Writes one part: documents in, shards, rejects and the commit record out.

    Args:
        spec: the run's shared settings.
        name: the part folder, relative to ``spec.output``.
        key: the unit key the record will hold.
        sources: the names documents refer to by index.
    """

    def __init__(self, *, spec: UnitSpec, name: str, key: str, sources: list[str]) -> None:
        assert spec.config.blocks_per_shard is not None
        self.spec, self.name, self.key = spec, name, key
        self.dtype = token_dtype(spec.tokenizer.vocab_size)
        self.store = open_store(join_url(spec.output, name), spec.storage_options)
        self.store.delete(UNIT_RECORD_NAME)  # Uncommit first: this part is being rewritten
        _remove_temp_files(self.store)
        self.builder = ShardBuilder(
            store=self.store,
            layout=ShardLayout(
                dtype=self.dtype,
                block_tokens=spec.config.block_tokens,
                blocks_per_shard=spec.config.blocks_per_shard,
                zstd_level=spec.config.zstd_level,
                compress_threads=1,
                borrow_input=spec.config.tokens,
            ),
            sources=sources,
        )
        self.rejects = tempfile.SpooledTemporaryFile(max_size=1 << 20)
        self.reject_counts: Counter[str] = Counter()

    def reject(self, item: Reject) -> None:
        self.rejects.write(item.to_json().encode("utf-8") + b"\n")
        self.reject_counts[item.reason] += 1

    def commit(self, sources: Iterable[SourceCount], input_bytes: int) -> UnitRecord:
        """Write the last shard, the rejects, then the record (the unit's commit)."""
        self.builder.end_input()
        if self.reject_counts:
            self.rejects.seek(0)
            self.store.write_atomic(REJECTS_NAME, self.rejects.read())
        else:
            self.store.delete(REJECTS_NAME)
        shards = self.builder.finish()
        keep = {n for s in shards for n in (s.path, s.index_path)}
        for path in self.store.list(SHARDS_DIR + "/"):
            if path not in keep:
                self.store.delete(path)
        record = UnitRecord(
            name=self.name,
            key=self.key,
            shards=tuple(shards),
            sources=tuple(sources),
            rejected=dict(sorted(self.reject_counts.items())),
            num_tokens=self.builder.num_tokens,
            input_bytes=input_bytes,
        )
        self.store.write_atomic(UNIT_RECORD_NAME, record.to_bytes())
        return record

    def close(self) -> None:
        self.builder.close()
        self.rejects.close()
        self.store.close()


def _remove_temp_files(store: Store) -> None:
    if isinstance(store, LocalStore):
        for folder in (store.root, store.root / SHARDS_DIR):
            for leftover in folder.glob(TEMP_PREFIX + "*"):
                leftover.unlink(missing_ok=True)


def convert_unit(unit: WorkUnit, spec: UnitSpec, *, name: str, key: str) -> UnitRecord:
    """Convert ``unit`` into the part ``name`` below ``spec.output``; its record is written last.

    Whatever the part folder holds is replaced (the driver has found no
    record with ``key`` there). Text is tokenized on one helper thread while
    this one reads and writes shards, as ``write_dataset(workers=1)`` does.

    Raises:
        InputError: an input that cannot be read (named, with the offset).
    """
    writer = PartWriter(spec=spec, name=name, key=key, sources=[p.url for p in unit.pieces])
    try:
        if spec.config.tokens:
            counts = [_token_piece(writer, index, piece.url) for index, piece in enumerate(unit.pieces)]
        else:
            # Measured (docs/WRITING.md, "CPU per token"): tokenizing on
            # this thread, between the reading and the shard building, cost
            # 1.12-1.37x the CPU of tokenizing on a thread of its own (as the
            # pool's workers do, being processes of their own).
            with TokenizePool(
                tokenizer=spec.tokenizer, dtype=writer.dtype, workers=1, max_in_flight=TOKENIZE_IN_FLIGHT
            ) as pool:
                counts = [_text_piece(writer, pool, index, piece) for index, piece in enumerate(unit.pieces)]
                while len(pool):
                    _add_tokens(writer, pool)
        return writer.commit(counts, unit.num_bytes)
    finally:
        writer.close()


def _add_tokens(writer: PartWriter, pool: TokenizePool) -> None:
    tokens, lengths, (index, numbers) = pool.take()
    writer.builder.add(tokens, lengths, np.full(len(lengths), index, np.int64), np.asarray(numbers, np.int64))


def _text_piece(writer: PartWriter, pool: TokenizePool, index: int, piece: Any) -> SourceCount:
    config = writer.spec.config
    reader = SourceReader(
        piece.url,
        text_field=config.text_field,
        lines=config.lines,
        input_format_override=config.input_format,
        storage_options=writer.spec.storage_options,
        byte_range=piece.byte_range,
        row_groups=piece.row_groups,
        first_record=piece.first_record,
    )
    records = documents = rejected = 0
    texts: list[str] = []
    numbers: list[int] = []
    chars = 0

    def submit() -> None:
        nonlocal texts, numbers
        while pool.full:
            _add_tokens(writer, pool)
        pool.submit(texts, (index, numbers))
        texts, numbers = [], []

    for number, item in reader:
        records += 1
        if isinstance(item, Reject):
            writer.reject(item)
            rejected += 1
            continue
        documents += 1
        texts.append(item)
        numbers.append(number)
        chars += len(item)
        if chars >= config.chunk_chars:
            submit()
            chars = 0
    if texts:
        submit()
    return SourceCount(path=piece.url, num_records=records, num_documents=documents, num_rejected=rejected)


def add_raw_documents(writer: PartWriter, index: int, raw: RawDocuments) -> tuple[int, int, int]:
    """Check and frame ``raw``'s token ids into the part; ``(records, documents, rejected)``."""
    tokenizer = writer.spec.tokenizer
    framed = frame_documents(
        raw,
        vocab_size=tokenizer.vocab_size,
        eos_id=tokenizer.eos_id,
        append_eos=writer.spec.config.append_eos,
        dtype=writer.dtype,
    )
    for reject in framed.rejects:
        writer.reject(reject)
    sources = np.full(len(framed.lengths), index, dtype=np.int64)
    writer.builder.add(framed.tokens, framed.lengths, sources, framed.records)
    return raw.num_records, len(framed.lengths), len(framed.rejects)


def _token_piece(writer: PartWriter, index: int, url: str) -> SourceCount:
    config, tokenizer = writer.spec.config, writer.spec.tokenizer
    token_config = TokenInputConfig(
        tokens_field=config.tokens_field, token_dtype=config.token_dtype, eos_id=tokenizer.eos_id
    )
    records = documents = rejected = 0
    for raw in TokenSource(url, config=token_config, storage_options=writer.spec.storage_options):
        r, d, j = add_raw_documents(writer, index, raw)
        records, documents, rejected = records + r, documents + d, rejected + j
    return SourceCount(path=url, num_records=records, num_documents=documents, num_rejected=rejected)
