"""Run torchft replica groups (demo/torchft_group.py) as processes on
loopback with a real lighthouse, and read back what their committed steps
trained (``zephon-stream demo --torchft`` and tests/test_torchft.py)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from zephon_stream.errors import ZephonError

# The worker processes must import this copy of the package.
ROOT = Path(__file__).resolve().parent.parent.parent


class RunError(ZephonError, RuntimeError):
    """A replica group exited with an error, or the run did not finish in time."""


@dataclass
class Run:
    """What one run left: each surviving group rank's final model and records."""

    out: Path
    finals: dict[str, dict]
    records: dict[str, list[dict]]
    exit_codes: dict[str, list[int]] = field(default_factory=dict)

    def counts(self, key: str) -> torch.Tensor:
        """Times each position was trained (summed over group ranks: each rank counts its own rows)."""
        ranks = sorted({name.split("r")[1] for name in self.finals})
        total = None
        for rank in ranks:
            final = max((f for n, f in self.finals.items() if n.endswith(f"r{rank}")), key=lambda f: f["step"])
            value = -final[key]
            total = value if total is None else total + value
        return total


def lost_and_repeated(counts: torch.Tensor) -> tuple[int, int, int]:
    """``(lost, repeated, trained)``: positions up to the highest trained one
    that no committed step trained, extra trainings of a position, and all trainings."""
    trained = int(counts.sum())
    seen = torch.nonzero(counts > 0).flatten()
    top = int(seen.max()) + 1 if len(seen) else 0
    lost = int((counts[:top] == 0).sum())
    repeated = int((counts - 1).clamp(min=0).sum())
    return lost, repeated, trained


def run_groups(
    tmp: Path,
    *,
    dataset: str,
    groups: int,
    group_world_size: int,
    async_quorum: bool,
    loaders: list[dict],
    steps: int,
    seq_len: int = 16,
    lanes: int,
    events: dict[int, dict],
    restart: dict[int, str] | None = None,
    timeout_s: float = 150.0,
    worker: Sequence[str] = ("-m", "zephon_stream.demo.torchft_group"),
    extra: dict | None = None,
) -> Run:
    """Start a lighthouse and ``groups`` groups of ``group_world_size`` ranks;
    ``events[g]`` schedules group ``g``'s kill, hold, leave and failed commit
    (group.py); ``restart[g]`` restarts a killed group once the file it names exists.
    ``worker`` is the Python argv of a group rank (it gets the spec as its last
    argument, with ``extra``'s keys added)."""
    from torchft.coordination import LighthouseServer

    out = tmp / "run"
    out.mkdir()
    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=400, heartbeat_timeout_ms=1500)
    rows = max(k.get("group_batch", 0) * groups for k in loaders) + max(k.get("global_batch", 0) for k in loaders)
    max_positions = steps * rows * 2 + 64
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {"RUST_LOG": "warn", **os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "GLOG_minloglevel": "2"}
    procs: dict[tuple[int, int], subprocess.Popen] = {}
    exit_codes: dict[str, list[int]] = {}

    def start(group: int, rank: int, life: int) -> subprocess.Popen:
        spec = {
            "out": str(out),
            "group": group,
            "group_rank": rank,
            "group_world_size": group_world_size,
            "life": life,
            "steps": steps,
            "max_positions": max_positions,
            "async_quorum": async_quorum,
            "lighthouse": lighthouse.address(),
            "seq_len": seq_len,
            "loaders": loaders,
            "lanes": lanes,
            "dataset": dataset,
            "sampler_groups": groups,
            "events": events.get(group, {}),
            **(extra or {}),
        }
        log = (out / f"g{group}r{rank}.life{life}.log").open("w")
        return subprocess.Popen(
            [sys.executable, *worker, json.dumps(spec)], env=env, stdout=log, stderr=subprocess.STDOUT
        )

    try:
        for g in range(groups):
            for r in range(group_world_size):
                procs[(g, r)] = start(g, r, 1)
        deadline = time.monotonic() + timeout_s
        ready = [out / f"g{g}r{r}.life1.ready" for g in range(groups) for r in range(group_world_size)]
        while not all(p.exists() for p in ready):
            _check_alive(procs, out, deadline)
            time.sleep(0.05)
        (out / "go").write_text("")
        restarted: set[tuple[int, int]] = set()
        to_restart = {(g, r) for g in (restart or {}) for r in range(group_world_size)}
        while any(p.poll() is None for p in procs.values()) or to_restart - restarted:
            for (g, r), proc in list(procs.items()):
                code = proc.poll()
                if code is not None and code != 0 and (g, r) in to_restart - restarted:
                    if code != -signal.SIGKILL:
                        raise RunError(f"group {g} rank {r} exited {code}:\n{_log_tail(out, g, r)}")
                    exit_codes.setdefault(f"g{g}r{r}", []).append(code)
                    wait_for = out / restart[g]
                    while not wait_for.exists():
                        _check_alive({k: v for k, v in procs.items() if k != (g, r)}, out, deadline)
                        time.sleep(0.05)
                    procs[(g, r)] = start(g, r, 2)
                    restarted.add((g, r))
            if time.monotonic() > deadline:
                raise RunError(f"torchft run did not finish in {timeout_s} s:\n" + _all_tails(out, procs))
            time.sleep(0.05)
        for (g, r), proc in procs.items():
            exit_codes.setdefault(f"g{g}r{r}", []).append(proc.returncode)
            if proc.returncode != 0:
                raise RunError(f"group {g} rank {r} exited {proc.returncode}:\n{_log_tail(out, g, r)}")
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        lighthouse.shutdown()
    finals = {}
    for path in sorted(out.glob("*.final.pt")):
        finals[path.name.split(".")[0]] = torch.load(path, weights_only=False)
    records: dict[str, list[dict]] = {}
    for path in sorted(out.glob("*.jsonl")):
        records.setdefault(path.name.split(".")[0], []).extend(json.loads(line) for line in path.open())
    return Run(out=out, finals=finals, records=records, exit_codes=exit_codes)


