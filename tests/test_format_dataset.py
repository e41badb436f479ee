"""A small dataset built from the format functions alone, and its layout rules.

``make_dataset`` is also used by the reader, verify and inspect tests so they
do not depend on the writer.
"""

from __future__ import annotations

import hashlib
import json
import sysconfig
from pathlib import Path

import numpy as np

from zephon_stream.format.block import decode_block, encode_block
from zephon_stream.format.docindex import DocIndex
from zephon_stream.format.manifest import Manifest, ShardInfo, SourceInfo, TokenizerInfo
from zephon_stream.format.spec import MANIFEST_NAME, REJECTS_NAME, index_name, shard_name, token_dtype

BYTES_TOKENIZER = TokenizerInfo(
    kind="bytes", name="bytes", vocab_size=257, eos_id=256, bos_id=None, fingerprint="bytes-v1"
)


def stdlib_documents(count: int, *, max_bytes: int = 3000) -> list[tuple[str, bytes]]:
    """(source path, text bytes) of real Python stdlib files, in sorted order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    docs = []
    for path in sorted(root.glob("*.py")):
        data = path.read_bytes()[:max_bytes]
        if data:
            docs.append((path.name, data))
        if len(docs) == count:
            break
    return docs


def make_dataset(
    root: Path,
    docs: list[tuple[str, np.ndarray]],
    *,
    tokenizer: TokenizerInfo = BYTES_TOKENIZER,
    block_tokens: int = 1000,
    blocks_per_shard: int = 3,
    version: tuple[int, int] | None = None,
    rejects: list[dict] = (),
) -> Manifest:
    """Write a committed dataset of ``docs`` (source, tokens incl. EOS) under ``root``.

    Documents are token-concatenated in order; shards are cut every
    ``blocks_per_shard * block_tokens`` tokens, as the format requires.
    """
    dtype = token_dtype(tokenizer.vocab_size)
    stream = np.concatenate([np.asarray(t, dtype=dtype) for _, t in docs])
    starts = np.cumsum([0] + [len(t) for _, t in docs[:-1]])
    source_names = sorted({s for s, _ in docs})
    records: dict[str, int] = {}
    doc_records = []
    for source, _ in docs:
        doc_records.append(records.get(source, 0))
        records[source] = records.get(source, 0) + 1
    shard_tokens = block_tokens * blocks_per_shard
    (root / "shards").mkdir(parents=True, exist_ok=True)
    shards = []
    for index, shard_start in enumerate(range(0, len(stream), shard_tokens)):
        chunk = stream[shard_start : shard_start + shard_tokens]
        frames = [encode_block(chunk[i : i + block_tokens]) for i in range(0, len(chunk), block_tokens)]
        data = b"".join(frames)
        offsets = np.concatenate([[0], np.cumsum([len(f) for f in frames])]).tolist()
        here = (starts >= shard_start) & (starts < shard_start + len(chunk))
        local_sources = sorted({docs[i][0] for i in np.flatnonzero(here)})
        sidecar = DocIndex.build(
            doc_starts=starts[here] - shard_start,
            doc_source=[local_sources.index(docs[i][0]) for i in np.flatnonzero(here)],
            doc_record=[doc_records[i] for i in np.flatnonzero(here)],
            sources=local_sources,
        ).to_bytes()
        (root / shard_name(index)).write_bytes(data)
        (root / index_name(index)).write_bytes(sidecar)
        shards.append(
            ShardInfo(
                path=shard_name(index),
                num_tokens=len(chunk),
                num_bytes=len(data),
                sha256=hashlib.sha256(data).hexdigest(),
                block_offsets=tuple(int(o) for o in offsets),
                index_path=index_name(index),
                index_sha256=hashlib.sha256(sidecar).hexdigest(),
                num_documents=int(here.sum()),
            )
        )
    rejected_by_source: dict[str, int] = {}
    for reject in rejects:
        rejected_by_source[reject["source"]] = rejected_by_source.get(reject["source"], 0) + 1
    names = sorted(set(source_names) | set(rejected_by_source))
    sources = [
        SourceInfo(
            path=name,
            num_records=records.get(name, 0) + rejected_by_source.get(name, 0),
            num_documents=records.get(name, 0),
            num_rejected=rejected_by_source.get(name, 0),
        )
        for name in names
    ]
    manifest = Manifest.create(
        tokenizer=tokenizer,
        block_tokens=block_tokens,
        blocks_per_shard=blocks_per_shard,
        shards=shards,
        sources=sources,
        **({} if version is None else {"version": version}),
    )
    (root / REJECTS_NAME).write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rejects))
    for path, data in manifest.objects().items():  # Format 1.1's index objects, the manifest last
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)
    return manifest


def byte_docs(count: int = 12) -> list[tuple[str, np.ndarray]]:
    """Real stdlib text as ``bytes``-tokenizer documents (UTF-8 bytes then EOS 256)."""
    return [
        (name, np.append(np.frombuffer(text, dtype=np.uint8).astype(np.uint16), 256))
        for name, text in stdlib_documents(count)
    ]


def test_dataset_blocks_concatenate_to_the_token_stream(tmp_path: Path) -> None:
    docs = byte_docs()
    manifest = make_dataset(tmp_path, docs)
    expected = np.concatenate([t for _, t in docs])
    pieces = []
    for block_id in range(manifest.num_blocks):
        path, start, end = manifest.block_byte_range(block_id)
        frame = (tmp_path / path).read_bytes()[start:end]
        pieces.append(
            decode_block(frame, num_tokens=manifest.block_num_tokens(block_id), dtype=manifest.np_dtype, where=path)
        )
        assert manifest.token_offset_of_block(block_id) == sum(len(p) for p in pieces[:-1])
    assert np.array_equal(np.concatenate(pieces), expected)
    assert manifest.num_tokens == len(expected)
    assert manifest.num_documents == len(docs)


def test_every_shard_is_full_except_the_last(tmp_path: Path) -> None:
    manifest = make_dataset(tmp_path, byte_docs(), block_tokens=500, blocks_per_shard=4)
    assert manifest.num_shards >= 3
    for shard in manifest.shards[:-1]:
        assert shard.num_tokens == 500 * 4 and shard.num_blocks == 4
    counts = manifest.block_token_counts()
    assert (counts[:-1] == 500).all() and 0 < counts[-1] <= 500


def test_manifest_file_round_trips_and_is_byte_identical_when_rewritten(tmp_path: Path) -> None:
    first = make_dataset(tmp_path / "a", byte_docs())
    second = make_dataset(tmp_path / "b", byte_docs())
    data = (tmp_path / "a" / MANIFEST_NAME).read_bytes()
    assert data == (tmp_path / "b" / MANIFEST_NAME).read_bytes()
    assert (
        Manifest.from_bytes(data, where="a", read=lambda path: (tmp_path / "a" / path).read_bytes()) == first == second
    )
    for shard in first.shards:
        assert (tmp_path / "a" / shard.path).read_bytes() == (tmp_path / "b" / shard.path).read_bytes()
