"""``which --packing best_fit``: each sample named by its row's pieces, each piece by its document.

On ``definitions_dataset`` (real text cut at top-level definitions, 26 blocks
of 4,097 BPE tokens). The pieces' tokens are read back from the document
index and the dataset's token stream (never from the block's rows) and
compared with the rows the loader and ``plan/packing.py`` deliver.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from loader_reference import DirectReader
from zephon_stream.cli import PACKING_CHOICES, main
from zephon_stream.plan import SchedulePhase
from zephon_stream.plan.packing import PACKINGS
from zephon_stream.reader import DatasetReader
from zephon_stream.reader.provenance import range_provenance, schedule_for, step_provenance

SEQ_LEN = 256  # 4097-token blocks hold 16 rows
BATCH = 8


def one_phase(seq_len: int = SEQ_LEN, batch: int = BATCH) -> list[SchedulePhase]:
    return [SchedulePhase(start_step=0, global_batch=batch, seq_len=seq_len, lanes=batch)]


def read_back(reader: DatasetReader, sample) -> np.ndarray:
    """The sample's tokens as its pieces and label name them, read from the token stream."""
    parts = [
        reader.read_tokens(d.token_start + d.document_token_start, d.token_start + d.document_token_end)
        for d in sample.documents
    ]
    label = sample.label
    parts.append(
        reader.read_tokens(label.token_start + label.document_token, label.token_start + label.document_token + 1)
    )
    return np.concatenate(parts).astype(np.int64)


def test_every_row_of_an_epoch_is_its_pieces_read_from_their_documents(definitions_dataset):
    """Every position of an epoch: the pieces, read from their documents, are the block's best-fit row."""
    with DatasetReader.open(definitions_dataset.url) as reader:
        order = schedule_for([reader], one_phase(), seed=1)
        epoch = order.phase_at_step(0).order.streams[0].lane_length * BATCH
        samples = range_provenance([reader], order, 0, epoch, packing="best_fit")
        direct = DirectReader([definitions_dataset.url])
        try:
            for s in samples:
                assert s.packing == "best_fit" and s.token_start is None and s.num_tokens == SEQ_LEN + 1
                want = direct.sample(0, s.block, s.sample, SEQ_LEN, "best_fit")
                np.testing.assert_array_equal(read_back(reader, s), want, err_msg=f"position {s.position}")
                # The pieces tile the row's inputs in order.
                edges = [(d.sample_token_start, d.sample_token_end) for d in s.documents]
                assert edges[0][0] == 0 and edges[-1][1] == SEQ_LEN
                assert all(a[1] == b[0] for a, b in zip(edges, edges[1:]))
                base = reader.manifest.token_offset_of_block(s.block)
                for d in s.documents:
                    assert d.token_start + d.document_token_start == base + d.block_token_start
        finally:
            direct.close()
    assert len({(s.block, s.sample) for s in samples}) == len(samples) == epoch


def test_a_mixture_names_each_streams_pieces_with_its_own_eos(definitions_dataset, small_dataset):
    urls = [definitions_dataset.url, small_dataset.url]
    phase = SchedulePhase(start_step=0, global_batch=BATCH, seq_len=SEQ_LEN, lanes=BATCH, weights=("1", "1"))
    readers = [DatasetReader.open(url) for url in urls]
    direct = DirectReader(urls)
    try:
        assert readers[0].manifest.tokenizer.eos_id != readers[1].manifest.tokenizer.eos_id
        samples = range_provenance(readers, schedule_for(readers, [phase], seed=5), 0, 6 * BATCH, packing="best_fit")
        assert {s.stream for s in samples} == {0, 1}
        for s in samples:
            want = direct.sample(s.stream, s.block, s.sample, SEQ_LEN, "best_fit")
            np.testing.assert_array_equal(read_back(readers[s.stream], s), want, err_msg=f"position {s.position}")
    finally:
        direct.close()
        for reader in readers:
            reader.close()


def test_pieces_lie_in_their_documents_and_whole_means_the_whole_document(definitions_dataset):
    eos = definitions_dataset.manifest.tokenizer.eos_id
    with DatasetReader.open(definitions_dataset.url) as reader:
        order = schedule_for([reader], one_phase(), seed=0)
        epoch = order.phase_at_step(0).order.streams[0].lane_length * BATCH
        samples = range_provenance([reader], order, 0, epoch, packing="best_fit")
        lengths = reader.tokenizer().encode_documents(list(definitions_dataset.texts))[1]
        kinds = set()
        for s in samples:
            base = reader.manifest.token_offset_of_block(s.block)
            for k, d in enumerate(s.documents):
                assert 0 <= d.document_token_start < d.document_token_end <= d.num_tokens
                assert d.num_tokens == lengths[d.record], (d.source, d.record)
                head, tail = d.document_token_start == 0, d.document_token_end == d.num_tokens
                assert (
                    d.cut
                    == {(True, True): "whole", (True, False): "head", (False, True): "tail", (False, False): "middle"}[
                        head, tail
                    ]
                )
                kinds.add(d.cut)
                tokens = reader.read_tokens(
                    d.token_start + d.document_token_start, d.token_start + d.document_token_end
                )
                # A piece not ending on its EOS comes last in its row (plan/packing.py's contract).
                assert tokens[-1] == eos or k == len(s.documents) - 1
                if d.block_token_start == 0 and d.token_start < base:
                    # The document that began in an earlier block owns this block's first tokens.
                    assert d.cut in ("tail", "middle")
                    kinds.add("begun in an earlier block")
    assert kinds == {"whole", "head", "tail", "middle", "begun in an earlier block"}


