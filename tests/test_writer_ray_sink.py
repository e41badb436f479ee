"""zephon_stream.ray.ShardSink on real Ray Datasets (the session's Ray instance):
a ``ray.data.read_json`` dataset of stdlib sources written as text, and a
dataset of token-id lists, each against the single-process writer. The
pipelines run in the driver process (``ray_driver``), with the dataset's
order kept (``preserve_order``)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fixtures_ray import RAY_BLOCK_TOKENS, RAY_BLOCKS_PER_SHARD, dataset_contents
from zephon_stream import Manifest, write_dataset
from zephon_stream.errors import ConfigError

LAYOUT = {"block_tokens": RAY_BLOCK_TOKENS, "blocks_per_shard": RAY_BLOCKS_PER_SHARD}


def _ordered():
    """Ray Data in the driver, keeping each dataset's order."""
    import ray
    from ray.data import DataContext

    DataContext.get_current().execution_options.preserve_order = True
    return ray


def _sink_read_json(jsonl: str, url: str, spec: str):
    """Run in the driver: ``read_json`` of ``jsonl`` in 3 blocks into a sink; the sink's manifest."""
    from zephon_stream.ray import ShardSink

    sink = ShardSink(url, tokenizer=spec, text_column="text", **LAYOUT)
    _ordered().data.read_json(jsonl).repartition(3).write_datasink(sink)
    return sink.manifest


def _sink_items(rows: list[dict], url: str, num_blocks: int, **sink_options):
    """Run in the driver: ``from_items(rows)`` into a sink."""
    from zephon_stream.ray import ShardSink

    sink = ShardSink(url, **sink_options)
    _ordered().data.from_items(rows, override_num_blocks=num_blocks).write_datasink(sink)
    return sink.manifest


def _document_lengths(contents) -> list[int]:
    return [end - start for _, _, start, end in contents.documents]


def test_sink_writes_a_read_json_dataset_as_one_process_writes_its_file(
    ray_driver, stdlib_corpus, bpe_tokenizer_json, tmp_path
):
    from zephon_stream.ray import sink_part_name

    texts = list(stdlib_corpus.texts[:60])
    lines = [json.dumps({"text": t}) for t in texts]
    lines[9] = json.dumps({"text": ""})
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text("\n".join(lines) + "\n", encoding="utf-8")
    spec = f"hf:{bpe_tokenizer_json}"
    manifest = ray_driver.call(_sink_read_json, str(jsonl), str(tmp_path / "sink"), spec)

    write_dataset(str(jsonl), str(tmp_path / "reference"), tokenizer=spec, progress=False, **LAYOUT)
    got, want = dataset_contents(str(tmp_path / "sink")), dataset_contents(str(tmp_path / "reference"))
    assert got.problems == ()
    assert np.array_equal(got.tokens, want.tokens)
    assert _document_lengths(got) == _document_lengths(want)
    assert manifest is not None and manifest == Manifest.load(str(tmp_path / "sink"))
    names = [s.path for s in manifest.sources]
    assert names == [f"ray-dataset/{sink_part_name(i)}" for i in range(3)]
    assert sum(s.num_records for s in manifest.sources) == len(texts)
    assert manifest.num_rejected == 1 and json.loads(got.rejects[0])["reason"] == "empty"
    # Each part's rows are numbered from 0 within that part, in the dataset's order.
    firsts = {}
    for source, record, _, _ in got.documents:
        firsts.setdefault(source, record)
    assert set(firsts.values()) == {0}


def test_sink_writes_a_token_id_column_as_one_process_writes_the_same_ids(ray_driver, stdlib_corpus, tmp_path):
    from zephon_stream.writer.tokenizers import load_tokenizer

    tokenizer = load_tokenizer("bytes")
    rows = [list(t.encode("utf-8")) + [tokenizer.eos_id] for t in stdlib_corpus.texts[:40]]
    rows[3] = [1, 2, 3]  # No EOS: rejected, as by the file writer
    jsonl = tmp_path / "ids.jsonl"
    jsonl.write_text("".join(json.dumps({"input_ids": r}) + "\n" for r in rows), encoding="utf-8")
    ray_driver.call(
        _sink_items,
        [{"input_ids": r} for r in rows],
        str(tmp_path / "sink"),
        4,
        tokenizer="bytes",
        tokens_column="input_ids",
        **LAYOUT,
    )

    write_dataset(
        str(jsonl), str(tmp_path / "reference"), tokenizer="bytes", input_format="tokens", progress=False, **LAYOUT
    )
    got, want = dataset_contents(str(tmp_path / "sink")), dataset_contents(str(tmp_path / "reference"))
    assert got.problems == ()
    assert np.array_equal(got.tokens, want.tokens)
    assert _document_lengths(got) == _document_lengths(want)
    assert (
        [json.loads(r)["reason"] for r in got.rejects] == [json.loads(r)["reason"] for r in want.rejects] == ["no_eos"]
    )


def test_sink_refuses_a_dataset_without_its_column_and_an_output_already_committed(ray_driver, tmp_path, small_dataset):
    with pytest.raises(ConfigError, match="already holds a committed dataset"):
        ray_driver.call(_sink_items, [{"text": "a"}], small_dataset.url, 1, tokenizer="bytes")
    with pytest.raises(ConfigError, match="no column 'body'"):
        ray_driver.call(_sink_items, [{"text": "a"}], str(tmp_path / "x"), 1, tokenizer="bytes", text_column="body")
