"""A TorchElastic job on the nodes of a box (tools/cluster_box.py): one torchrun agent a node, the example's
worker (tests/dist_cluster/elastic_node.py runs examples/torchelastic/train.py), its records and events in
the box's shared folder, and the checks every scenario makes against an uninterrupted reading."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tools.cluster_box import Box
from zephon_stream import StreamingLoader

WORKER = Path(__file__).parent / "dist_cluster" / "elastic_node.py"
RDZV_PORT = 29400
SEQ_LEN, GLOBAL_BATCH, CKPT_EVERY = 32, 12, 4
# docs/ELASTIC.md's recipe: a dead agent is counted for keep_alive_interval x keep_alive_max_attempt
# (5 s), a round with MIN nodes waits last_call_timeout (3 s) for more.
RDZV_CONF = "keep_alive_interval=1,keep_alive_max_attempt=5,join_timeout=90,last_call_timeout=3"
WAIT_S = 150.0


class ElasticBoxJob:
    """The agents of one job on a box's nodes, ``nproc`` workers each, and what they recorded.

    Args:
        box: the box (its store holds the dataset at ``data``).
        data: the dataset's URL on the store.
        steps: global steps the job trains.
        nnodes: torchrun's ``--nnodes`` (``MIN:MAX``).
        timeout_s: the worker's collective timeout (``--timeout-s``).
        env: variables for every worker (pace, hold).
    """

    def __init__(
        self, box: Box, data: str, *, steps: int, nnodes: str, nproc: int, timeout_s: float, env: dict[str, str]
    ) -> None:
        self.box = box
        self.shared = box.shared
        self.events_dir = self.shared / "events"
        self.events_dir.mkdir(exist_ok=True)
        self.record = self.shared / "record.jsonl"
        self.steps = steps
        self.agents: dict[str, subprocess.Popen] = {}
        self.env = {
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
            "OMP_NUM_THREADS": "1",
            "GLOO_SOCKET_IFNAME": "eth0",
            "ZS_EVENTS": str(self.events_dir),
            **env,
        }
        self.torchrun = [
            f"--nnodes={nnodes}",
            f"--nproc-per-node={nproc}",
            "--rdzv-backend=c10d",
            "--rdzv-id=box-job",
            "--max-restarts=5",
            "--monitor-interval=0.5",
        ]
        self.worker = [
            str(WORKER),
            "--data",
            data,
            "--ckpt-dir",
            str(self.shared / "ckpt"),
            "--steps",
            str(steps),
            "--ckpt-every",
            str(CKPT_EVERY),
            "--seq-len",
            str(SEQ_LEN),
            "--global-batch",
            str(GLOBAL_BATCH),
            "--record",
            str(self.record),
            "--timeout-s",
            str(timeout_s),
        ]

    def set_pace(self, seconds: float) -> None:
        """Make every worker wait ``seconds`` before each step from now on (the file its steps read)."""
        pace = self.events_dir / "pace"
        pace.with_suffix(".new").write_text(str(seconds))
        pace.with_suffix(".new").replace(pace)  # A reader never sees it empty

    def command(self, host_node: int, is_host: bool) -> list[str]:
        """The torchrun line of an agent whose rendezvous store is on node ``host_node``."""
        endpoint = f"{self.box.nodes[host_node].address}:{RDZV_PORT}"
        return [
            sys.executable,
            "-m",
            "torch.distributed.run",
            *self.torchrun,
            f"--rdzv-endpoint={endpoint}",
            f"--rdzv-conf={RDZV_CONF},is_host={int(is_host)}",
            *self.worker,
        ]

    def launch(self, name: str, node: int, *, host_node: int = 0) -> None:
        """Start agent ``name`` on ``node``; its output goes to ``<shared>/<name>.out``."""
        with open(self.shared / f"{name}.out", "wb") as out:
            self.agents[name] = self.box.run(
                node, self.command(host_node, node == host_node), env=self.env, stdout=out, stderr=subprocess.STDOUT
            )

    def events(self) -> list[dict[str, Any]]:
        path = self.events_dir / "events.jsonl"
        if not path.exists():
            return []
        out = []
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # A node killed mid-write
                pass
        return out

    def records(self) -> list[dict[str, Any]]:
        if not self.record.exists():
            return []
        return [json.loads(line) for line in self.record.read_text().splitlines() if line.strip()]

    def output(self) -> str:
        tails = []
        for name in self.agents:
            lines = (self.shared / f"{name}.out").read_text(errors="replace").splitlines()
            tails.append(f"--- agent {name}:\n" + "\n".join(lines[-30:]))
        return "\n".join(tails)

    def wait_for(self, reached: Callable[[list[dict[str, Any]]], Any], what: str, wait_s: float = WAIT_S) -> Any:
        """Poll the events until ``reached(events)`` is truthy; returns it, or fails naming ``what``."""
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            found = reached(self.events())
            if found:
                return found
            time.sleep(0.1)
        raise AssertionError(f"no {what} within {wait_s:.0f} s\n{self.output()}")

    def wait_agents(self, names: list[str], wait_s: float = WAIT_S) -> list[int | None]:
        codes = []
        for name in names:
            try:
                codes.append(self.agents[name].wait(timeout=wait_s))
            except subprocess.TimeoutExpired:
                codes.append(None)
        return codes


def steps_after(events: list[dict], since: float, world: int) -> list[dict]:
    """Rank 0's step events at world size ``world`` after time ``since``."""
    return [e for e in events if e["event"] == "step" and e["rank"] == 0 and e["world"] == world and e["time"] > since]


def reference_rows(url: str, options: dict | None, steps: int) -> list[dict[str, str]]:
    """Each global step's rows (position -> digest of its tokens) as one uninterrupted rank reads them."""
    rows = []
    with StreamingLoader(
        url,
        seq_len=SEQ_LEN,
        local_batch_size=GLOBAL_BATCH,
        seed=0,
        storage_options=options,
        pipeline="threads",
        node_cache=False,
    ) as loader:
        for _ in range(steps):
            batch = next(loader)
            rows.append(
                {
                    str(int(p)): hashlib.sha256(row.numpy().tobytes()).hexdigest()[:16]
                    for p, row in zip(batch["sample_positions"], batch["input"])
                }
            )
    return rows
