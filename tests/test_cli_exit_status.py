"""The command's exit status and version, as README.md and docs/CLI.md state them:
0 done, 1 an error the command reports, 2 a usage error; ``--version``; the
help names every store a URL may name."""

from __future__ import annotations

import importlib.metadata

import pytest

import zephon_stream
from zephon_stream.cli import EXIT_USAGE, main, package_version


def test_version_prints_the_package_version_and_exits_0(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"zephon-stream {package_version()}\n"


def test_version_falls_back_to_the_module_version_where_the_package_is_not_installed(monkeypatch):
    def not_installed(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    assert package_version() == zephon_stream.__version__


@pytest.mark.parametrize("argv", [["write"], ["write", "x.txt", "--output", "./out/x"], ["--no-such-option"], ["nope"]])
def test_a_usage_error_exits_2_with_the_usage_on_stderr(argv, capsys):
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == EXIT_USAGE == 2
    captured = capsys.readouterr()
    assert "usage: zephon-stream" in captured.err and "error:" in captured.err
    assert captured.out == ""


def test_no_command_prints_the_help_and_exits_2(capsys):
    assert main([]) == EXIT_USAGE
    out = capsys.readouterr().out
    assert "usage: zephon-stream" in out and "exit status: 0 done" in out


def test_an_error_the_command_reports_exits_1(tmp_path, capsys):
    assert main(["inspect", str(tmp_path / "no-such-dataset")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("zephon-stream inspect: error: ") and err.count("\n") == 1


@pytest.mark.parametrize("command", ["write", "inspect", "verify", "merge", "reindex"])
def test_help_names_every_object_store(command, capsys):
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert all(scheme in text for scheme in ("s3://", "gs://", "az://")), text
