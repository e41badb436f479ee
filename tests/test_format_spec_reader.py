"""A reader written from docs/FORMAT.md alone (msgpack, zstandard, hashlib, numpy),
run on the writer's output: the spec is enough to read a dataset back."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import msgpack
import numpy as np
import zstandard


def spec_read(root: Path) -> tuple[dict, np.ndarray, list[tuple[int, str, int]]]:
    """(manifest, token stream, [(global start, source, record)]) per FORMAT.md sections 4-6."""
    manifest = msgpack.unpackb((root / "manifest").read_bytes(), raw=False)
    assert manifest["format"] == "zephon-stream" and manifest["version"][0] == 1
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
        documents += [(shard_base + int(s), index["sources"][int(i)], int(r)) for s, i, r in zip(starts, source, record)]
        shard_base += shard["num_tokens"]
        fingerprint_text += f"shard={shard['num_tokens']} {shard['sha256']}\n"
    assert hashlib.sha256(fingerprint_text.encode()).hexdigest() == manifest["fingerprint"]
    stream = np.concatenate(pieces)
    assert len(stream) == manifest["num_tokens"]
    return manifest, stream, documents


def test_spec_reader_recovers_every_document_of_the_writer(small_dataset) -> None:
    manifest, stream, documents = spec_read(Path(small_dataset.url))
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
