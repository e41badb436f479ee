"""A writer killed mid-run leaves no manifest; rerunning it gives the bytes of
an uninterrupted run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from zephon_stream.format.spec import MANIFEST_NAME, shard_name
from zephon_stream.storage import LocalStore


def write_command(corpus, tokenizer_json, out) -> list[str]:
    return [
        sys.executable,
        "-m",
        "zephon_stream",
        "write",
        corpus.glob,
        "--output",
        str(out),
        "--tokenizer",
        f"hf:{tokenizer_json}",
        "--block-tokens",
        "4097",
        "--blocks-per-shard",
        "2",
        "--no-progress",
    ]


def committed_objects(root) -> dict[str, bytes]:
    store = LocalStore(root)
    return {path: store.read(path) for path in store.list()}


@pytest.mark.slow
def test_killed_writer_leaves_no_manifest_and_rerun_is_identical(stdlib_corpus, bpe_tokenizer_json, tmp_path):
    out = tmp_path / "killed"
    cmd = write_command(stdlib_corpus, bpe_tokenizer_json, out)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS")}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    first_shard = out / shard_name(0)
    deadline = time.monotonic() + 120
    while not first_shard.exists():
        assert proc.poll() is None, f"writer ended before its first shard: {proc.stderr.read().decode()}"
        assert time.monotonic() < deadline, "no shard written within 120 s"
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    partial = committed_objects(out)
    assert MANIFEST_NAME not in partial, "the killed run finished before the kill; the test proved nothing"
    assert shard_name(0) in partial

    rerun = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    clean = tmp_path / "clean"
    once = subprocess.run(
        write_command(stdlib_corpus, bpe_tokenizer_json, clean), env=env, capture_output=True, text=True, timeout=300
    )
    assert once.returncode == 0, once.stderr
    resumed, uninterrupted = committed_objects(out), committed_objects(clean)
    assert MANIFEST_NAME in resumed and len(resumed) > 20
    assert resumed.keys() == uninterrupted.keys()
    assert [p for p in resumed if resumed[p] != uninterrupted[p]] == []
    assert sorted(p.name for p in (out / "shards").iterdir()) == sorted(p.name for p in (clean / "shards").iterdir()), (
        "the rerun left temporary files of the killed run"
    )
