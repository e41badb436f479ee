"""DatasetReader and read_block: blocks, token ranges, documents and text, local and S3."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from test_format_dataset import byte_docs, make_dataset, stdlib_documents
from zephon_stream.errors import (
    ConfigError,
    CorruptBlockError,
    FormatError,
    ObjectMissingError,
    TokenizerError,
    TruncatedObjectError,
)
from zephon_stream.format.manifest import Manifest
from zephon_stream.reader import DatasetReader, read_block
from zephon_stream.storage import open_store


@pytest.fixture
def dataset(tmp_path: Path) -> tuple[Path, Manifest, list]:
    docs = byte_docs(12)
    return tmp_path, make_dataset(tmp_path, docs, block_tokens=900, blocks_per_shard=3), docs


def test_read_block_by_url_and_by_manifest(dataset) -> None:
    root, manifest, docs = dataset
    stream = np.concatenate([t for _, t in docs])
    for block_id in (0, 4, manifest.num_blocks - 1):
        start = manifest.token_offset_of_block(block_id)
        expected = stream[start : start + manifest.block_num_tokens(block_id)]
        assert np.array_equal(read_block(str(root), block_id), expected)
        assert np.array_equal(read_block(manifest, block_id, store=open_store(str(root))), expected)
    with pytest.raises(ConfigError, match="store"):
        read_block(manifest, 0)


def test_read_tokens_across_blocks_and_shards(dataset) -> None:
    root, manifest, docs = dataset
    stream = np.concatenate([t for _, t in docs])
    with DatasetReader.open(str(root)) as reader:
        for start, end in [
            (0, 1),
            (850, 2750),
            (2699, 2701),
            (0, manifest.num_tokens),
            (manifest.num_tokens, manifest.num_tokens),
        ]:
            assert np.array_equal(reader.read_tokens(start, end), stream[start:end])
        with pytest.raises(IndexError):
            reader.read_tokens(0, manifest.num_tokens + 1)


def test_every_document_is_recovered_through_the_document_index(dataset) -> None:
    root, manifest, docs = dataset
    with DatasetReader.open(str(root)) as reader:
        spans = reader.documents(0, manifest.num_tokens)
        assert len(spans) == len(docs)
        for span, (name, tokens) in zip(spans, docs):
            assert span.source == name
            assert np.array_equal(reader.document_tokens(span), tokens)


def test_documents_of_a_block_include_the_one_started_in_an_earlier_shard(dataset) -> None:
    root, manifest, docs = dataset
    with DatasetReader.open(str(root)) as reader:
        first_of_shard1 = int(manifest.shard_first_block[1])
        spans = reader.documents_of_block(first_of_shard1, 0, 1)
        assert len(spans) == 1
        assert spans[0].token_start <= manifest.token_offset_of_block(first_of_shard1) < spans[0].token_end


def test_dataset_tokenizer_decodes_document_text(tmp_path: Path) -> None:
    from zephon_stream.writer.tokenizers import BytesTokenizer

    make_dataset(tmp_path, byte_docs(3), tokenizer=BytesTokenizer().identity())
    with DatasetReader.open(str(tmp_path)) as reader:
        spans = reader.documents(0, reader.manifest.num_tokens)
        texts = [reader.decode_text(reader.document_tokens(span)[:-1]) for span in spans]
    assert texts == [text.decode("utf-8") for _, text in stdlib_documents(3)]


def test_wrong_tokenizer_identity_is_refused_when_decoding(dataset) -> None:
    root, _, _ = dataset
    with (
        DatasetReader.open(str(root)) as reader,
        pytest.raises(TokenizerError, match="not the one the dataset was written with"),
    ):
        reader.decode_text(reader.read_block(0)[:10])


def test_corrupt_block_names_shard_and_block(dataset) -> None:
    root, manifest, _ = dataset
    path, start, end = manifest.block_byte_range(4)
    data = bytearray((root / path).read_bytes())
    data[(start + end) // 2] ^= 0xFF
    (root / path).write_bytes(bytes(data))
    shard, local = manifest.block_location(4)
    with pytest.raises(CorruptBlockError, match=f"shard {path} block {local} \\(bytes {start}..{end}\\)"):
        read_block(str(root), 4)


def test_truncated_shard_is_a_truncation_error(dataset) -> None:
    root, manifest, _ = dataset
    path, start, end = manifest.block_byte_range(2)
    data = (root / path).read_bytes()
    (root / path).write_bytes(data[: end - 10])
    with pytest.raises(TruncatedObjectError, match=path):
        read_block(str(root), 2)


def test_missing_shard_is_object_missing(dataset) -> None:
    root, manifest, _ = dataset
    (root / manifest.shards[1].path).unlink()
    with pytest.raises(ObjectMissingError, match="00000001.zst"):
        read_block(str(root), int(manifest.shard_first_block[1]))


def test_tampered_sidecar_is_refused(dataset) -> None:
    root, manifest, _ = dataset
    index_path = root / manifest.shards[0].index_path
    index_path.write_bytes(index_path.read_bytes() + b"\x00")
    with DatasetReader.open(str(root)) as reader, pytest.raises(FormatError, match="sha256 mismatch"):
        reader.read_doc_index(0)


def test_reader_over_s3(tmp_path: Path, s3_url, s3_options) -> None:
    docs = byte_docs(6)
    manifest = make_dataset(tmp_path, docs, block_tokens=700, blocks_per_shard=2)
    url = s3_url("datasets/small")
    store = open_store(url, s3_options)
    for path in sorted(p for p in tmp_path.rglob("*") if p.is_file()):
        store.write_atomic(path.relative_to(tmp_path).as_posix(), path.read_bytes())
    with DatasetReader.open(url, s3_options) as reader:
        assert reader.manifest == manifest
        assert np.array_equal(reader.read_tokens(0, manifest.num_tokens), np.concatenate([t for _, t in docs]))
        assert [s.source for s in reader.documents(0, manifest.num_tokens)] == [n for n, _ in docs]
    assert Manifest.load(url, s3_options) == manifest


def test_format_imports_without_torch_or_fsspec() -> None:
    code = (
        "import sys\n"
        "for name in ('torch', 'fsspec', 's3fs', 'zephon_stream.storage', 'tokenizers'):\n"
        "    sys.modules[name] = None\n"
        "import zephon_stream.format.spec, zephon_stream.format.block, zephon_stream.format.manifest, "
        "zephon_stream.format.docindex\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_writer_output_round_trips_through_the_document_index(small_bpe_dataset) -> None:
    with DatasetReader.open(small_bpe_dataset.url) as reader:
        m = reader.manifest
        spans = reader.documents(0, m.num_tokens)
        assert len(spans) == m.num_documents == len(small_bpe_dataset.texts)
        tok = reader.tokenizer()
        for span, text in zip(spans, small_bpe_dataset.texts):
            tokens = reader.document_tokens(span)
            assert int(tokens[-1]) == m.tokenizer.eos_id
            assert tokens[:-1].tolist() == tok.encode_batch([text])[0]
            assert reader.decode_text(tokens[:-1]) == text
