"""The session's check that the suite's child processes leave nothing in their temp folder."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import time
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


# A test of the inner session that says when it runs and waits for the outer test's
# go-ahead, so that another process can write while the session runs.
WAITS = """
import os, pathlib, tempfile, time

def test_waits_while_another_process_writes():
    flags = pathlib.Path(os.environ["ZS_FLAGS"])
    (flags / "started").touch()
    deadline = time.monotonic() + 60
    while not (flags / "written").exists():
        assert time.monotonic() < deadline, "the other process never wrote"
        time.sleep(0.05)
"""

# A node cache user outside the session: it opens the cache once the session runs and holds it.
NODE_CACHE_PEER = """
import pathlib, sys, time
from zephon_stream.storage.node_cache import NodeCache

flags = pathlib.Path(sys.argv[1])
while not (flags / "started").exists():
    time.sleep(0.05)
with NodeCache(sys.argv[2]) as cache:
    cache.get("manifests/peer", lambda: b"the peer's metadata")
    (flags / "written").touch()
    while not (flags / "stop").exists():
        time.sleep(0.05)
"""

NODE_CACHE_LEAK = """
import subprocess, sys

def test_a_child_exits_without_closing_its_node_cache():
    code = ("import os; from zephon_stream.storage.node_cache import NodeCache, node_cache_root; "
            "cache = NodeCache(node_cache_root()); cache.get('manifests/x', lambda: b'x'); os._exit(0)")
    subprocess.run([sys.executable, "-c", code], check=True)
"""


def start_inner_session(
    tmp_path: Path, source: str, *options: str, env: dict | None = None
) -> tuple[subprocess.Popen, Path]:
    """A pytest session with the check, on its own machine temp folder, started; the process and that folder."""
    (tmp_path / "test_inner.py").write_text(source)
    machine = tmp_path / "machine-tmp"
    machine.mkdir()
    path = os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "TMPDIR": str(machine), "PYTHONPATH": path, **(env or {})}
    env.pop("TIKTOKEN_CACHE_DIR", None)
    argv = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "fixtures_tmp",
        "-p",
        "no:cacheprovider",
        "--basetemp",
        str(tmp_path / "basetemp"),
        *options,
        "test_inner.py",
    ]
    process = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return process, machine


def finish(process: subprocess.Popen) -> tuple[int, str]:
    try:
        output, _ = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    return process.returncode, output


def run_inner_session(tmp_path: Path, source: str, *options: str, env: dict | None = None) -> tuple[int, str, Path]:
    """A pytest session with the check, on its own machine temp folder; its exit code, output and that folder."""
    process, machine = start_inner_session(tmp_path, source, *options, env=env)
    code, output = finish(process)
    return code, output, machine


def wait_for(path: Path, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while not path.exists():
        assert process.poll() is None and time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.05)


CHILDREN_LEFT_ONE = "the suite's child processes left 1 entries in their temp folder"


def lines_starting(output: str, start: str) -> list[str]:
    """The lines of ``output`` that start with ``start``: a message glued onto pytest's progress is not one."""
    return [line for line in output.splitlines() if line.startswith(start)]


def test_a_session_whose_child_leaves_a_torchelastic_folder_fails_naming_it(tmp_path):
    code, output, machine = run_inner_session(tmp_path, LEAKY)
    assert code == 1, output
    assert "1 passed" in output and lines_starting(output, CHILDREN_LEFT_ONE), output
    assert "torchelastic_" in output
    assert os.listdir(machine) == [], "the children's temp folder is removed, leak and all"


def test_under_xdist_a_worker_child_that_leaves_a_folder_fails_the_session_naming_it(tmp_path):
    pytest.importorskip("xdist")
    code, output, machine = run_inner_session(tmp_path, LEAKY + TIDY.split("\n", 2)[2], "-n", "2", "-p", "xdist")
    assert code == 1, output
    # On a line of its own, not glued onto the progress line's "[100%]"
    assert "2 passed" in output and lines_starting(output, CHILDREN_LEFT_ONE), output
    assert "torchelastic_" in output
    assert os.listdir(machine) == [], "the children's temp folder is removed, leak and all"


def test_a_session_whose_children_clean_up_passes_and_leaves_nothing(tmp_path):
    code, output, machine = run_inner_session(tmp_path, TIDY)
    assert code == 0, output
    assert "left" not in output
    assert os.listdir(machine) == []


@pytest.mark.parametrize("options", [(), ("-n", "2", "-p", "xdist")], ids=["one-process", "xdist"])
def test_what_the_test_processes_leave_is_named_on_a_line_of_its_own_and_what_other_processes_write_never(
    tmp_path, options
):
    if options:
        pytest.importorskip("xdist")
    flags = tmp_path / "flags"
    flags.mkdir()
    cache = "def test_keeps_a_cache_like_torch_compile():\n    tempfile.mkdtemp(prefix='torchinductor_')\n\n\n"
    source = WAITS.replace("def test_waits", cache + "def test_waits")
    process, machine = start_inner_session(tmp_path, source, *options, env={"ZS_FLAGS": str(flags)})
    try:
        wait_for(flags / "started", process)
        # Another process of the machine writes into its temp folder while the session runs.
        (machine / "weed.other-host.root.log.INFO.20261208").write_text("another process's log")
        (machine / "torchelastic_other").mkdir()
    finally:
        (flags / "written").touch()
        code, output = finish(process)
    assert code == 0, output
    # Other notes (folders a killed session left, a node cache another process holds) depend on the machine.
    [note] = lines_starting(output, "note: the processes that ran the tests")
    assert note.startswith("note: the processes that ran the tests left 1 entries in their temp folder"), output
    assert "torchinductor_" in note and "weed." not in output and "torchelastic_other" not in output
    assert sorted(os.listdir(machine)) == ["torchelastic_other", "weed.other-host.root.log.INFO.20261208"]


def test_a_node_cache_held_by_a_process_outside_the_session_is_not_its_leak(tmp_path):
    flags, root = tmp_path / "flags", tmp_path / "node-cache"
    flags.mkdir()
    peer = subprocess.Popen(
        [sys.executable, "-c", NODE_CACHE_PEER, str(flags), str(root)],
        env={**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", "")},
    )
    try:
        process, _ = start_inner_session(tmp_path, WAITS, env={"ZS_FLAGS": str(flags), "ZEPHON_NODE_CACHE": str(root)})
        code, output = finish(process)
        assert (root / "node-cache-objects").is_dir(), "the peer's cache was open while the session ended"
    finally:
        (flags / "stop").touch()
        (flags / "written").touch()
        assert peer.wait(timeout=60) == 0
    assert code == 0, output
    [note] = lines_starting(output, "note: the node cache's folder")
    assert f"held open by processes outside this session (pids {peer.pid})" in note, output
    assert "the suite left" not in output
    assert not root.exists(), "the peer, its last user, removed it"


def test_a_node_cache_left_by_the_sessions_own_process_fails_the_session_naming_it(tmp_path):
    root = tmp_path / "node-cache"
    code, output, _ = run_inner_session(tmp_path, NODE_CACHE_LEAK, env={"ZEPHON_NODE_CACHE": str(root)})
    assert code == 1, output
    [failure] = lines_starting(output, "the suite left ")
    assert "entries in the node cache's folder" in failure and "node-cache-users" in failure, output


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
