"""examples/torchelastic/train.py, the script docs/ELASTIC.md shows, run under real torchrun (gloo, CPU).

The doc holds the script verbatim. Under torchrun it trains, checkpoints, and
goes on from the newest complete checkpoint: at the same world size with the
same losses (model and optimizer were restored, not only the loader), and at
a smaller one with the samples an uninterrupted single-rank reading gives,
none lost or repeated.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from test_torchelastic import descendants
from tools.reliability.common import child_env
from zephon_stream import StreamingLoader

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "examples" / "torchelastic" / "train.py"
DOC = ROOT / "docs" / "ELASTIC.md"
SEQ_LEN, GLOBAL_BATCH = 32, 4


def test_the_doc_shows_the_example_script_verbatim() -> None:
    text = DOC.read_text()
    marker = "<!-- examples/torchelastic/train.py, verbatim -->"
    assert text.count(marker) == 1
    block = re.search(r"```python\n(.*?)```", text[text.index(marker) :], re.S)
    assert block is not None and block.group(1) == SCRIPT.read_text()


def _torchrun(tmp_path: Path, data: str, nproc: int, steps: int, record: Path) -> str:
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
        "--max-restarts=1", str(SCRIPT), "--data", data, "--ckpt-dir", str(tmp_path / "ckpt"),
        "--steps", str(steps), "--seq-len", str(SEQ_LEN), "--global-batch", str(GLOBAL_BATCH), "--record", str(record),
    ]  # fmt: skip
    # The recipe's variable (docs/ELASTIC.md); TMPDIR and the node cache
    # in the test's folder, so nothing is left elsewhere.
    env = child_env(
        {
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
            "TMPDIR": str(tmp_path),
            "ZEPHON_NODE_CACHE": str(tmp_path / "node-cache"),
        }
    )
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=180)
    finally:
        for pid in reversed(descendants(proc.pid)):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()
    assert proc.returncode == 0, out
    return out


def _records(path: Path) -> dict[int, dict]:
    return {r["step"]: r for r in map(json.loads, path.read_text().splitlines())}


@pytest.mark.slow
@pytest.mark.torchrun
def test_the_example_goes_on_from_the_newest_complete_checkpoint_at_any_world_size(small_dataset, tmp_path) -> None:
    data = small_dataset.url
    first, again, smaller = tmp_path / "first.jsonl", tmp_path / "again.jsonl", tmp_path / "smaller.jsonl"
    out = _torchrun(tmp_path, data, 2, 12, first)
    assert "world size 2: step 0 from scratch" in out
    # A save killed before its .metadata: the newest complete checkpoint is step 8.
    (tmp_path / "ckpt" / "step-00000012" / ".metadata").unlink()
    out = _torchrun(tmp_path, data, 2, 12, again)
    assert f"world size 2: step 8 from {tmp_path / 'ckpt' / 'step-00000008'}" in out
    out = _torchrun(tmp_path, data, 1, 16, smaller)
    assert f"world size 1: step 12 from {tmp_path / 'ckpt' / 'step-00000012'}" in out

    runs = [_records(first), _records(again), _records(smaller)]
    assert [sorted(r) for r in runs] == [list(range(12)), list(range(8, 12)), list(range(12, 16))]
    for step in range(8, 12):
        # Equal losses after the restart mean the optimizer's moments came back too.
        assert runs[1][step]["losses"] == runs[0][step]["losses"], step
        assert runs[1][step]["rows"] == runs[0][step]["rows"], step
    assert {r["world_size"] for r in runs[2].values()} == {1}

    trained = {**runs[0], **runs[2]}
    with StreamingLoader(data, seq_len=SEQ_LEN, local_batch_size=GLOBAL_BATCH, seed=0, pipeline="threads") as loader:
        for step in range(16):
            batch = next(loader)
            expected = {
                str(int(p)): hashlib.sha256(row.numpy().tobytes()).hexdigest()[:16]
                for p, row in zip(batch["sample_positions"], batch["input"])
            }
            assert trained[step]["rows"] == expected, step
            assert sorted(map(int, expected)) == list(range(step * GLOBAL_BATCH, (step + 1) * GLOBAL_BATCH))
