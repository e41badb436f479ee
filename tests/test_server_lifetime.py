"""No server outlives the test process that started it, and no test worker is lost to Ray.

Each claim is shown on a pytest session of its own, run as a child process:

- a session holding every server fixture (SeaweedFS, fake-gcs-server,
  Azurite, the Ray head) is SIGKILLed: within seconds none of their
  processes runs and their folders are gone;
- under pytest-xdist, a test whose Ray node fails under it (its dashboard
  agent SIGKILLed: the raylet goes with the agent, and Ray then ends every
  driver of the node, which had ended a pytest worker in CI) fails with a
  message, and the worker goes on: the next Ray test gets a head started
  again, and a test after it passes.

The guard and the sweep behind them are tested directly too.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tools.processes import alive, process_group
from zephon_stream.storage.lifetime import guarded_command, mark_owner, process_start_ticks, sweep_orphaned

TESTS = Path(__file__).resolve().parent
GONE_WITHIN_S = 10.0

HOLDS_EVERY_SERVER = """
import json, os, time
from pathlib import Path

from tools.processes import process_group

def test_hold_the_servers(seaweedfs_server, fake_gcs_server, azurite_server, ray_instance):
    servers = [seaweedfs_server, fake_gcs_server, azurite_server, ray_instance.head]
    groups = {s.pid: process_group(s.pid) for s in servers}
    record = {"session": os.getpid(), "groups": groups, "folders": [str(s.data_dir) for s in servers]}
    Path(os.environ["ZS_RECORD"]).write_text(json.dumps(record))
    time.sleep(600)
"""

RAY_NODE_KILLED = """
import os, signal, time
from pathlib import Path

def _wait_in_a_task(marker):
    import ray

    @ray.remote
    def wait():
        Path(marker).touch()
        time.sleep(120)

    return ray.get(wait.remote())

def _add(a, b):
    import ray

    return ray.get(ray.remote(lambda x, y: x + y).remote(a, b))

def test_1_a_driver_whose_node_is_killed(ray_instance, ray_driver, tmp_path):
    marker = tmp_path / "running"
    call = ray_driver.submit(_wait_in_a_task, str(marker))
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert time.monotonic() < deadline and not call.done()
        time.sleep(0.05)
    # The chain met in CI: the dashboard agent dies, the raylet goes
    # with it, and Ray ends the driver.
    agents = [pid for pid in ray_instance.head.group_pids()
              if b"dashboard/agent.py" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert len(agents) == 1
    os.kill(agents[0], signal.SIGKILL)
    call.result(timeout=120)

def test_2_ray_runs_again_on_the_same_worker(ray_driver):
    assert ray_driver.call(_add, 1, 2) == 3

def test_3_the_worker_goes_on():
    assert os.environ["PYTEST_XDIST_WORKER"] == "gw0"
"""


def _inner_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, **extra}
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), str(TESTS.parent), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


@pytest.mark.slow
def test_a_sigkilled_session_leaves_no_server_and_no_folder(tmp_path):
    (tmp_path / "test_inner.py").write_text(HOLDS_EVERY_SERVER)
    record_path = tmp_path / "record.json"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "fixtures_stores", "-p", "fixtures_ray",
               "-p", "no:cacheprovider", "--basetemp", str(tmp_path / "basetemp"), "test_inner.py"]  # fmt: skip
    session = subprocess.Popen(
        command,
        cwd=tmp_path,
        env=_inner_env(tmp_path, ZS_RECORD=str(record_path)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 180
        while not record_path.exists():
            assert session.poll() is None, session.stdout.read().decode()[-3000:]
            assert time.monotonic() < deadline, "the servers did not start within 180 s"
            time.sleep(0.1)
        record = json.loads(record_path.read_text())
        os.kill(record["session"], signal.SIGKILL)
        session.wait(timeout=30)
    finally:
        session.kill()
        session.wait()
        session.stdout.close()
    pids = sorted({int(pid) for group in record["groups"].values() for pid in group})
    assert len(record["groups"]) == 4 and len(pids) >= 8, record  # Guards, servers, Ray's daemons
    deadline = time.monotonic() + GONE_WITHIN_S
    while time.monotonic() < deadline and (any(map(alive, pids)) or any(map(os.path.exists, record["folders"]))):
        time.sleep(0.1)
    assert not [pid for pid in pids if alive(pid)], f"still running {GONE_WITHIN_S:.0f} s after the SIGKILL"
    assert not [folder for folder in record["folders"] if os.path.exists(folder)]


@pytest.mark.slow
def test_under_xdist_a_ray_node_killed_under_a_test_fails_that_test_and_the_worker_goes_on(tmp_path):
    pytest.importorskip("xdist")
    pytest.importorskip("ray")
    (tmp_path / "test_inner.py").write_text(RAY_NODE_KILLED)
    command = [sys.executable, "-m", "pytest", "-q", "-n", "1", "-p", "xdist", "-p", "fixtures_ray",
               "-p", "no:cacheprovider", "--basetemp", str(tmp_path / "basetemp"), "test_inner.py"]  # fmt: skip
    done = subprocess.run(command, cwd=tmp_path, env=_inner_env(tmp_path), capture_output=True, text=True, timeout=420)
    output = done.stdout + done.stderr
    assert done.returncode == 1, output[-4000:]
    assert "1 failed, 2 passed" in output, output[-4000:]
    assert "RayDriverLost: the Ray driver process ended during the call" in output, output[-4000:]
    assert "node down" not in output and "crashed" not in output, output[-4000:]


def test_a_guarded_command_exits_as_the_command_does():
    assert subprocess.run(guarded_command(["sh", "-c", "exit 3"])).returncode == 3
    assert subprocess.run(guarded_command(["sh", "-c", "kill -9 $$"])).returncode == 128 + signal.SIGKILL


def test_a_guarded_command_stops_when_its_starter_is_killed_and_its_folder_goes(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    starter = (
        "import subprocess, sys, time\n"
        "from zephon_stream.storage.lifetime import guarded_command\n"
        f"p = subprocess.Popen(guarded_command(['sleep', '600'], remove_on_orphan={str(folder)!r}), "
        "start_new_session=True)\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", starter], stdout=subprocess.PIPE, text=True)
    try:
        guard = int(parent.stdout.readline())
        deadline = time.monotonic() + 10
        while len(process_group(guard)) < 2:
            assert time.monotonic() < deadline, "the guarded command did not start"
            time.sleep(0.05)
        group = process_group(guard)
        parent.kill()
        parent.wait()
    finally:
        parent.kill()
        parent.wait()
        parent.stdout.close()
    deadline = time.monotonic() + GONE_WITHIN_S
    while time.monotonic() < deadline and (any(map(alive, group)) or folder.exists()):
        time.sleep(0.05)
    assert not [pid for pid in group if alive(pid)] and not folder.exists()


def test_the_sweep_takes_folders_whose_owner_is_gone_and_nothing_else(tmp_path):
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()
    dead, live, unmarked, other = (
        tmp_path / name for name in ("zs-seaweedfs-dead", "zs-ray-live", "zs-azurite-x", "keep-dead")
    )
    for folder in (dead, live, unmarked, other):
        folder.mkdir()
        (folder / "data").write_text("x")
    for folder in (dead, other):
        (folder / ".zs-owner").write_text(f"{finished.pid} {process_start_ticks(os.getpid())}\n")
    mark_owner(live)
    removed = sweep_orphaned(tmp_path, ("zs-seaweedfs-", "zs-ray-", "zs-azurite-"))
    assert removed == [str(dead)]
    assert live.exists() and unmarked.exists() and other.exists() and not dead.exists()
