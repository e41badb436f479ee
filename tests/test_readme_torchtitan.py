"""The README's TorchTitan job config runs as written: it returns TorchTitan's
own ``Trainer.Config`` with the loader's ``ZephonDataLoader.Config`` in it.

NOTE: TorchTitan's model package imports triton (its GPU installs have it) in
one module, ``minimal_async_ep.kernels``; where triton is missing that one
module is stood in for, in a process of its own, so the rest is TorchTitan's.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

STAND_IN = """\
import sys
from unittest import mock
sys.modules["torchtitan.distributed.minimal_async_ep.kernels"] = mock.MagicMock()
"""

CHECK = """
config = llama3_debugmodel_zephon()
from zephon_stream.integrations.torchtitan import ZephonDataLoader
assert isinstance(config.dataloader, ZephonDataLoader.Config), type(config.dataloader)
print(type(config).__qualname__, config.dataloader.dataset_path)
"""


def readme_torchtitan_block() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## TorchTitan\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 1, "the README's TorchTitan section holds one Python block"
    return blocks[0]


def test_the_readme_torchtitan_job_config_builds_trainer_config_with_the_zephon_loader(tmp_path):
    pytest.importorskip("torchtitan", reason="needs the [torchtitan] extra")
    prelude = STAND_IN if importlib.util.find_spec("triton") is None else ""
    # NOTE: TorchTitan's imports leave a torchinductor_* folder in TMPDIR: the test's own.
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, "-c", prelude + readme_torchtitan_block() + CHECK],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "PYTHONPATH": path, "TMPDIR": str(tmp_path)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "Trainer.Config ./out/ds"
