"""TorchElastic (``torchrun``, c10d rendezvous) restarts and resizes a job under
the loader, on loopback with gloo on CPU; every restarted worker group loads
the newest DCP checkpoint and every step it trains is, bit for bit, the step of
an uninterrupted single-rank reading (docs/ELASTIC.md gives the commands).

- a SIGKILLed worker: ``--max-restarts`` restarts the group at the same size;
- two agents, one SIGKILLed with its worker (a lost node): the survivor
  restarts its group alone at W = 1;
- an agent joining a running job (a repaired node): the running agent
  restarts its group with the newcomer at W = 2;
- the rendezvous store hosted outside the agents: the loss of the agent whose
  worker is rank 0 leaves the other going on alone.

The worker is tests/dist_elastic/elastic_worker.py. The agents' temp folders
(``torchelastic_*``) go to a folder of the test (TMPDIR), and every process a
test starts is SIGKILLed at its end if it still runs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tools.reliability.common import child_env, process_table, step_hashes
from tools.server_process import free_ports
from zephon_stream import StreamingLoader

WORKER = Path(__file__).parent / "dist_elastic" / "elastic_worker.py"
SEQ_LEN = 32
GLOBAL_BATCH = 6
SEED = 5
STEPS = 16
CKPT_EVERY = 4
# The hold lands between checkpoints (8 and 12), so a restart replays steps 8 and 9.
HOLD_AFTER = 10
# These settings are the recipe in docs/ELASTIC.md. Heartbeats go out at
# most every 2 x keep_alive_interval, so keep_alive_max_attempt must be well
# above 2 or a live agent is declared dead (and a newcomer starts a job of its
# own); join_timeout bounds a rendezvous that cannot complete.
RDZV_CONF = "keep_alive_interval=1,keep_alive_max_attempt=5,join_timeout=60,last_call_timeout=3"
WAIT_S = 150
# torch 2.13's agents share one TCPStore with their workers and keep it
# across restarts, with the workers' keys not separated per attempt: a restarted
# rank can read the killed rank's gloo address ("Connection refused",
# pytorch/pytorch#135712), and a newcomer waits for the new round's MASTER_ADDR,
# which the old rank-0 agent never publishes again. Each round then gets a
# store of its own.
NO_SHARED_STORE = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def descendants(pid: int) -> list[int]:
    """``pid`` and every process under it (torchrun starts its workers in sessions of their own)."""
    children: dict[int, list[int]] = {}
    for child, (_, parent) in process_table().items():
        children.setdefault(parent, []).append(child)
    out, todo = [pid], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


class ElasticJob:
    """The agents of one elastic job, its event log and checkpoints, in one folder."""

    def __init__(self, root: Path, data: str, vocab_size: int) -> None:
        self.root = root
        self.events_path = root / "events.jsonl"
        self.agents: dict[str, subprocess.Popen] = {}
        tmp = root / "tmp"
        tmp.mkdir(parents=True)
        # TMPDIR keeps torchrun's torchelastic_* folders (and torch's
        # caches) inside the test's folder instead of /tmp, and the node cache
        # that agents killed leave behind goes with it instead of /dev/shm.
        self.env = child_env({"TMPDIR": str(tmp), "ZEPHON_NODE_CACHE": str(root / "node-cache")})
        self.worker_args = [
            str(WORKER),
            "--data",
            data,
            "--events",
            str(self.events_path),
            "--ckpt-dir",
            str(root / "ckpt"),
            "--steps",
            str(STEPS),
            "--ckpt-every",
            str(CKPT_EVERY),
            "--hold-after",
            str(HOLD_AFTER),
            "--seq-len",
            str(SEQ_LEN),
            "--global-batch",
            str(GLOBAL_BATCH),
            "--seed",
            str(SEED),
            "--vocab-size",
            str(vocab_size),
        ]

    def launch(self, name: str, torchrun_args: list[str], env: dict[str, str] | None = None) -> None:
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            *torchrun_args,
            "--monitor-interval=0.5",
            *self.worker_args,
        ]
        with open(self.root / f"{name}.out", "wb") as out:
            self.agents[name] = subprocess.Popen(
                command, env={**self.env, **(env or {})}, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def events(self) -> list[dict[str, Any]]:
        if not self.events_path.exists():
            return []
        records = []
        for line in self.events_path.read_text().splitlines():
            # A kill can cut the last line short.
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                pass
        return records

    def output(self) -> str:
        text = []
        for name in self.agents:
            lines = (self.root / f"{name}.out").read_text(errors="replace").splitlines()
            text.append(f"--- agent {name}:\n" + "\n".join(lines[-25:]))
        return "\n".join(text)

    def wait_for(self, reached: Callable[[list[dict[str, Any]]], bool], what: str) -> list[dict[str, Any]]:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            events = self.events()
            if reached(events):
                return events
            if all(agent.poll() is not None for agent in self.agents.values()):
                break
            time.sleep(0.1)
        raise AssertionError(f"no {what}: events {[e['event'] for e in self.events()]}\n{self.output()}")

    def wait_agents(self, names: list[str]) -> None:
        for name in names:
            try:
                code = self.agents[name].wait(timeout=WAIT_S)
            except subprocess.TimeoutExpired:
                code = None
            assert code == 0, f"agent {name} ended with {code}\n{self.output()}"

    def agent_of(self, pid: int) -> str:
        """The agent whose worker ``pid`` is."""
        return next(name for name, agent in self.agents.items() if pid in descendants(agent.pid))

    def kill(self, name: str) -> None:
        """SIGKILL an agent and its workers at once, as a lost node."""
        for pid in descendants(self.agents[name].pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.agents[name].wait(timeout=60)

    def close(self) -> None:
        for name, agent in self.agents.items():
            if agent.poll() is None:
                self.kill(name)


@pytest.fixture
def elastic_job(small_dataset, tmp_path) -> Iterator[ElasticJob]:
    job = ElasticJob(tmp_path, small_dataset.url, small_dataset.manifest.tokenizer.vocab_size)
    try:
        yield job
    finally:
        job.close()


@pytest.fixture(scope="module")
def reference(small_dataset) -> list[str]:
    """Per-step hashes (positions, inputs, labels) of an uninterrupted single-rank reading."""
    with StreamingLoader(small_dataset.url, seq_len=SEQ_LEN, local_batch_size=GLOBAL_BATCH, seed=SEED) as single:
        return step_hashes(single, STEPS)


def check_run(events: list[dict[str, Any]], reference: list[str]) -> list[dict[str, Any]]:
    """Every step trained, before and after each restart, is the reference's
    step; each restart loaded the newest checkpoint then complete; every step
    ran. Returns the ``start`` events."""
    starts, newest = [], 0
    for event in events:
        if event["event"] == "start":
            assert event["start_step"] == newest, (
                f"a group started at step {event['start_step']}, newest checkpoint {newest}"
            )
            starts.append(event)
        elif event["event"] == "checkpoint":
            newest = event["steps_done"]
        elif event["event"] == "step":
            step = event["step"]
            assert event["positions"] == list(range(step * GLOBAL_BATCH, (step + 1) * GLOBAL_BATCH)), event
            assert event["hash"] == reference[step], (
                f"step {step} at W={event['world_size']} differs from the reference"
            )
    assert sorted({e["step"] for e in events if e["event"] == "step"}) == list(range(STEPS))
    assert events[-1]["event"] == "done"
    return starts


def held(count: int) -> Callable[[list[dict[str, Any]]], bool]:
    return lambda events: sum(e["event"] == "holding" for e in events) >= count


@pytest.mark.slow
@pytest.mark.torchrun
def test_max_restarts_restarts_a_killed_worker_from_the_newest_checkpoint_bit_identically(elastic_job, reference):
    elastic_job.launch("agent", ["--standalone", "--nproc-per-node=2", "--max-restarts=1"], NO_SHARED_STORE)
    events = elastic_job.wait_for(held(1), f"hold after {HOLD_AFTER} steps")
    worker = next(e["pid"] for e in events if e["event"] == "holding")
    os.kill(worker, signal.SIGKILL)
    elastic_job.wait_agents(["agent"])

    events = elastic_job.events()
    starts = check_run(events, reference)
    assert [(s["world_size"], s["restart_count"], s["start_step"]) for s in starts] == [(2, 0, 0), (2, 1, 8)]
    # Steps 8 and 9 ran before the kill and again after it; the same loss
    # means model and optimizer came back exactly, not only the data.
    losses: dict[int, set[float]] = {}
    for event in events:
        if event["event"] == "step":
            losses.setdefault(event["step"], set()).add(event["loss"])
    assert all(len(losses[step]) == 1 for step in (8, 9)), {step: losses[step] for step in (8, 9)}


def elastic_agent_args(port: int, *, host: bool) -> list[str]:
    return [
        "--nnodes=1:2",
        "--nproc-per-node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        "--rdzv-id=elastic-test",
        f"--rdzv-conf={RDZV_CONF},is_host={int(host)}",
        "--max-restarts=3",
    ]


@pytest.mark.slow
@pytest.mark.torchrun
def test_two_agents_one_killed_the_survivor_goes_on_alone_from_the_newest_checkpoint(elastic_job, reference):
    (port,) = free_ports(1)
    elastic_job.launch("host", elastic_agent_args(port, host=True), NO_SHARED_STORE)
    elastic_job.launch("other", elastic_agent_args(port, host=False), NO_SHARED_STORE)
    events = elastic_job.wait_for(held(1), f"hold after {HOLD_AFTER} steps")
    assert next(e for e in events if e["event"] == "holding")["world_size"] == 2
    elastic_job.kill("other")
    elastic_job.wait_agents(["host"])

    starts = check_run(elastic_job.events(), reference)
    assert (starts[-1]["world_size"], starts[-1]["start_step"]) == (1, 8), starts


@pytest.mark.slow
@pytest.mark.torchrun
def test_an_agent_joining_restarts_the_running_group_at_two_ranks_from_the_newest_checkpoint(elastic_job, reference):
    (port,) = free_ports(1)
    elastic_job.launch("host", elastic_agent_args(port, host=True), NO_SHARED_STORE)
    events = elastic_job.wait_for(held(1), f"hold after {HOLD_AFTER} steps")
    assert next(e for e in events if e["event"] == "holding")["world_size"] == 1
    elastic_job.launch("joiner", elastic_agent_args(port, host=False), NO_SHARED_STORE)
    elastic_job.wait_agents(["host", "joiner"])

    starts = check_run(elastic_job.events(), reference)
    assert [(s["world_size"], s["start_step"]) for s in starts] == [(1, 0), (2, 8)], starts
    # A membership change is not a failure: it spends no --max-restarts.
    assert starts[-1]["restart_count"] == 0


@pytest.mark.slow
@pytest.mark.torchrun
def test_with_the_store_outside_the_agents_losing_rank_0s_agent_leaves_the_other_going_on_alone(elastic_job, reference):
    from torch.distributed import TCPStore

    # The c10d rendezvous keeps its state in this store; hosted by a
    # process that does not leave (here the test), no agent's loss takes it along.
    store = TCPStore("127.0.0.1", 0, is_master=True, multi_tenant=True, wait_for_workers=False)
    elastic_job.launch("first", elastic_agent_args(store.port, host=False), NO_SHARED_STORE)
    elastic_job.launch("second", elastic_agent_args(store.port, host=False), NO_SHARED_STORE)
    events = elastic_job.wait_for(held(1), f"hold after {HOLD_AFTER} steps")
    holding = next(e for e in events if e["event"] == "holding")
    assert holding["world_size"] == 2
    lost = elastic_job.agent_of(holding["pid"])
    elastic_job.kill(lost)
    survivor = ({"first", "second"} - {lost}).pop()
    elastic_job.wait_agents([survivor])

    starts = check_run(elastic_job.events(), reference)
    assert (starts[-1]["world_size"], starts[-1]["start_step"]) == (1, 8), starts
    del store