def test_step_provenance_names_the_rows_the_loader_delivers_at_each_rank(definitions_dataset):
    pytest.importorskip("torch")
    from zephon_stream import StreamingLoader

    step = 6
    with DatasetReader.open(definitions_dataset.url) as reader:
        order = schedule_for([reader], one_phase(), seed=4)
        samples = step_provenance([reader], order, step, world_size=2, text=True, packing="best_fit")
        for rank in (0, 1):
            with StreamingLoader(
                definitions_dataset.url,
                seq_len=SEQ_LEN,
                local_batch_size=BATCH // 2,
                rank=rank,
                world_size=2,
                seed=4,
                packing="best_fit",
                pipeline="threads",
            ) as loader:
                for _ in range(step):
                    next(loader)
                batch = next(loader)
            mine = [s for s in samples if s.rank == rank]
            assert batch["sample_positions"].tolist() == [s.position for s in mine]
            for row, s in enumerate(mine):
                tokens = read_back(reader, s)
                np.testing.assert_array_equal(batch["input"][row].numpy(), tokens[:-1])
                assert int(batch["labels"][row][-1]) == tokens[-1]
                # The text is the packed row as delivered, not the block's window.
                assert s.text == reader.decode_text(tokens)


def test_which_best_fit_prints_pieces_in_json_and_text(definitions_dataset, capsys):
    args = ["which", definitions_dataset.url, "--step", "2", "--seq-len", str(SEQ_LEN), "--global-batch", str(BATCH),
            "--seed", "3", "--world-size", "2", "--packing", "best_fit"]  # fmt: skip
    assert main(args + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    with DatasetReader.open(definitions_dataset.url) as reader:
        expected = step_provenance(
            [reader], schedule_for([reader], one_phase(), seed=3), 2, world_size=2, packing="best_fit"
        )
    assert out["packing"] == "best_fit" and out["samples"] == [s.to_dict() for s in expected]
    first = out["samples"][0]
    assert first["token_start"] is None and first["packing"] == "best_fit"
    assert set(first["documents"][0]) == {
        "source",
        "record",
        "token_start",
        "token_end",
        "sample_token_start",
        "sample_token_end",
        "document_token_start",
        "document_token_end",
        "block_token_start",
        "cut",
    }
    assert set(first["label"]) == {"source", "record", "token_start", "token_end", "document_token", "block_token"}

    assert main(args + ["--text"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(
        "step 2 (from 0; TorchTitan train step 3 without accumulation): positions [16, 24), "
        "seq_len 256, lanes 8, seed 3, packing best_fit\n"
    )
    pieces = len(first["documents"])
    assert (
        f"position {first['position']} rank 0: stream 0 {first['dataset']} {first['shard_path']} block "
        f"{first['block']} (#{first['block_in_shard']} in shard) row {first['sample']}, {pieces} piece"
    ) in printed
    for k, d in enumerate(first["documents"]):
        assert (
            f"    piece {k}: sample tokens [{d['sample_token_start']}, {d['sample_token_end']}) = {d['source']} "
            f"record {d['record']}: document tokens [{d['document_token_start']}, {d['document_token_end']}) of "
            f"{d['token_end'] - d['token_start']} ({d['cut']})\n"
        ) in printed
    label = first["label"]
    assert (
        f"    label: sample token {SEQ_LEN} = {label['source']} record {label['record']}: document token "
        f"{label['document_token']} of {label['token_end'] - label['token_start']}\n"
    ) in printed
    assert printed.count(f"    text of the packed row, sample tokens [0, {SEQ_LEN + 1}):\n") == BATCH


def test_which_best_fit_follows_a_schedule_that_changes_seq_len(definitions_dataset, tmp_path, capsys):
    phases = [
        {"start_step": 0, "global_batch": 4, "seq_len": 128, "lanes": 4},
        {"start_step": 3, "global_batch": 2, "seq_len": 512, "lanes": 4},
    ]
    path = tmp_path / "schedule.json"
    path.write_text(json.dumps({"seed": 2, "phases": phases}))
    direct = DirectReader([definitions_dataset.url])
    try:
        for step, seq_len in ((1, 128), (4, 512)):
            assert main(["which", definitions_dataset.url, "--step", str(step), "--schedule", str(path), "--packing",
                         "best_fit", "--json"]) == 0  # fmt: skip
            samples = json.loads(capsys.readouterr().out)["samples"]
            for s in samples:
                assert s["num_tokens"] == seq_len + 1 and s["documents"][-1]["sample_token_end"] == seq_len
                row = direct.sample(0, s["block"], s["sample"], seq_len, "best_fit")
                assert s["label"]["block_token"] < definitions_dataset.manifest.block_num_tokens(s["block"])
                assert direct.block(0, s["block"])[s["label"]["block_token"]] == row[-1]
    finally:
        direct.close()


def test_which_refuses_an_unknown_packing_and_keeps_concat_as_it_was(definitions_dataset, capsys):
    assert PACKING_CHOICES == PACKINGS
    base = ["which", definitions_dataset.url, "--step", "1", "--seq-len", str(SEQ_LEN), "--global-batch", str(BATCH)]
    with pytest.raises(SystemExit) as exc:
        main(base + ["--packing", "first_fit"])
    assert exc.value.code == 2
    assert (
        "argument --packing: invalid choice: 'first_fit' (choose from 'concat', 'best_fit')" in capsys.readouterr().err
    )
    # --packing concat is the default, key for key.
    assert main(base + ["--json"]) == 0
    default = capsys.readouterr().out
    assert main(base + ["--json", "--packing", "concat"]) == 0
    assert capsys.readouterr().out == default
    assert "packing" not in json.loads(default) and "label" not in json.loads(default)["samples"][0]
