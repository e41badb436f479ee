"""The ``zephon-stream write`` command: arguments reach the writer, errors exit non-zero."""

from __future__ import annotations

import json

import pytest

from zephon_stream import Manifest
from zephon_stream.cli import main


def test_write_command_jsonl_with_text_field_and_json_summary(tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"body": f"row {i}"}) + "\n" for i in range(10)) + '{"text": "no body"}\n')
    out = tmp_path / "out"
    rc = main(
        [
            "write",
            str(src),
            "--output",
            str(out),
            "--tokenizer",
            "bytes",
            "--text-field",
            "body",
            "--block-tokens",
            "16",
            "--blocks-per-shard",
            "2",
            "--no-progress",
            "--json",
        ]
    )
    captured = capsys.readouterr()
    assert rc == 0
    summary = json.loads(captured.out.strip().splitlines()[-1])
    assert summary["records_in"] == 11 and summary["rejected"] == {"missing_field": 1}
    assert "1 records rejected" in captured.err
    manifest = Manifest.load(str(out))
    assert (manifest.block_tokens, manifest.blocks_per_shard) == (16, 2)
    assert manifest.num_tokens == sum(len(f"row {i}") + 1 for i in range(10))


def test_write_command_lines_prints_a_table(tmp_path, capsys):
    src = tmp_path / "in.txt"
    src.write_text("a\nbb\nccc\n")
    rc = main(
        ["write", str(src), "--output", str(tmp_path / "out"), "--tokenizer", "bytes", "--lines", "--no-progress"]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert "documents" in out and "3" in out.split("documents")[1].splitlines()[0]


def test_write_command_errors_exit_1_with_a_message(tmp_path, capsys):
    src = tmp_path / "in.txt"
    src.write_text("text")
    assert main(["write", str(src), "--output", str(tmp_path / "o"), "--tokenizer", "nope", "--no-progress"]) == 1
    assert "unknown tokenizer spec 'nope'" in capsys.readouterr().err
    assert main(["write", str(tmp_path / "missing*.txt"), "--output", str(tmp_path / "o"), "--tokenizer", "bytes"]) == 1
    assert "matches no file" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="2"):  # A usage error (tests/test_cli_exit_status.py)
        main(["write", str(src), "--output", str(tmp_path / "o"), "--tokenizer", "bytes", "--workers", "0"])
    assert "argument --workers: must be >= 1 (got 0)" in capsys.readouterr().err
    rc = main(
        ["write", str(src), "--output", str(tmp_path / "o"), "--tokenizer", "bytes", "--storage-option", "secret"]
    )
    assert rc == 1 and "expected KEY=VALUE" in capsys.readouterr().err
    assert not (tmp_path / "o" / "manifest").exists()
