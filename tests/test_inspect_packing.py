"""``zephon-stream inspect --packing-report``: how concat and best_fit cut a dataset's documents.

On ``definitions_dataset`` (real text cut at top-level definitions, 26 blocks
of 4,097 BPE tokens). The report's figures are ``cut_counts`` summed over the
blocks it says it read, computed here block by block from the decoded blocks.
"""

from __future__ import annotations

import json

import pytest

from loader_reference import DirectReader
from zephon_stream.cli import main
from zephon_stream.plan.packing import PACKINGS, block_rows
from zephon_stream.plan.packing_cuts import CutCounts, cut_counts
from zephon_stream.reader import DatasetReader
from zephon_stream.reader.packing_report import figures, packing_report, spread_blocks


def summed(url: str, blocks: list[int], seq_len: int) -> dict[str, CutCounts]:
    direct = DirectReader([url])
    try:
        eos = int(direct.manifests[0].tokenizer.eos_id)
        out = {p: CutCounts() for p in PACKINGS}
        for block in blocks:
            tokens = direct.block(0, block)
            for packing in PACKINGS:
                out[packing] += cut_counts(tokens, block_rows(packing, tokens, seq_len, eos), eos)
        return out
    finally:
        direct.close()


def test_the_report_is_cut_counts_summed_over_the_blocks_it_read(definitions_dataset):
    url = definitions_dataset.url
    with DatasetReader.open(url) as reader:
        every = packing_report(reader, [256, 1024], workers=2)
        some = packing_report(reader, [256], blocks=7)
    assert every.blocks == tuple(range(26)) and every.blocks_read() == "all 26 blocks"
    for seq_len in (256, 1024):
        assert every.counts[seq_len] == summed(url, list(range(26)), seq_len)
    assert some.blocks == (0, 3, 7, 11, 14, 18, 22) == tuple(spread_blocks(26, 7))
    assert some.blocks_read() == "7 of 26 blocks, spread evenly (ids 0, 3, 7, 11, 14, 18, 22)"
    assert some.counts[256] == summed(url, list(some.blocks), 256)
    # The shares are of the documents inside a block; edge documents are counted apart.
    counts = every.counts[256]["concat"]
    shown = figures(counts)
    assert shown["documents"] == counts.documents - counts.edge_documents > 100
    assert shown["documents_cut"] == counts.documents_cut - counts.edge_documents_cut
    assert shown["floor"] == counts.floor - counts.edge_floor
    assert shown["edge_documents"] == counts.edge_documents > 0
    assert shown["tokens_without_beginning_share"] == counts.tokens_without_beginning / counts.tokens


@pytest.mark.parametrize("seq_len", [256, 1024])
def test_best_fit_cuts_fewer_documents_than_concat_but_never_below_the_floor(definitions_dataset, seq_len):
    with DatasetReader.open(definitions_dataset.url) as reader:
        report = packing_report(reader, [seq_len])
    windows, best = (figures(report.counts[seq_len][p]) for p in PACKINGS)
    assert best["floor_share"] <= best["documents_cut_share"] < windows["documents_cut_share"]
    assert best["tokens_without_beginning_share"] < windows["tokens_without_beginning_share"]
    assert best["floor"] == windows["floor"] and best["documents"] == windows["documents"]


def test_inspect_packing_report_prints_both_packings_side_by_side(definitions_dataset, capsys):
    url = definitions_dataset.url
    assert main(["inspect", url, "--packing-report", "--seq-len", "256", "--seq-len", "1024", "--blocks", "7"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""  # No progress bar when stderr is not a terminal
    out = captured.out
    assert f"packing report of {url}: 7 of 26 blocks, spread evenly (ids 0, 3, 7, 11, 14, 18, 22)\n" in out
    assert "such documents are counted apart" in out
    with DatasetReader.open(url) as reader:
        report = packing_report(reader, [256, 1024], blocks=7)
    for seq_len in (256, 1024):
        windows, best = (figures(report.counts[seq_len][p]) for p in PACKINGS)
        table = out.split(f"\nseq_len {seq_len} ")[1]
        header, inside, cut = table.splitlines()[:3]
        assert header.split() == list(PACKINGS)
        assert inside.split()[-2:] == [f"{windows['documents']:,}", f"{best['documents']:,}"]
        assert cut.split()[-2:] == [f"{windows['documents_cut_share']:.1%}", f"{best['documents_cut_share']:.1%}"]
        assert (
            f"seq_len {seq_len}: best_fit cuts {best['documents_cut_share']:.1%} of the documents inside a "
            f"block, concat {windows['documents_cut_share']:.1%}"
        ) in out


def test_inspect_packing_report_json_adds_one_key(definitions_dataset, capsys):
    url = definitions_dataset.url
    assert main(["inspect", url, "--json", "--packing-report", "--seq-len", "256", "--no-progress"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert main(["inspect", url, "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert "packing_report" not in plain and {k: v for k, v in summary.items() if k != "packing_report"} == plain
    got = summary["packing_report"]
    assert got["blocks"] == list(range(26)) and got["num_blocks"] == 26
    [entry] = got["seq_lens"]
    expected = summed(url, list(range(26)), 256)
    assert entry["seq_len"] == 256
    assert {p: entry[p] for p in PACKINGS} == {p: figures(expected[p]) for p in PACKINGS}
    assert entry["conclusion"].startswith("seq_len 256: best_fit cuts ")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--packing-report"], "--packing-report needs --seq-len L"),
        (["--seq-len", "256"], "--seq-len and --blocks belong to --packing-report"),
    ],
)
def test_inspect_packing_report_refuses_what_it_cannot_count(definitions_dataset, capsys, args, message):
    assert main(["inspect", definitions_dataset.url, *args]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and f"zephon-stream inspect: error: {message}" in captured.err


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--blocks", "0"], "--blocks: must be >= 1 (got 0)"), (["--seq-len", "0"], "--seq-len: must be >= 1 (got 0)")],
)
def test_inspect_packing_report_at_no_row_length_or_no_block_is_a_usage_error(
    definitions_dataset, capsys, args, message
):
    with pytest.raises(SystemExit, match="2"):
        main(["inspect", definitions_dataset.url, "--packing-report", "--seq-len", "256", *args])
    captured = capsys.readouterr()
    assert captured.out == "" and f"zephon-stream inspect: error: argument {message}" in captured.err
