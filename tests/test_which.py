"""Provenance: a step's samples traced to shards, blocks and source documents."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from zephon_stream.cli import main
from zephon_stream.plan import OrderConfig
from zephon_stream.provenance import order_for, provenance, step_range
from zephon_stream.reader import DatasetReader

SEQ_LEN = 64
BATCH = 8


def trace(urls, step, *, world_size=None, text=False, **config):
    readers = [DatasetReader.open(url) for url in urls]
    try:
        settings = {"seq_len": SEQ_LEN, "lanes": BATCH} | config
        order = order_for(readers, OrderConfig(**settings))
        start, end = step_range(step, BATCH)
        return provenance(readers, order, start, end, world_size=world_size, text=text)
    finally:
        for reader in readers:
            reader.close()


def test_each_sample_is_traced_to_the_bytes_of_its_source_documents(small_dataset):
    """bytes tokenizer: a document's tokens are its file's bytes, then EOS."""
    samples = trace([small_dataset.url], 3, seed=5)
    assert [s.position for s in samples] == list(range(3 * BATCH, 4 * BATCH))
    eos = small_dataset.manifest.tokenizer.eos_id
    with DatasetReader.open(small_dataset.url) as reader:
        for s in samples:
            tokens = reader.read_tokens(s.token_start, s.token_start + s.num_tokens)
            block = reader.read_block(s.block)
            assert np.array_equal(tokens, block[s.sample * SEQ_LEN : s.sample * SEQ_LEN + SEQ_LEN + 1])
            assert s.shard_path == small_dataset.manifest.shards[s.shard].path
            covered = 0
            for d in s.documents:
                source = Path(d.source).read_bytes()
                part = tokens[d.sample_token_start : d.sample_token_end]
                into_doc = s.token_start + d.sample_token_start - d.token_start
                text_part = part[part != eos] if d.sample_token_end == d.token_end - s.token_start else part
                expected = np.frombuffer(source[into_doc : into_doc + text_part.size], dtype=np.uint8)
                assert np.array_equal(text_part, expected), (d.source, d.record)
                covered += d.sample_token_end - d.sample_token_start
            assert covered == s.num_tokens
            assert s.documents[0].sample_token_start == 0


def test_provenance_matches_what_the_loader_reads(small_dataset):
    pytest.importorskip("torch")
    from zephon_stream.loader.api import StreamingLoader

    step = 5
    samples = trace([small_dataset.url], step, world_size=2, seed=9, text=True)
    by_rank = {r: [s for s in samples if s.rank == r] for r in (0, 1)}
    with DatasetReader.open(small_dataset.url) as reader:
        for rank in (0, 1):
            loader = StreamingLoader(small_dataset.url, seq_len=SEQ_LEN, local_batch_size=BATCH // 2,
                                     rank=rank, world_size=2, seed=9)  # fmt: skip
            try:
                for _ in range(step):
                    next(loader)
                batch = next(loader)
            finally:
                loader.close()
            mine = by_rank[rank]
            assert batch["sample_positions"].tolist() == [s.position for s in mine]
            for row, s in zip(batch["input"].numpy(), mine):
                tokens = reader.read_block(s.block)[s.sample * SEQ_LEN :][:SEQ_LEN + 1]
                assert np.array_equal(row, tokens[:SEQ_LEN].astype(np.int64))
                assert s.text == reader.decode_text(tokens)


def test_mixture_traces_each_stream_to_its_own_dataset(small_dataset, small_bpe_dataset):
    urls = [small_dataset.url, small_bpe_dataset.url]
    samples = trace(urls, 2, weights=("3", "1"), text=True)
    streams = [s.stream for s in samples]
    assert streams.count(0) == 6 and streams.count(1) == 2
    for s in samples:
        assert s.dataset.endswith(Path(urls[s.stream]).name)
        assert s.text and all(d.source.endswith(".py") for d in s.documents)


def test_which_command_prints_json_and_text(small_dataset, capsys):
    args = ["which", small_dataset.url, "--step", "4", "--seq-len", str(SEQ_LEN),
            "--global-batch", str(BATCH), "--seed", "2", "--world-size", "4"]  # fmt: skip
    assert main(args + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    expected = [s.to_dict() for s in trace([small_dataset.url], 4, world_size=4, seed=2)]
    assert out["samples"] == expected
    assert out["positions"] == [32, 40] and out["lanes"] == BATCH

    assert main(args + ["--text"]) == 0
    printed = capsys.readouterr().out
    first = expected[0]
    assert printed.startswith("step 4: positions [32, 40), seq_len 64, lanes 8, seed 2\n")
    assert f"rank 0: stream 0 {first['dataset']} {first['shard_path']} block {first['block']}" in printed
    assert f"{first['documents'][0]['source']} record {first['documents'][0]['record']}" in printed
    assert printed.count("    | ") >= BATCH


def test_which_command_position_range_and_errors(small_dataset, capsys):
    base = ["which", small_dataset.url, "--seq-len", str(SEQ_LEN), "--global-batch", str(BATCH)]
    assert main(base + ["--positions", "3:6", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [s["position"] for s in out["samples"]] == [3, 4, 5]
    assert main(base + ["--step", "1", "--world-size", "3"]) == 1
    assert "world size 3 does not divide the global batch 8" in capsys.readouterr().err
    assert main(base + ["--positions", "6"]) == 1
    assert "--positions must be START:END, got '6'" in capsys.readouterr().err


def test_which_reads_a_dataset_on_s3(small_dataset, s3_bucket, capsys):
    from zephon_stream.storage import open_store

    url = s3_bucket.url("datasets/which")
    root = Path(small_dataset.url)
    with open_store(url, s3_bucket.storage_options) as store:
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            store.write_atomic(path.relative_to(root).as_posix(), path.read_bytes())
    # NOTE: the AWS variables of the session's server reach it, as a user's would.
    args = ["which", url, "--step", "2", "--seq-len", str(SEQ_LEN), "--global-batch", str(BATCH),
            "--json", "--text"]  # fmt: skip
    assert main(args) == 0
    remote = json.loads(capsys.readouterr().out)["samples"]
    local = [s.to_dict() for s in trace([small_dataset.url], 2, text=True)]
    assert [s.pop("dataset") for s in remote] == [url] * BATCH
    assert remote == [{k: v for k, v in s.items() if k != "dataset"} for s in local]
