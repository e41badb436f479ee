"""The README's own commands, as a newcomer runs them from the repository root.

Its packing report runs on a dataset whose documents are mostly shorter than
a row, where best fit cuts far fewer than windows (what the README says it
shows); every write it runs here reruns as written; and the peers'
interpreter of its benchmarks table is named as docs/BENCHMARKS.md's set-up
leaves it, with no path of one machine.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()


def code_blocks(text: str) -> list[list[str]]:
    """The fenced code blocks of ``text``, each as its lines (blanks and comment lines left out)."""
    blocks: list[list[str]] = []
    inside = False
    for line in text.splitlines():
        if line.startswith("```"):
            inside = not inside
            if inside:
                blocks.append([])
        elif inside and line.strip() and not line.startswith("#"):
            blocks[-1].append(line)
    return blocks


def code_lines(text: str) -> list[str]:
    return [line for block in code_blocks(text) for line in block]


def run_here(command: str, cwd: Path) -> subprocess.CompletedProcess:
    """A README command line, run in ``cwd`` with this interpreter for ``python`` and ``zephon-stream``."""
    python = shlex.quote(sys.executable)
    command = re.sub(r"^zephon-stream ", f"{python} -m zephon_stream ", command)
    command = re.sub(r"^python ", f"{python} ", command)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(command, shell=True, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def workdir(tmp_path: Path) -> Path:
    """A folder that looks like the repository root to the README's commands: its sources, an empty ./out."""
    (tmp_path / "zephon_stream").symlink_to(REPO / "zephon_stream")
    (tmp_path / "out").mkdir()
    return tmp_path


def test_the_packing_report_of_the_readme_shows_best_fit_cutting_far_fewer_documents(tmp_path):
    [commands] = [block for block in code_blocks(README) if any("--packing-report" in line for line in block)]
    assert commands[-1].startswith("zephon-stream inspect ") and "--seq-len 512" in commands[-1]
    cwd = workdir(tmp_path)
    for command in commands[:-1]:
        done = run_here(command, cwd)
        assert done.returncode == 0, (command, done.stderr[-2000:])
    done = run_here(commands[-1], cwd)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "seq_len 512: best_fit cuts " in done.stdout
    report = json.loads(run_here(commands[-1] + " --json --no-progress", cwd).stdout)["packing_report"]
    [at_512] = report["seq_lens"]
    windows, best = at_512["concat"], at_512["best_fit"]
    assert windows["documents"] > 1000
    assert windows["floor_share"] < 0.5, "most documents are shorter than a row"
    # Past the floor (documents longer than a row, cut by any packing) best fit cuts a fifth or less.
    past_the_floor = [f["documents_cut_share"] - f["floor_share"] for f in (windows, best)]
    assert past_the_floor[1] <= past_the_floor[0] / 5, past_the_floor
    assert best["tokens_without_beginning_share"] < windows["tokens_without_beginning_share"] * 0.7


def test_every_write_the_readme_runs_here_reruns_as_written(tmp_path):
    lines = code_lines(README)
    writes = [line for line in lines if line.startswith("zephon-stream write ") and "<" not in line]
    assert len(writes) >= 5 and all("--overwrite" in line for line in writes), writes
    in_python = [line for line in lines if "write_dataset(" in line]
    assert in_python and all("overwrite=True" in line for line in in_python), in_python
    cwd = workdir(tmp_path)
    manifests = []
    for _ in range(2):
        done = run_here(writes[0], cwd)
        assert done.returncode == 0, done.stderr[-2000:]
        manifests.append((cwd / "out" / "ds" / "manifest").read_bytes())
    assert manifests[0] == manifests[1]


def test_the_readme_names_the_peers_interpreter_as_the_benchmarks_set_up_leaves_it():
    benchmarks = (REPO / "docs" / "BENCHMARKS.md").read_text()
    [venv] = set(re.findall(r"^python -m venv --system-site-packages (\S+)$", benchmarks, flags=re.M))
    assert not os.path.isabs(venv)
    named = re.findall(r"([^\s`(]*/bin/python)\b", README + benchmarks)
    assert named and set(named) == {f"{venv}/bin/python"}, set(named)
    ignored = subprocess.run(["git", "check-ignore", "-q", f"{venv}/bin/python"], cwd=REPO)
    assert ignored.returncode == 0, f"{venv}/ is not ignored by git"
    assert not re.search(r"(?<![\w.])/(tmp|home|root|work)/", README), "a path of one machine in the README"
