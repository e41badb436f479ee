"""constraints.txt is the lock of pyproject.toml's own dependency closure: the
command in its header, rerun now, must write the same file (uv keeps every
pin of the existing lock that still fits, so only a change to pyproject.toml
or constraints.in changes it)."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def uv_command() -> list[str] | None:
    if shutil.which("uv"):
        return ["uv"]
    try:
        import uv  # noqa: F401  (the dev extra installs it)
    except ImportError:
        return None
    return [sys.executable, "-m", "uv"]


def test_constraints_txt_is_the_lock_its_header_command_regenerates(tmp_path):
    uv = uv_command()
    if uv is None:
        pytest.skip("uv is not installed (pip install 'zephon-stream[dev]' installs it): cannot regenerate the lock")
    lock = (ROOT / "constraints.txt").read_text()
    header = lock.splitlines()[1].lstrip("#").strip()
    args = shlex.split(header)
    assert args[:3] == ["uv", "pip", "compile"] and args[args.index("-o") + 1] == "constraints.txt", header
    for name in ("pyproject.toml", "constraints.in"):
        shutil.copy(ROOT / name, tmp_path / name)
    (tmp_path / "constraints.txt").write_text(lock)
    done = subprocess.run([*uv, *args[1:], "--quiet"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{header} failed:\n{done.stderr[-3000:]}"
    regenerated = (tmp_path / "constraints.txt").read_text()
    assert regenerated == lock, (
        "constraints.txt is stale: pyproject.toml or constraints.in changed; rerun\n    " + header
    )
