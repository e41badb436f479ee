"""One ``torchrun`` job of the demo in its own session, and its event log.

The demo's workers write one JSON line per event; a job is watched through
that log and killed with SIGKILL, as when a node dies.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from zephon_stream.errors import ZephonError

RUN_TIMEOUT_S = 600.0
POLL_S = 0.05


class DemoFailedError(ZephonError, RuntimeError):
    """A demo run that failed, or data that did not match the reference."""


class TorchrunJob:
    """One torchrun job in its own session, with its workers' pid files."""

    def __init__(self, *, name: str, world_size: int, workdir: pathlib.Path, args: list[str]) -> None:
        self.name = name
        self.world_size = world_size
        self.pid_dir = workdir / "pids" / name
        self.output = workdir / f"{name}.out"
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={world_size}",
            "-m",
            "zephon_stream.demo.train",
            *args,
            "--pid-dir",
            str(self.pid_dir),
        ]
        self._out = open(self.output, "wb")
        # OMP_NUM_THREADS set, torchrun prints no banner about it; TMPDIR in the
        # workdir keeps its torchelastic_* folders (never removed) out of the machine's.
        (workdir / "tmp").mkdir(exist_ok=True)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(workdir / "tmp")}
        # The demo SIGKILLs a job whose ranks share a node cache, and
        # resumes on one rank, which would not open the default /dev/shm
        # folder to wipe what the killed ranks left: every run of the demo
        # shares one in the workdir instead, and the last to close empties it.
        env.setdefault("ZEPHON_NODE_CACHE", str(workdir / "node-cache"))
        self.process = subprocess.Popen(
            command, stdout=self._out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        self.started = time.monotonic()

    def wait(self, timeout_s: float = RUN_TIMEOUT_S) -> None:
        try:
            code = self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise DemoFailedError(
                f"run {self.name} did not finish within {timeout_s:.0f}s; output: {self.output}"
            ) from None
        finally:
            self._out.close()
        if code != 0:
            raise DemoFailedError(f"run {self.name} (W={self.world_size}) exited with code {code}:\n{self.tail()}")

    def kill(self) -> None:
        """SIGKILL every worker and torchrun itself: no handler runs, nothing is flushed."""
        # torchrun starts each worker in a session of its own, so killing
        # torchrun's process group would leave the workers running.
        for pid_file in sorted(self.pid_dir.glob("rank-*.pid")):
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        self._out.close()

    def tail(self, lines: int = 15) -> str:
        """The end of the workers' own output (their traceback), else of torchrun's."""
        text = self.output.read_text(errors="replace").splitlines()
        # torchrun prefixes worker lines with [rankN]; its own trailer only says a child failed.
        worker = [line for line in text if line.startswith("[rank")]
        return "\n".join((worker or text)[-lines:]) + f"\n(full output: {self.output})"


def read_events(path: pathlib.Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        # A kill can cut the last line short; every complete line is whole JSON.
        with contextlib.suppress(json.JSONDecodeError):
            records.append(json.loads(line))
    return records


def wait_until(
    launch: TorchrunJob, events: pathlib.Path, reached: Callable[[list[dict[str, Any]]], bool], what: str
) -> None:
    """Block until the run's event log satisfies ``reached``."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while time.monotonic() < deadline:
        if reached(read_events(events)):
            return
        if launch.process.poll() is not None:
            launch.wait(0)
            raise DemoFailedError(f"run {launch.name} finished before {what}; raise --steps")
        time.sleep(POLL_S)
    launch.kill()
    raise DemoFailedError(f"run {launch.name}: no {what} within {RUN_TIMEOUT_S:.0f}s")


def last_step(records: list[dict[str, Any]]) -> int:
    return max((r["step"] for r in records if r["event"] == "step"), default=-1)
