"""The README's TorchTitan job config runs as written: it returns TorchTitan's
own ``Trainer.Config`` with the loader's ``ZephonDataLoader.Config`` in it;
and its twin, ``examples/torchtitan/check_job.py``, runs the job's data side
as written (on TorchTitan 0.3.0 and, in tests/test_torchtitan_main.py, main).

TorchTitan's model package imports triton (its GPU installs have it) in
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


def readme_torchtitan_section() -> str:
    text = (ROOT / "README.md").read_text()
    return text.split("\n## TorchTitan\n", 1)[1].split("\n## ", 1)[0]


def readme_torchtitan_block() -> str:
    blocks = re.findall(r"```python\n(.*?)```", readme_torchtitan_section(), flags=re.S)
    assert len(blocks) == 1, "the README's TorchTitan section holds one Python block"
    return blocks[0]


def test_the_readme_torchtitan_job_config_builds_trainer_config_with_the_zephon_loader(tmp_path):
    pytest.importorskip("torchtitan", reason="needs the [torchtitan] extra")
    prelude = STAND_IN if importlib.util.find_spec("triton") is None else ""
    # TorchTitan's imports leave a torchinductor_* folder in TMPDIR: the test's own.
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, "-c", prelude + readme_torchtitan_block() + CHECK],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "PYTHONPATH": path, "TMPDIR": str(tmp_path)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "Trainer.Config ./out/ds"


def test_the_readme_twin_checks_the_jobs_data_side_here(small_bpe_dataset, bpe_tokenizer_json, tmp_path):
    pytest.importorskip("torchtitan", reason="needs the [torchtitan] extra")
    import json
    import shlex
    import shutil

    from fixtures_corpus import EOS_TOKEN
    from zephon_stream.integrations.torchtitan import TITAN

    (command,) = [
        body
        for lang, body in re.findall(r"^```(\w*)\n(.*?)^```$", readme_torchtitan_section(), flags=re.S | re.M)
        if not lang
    ]
    # The README's ./out/ds-bpe and ./out/tok: the fixtures' BPE dataset and tokenizer, in a folder of the test's.
    (tmp_path / "out" / "tok").mkdir(parents=True)
    shutil.copy(bpe_tokenizer_json, tmp_path / "out" / "tok" / "tokenizer.json")
    (tmp_path / "out" / "tok" / "tokenizer_config.json").write_text(json.dumps({"eos_token": EOS_TOKEN}))
    shutil.copytree(small_bpe_dataset.url, tmp_path / "out" / "ds-bpe")
    argv = shlex.split(command.strip())
    assert argv[:2] == ["python", "examples/torchtitan/check_job.py"]
    path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(ROOT)) if p)
    (tmp_path / "tmp").mkdir()
    done = subprocess.run(
        [sys.executable, str(ROOT / argv[1]), *argv[2:]],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "PYTHONPATH": path, "TMPDIR": str(tmp_path / "tmp")},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert lines[0].startswith(f"TorchTitan {TITAN.name}: dataloader.build(")
    shape = "(4096,)" if TITAN.flat_batches else "(8, 512)"
    steps = [line for line in lines if line.startswith("step ")]
    assert len(steps) == 3 and all(f"input {shape}" in line and f"labels {shape}" in line for line in steps)
    assert "samples [0, 1, 2, 3, 4, 5, 6, 7]" in steps[0]
    assert lines[-1].startswith("checkpoint entry: dataloader.zephon")