def _check_alive(procs: dict, out: Path, deadline: float) -> None:
    for (g, r), proc in procs.items():
        if proc.poll() not in (None, 0, -signal.SIGKILL):
            raise RunError(f"group {g} rank {r} exited {proc.returncode}:\n{_log_tail(out, g, r)}")
    if time.monotonic() > deadline:
        raise RunError("torchft run timed out:\n" + _all_tails(out, procs))


def _log_tail(out: Path, group: int, rank: int) -> str:
    logs = sorted(out.glob(f"g{group}r{rank}.life*.log"))
    return "\n".join(f"--- {p.name}\n" + p.read_text()[-3000:] for p in logs)


def _all_tails(out: Path, procs: dict) -> str:
    return "\n".join(_log_tail(out, g, r) for g, r in procs)


def reference_digests(
    dataset: str, *, seq_len: int, lanes: int, positions: int, packing: str = "concat"
) -> dict[int, str]:
    """Row digest at each global position ``< positions``, read by one rank of a plain ``StreamingLoader``."""
    from zephon_stream.loader import StreamingLoader

    batch = lanes
    digests = {}
    with StreamingLoader(
        dataset,
        seq_len=seq_len,
        local_batch_size=batch,
        rank=0,
        world_size=1,
        seed=3,
        lanes=lanes,
        window=0,
        pipeline="threads",
        packing=packing,
    ) as loader:
        while loader.position < positions:
            rows = next(loader)
            for i, p in enumerate(rows["sample_positions"].tolist()):
                digests[p] = hashlib.sha1(
                    rows["input"][i].numpy().tobytes() + rows["labels"][i].numpy().tobytes()
                ).hexdigest()[:16]
    return digests
