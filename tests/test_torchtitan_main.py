"""The TorchTitan tests again, against TorchTitan main.

TorchTitan's users run it from its source tree, whose data API differs from
0.3.0's (the ``torchtitan`` extra installs 0.3.0). Every TorchTitan test module
runs here in a pytest session (the long ones each alone) with main's source first on
``PYTHONPATH`` (its processes, torchrun ranks included, inherit it) and
``ZEPHON_EXPECT_TORCHTITAN=main``, which every one of them checks
(tests/titan_forms.py). Main's source is the archive named by
``ZEPHON_TORCHTITAN_MAIN`` (a ``torchtitan-main-*.tar.gz`` or an unpacked
source folder), or else the one in ``shared/vendor/`` beside this repository;
where there is none, these tests skip, naming where they looked.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
ARCHIVE_ENV = "ZEPHON_TORCHTITAN_MAIN"
VENDOR = REPO.parent / "shared" / "vendor"

# Every module of TorchTitan tests, in sessions against main: the long ones alone, the quick ones together
# (each session pays TorchTitan's import and the corpus fixtures once).
TITAN_TEST_SESSIONS = (
    ("test_torchtitan_run.py",),
    ("test_torchtitan.py",),
    ("test_torchtitan_torchft.py",),
    (
        "test_torchtitan_eval.py",
        "test_torchtitan_packing.py",
        "test_torchtitan_schedule.py",
        "test_torchtitan_trainer.py",
        "test_readme_torchtitan.py",
    ),
    ("test_torchtitan_gpu.py",),
)
TITAN_TEST_MODULES = tuple(module for session in TITAN_TEST_SESSIONS for module in session)
INNER_FLAGS = ("-q", "-rs", "-p", "no:cacheprovider", "-p", "no:xdist")


def main_source() -> Path | None:
    """The archive or folder of TorchTitan main's source, or None."""
    named = os.environ.get(ARCHIVE_ENV)
    if named:
        return Path(named)
    found = sorted(VENDOR.glob("torchtitan-main-*.tar.gz"))
    return found[-1] if found else None


@pytest.fixture(scope="session")
def titan_main(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder whose ``torchtitan/`` is TorchTitan main's package."""
    source = main_source()
    if source is None:
        pytest.skip(f"TorchTitan main's source is absent: no {ARCHIVE_ENV} and no torchtitan-main-*.tar.gz in {VENDOR}")
    if importlib.util.find_spec("grain") is None:
        pytest.skip("TorchTitan main's data pipeline needs grain: pip install -e '.[dev]' installs it")
    if source.is_dir():
        folder = source
    else:
        unpacked = tmp_path_factory.mktemp("torchtitan-main")
        with tarfile.open(source) as archive:
            archive.extractall(unpacked, filter="data")
        folder = next(unpacked.iterdir())
    assert (folder / "torchtitan" / "components" / "data" / "loader.py").is_file(), f"{source}: not TorchTitan main"
    return folder


def test_the_torchtitan_modules_are_all_listed():
    found = sorted(p.name for p in (REPO / "tests").glob("test_*torchtitan*.py") if p.name != Path(__file__).name)
    assert found == sorted(TITAN_TEST_MODULES)


@pytest.mark.slow
@pytest.mark.parametrize("modules", TITAN_TEST_SESSIONS, ids=[session[0] for session in TITAN_TEST_SESSIONS])
def test_passes_against_torchtitan_main(modules: tuple[str, ...], titan_main: Path, tmp_path: Path):
    if modules == ("test_torchtitan_gpu.py",) and not torch.cuda.is_available():
        pytest.skip("test_torchtitan_gpu.py needs CUDA (every test of it would skip)")
    path = os.pathsep.join(p for p in (str(titan_main), os.environ.get("PYTHONPATH"), str(REPO)) if p)
    (tmp_path / "tmp").mkdir()
    # A session of its own: none of this one's xdist worker variables.
    outer = {key: value for key, value in os.environ.items() if not key.startswith(("PYTEST_", "XDIST_"))}
    env = {**outer, "PYTHONPATH": path, "ZEPHON_EXPECT_TORCHTITAN": "main", "TMPDIR": str(tmp_path / "tmp")}
    paths = [f"tests/{module}" for module in modules]
    command = [sys.executable, "-m", "pytest", *INNER_FLAGS, f"--basetemp={tmp_path / 'base'}", *paths]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    output = done.stdout + done.stderr
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert done.returncode == 0, f"{modules} against TorchTitan main: exit {done.returncode}\n{output[-8000:]}"
    assert re.search(r"\d+ passed", summary) or "skipped" in summary, summary
    print(f"{', '.join(modules)} against TorchTitan main: {summary}")
