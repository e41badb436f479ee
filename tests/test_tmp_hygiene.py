"""The session's check that the suite's child processes leave nothing in their temp folder."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

LEAKY = """
import subprocess, sys

def test_a_child_leaves_a_folder_as_torchrun_does():
    code = "import tempfile; tempfile.mkdtemp(prefix='torchelastic_')"
    subprocess.run([sys.executable, "-c", code], check=True)
"""

TIDY = """
import subprocess, sys

def test_a_child_removes_its_temp_folder():
    code = "import tempfile\\nwith tempfile.TemporaryDirectory(prefix='torchelastic_'): pass"
    subprocess.run([sys.executable, "-c", code], check=True)
"""


def run_inner_session(tmp_path: Path, source: str, *options: str) -> tuple[int, str, Path]:
    """A pytest session with the check, on its own machine temp folder; its exit code, output and that folder."""
    (tmp_path / "test_inner.py").write_text(source)
    machine = tmp_path / "machine-tmp"
    machine.mkdir()
    env = {**os.environ, "TMPDIR": str(machine), "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    env.pop("TIKTOKEN_CACHE_DIR", None)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "fixtures_tmp", "-p", "no:cacheprovider",
                           "--basetemp", str(tmp_path / "basetemp"), *options, "test_inner.py"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    return done.returncode, done.stdout + done.stderr, machine


def test_a_session_whose_child_leaves_a_torchelastic_folder_fails_naming_it(tmp_path):
    code, output, machine = run_inner_session(tmp_path, LEAKY)
    assert code == 1, output
    assert "1 passed" in output and "child processes left 1 entries in their temp folder" in output, output
    assert "torchelastic_" in output
    assert os.listdir(machine) == [], "the children's temp folder is removed, leak and all"


def test_under_xdist_a_worker_child_that_leaves_a_folder_fails_the_session_naming_it(tmp_path):
    pytest.importorskip("xdist")
    code, output, machine = run_inner_session(tmp_path, LEAKY + TIDY.split("\n", 2)[2], "-n", "2", "-p", "xdist")
    assert code == 1, output
    assert "2 passed" in output and "child processes left 1 entries in their temp folder" in output, output
    assert "torchelastic_" in output
    assert os.listdir(machine) == [], "the children's temp folder is removed, leak and all"


def test_a_session_whose_children_clean_up_passes_and_leaves_nothing(tmp_path):
    code, output, machine = run_inner_session(tmp_path, TIDY)
    assert code == 0, output
    assert "left" not in output
    assert os.listdir(machine) == []


def test_a_local_tiktoken_file_is_read_without_a_copy_in_any_cache(tiktoken_cache, tmp_path):
    """A ``.tiktoken`` file is parsed in place: no copy in tiktoken's cache (by default under the temp folder)."""
    pytest.importorskip("tiktoken")
    from zephon_stream.writer.tokenizers import load_tokenizer

    path = tmp_path / "bytes.tiktoken"
    path.write_text("".join(f"{base64.b64encode(bytes([b])).decode()} {b}\n" for b in range(256)))
    before = set(os.listdir(tiktoken_cache))
    tokenizer = load_tokenizer(f"tiktoken:{path}")
    assert tokenizer.vocab_size == 257
    assert tokenizer.encode_batch(["hi"]) == [[ord("h"), ord("i")]]
    assert set(os.listdir(tiktoken_cache)) == before


def test_a_malformed_tiktoken_file_names_its_line(tmp_path):
    pytest.importorskip("tiktoken")
    from zephon_stream.errors import TokenizerError
    from zephon_stream.writer.tokenizers import load_tokenizer

    path = tmp_path / "bad.tiktoken"
    path.write_text("YQ== 0\nnot-base64! 1\n")
    with pytest.raises(TokenizerError, match=r"bad.tiktoken line 2: cannot parse ranks"):
        load_tokenizer(f"tiktoken:{path}")
