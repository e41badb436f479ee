"""Shared pieces of the reliability scenarios: a real corpus, datasets, step
hashes, process counters and a subprocess runner with a time and memory cap."""

from __future__ import annotations

import dataclasses
import os
import resource
import shutil
import signal
import subprocess
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from zephon_stream.loader import union_sha256
from zephon_stream.storage.lifetime import processes

REPO_ROOT = Path(__file__).resolve().parents[2]
BLOCK_TOKENS = 4097
BLOCKS_PER_SHARD = 4


class ScenarioFailure(AssertionError):
    """The library did something a scenario forbids (wrong data, a hang, a leak)."""


def process_table() -> dict[int, tuple[str, int]]:
    """Every process of the machine: pid -> (state letter, parent pid), from /proc."""
    return {stat.pid: (stat.state, stat.parent) for stat in processes()}


def check(condition: bool, message: str) -> None:
    """Raise ``ScenarioFailure(message)`` unless ``condition``."""
    if not condition:
        raise ScenarioFailure(message)


def stdlib_corpus(folder: Path, *, num_files: int, stride: int = 5, max_file_bytes: int = 64 * 1024) -> list[Path]:
    """Copy every ``stride``-th stdlib ``.py`` file (sorted, valid UTF-8, at most
    ``max_file_bytes``) into ``folder``, named so sorting keeps the order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    folder.mkdir(parents=True, exist_ok=True)
    picked: list[Path] = []
    candidates = 0
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if "site-packages" in rel.split("/") or not path.is_file():
            continue
        data = path.read_bytes()
        if not 0 < len(data) <= max_file_bytes:
            continue
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        candidates += 1
        if (candidates - 1) % stride:
            continue
        out = folder / f"{len(picked):05d}_{rel.replace('/', '_')}"
        out.write_bytes(data)
        picked.append(out)
        if len(picked) == num_files:
            break
    return picked


def write_local_dataset(inputs: Sequence[Path], out: Path, *, tokenizer: str = "bytes") -> Any:
    """Write ``inputs`` with small blocks (4097 tokens, 4 a shard); the summary."""
    from zephon_stream import write_dataset

    return write_dataset(
        [str(p) for p in inputs],
        str(out),
        tokenizer=tokenizer,
        block_tokens=BLOCK_TOKENS,
        blocks_per_shard=BLOCKS_PER_SHARD,
        progress=False,
    )


def committed_objects(url: str, storage_options: dict[str, Any] | None = None) -> dict[str, bytes]:
    """Every object under a dataset root, by relative path."""
    from zephon_stream.storage import open_store

    with open_store(url, storage_options) as store:
        return {path: store.read(path) for path in store.list()}


def copy_dataset(src: Path, dst: Path) -> Path:
    """A fresh copy of a local dataset folder."""
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    return dst


def batch_rows(batch: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(sample_positions, input, labels)`` of one loader batch as numpy arrays."""
    return batch["sample_positions"].numpy(), batch["input"].numpy(), batch["labels"].numpy()


def step_hashes(loader: Any, steps: int) -> list[str]:
    """Per-step hashes of the next ``steps`` batches of a single-rank loader."""
    out = []
    for _ in range(steps):
        out.append(union_sha256([batch_rows(next(loader))]))
    return out


def rss_bytes() -> int:
    """Resident set size of this process, from /proc."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def open_fds() -> dict[str, int]:
    """This process's open descriptors by kind (``socket``, ``file``, ``pipe``, ``other``)."""
    kinds = {"socket": 0, "file": 0, "pipe": 0, "other": 0}
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:"):
            kinds["socket"] += 1
        elif target.startswith("pipe:"):
            kinds["pipe"] += 1
        elif target.startswith("/"):
            kinds["file"] += 1
        else:
            kinds["other"] += 1
    return kinds


@dataclasses.dataclass(frozen=True)
class LimitedRun:
    """What a capped subprocess did: exit code (negative: signal), output, and
    whether it ran out of time."""

    returncode: int
    stdout: str
    stderr: str
    timed_out: bool


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment with the repository importable and no launcher variables."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS")
    }
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra or {})
    return env


def run_limited(
    args: Sequence[str], *, timeout_s: float, memory_bytes: int | None, env: dict[str, str] | None = None
) -> LimitedRun:
    """Run ``python args...`` in a new session with an RLIMIT_AS cap, killing
    the whole group at ``timeout_s``."""

    def limit() -> None:
        if memory_bytes is not None:
            resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))

    proc = subprocess.Popen(
        [sys.executable, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env or child_env(),
        preexec_fn=limit,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
        return LimitedRun(proc.returncode, out, err, timed_out=False)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return LimitedRun(proc.returncode, out, err, timed_out=True)
