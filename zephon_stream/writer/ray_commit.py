"""The driver's commit: every unit's record checked, one manifest over all parts.

The records are read in input order, a bounded number ahead on threads (a
store of 100,000 small objects is latency-bound), each checked against the
key its unit must hold. The manifest lists each part's shards by their paths
below the output root, in unit order, with the per-source accounting summed
over the units that read parts of one input, and the parts' rejects joined
into ``rejects.jsonl``. What stays in memory is one entry per shard and per
source (which the manifest needs) and the next few records; the rejects pass
through a spooled file. The manifest is written with ``Manifest.write`` (its
index objects, then the ``manifest`` itself): the commit of the dataset.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from zephon_stream.errors import ManifestError, ObjectMissingError
from zephon_stream.format.entries import TokenizerInfo
from zephon_stream.format.manifest import Manifest, ShardInfo, SourceInfo
from zephon_stream.format.spec import REJECTS_NAME
from zephon_stream.storage import Store
from zephon_stream.writer.empty import refuse_empty
from zephon_stream.writer.unit_part import UNIT_RECORD_NAME, UnitRecord, read_unit_record

COMMIT_READ_THREADS = 16
COMMIT_READ_AHEAD = 256
REJECTS_SPOOL_BYTES = 16 * 2**20


def iter_records(store: Store, names: Sequence[str], *, threads: int = COMMIT_READ_THREADS) -> Iterator[UnitRecord]:
    """The records of parts ``names``, in that order, read ahead on ``threads``.

    Raises:
        ObjectMissingError: a part without a record (a unit not complete).
    """

    def read(name: str) -> UnitRecord:
        record = read_unit_record(store, name)
        if record is None:
            raise ObjectMissingError(
                f"{store.url.rstrip('/')}/{name}/{UNIT_RECORD_NAME}: missing; the unit is not complete "
                "(rerun the conversion to finish it)"
            )
        return record

    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="zs-commit-read") as pool:
        pending: deque[Future[UnitRecord]] = deque()
        for name in names:
            pending.append(pool.submit(read, name))
            if len(pending) >= COMMIT_READ_AHEAD:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def complete_units(
    store: Store, names: Sequence[str], keys: Sequence[str], *, threads: int = COMMIT_READ_THREADS
) -> list[tuple[int, int] | None]:
    """Per part, ``(records, tokens)`` when its record holds the expected key (the unit is complete), else None.

    Only the counts are kept: the records themselves are read again, in order, by the commit.
    """

    def read(position: int) -> tuple[int, int] | None:
        try:
            record = read_unit_record(store, names[position])
        except ManifestError:
            return None  # An unreadable record is rewritten, like a missing one
        if record is None or record.key != keys[position]:
            return None
        return record.num_records, record.num_tokens

    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="zs-commit-read") as pool:
        return list(pool.map(read, range(len(names))))


@dataclasses.dataclass(slots=True, kw_only=True)
class CommitTotals:
    """What the commit found in the records (for the run's summary)."""

    records_in: int = 0
    records_written: int = 0
    rejected: Counter[str] = dataclasses.field(default_factory=Counter)
    input_bytes: int = 0
    num_units: int = 0


def commit_units(
    store: Store,
    names: Sequence[str],
    *,
    tokenizer: TokenizerInfo,
    block_tokens: int,
    blocks_per_shard: int,
    keys: Sequence[str] | None = None,
    on_record: Callable[[UnitRecord], None] | None = None,
    allow_empty: bool = False,
) -> tuple[Manifest, CommitTotals]:
    """Write the manifest of the dataset made of parts ``names``, in that order.

    Args:
        store: the output root.
        names: part folders relative to it, in input order.
        tokenizer: the identity the parts were written with.
        block_tokens: tokens per block of every part.
        blocks_per_shard: blocks per shard of every part.
        keys: the unit key each record must hold (None: any).
        on_record: called with each record as it is read (progress).
        allow_empty: commit a dataset that holds no tokens (else, with the
            rejects written, ``EmptyDatasetError``).

    Returns:
        The committed manifest and the totals of the records.

    Raises:
        ObjectMissingError: a unit without a record.
        ManifestError: a record of another run (its key differs), or whose
            shards do not fit the layout.
        EmptyDatasetError: no part holds a token and ``allow_empty`` is false.
    """
    shards: list[ShardInfo] = []
    sources: dict[str, list[int]] = {}
    totals = CommitTotals()
    with tempfile.SpooledTemporaryFile(max_size=REJECTS_SPOOL_BYTES) as rejects:
        for position, record in enumerate(iter_records(store, names)):
            name = names[position]
            if keys is not None and record.key != keys[position]:
                raise ManifestError(
                    f"{store.url.rstrip('/')}/{name}/{UNIT_RECORD_NAME}: written for other inputs or settings "
                    f"(key {record.key[:16]}, expected {keys[position][:16]}); rerun the conversion"
                )
            for shard in record.shards:
                if shard.num_blocks > blocks_per_shard or shard.num_tokens > shard.num_blocks * block_tokens:
                    raise ManifestError(
                        f"part {name} shard {shard.path}: {shard.num_tokens} tokens in {shard.num_blocks} blocks "
                        f"do not fit block_tokens {block_tokens} and blocks_per_shard {blocks_per_shard}"
                    )
                shards.append(
                    dataclasses.replace(shard, path=f"{name}/{shard.path}", index_path=f"{name}/{shard.index_path}")
                )
            for count in record.sources:
                totals_of = sources.setdefault(count.path, [0, 0, 0])
                totals_of[0] += count.num_records
                totals_of[1] += count.num_documents
                totals_of[2] += count.num_rejected
            if record.num_rejected:
                chunk = store.read(f"{name}/{REJECTS_NAME}")
                rejects.write(chunk if chunk.endswith(b"\n") else chunk + b"\n")
            totals.records_in += record.num_records
            totals.records_written += sum(s.num_documents for s in record.sources)
            totals.rejected.update(record.rejected)
            totals.input_bytes += record.input_bytes
            totals.num_units += 1
            if on_record is not None:
                on_record(record)
        assert totals.records_in == totals.records_written + sum(totals.rejected.values())
        rejects.seek(0)
        store.write_atomic(REJECTS_NAME, rejects.read())
    refuse_empty(
        output=store.url,
        num_tokens=sum(s.num_tokens for s in shards),
        allow_empty=allow_empty,
        records_in=totals.records_in,
        num_inputs=len(sources),
        rejected=totals.rejected,
        rejects_path=REJECTS_NAME,
    )
    manifest = Manifest.create(
        tokenizer=tokenizer,
        block_tokens=block_tokens,
        blocks_per_shard=blocks_per_shard,
        shards=shards,
        sources=[
            SourceInfo(path=p, num_records=r, num_documents=d, num_rejected=j) for p, (r, d, j) in sources.items()
        ],
    )
    del shards
    # The manifest is written last: its presence commits the dataset.
    manifest.write(store)
    return manifest, totals
