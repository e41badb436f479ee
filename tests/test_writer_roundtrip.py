"""Round trips on the stdlib corpus: every document comes back through the
document index as the tokenizer's output plus EOS, and the bytes do not
depend on the number of workers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from zephon_stream import Manifest, write_dataset
from zephon_stream.format.spec import MANIFEST_NAME, REJECTS_NAME
from zephon_stream.reader import DatasetReader
from zephon_stream.writer.tokenizers import load_tokenizer


def dataset_files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def assert_round_trip(url: str, files, texts, spec: str) -> None:
    tok = load_tokenizer(spec)
    expected = [ids + [tok.eos_id] for ids in tok.encode_batch(list(texts))]
    with DatasetReader.open(url) as reader:
        manifest = reader.manifest
        assert manifest.num_documents == len(texts)
        assert manifest.num_tokens == sum(len(e) for e in expected)
        assert reader.tokenizer().fingerprint == tok.fingerprint
        spans = reader.documents(0, manifest.num_tokens)
        assert [(s.source, s.record) for s in spans] == [(str(f), 0) for f in files]
        all_tokens = np.concatenate([reader.read_block(b) for b in range(manifest.num_blocks)])
        for span, want in zip(spans, expected):
            got = all_tokens[span.token_start : span.token_end]
            assert got.tolist() == want, f"document {span.source} differs"
        # The document index alone (no block reads) also gives each one.
        middle = len(spans) // 2
        assert reader.document_tokens(spans[middle]).tolist() == expected[middle]


def test_bytes_round_trip_on_stdlib_corpus(stdlib_corpus, tmp_path):
    out = tmp_path / "bytes"
    summary = write_dataset(
        stdlib_corpus.glob, str(out), tokenizer="bytes", block_tokens=8193, blocks_per_shard=16, progress=False
    )
    assert summary.records_in == summary.records_written == len(stdlib_corpus.files)
    assert summary.num_tokens == stdlib_corpus.num_bytes + len(stdlib_corpus.files)
    manifest = Manifest.load(str(out))
    assert manifest.dtype == "uint16" and manifest.num_shards == summary.num_shards > 1
    assert all(s.num_blocks == 16 for s in manifest.shards[:-1])
    assert (out / REJECTS_NAME).read_bytes() == b""
    assert_round_trip(str(out), stdlib_corpus.files, stdlib_corpus.texts, "bytes")


def test_bpe_round_trip_on_stdlib_corpus(stdlib_corpus, bpe_tokenizer_json, tmp_path):
    spec = f"hf:{bpe_tokenizer_json}"
    out = tmp_path / "bpe"
    summary = write_dataset(
        stdlib_corpus.glob, str(out), tokenizer=spec, block_tokens=16385, blocks_per_shard=8, progress=False
    )
    assert summary.num_documents == len(stdlib_corpus.files)
    assert summary.num_tokens < stdlib_corpus.num_bytes / 2
    info = Manifest.load(str(out)).tokenizer
    assert (info.kind, info.name, info.vocab_size) == ("hf", str(bpe_tokenizer_json), 2000)
    assert_round_trip(str(out), stdlib_corpus.files, stdlib_corpus.texts, spec)


@pytest.mark.slow
def test_same_bytes_for_one_and_three_workers(stdlib_corpus, bpe_tokenizer_json, tmp_path):
    spec = f"hf:{bpe_tokenizer_json}"
    files = [str(p) for p in stdlib_corpus.files[:120]]
    runs = {}
    for workers in (1, 3):
        out = tmp_path / f"w{workers}"
        summary = write_dataset(
            files,
            str(out),
            tokenizer=spec,
            workers=workers,
            block_tokens=4097,
            blocks_per_shard=8,
            progress=False,
            pool_min_input_bytes=0,
        )
        assert summary.tokenizer_processes == (0 if workers == 1 else workers)
        runs[workers] = dataset_files(out)
    assert len(runs[1]) > 10 and MANIFEST_NAME in runs[1]
    assert runs[1] == runs[3]


def test_jsonl_corpus_gives_the_same_tokens_as_the_files(stdlib_corpus, tmp_path):
    out_files, out_jsonl = tmp_path / "files", tmp_path / "jsonl"
    write_dataset(stdlib_corpus.glob, str(out_files), tokenizer="bytes", block_tokens=65537, progress=False)
    write_dataset(str(stdlib_corpus.jsonl), str(out_jsonl), tokenizer="bytes", block_tokens=65537, progress=False)
    a, b = Manifest.load(str(out_files)), Manifest.load(str(out_jsonl))
    # Same token stream, so same shards and fingerprint; only the sources differ.
    assert a.fingerprint == b.fingerprint and a.shards[0].sha256 == b.shards[0].sha256
    assert [s.path for s in b.sources] == [str(stdlib_corpus.jsonl)]
    assert b.sources[0].num_records == len(stdlib_corpus.files)
    with DatasetReader.open(str(out_jsonl)) as reader:
        spans = reader.documents(0, reader.manifest.num_tokens)
        assert [s.record for s in spans] == list(range(len(stdlib_corpus.files)))


def test_small_dataset_fixtures_have_several_shards(small_dataset, small_bpe_dataset):
    for ds in (small_dataset, small_bpe_dataset):
        m = ds.manifest
        assert m.block_tokens == 4097 and m.blocks_per_shard == 4 and m.num_shards > 3
        assert m.num_documents == len(ds.sources) == len(ds.texts)
        assert ds.summary.fingerprint == m.fingerprint
    assert 50 <= small_dataset.manifest.num_blocks <= 200
    assert small_bpe_dataset.manifest.tokenizer.kind == "hf"


def test_summary_reconciles_and_serializes(small_dataset):
    s = small_dataset.summary
    assert s.records_in == s.records_written + s.num_rejected
    as_json = json.loads(json.dumps(s.to_dict()))
    assert as_json["num_blocks"] == small_dataset.manifest.num_blocks
    table = s.table()
    for label in ("records in", "records rejected", "tokens", "shards", "blocks", "bytes/token", "tokens/s"):
        assert label in table


def test_documents_longer_than_a_shard_round_trip(stdlib_corpus, tmp_path):
    files = stdlib_corpus.files[:6]
    texts = stdlib_corpus.texts[:6]
    out = tmp_path / "long"
    write_dataset(
        [str(p) for p in files], str(out), tokenizer="bytes", block_tokens=64, blocks_per_shard=2, progress=False
    )
    manifest = Manifest.load(str(out))
    assert any(s.num_documents == 0 for s in manifest.shards)  # shards inside one long document
    assert manifest.num_shards == -(-manifest.num_tokens // 128)
    assert_round_trip(str(out), files, texts, "bytes")
