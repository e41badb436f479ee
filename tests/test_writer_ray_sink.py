"""zephon_stream.ray.ShardSink on real Ray Datasets (the session's Ray instance):
a ``ray.data.read_json`` dataset of stdlib sources written as text, and a
dataset of token-id lists, each against the single-process writer."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fixtures_ray import RAY_BLOCK_TOKENS, RAY_BLOCKS_PER_SHARD, dataset_contents
from zephon_stream import Manifest, write_dataset
from zephon_stream.errors import ConfigError

LAYOUT = {"block_tokens": RAY_BLOCK_TOKENS, "blocks_per_shard": RAY_BLOCKS_PER_SHARD}


@pytest.fixture
def ordered(ray_instance):
    from ray.data import DataContext

    context = DataContext.get_current()
    before = context.execution_options.preserve_order
    context.execution_options.preserve_order = True
    yield
    context.execution_options.preserve_order = before


def _document_lengths(contents) -> list[int]:
    return [end - start for _, _, start, end in contents.documents]


def test_sink_writes_a_read_json_dataset_as_one_process_writes_its_file(ordered, stdlib_corpus, bpe_tokenizer_json, tmp_path):
    import ray

    from zephon_stream.ray import ShardSink, sink_part_name

    texts = list(stdlib_corpus.texts[:60])
    lines = [json.dumps({"text": t}) for t in texts]
    lines[9] = json.dumps({"text": ""})
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text("\n".join(lines) + "\n", encoding="utf-8")
    spec = f"hf:{bpe_tokenizer_json}"
    sink = ShardSink(str(tmp_path / "sink"), tokenizer=spec, text_column="text", **LAYOUT)
    ray.data.read_json(str(jsonl)).repartition(3).write_datasink(sink)

    write_dataset(str(jsonl), str(tmp_path / "reference"), tokenizer=spec, progress=False, **LAYOUT)
    got, want = dataset_contents(str(tmp_path / "sink")), dataset_contents(str(tmp_path / "reference"))
    assert got.problems == ()
    assert np.array_equal(got.tokens, want.tokens)
    assert _document_lengths(got) == _document_lengths(want)
    assert sink.manifest is not None and sink.manifest == Manifest.load(str(tmp_path / "sink"))
    names = [s.path for s in sink.manifest.sources]
    assert names == [f"ray-dataset/{sink_part_name(i)}" for i in range(3)]
    assert sum(s.num_records for s in sink.manifest.sources) == len(texts)
    assert sink.manifest.num_rejected == 1 and json.loads(got.rejects[0])["reason"] == "empty"
    # NOTE: each part's rows are numbered from 0 within that part, in the dataset's order.
    firsts = {}
    for source, record, _, _ in got.documents:
        firsts.setdefault(source, record)
    assert set(firsts.values()) == {0}


def test_sink_writes_a_token_id_column_as_one_process_writes_the_same_ids(ordered, stdlib_corpus, tmp_path):
    import ray

    from zephon_stream.ray import ShardSink
    from zephon_stream.writer.tokenizers import load_tokenizer

    tokenizer = load_tokenizer("bytes")
    rows = [list(t.encode("utf-8")) + [tokenizer.eos_id] for t in stdlib_corpus.texts[:40]]
    rows[3] = [1, 2, 3]  # NOTE: no EOS: rejected, as by the file writer
    jsonl = tmp_path / "ids.jsonl"
    jsonl.write_text("".join(json.dumps({"input_ids": r}) + "\n" for r in rows), encoding="utf-8")
    sink = ShardSink(str(tmp_path / "sink"), tokenizer="bytes", tokens_column="input_ids", **LAYOUT)
    ray.data.from_items([{"input_ids": r} for r in rows], override_num_blocks=4).write_datasink(sink)

    write_dataset(str(jsonl), str(tmp_path / "reference"), tokenizer="bytes", input_format="tokens", progress=False, **LAYOUT)
    got, want = dataset_contents(str(tmp_path / "sink")), dataset_contents(str(tmp_path / "reference"))
    assert got.problems == ()
    assert np.array_equal(got.tokens, want.tokens)
    assert _document_lengths(got) == _document_lengths(want)
    assert [json.loads(r)["reason"] for r in got.rejects] == [json.loads(r)["reason"] for r in want.rejects] == ["no_eos"]


def test_sink_refuses_a_dataset_without_its_column_and_an_output_already_committed(ordered, tmp_path, small_dataset):
    import ray

    from zephon_stream.ray import ShardSink

    with pytest.raises(ConfigError, match="already holds a committed dataset"):
        ray.data.from_items([{"text": "a"}]).write_datasink(ShardSink(small_dataset.url, tokenizer="bytes"))
    with pytest.raises(ConfigError, match="no column 'body'"):
        ray.data.from_items([{"text": "a"}]).write_datasink(ShardSink(str(tmp_path / "x"), tokenizer="bytes", text_column="body"))
