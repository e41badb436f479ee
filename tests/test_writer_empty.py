"""A dataset with no tokens: the writer and the merge refuse to commit it unless asked, and the
loader says what is wrong with one that was committed all the same."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from zephon_stream import Manifest, StreamingLoader, write_dataset
from zephon_stream.cli import main
from zephon_stream.errors import ConfigError, EmptyDatasetError, InputError
from zephon_stream.loader import EvalLoader
from zephon_stream.writer.distributed import part_name
from zephon_stream.writer.merge import merge_parts

ALL_BAD = b'{"text": "cut short\n{not json}\n[1, 2]\n'


def _all_rejected(tmp_path: Path) -> Path:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(ALL_BAD)
    return path


def test_write_refuses_all_rejected_inputs_with_rc_1_keeping_and_naming_the_rejects(tmp_path, capsys):
    src, out = _all_rejected(tmp_path), tmp_path / "out"
    assert main(["write", str(src), "--output", str(out), "--tokenizer", "bytes", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"zephon-stream write: error: write {out}: no tokens to commit: ")
    assert "all 3 records of 1 input were rejected (bad_json 3)" in err
    assert f"listed in {out}/rejects.jsonl" in err and "--allow-empty" in err
    assert not (out / "manifest").exists()
    listed = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    assert [(r["record"], r["reason"]) for r in listed] == [(0, "bad_json"), (1, "bad_json"), (2, "bad_json")]
    with pytest.raises(FileNotFoundError):
        Manifest.load(str(out))


def test_write_refuses_empty_files(tmp_path, capsys):
    (tmp_path / "none.jsonl").write_bytes(b"")
    (tmp_path / "none.txt").write_bytes(b"")
    assert main(["write", str(tmp_path / "none.jsonl"), "-o", str(tmp_path / "a"), "--tokenizer", "bytes"]) == 1
    assert "no tokens to commit: 1 input held no record;" in capsys.readouterr().err
    # A whole text file is one record, so an empty one is an `empty` reject.
    assert main(["write", str(tmp_path / "none.txt"), "-o", str(tmp_path / "b"), "--tokenizer", "bytes"]) == 1
    assert "all 1 records of 1 input were rejected (empty 1)" in capsys.readouterr().err
    assert not (tmp_path / "a" / "manifest").exists() and not (tmp_path / "b" / "manifest").exists()


def test_write_dataset_raises_an_input_error_unless_allow_empty(tmp_path):
    src = _all_rejected(tmp_path)
    with pytest.raises(EmptyDatasetError, match="no tokens to commit") as info:
        write_dataset(str(src), str(tmp_path / "out"), tokenizer="bytes", progress=False)
    assert isinstance(info.value, InputError) and isinstance(info.value, ValueError)
    summary = write_dataset(str(src), str(tmp_path / "out"), tokenizer="bytes", progress=False, allow_empty=True)
    assert (summary.num_tokens, summary.records_in, summary.num_rejected) == (0, 3, 3)
    assert Manifest.load(str(tmp_path / "out")).num_tokens == 0


def test_allow_empty_commits_and_the_loader_names_the_url_and_says_it_holds_no_tokens(tmp_path, capsys):
    out = tmp_path / "empty-ds"
    argv = [
        "write",
        str(_all_rejected(tmp_path)),
        "-o",
        str(out),
        "--tokenizer",
        "bytes",
        "--allow-empty",
        "--no-progress",
    ]
    assert main(argv) == 0
    capsys.readouterr()
    with pytest.raises(ConfigError) as info:
        StreamingLoader(str(out), seq_len=512, local_batch_size=8, seed=0, pipeline="threads")
    message = str(info.value)
    assert message.startswith(f"stream 0 ({out}): the dataset holds no tokens")
    assert "lanes" not in message and Manifest.load(str(out)).fingerprint not in message
    with pytest.raises(ConfigError, match=re.escape(f"dataset 0 ({out}): the dataset holds no tokens")):
        EvalLoader(str(out), seq_len=512, local_batch_size=8)
    assert main(["which", str(out), "--step", "0", "--seq-len", "16", "--global-batch", "2"]) == 1
    assert f"stream 0 ({out}): the dataset holds no tokens" in capsys.readouterr().err


def test_a_mixture_names_its_empty_stream_by_url(small_dataset, tmp_path):
    empty = tmp_path / "empty"
    write_dataset(str(_all_rejected(tmp_path)), str(empty), tokenizer="bytes", progress=False, allow_empty=True)
    with pytest.raises(ConfigError, match=re.escape(f"stream 1 ({empty}): the dataset holds no tokens")):
        StreamingLoader([small_dataset.url, str(empty)], seq_len=64, local_batch_size=8, pipeline="threads")


def test_a_dataset_too_short_for_seq_len_says_which_seq_len_fits(tmp_path):
    src = tmp_path / "short.txt"
    src.write_text("a hundred bytes or so of text, in one document: far fewer than a sample of 512 tokens needs.")
    write_dataset(str(src), str(tmp_path / "out"), tokenizer="bytes", progress=False)
    tokens = Manifest.load(str(tmp_path / "out")).num_tokens
    with pytest.raises(ConfigError) as info:
        StreamingLoader(str(tmp_path / "out"), seq_len=512, local_batch_size=2, pipeline="threads")
    assert str(info.value) == (
        f"stream 0 ({tmp_path / 'out'}): its longest block holds {tokens} tokens, fewer than the 513 a sample "
        f"of seq_len 512 needs; use a seq_len of at most {tokens - 1}"
    )
    with StreamingLoader(str(tmp_path / "out"), seq_len=tokens - 1, local_batch_size=1, pipeline="threads") as loader:
        assert next(iter(loader))["input"].shape == (1, tokens - 1)


def _parts(tmp_path: Path, files: list[Path]) -> None:
    for rank, path in enumerate(files):
        url = str(tmp_path / part_name(rank, len(files)))
        write_dataset(str(path), url, tokenizer="bytes", block_tokens=4097, progress=False, allow_empty=True)


def test_merge_refuses_parts_that_hold_no_token_unless_asked(tmp_path, capsys):
    bad, empty = _all_rejected(tmp_path), tmp_path / "empty.txt"
    empty.write_bytes(b"")
    out = tmp_path / "merged"
    _parts(out, [bad, empty])
    with pytest.raises(
        EmptyDatasetError,
        match=re.escape(
            f"all 4 records of 2 inputs were rejected (bad_json 3, empty 1), listed in {out}/rejects.jsonl"
        ),
    ):
        merge_parts([], str(out))
    assert not (out / "manifest").exists()
    assert len((out / "rejects.jsonl").read_text().splitlines()) == 4
    assert main(["merge", "--output", str(out)]) == 1
    assert "zephon-stream merge: error: merge " in capsys.readouterr().err
    assert main(["merge", "--output", str(out), "--allow-empty"]) == 0
    assert Manifest.load(str(out)).num_tokens == 0


def test_an_empty_part_merges_with_parts_that_hold_tokens(stdlib_corpus, tmp_path):
    out = tmp_path / "merged"
    _parts(out, [stdlib_corpus.files[0], _all_rejected(tmp_path)])
    merged = merge_parts([], str(out))
    assert merged.num_tokens == len(stdlib_corpus.files[0].read_bytes()) + 1
    assert merged.num_rejected == 3


def test_a_launcher_rank_commits_its_part_even_when_its_share_is_all_rejects(
    stdlib_corpus, tmp_path, monkeypatch, capsys
):
    """Whether the dataset is empty is decided at the merge, not by one rank's share."""
    inputs = [str(_all_rejected(tmp_path)), str(stdlib_corpus.files[0])]
    out = tmp_path / "parts"
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        assert main(["write", *inputs, "-o", str(out), "--tokenizer", "bytes", "--no-progress"]) == 0
    capsys.readouterr()
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    assert Manifest.load(str(out / part_name(0, 2))).num_tokens == 0
    assert main(["merge", "--output", str(out)]) == 0
    assert Manifest.load(str(out)).num_tokens == len(stdlib_corpus.files[0].read_bytes()) + 1
