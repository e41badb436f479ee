"""The command in a pipeline: a reader that stops early ends it quietly, as other command-line tools end.

Real processes and real pipes: ``zephon-stream`` runs as ``python -m
zephon_stream`` with its stdout into ``head`` (or into a pipe whose reader
has already gone), and the test reads its stderr and exit status.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from zephon_stream.cli import EXIT_PIPE_CLOSED

ROOT = Path(__file__).resolve().parent.parent
COMMAND = [sys.executable, "-m", "zephon_stream"]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def _into_closed_pipe(args: list[str]) -> subprocess.CompletedProcess:
    """Run the command with its stdout a pipe whose only reader closed before reading a byte."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [*COMMAND, *args], stdout=write_end, stderr=subprocess.PIPE, env=_env(), timeout=120, check=False
        )
    finally:
        os.close(write_end)


def _which_args(url: str) -> list[str]:
    # 256 samples of 513 bytes of text: far more than a pipe's 64 KiB
    # buffer, so the command is still writing when `head` has gone.
    return ["which", url, "--step", "0", "--seq-len", "512", "--global-batch", "256", "--text"]


def test_which_text_into_head_ends_quietly(small_dataset) -> None:
    """``zephon-stream which ... --text | head -1``: head's line, no traceback, the shell's status of a closed pipe."""
    line = " ".join(f"'{a}'" for a in [*COMMAND, *_which_args(small_dataset.url)])
    done = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {line} | head -1"],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=120,
        check=False,
    )
    assert done.stdout.startswith("step 0 (from 0; "), done.stdout
    assert done.stdout.count("\n") == 1
    assert done.stderr == "", done.stderr
    assert done.returncode == EXIT_PIPE_CLOSED == 141


def test_which_reader_that_reads_a_line_then_closes(small_dataset) -> None:
    proc = subprocess.Popen(
        [*COMMAND, *_which_args(small_dataset.url)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env()
    )
    try:
        first = proc.stdout.readline()
        proc.stdout.close()
        stderr = proc.stderr.read()
        status = proc.wait(timeout=120)
    finally:
        proc.kill()
        proc.wait()
    assert first.startswith(b"step 0 (from 0; ")
    assert stderr == b"", stderr.decode()
    assert status == EXIT_PIPE_CLOSED


@pytest.mark.parametrize(
    "args",
    [["inspect", "{url}", "--json"], ["inspect", "{url}", "--shards"], ["verify", "{url}"]],
    ids=["inspect-json", "inspect-table", "verify"],
)
def test_every_subcommand_output_into_a_closed_pipe_ends_quietly(small_dataset, args: list[str]) -> None:
    done = _into_closed_pipe([a.format(url=small_dataset.url) for a in args])
    assert done.stderr == b"", done.stderr.decode()
    assert done.returncode == EXIT_PIPE_CLOSED


@pytest.mark.parametrize("args", [["--help"], ["which", "--help"]], ids=["help", "which-help"])
def test_help_into_a_closed_pipe_ends_quietly(args: list[str]) -> None:
    # argparse drops an OSError from its own write of a long text, and
    # exits with its own status (0 after help); a short text is
    # flushed by main() and meets the closed pipe there.
    done = _into_closed_pipe(args)
    assert "Traceback" not in done.stderr.decode() and "BrokenPipeError" not in done.stderr.decode()
    assert done.returncode in (0, EXIT_PIPE_CLOSED)


def test_an_error_keeps_its_status_and_message_when_stdout_is_closed(tmp_path: Path) -> None:
    done = _into_closed_pipe(["inspect", str(tmp_path / "nothing-here"), "--json"])
    assert done.returncode == 1
    message = done.stderr.decode()
    assert message.startswith("zephon-stream inspect: error: ") and "Traceback" not in message
