"""Provenance: a step's samples traced to shards, blocks and source documents."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from zephon_stream.cli import main
from zephon_stream.plan import OrderConfig
from zephon_stream.reader import DatasetReader
from zephon_stream.reader.provenance import order_for, provenance, step_range

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
                # The part's place in its document, beside its place in the sample.
                assert d.document_token_start == into_doc
                assert d.document_token_end - d.document_token_start == part.size
                assert 0 <= d.document_token_start < d.document_token_end <= d.num_tokens
                text_part = part[part != eos] if d.sample_token_end == d.token_end - s.token_start else part
                expected = np.frombuffer(source[into_doc : into_doc + text_part.size], dtype=np.uint8)
                assert np.array_equal(text_part, expected), (d.source, d.record)
                covered += d.sample_token_end - d.sample_token_start
            assert covered == s.num_tokens
            assert s.documents[0].sample_token_start == 0


def test_provenance_matches_what_the_loader_reads(small_dataset):
    pytest.importorskip("torch")
    from zephon_stream.loader.front.api import StreamingLoader

    step = 5
    samples = trace([small_dataset.url], step, world_size=2, seed=9, text=True)
    by_rank = {r: [s for s in samples if s.rank == r] for r in (0, 1)}
    with DatasetReader.open(small_dataset.url) as reader:
        for rank in (0, 1):
            loader = StreamingLoader(
                small_dataset.url, seq_len=SEQ_LEN, local_batch_size=BATCH // 2, rank=rank, world_size=2, seed=9
            )
            try:
                for _ in range(step):
                    next(loader)
                batch = next(loader)
            finally:
                loader.close()
            mine = by_rank[rank]
            assert batch["sample_positions"].tolist() == [s.position for s in mine]
            for row, s in zip(batch["input"].numpy(), mine):
                tokens = reader.read_block(s.block)[s.sample * SEQ_LEN :][: SEQ_LEN + 1]
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
    assert printed.startswith(
        "step 4 (from 0; TorchTitan train step 5 without accumulation): positions [32, 40), "
        "seq_len 64, lanes 8, seed 2\n"
    )
    assert f"rank 0: stream 0 {first['dataset']} {first['shard_path']} block {first['block']}" in printed
    for doc in first["documents"]:
        # An excerpt from mid-document says where in the document it is,
        # not only where in the sample.
        assert (
            f"    {doc['source']} record {doc['record']}: document tokens [{doc['document_token_start']}, "
            f"{doc['document_token_end']}) of {doc['token_end'] - doc['token_start']} = sample tokens "
            f"[{doc['sample_token_start']}, {doc['sample_token_end']})\n"
        ) in printed
    assert f"dataset tokens [{first['token_start']}, {first['token_start'] + SEQ_LEN + 1})" in printed
    assert printed.count(f"    text of sample tokens [0, {SEQ_LEN + 1}):\n") == BATCH
    assert printed.count("    | ") >= BATCH
    mid_document = [d for s in expected for d in s["documents"] if d["document_token_start"] > 0]
    assert mid_document and all(d["sample_token_start"] == 0 for d in mid_document)


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
    # The AWS variables of the session's server reach it, as a user's would.
    args = ["which", url, "--step", "2", "--seq-len", str(SEQ_LEN), "--global-batch", str(BATCH), "--json", "--text"]
    assert main(args) == 0
    remote = json.loads(capsys.readouterr().out)["samples"]
    local = [s.to_dict() for s in trace([small_dataset.url], 2, text=True)]
    assert [s.pop("dataset") for s in remote] == [url] * BATCH
    assert remote == [{k: v for k, v in s.items() if k != "dataset"} for s in local]


def test_steps_count_from_0_in_the_loader_its_audit_log_and_which(small_dataset, tmp_path, capsys):
    """Step N is the batch read after N steps: the loader's ``step`` before it, the audit log's
    ``step``, and ``which --step N``, across a phase change of the global batch."""
    pytest.importorskip("torch")
    from zephon_stream import StreamingLoader
    from zephon_stream.loader.front.audit import addresses_sha256, read_audit_log

    phases = [
        {"start_step": 0, "global_batch": 8, "seq_len": SEQ_LEN, "lanes": 8},
        {"start_step": 3, "global_batch": 4, "seq_len": 2 * SEQ_LEN, "lanes": 8},
    ]
    log = tmp_path / "audit.jsonl"
    loader = StreamingLoader(small_dataset.url, schedule=phases, rank=0, world_size=1, seed=3, audit_log=str(log))
    try:
        read = []
        for _ in range(5):
            step = loader.step
            read.append((step, next(loader)["sample_positions"].tolist()))
    finally:
        loader.close()
    records = [r for r in read_audit_log(str(log)) if r["kind"] == "step"]
    assert [r["step"] for r in records] == [step for step, _ in read] == [0, 1, 2, 3, 4]
    schedule = tmp_path / "schedule.json"
    schedule.write_text(json.dumps({"seed": 3, "phases": phases}))
    for (step, positions), record in zip(read, records):
        assert main(["which", small_dataset.url, "--step", str(step), "--schedule", str(schedule), "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        samples = out["samples"]
        assert out["step"] == step and out["positions"][0] == record["cursor"]
        assert sorted(s["position"] for s in samples) == sorted(positions)
        columns = [np.array([s[k] for s in samples]) for k in ("position", "stream", "block", "sample")]
        assert addresses_sha256(*columns) == record["addresses_sha256"]
    assert [len(p) for _, p in read] == [8, 8, 8, 4, 4]


def test_which_takes_a_torchtitan_train_step_and_its_accumulation(small_dataset, capsys):
    """TorchTitan counts train steps from 1, each taking A batches: its step S is steps (S-1)A to SA-1."""
    base = ["which", small_dataset.url, "--seq-len", str(SEQ_LEN), "--global-batch", str(BATCH), "--json"]
    assert main(base + ["--torchtitan-step", "3", "--accumulation", "2"]) == 0
    titan = json.loads(capsys.readouterr().out)
    assert titan["torchtitan_step"] == 3 and titan["accumulation"] == 2
    assert [s["step"] for s in titan["steps"]] == [4, 5]
    for described in titan["steps"]:
        assert main(base + ["--step", str(described["step"])]) == 0
        assert json.loads(capsys.readouterr().out) == described
    assert main(base + ["--torchtitan-step", "1"]) == 0
    assert [s["positions"] for s in json.loads(capsys.readouterr().out)["steps"]] == [[0, BATCH]]

    text = base[:-1]
    assert main(text + ["--torchtitan-step", "3", "--accumulation", "2"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("TorchTitan train step 3 (accumulation 2) is steps 4 to 5 (counted from 0)\n")
    assert "step 5 (from 0; TorchTitan train step 3, batch 2 of 2): positions [40, 48)" in printed
    with pytest.raises(SystemExit, match="2"):
        main(text + ["--torchtitan-step", "0"])
    err = capsys.readouterr().err
    assert "argument --torchtitan-step: must be >= 1 (got 0); TorchTitan counts its train steps from 1" in err
    with pytest.raises(SystemExit, match="2"):
        main(text + ["--step", "-1"])
    assert "argument --step: must be >= 0 (got -1); steps count from 0" in capsys.readouterr().err


def _help(command: str, capsys) -> str:
    with pytest.raises(SystemExit):
        main([command, "--help"])
    return " ".join(capsys.readouterr().out.split())


def test_which_help_says_how_steps_are_counted(capsys):
    help_text = _help("which", capsys)
    assert "Steps count from 0: step N is the global batch a job reads after N steps" in help_text
    assert "its train step S is steps (S-1)*A to S*A-1 here" in help_text


@pytest.mark.parametrize("command", ["demo", "diff-log"])
def test_the_demo_and_diff_log_help_count_steps_as_which_does(command, capsys):
    assert "Steps count from 0, as" in _help(command, capsys)
