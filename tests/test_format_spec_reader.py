"""A reader written from docs/FORMAT.md alone (msgpack, zstandard, hashlib, numpy),
run on the writer's output: the spec is enough to read a dataset back."""

from __future__ import annotations

import hashlib
import math
import shutil
from pathlib import Path

import msgpack
import numpy as np
import zstandard

FIXTURE = Path(__file__).resolve().parent / "data" / "format-1.0"


def spec_table(root: Path, entry: dict) -> dict[str, np.ndarray]:
    """Every column of a table object, each page checked (FORMAT.md 11.2)."""
    data = (root / entry["path"]).read_bytes()
    assert len(data) == entry["num_bytes"] and hashlib.sha256(data).hexdigest() == entry["sha256"]
    page, rows = entry["page_bytes"], entry["rows"]

    def blake(chunk: bytes) -> bytes:
        return hashlib.blake2b(chunk, digest_size=16).digest()

    region = data[entry["digests_offset"] :]
    assert b"".join(blake(region[i : i + page]) for i in range(0, len(region), page)) == entry["digest_pages"]
    columns, digests, offset = {}, [], 0
    for column in entry["columns"]:
        width = np.dtype(column["type"]).itemsize
        assert column["offset"] == offset
        body = data[offset : offset + rows * width]
        digests += [blake(body[i : i + page]) for i in range(0, len(body), page)]
        columns[column["name"]] = np.frombuffer(body, dtype=column["type"])
        offset += rows * width
    assert offset == entry["digests_offset"] and b"".join(digests) == region
    return columns


def spec_entries(root: Path, manifest: dict) -> tuple[list[dict], list[dict]]:
    """The 1.0 shard and source entries of a 1.1 manifest, from its index objects (FORMAT.md 11.3)."""
    frames = spec_table(root, manifest["index"]["blocks"])["frames"]
    frames = frames.view([("start", "<u8"), ("end", "<u8"), ("shard", "<u4"), ("block", "<u4"), ("tokens", "<u4")])
    table = spec_table(root, manifest["index"]["shards"])
    shards = []
    for i in range(manifest["num_shards"]):
        rows = frames[frames["shard"] == i]
        assert rows["block"].tolist() == list(range(len(rows))) and int(table["first_block"][i]) == int(
            np.flatnonzero(frames["shard"] == i)[0]
        )
        shards.append(
            {
                "path": table["path"][i].decode(),
                "index_path": table["index_path"][i].decode(),
                "num_tokens": int(table["num_tokens"][i]),
                "num_bytes": int(table["num_bytes"][i]),
                "num_documents": int(table["num_documents"][i]),
                "sha256": bytes(table["sha256"][i]).hex(),
                "index_sha256": bytes(table["index_sha256"][i]).hex(),
                "block_offsets": [int(rows["start"][0]), *map(int, rows["end"])],
            }
        )
    short = manifest["short_blocks"]
    sizes = np.full(manifest["num_blocks"], manifest["block_tokens"])
    sizes[np.frombuffer(short["ids"], "<u8").astype(np.int64)] = np.frombuffer(short["counts"], "<u4")
    assert np.array_equal(frames["tokens"], sizes)
    sources_entry = manifest["index"]["sources"]
    data = (root / sources_entry["path"]).read_bytes()
    assert hashlib.sha256(data).hexdigest() == sources_entry["sha256"]
    return shards, msgpack.unpackb(data, raw=False)


