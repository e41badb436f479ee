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


WHICH = ["which", "./out/ds", "--seq-len", "512", "--global-batch", "8"]
WRITE = ["write", "x.txt", "--output", "./out/x", "--tokenizer", "bytes"]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (WHICH + ["--step", "5", "--world-size", "0"], "--world-size: must be >= 1 (got 0)"),
        (WHICH + ["--step", "5", "--world-size", "-1"], "--world-size: must be >= 1 (got -1)"),
        (WHICH + ["--step", "-1"], "--step: must be >= 0 (got -1)"),
        (WHICH + ["--torchtitan-step", "0"], "--torchtitan-step: must be >= 1 (got 0)"),
        (WHICH[:2] + ["--step", "0", "--seq-len", "0", "--global-batch", "8"], "--seq-len: must be >= 1 (got 0)"),
        (WHICH[:2] + ["--step", "0", "--seq-len", "8", "--global-batch", "0"], "--global-batch: must be >= 1 (got 0)"),
        (WHICH + ["--step", "0", "--lanes", "0"], "--lanes: must be >= 1 (got 0)"),
        (WHICH + ["--step", "0", "--window", "-1"], "--window: must be >= 0 (got -1)"),
        (WHICH + ["--step", "0", "--accumulation", "0"], "--accumulation: must be >= 1 (got 0)"),
        (WHICH + ["--step", "0", "--seed", "-1"], "--seed: must be in [0, 18446744073709551615] (got -1)"),
        (["inspect", "./out/ds", "--packing-report", "--seq-len", "-3"], "--seq-len: must be >= 1 (got -3)"),
        (["verify", "./out/ds", "--workers", "0"], "--workers: must be >= 1 (got 0)"),
        (WRITE + ["--workers", "0"], "--workers: must be >= 1 (got 0)"),
        (WRITE + ["--pool-min-input-bytes", "-1"], "--pool-min-input-bytes: must be >= 0 (got -1)"),
        (WRITE + ["--block-tokens", "1"], "--block-tokens: must be in [2, 1073741824] (got 1)"),
        (WRITE + ["--blocks-per-shard", "0"], "--blocks-per-shard: must be >= 1 (got 0)"),
        (WRITE + ["--zstd-level", "0"], "--zstd-level: must be in [1, 22] (got 0)"),
        (WRITE + ["--ray-workers", "0"], "--ray-workers: must be >= 1 (got 0)"),
        (WRITE + ["--unit-bytes", "0"], "--unit-bytes: must be >= 1 (got 0)"),
        (["demo", "--steps", "0"], "--steps: must be >= 1 (got 0)"),
        (["demo", "--world-sizes", "2,0"], "--world-sizes: world sizes must be >= 1 (got '2,0')"),
        (["demo", "--reference-world-size", "0"], "--reference-world-size: must be >= 1 (got 0)"),
        (["demo", "--kill-after", "0"], "--kill-after: must be >= 1 (got 0)"),
        (["demo", "--ckpt-every", "0"], "--ckpt-every: must be >= 1 (got 0)"),
        (["demo", "--seq-len", "0"], "--seq-len: must be >= 1 (got 0)"),
        (["demo", "--global-batch", "-2"], "--global-batch: must be >= 1 (got -2)"),
        (["demo", "--block-tokens", "0"], "--block-tokens: must be in [2, 1073741824] (got 0)"),
        (["demo", "--blocks-per-shard", "0"], "--blocks-per-shard: must be >= 1 (got 0)"),
        (["demo", "--s3-port", "65536"], "--s3-port: must be in [0, 65535] (got 65536)"),
        (["demo", "--seed", "-1"], "--seed: must be in [0, 18446744073709551615] (got -1)"),
        (WHICH + ["--step", "five"], "--step: invalid int value: 'five'"),
    ],
)
def test_an_integer_option_out_of_its_range_is_a_usage_error_naming_the_bound(argv, says, capsys):
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == EXIT_USAGE == 2
    err = capsys.readouterr().err
    assert f"zephon-stream {argv[0]}: error: argument {says}" in err and "usage: zephon-stream" in err


def test_integer_options_take_the_values_at_their_bounds():
    from zephon_stream.cli import build_parser

    parser = build_parser()
    which = parser.parse_args(
        WHICH[:1]
        + [
            "./out/ds",
            "--step",
            "0",
            "--seq-len",
            "1",
            "--global-batch",
            "1",
            "--world-size",
            "1",
            "--window",
            "0",
            "--seed",
            str(2**64 - 1),
        ]
    )
    assert (which.step, which.seq_len, which.world_size, which.window, which.seed) == (0, 1, 1, 0, 2**64 - 1)
    write = parser.parse_args(WRITE + ["--zstd-level", "22", "--block-tokens", "2", "--pool-min-input-bytes", "0"])
    assert (write.zstd_level, write.block_tokens, write.pool_min_input_bytes) == (22, 2, 0)
    assert parser.parse_args(["demo", "--s3-port", "0", "--world-sizes", "1,2"]).s3_port == 0


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