def spec_read(root: Path) -> tuple[dict, np.ndarray, list[tuple[int, str, int]]]:
    """(manifest, token stream, [(global start, source, record)]) per FORMAT.md sections 4-6 and 11."""
    manifest = msgpack.unpackb((root / "manifest").read_bytes(), raw=False)
    assert manifest["format"] == "zephon-stream" and manifest["version"][0] == 1
    if "index" in manifest:
        manifest["shards"], manifest["sources"] = spec_entries(root, manifest)
    dtype = {"uint16": "<u2", "uint32": "<u4"}[manifest["dtype"]]
    itemsize = np.dtype(dtype).itemsize
    bt = manifest["block_tokens"]
    pieces, documents, shard_base = [], [], 0
    fingerprint_text = (
        f"zephon-stream dataset fingerprint\nformat_major=1\ndtype={manifest['dtype']}\n"
        f"tokenizer={manifest['tokenizer']['fingerprint']}\nblock_tokens={bt}\n"
    )
    for shard in manifest["shards"]:
        data = (root / shard["path"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == shard["sha256"] and len(data) == shard["num_bytes"]
        nblocks = math.ceil(shard["num_tokens"] / bt)
        offsets = shard["block_offsets"]
        assert len(offsets) == nblocks + 1 and offsets[0] == 0 and offsets[-1] == len(data)
        for b in range(nblocks):
            frame = data[offsets[b] : offsets[b + 1]]
            count = bt if b < nblocks - 1 else shard["num_tokens"] - (nblocks - 1) * bt
            params = zstandard.get_frame_parameters(frame)
            assert params.has_checksum and params.content_size == count * itemsize
            pieces.append(np.frombuffer(zstandard.ZstdDecompressor().decompress(frame), dtype=dtype))
        index_bytes = (root / shard["index_path"]).read_bytes()
        assert hashlib.sha256(index_bytes).hexdigest() == shard["index_sha256"]
        index = msgpack.unpackb(index_bytes, raw=False)
        starts = np.frombuffer(index["doc_starts"], "<u8")
        source = np.frombuffer(index["doc_source"], "<u4")
        record = np.frombuffer(index["doc_record"], "<u8")
        assert len(starts) == index["num_documents"] == shard["num_documents"]
        documents += [
            (shard_base + int(s), index["sources"][int(i)], int(r)) for s, i, r in zip(starts, source, record)
        ]
        shard_base += shard["num_tokens"]
        fingerprint_text += f"shard={shard['num_tokens']} {shard['sha256']}\n"
    assert hashlib.sha256(fingerprint_text.encode()).hexdigest() == manifest["fingerprint"]
    stream = np.concatenate(pieces)
    assert len(stream) == manifest["num_tokens"]
    return manifest, stream, documents


def test_spec_reader_reads_the_format_1_0_fixture_and_its_reindexed_copy(tmp_path: Path) -> None:
    from zephon_stream.cli import main

    shutil.copytree(FIXTURE, tmp_path / "ds")
    old = spec_read(tmp_path / "ds")
    assert main(["reindex", str(tmp_path / "ds")]) == 0
    new = spec_read(tmp_path / "ds")
    assert (old[0]["version"], new[0]["version"]) == ([1, 0], [1, 1])
    assert old[0]["fingerprint"] == new[0]["fingerprint"] and np.array_equal(old[1], new[1]) and old[2] == new[2]


def test_spec_reader_recovers_every_document_of_the_writer(small_dataset) -> None:
    manifest, stream, documents = spec_read(Path(small_dataset.url))
    assert manifest["version"] == [1, 1]
    assert manifest["tokenizer"]["kind"] == "bytes" and manifest["tokenizer"]["eos_id"] == 256
    ends = [start for start, _, _ in documents[1:]] + [len(stream)]
    texts = [stream[start:end] for (start, _, _), end in zip(documents, ends)]
    assert len(texts) == len(small_dataset.texts)
    for tokens, expected, (_, source, record) in zip(texts, small_dataset.texts, documents):
        assert tokens[-1] == 256
        assert tokens[:-1].astype(np.uint8).tobytes().decode("utf-8") == expected
        assert record == 0 and source.endswith(".py")
    assert [Path(s).name for _, s, _ in documents] == [p.name for p in small_dataset.sources]


def test_spec_reader_agrees_with_the_library_on_a_bpe_dataset(small_bpe_dataset) -> None:
    from zephon_stream.reader import DatasetReader

    manifest, stream, _ = spec_read(Path(small_bpe_dataset.url))
    with DatasetReader.open(small_bpe_dataset.url) as reader:
        assert np.array_equal(reader.read_tokens(0, reader.manifest.num_tokens), stream)
        assert reader.manifest.fingerprint == manifest["fingerprint"]
