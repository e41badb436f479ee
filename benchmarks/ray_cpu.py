"""CPU seconds of this process tree by role (the driver, its reaped children, Ray's task workers and Ray's
daemons), Ray's idle cost, a model of its daemons on a larger node, and a check of the code Ray's workers run.

Read from ``/proc/<pid>/stat`` and ``/proc/<pid>/task/<tid>/stat`` (utime +
stime), for this process and every live descendant; children this process
reaped (a process pool's workers) come from ``RUSAGE_CHILDREN``.

Roles:

- ``driver``: this process (all its threads).
- ``reaped``: children this process waited for since the first snapshot
  (the pool's workers, once the pool has shut down).
- ``task``: Ray's worker processes (the raylet's children titled ``ray::``
  but not its agents), less Ray's own named threads there: the main thread
  runs the task, and threads it starts (the tokenizer's, zstd's) inherit its
  name, ``ray::...``; those that have exited count in the process's total.
- ``worker_ray``: the live threads inside those workers that Ray named
  (gRPC, io, metrics).
- ``daemon``: every other process of Ray's (``gcs_server``, ``raylet``, the
  dashboard and runtime-env agents, the log monitor, the autoscaler's
  monitor, the minimal dashboard).
- ``other``: any other live descendant (a pool's workers still running).

A Ray process that exits between two snapshots takes its CPU with it
(``vanished`` counts them); Ray's processes are the raylet's or this
process's children and are not reaped here.
"""

from __future__ import annotations

import os
import resource
import statistics
import time
from dataclasses import dataclass, field

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
RAY_AGENT_TITLES = ("ray::DashboardAgent", "ray::RuntimeEnvAgent")
RAY_DAEMON_MARKERS = (
    "gcs_server",
    "raylet",
    "log_monitor.py",
    "monitor.py",
    "dashboard.py",
    "dashboard/agent.py",
    "runtime_env/agent",
)


@dataclass
class Snapshot:
    """CPU seconds so far, by role and by process."""

    by_pid: dict[int, tuple[str, dict[str, float]]] = field(default_factory=dict)
    daemon_names: dict[int, str] = field(default_factory=dict)
    reaped_s: float = 0.0


def _stat(path: str) -> tuple[str, int, float]:
    with open(path, "rb") as stat:
        raw = stat.read()
    name = raw.split(b"(", 1)[1].rsplit(b")", 1)[0].decode(errors="replace")
    fields = raw.rsplit(b")", 1)[1].split()
    return name, int(fields[1]), (int(fields[11]) + int(fields[12])) * TICK_S


def _cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
        return cmdline.read().replace(b"\0", b" ").decode(errors="replace")


def _kind(pid: int, cmd: str) -> str:
    if pid == os.getpid():
        return "driver"
    command = cmd.split(" --", 1)[0]  # The raylet's flags name the worker's script
    if cmd.startswith(RAY_AGENT_TITLES) or any(marker in command for marker in RAY_DAEMON_MARKERS):
        return "daemon"
    if cmd.startswith("ray::") or "workers/default_worker.py" in command:
        return "ray_worker"
    return "other"


def _daemon_name(cmd: str) -> str:
    if cmd.startswith("ray::"):
        return cmd.split()[0].removeprefix("ray::")
    return os.path.basename(cmd.split(" --", 1)[0].split()[-1]).removesuffix(".py")


def snapshot() -> Snapshot:
    """The CPU seconds of this process tree now."""
    parents, cmds = {}, {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                _, parents[int(entry)], _ = _stat(f"/proc/{entry}/stat")
                cmds[int(entry)] = _cmdline(int(entry))
            except (OSError, IndexError):
                continue
    tree, frontier = set(), {os.getpid()}
    while frontier:
        tree |= frontier
        frontier = {pid for pid, parent in parents.items() if parent in frontier and pid not in tree}
    out = Snapshot()
    for pid in tree:
        kind = _kind(pid, cmds.get(pid, ""))
        roles: dict[str, float] = {}
        try:
            if kind == "ray_worker":
                # Threads that have exited (a unit's tokenizer thread) leave their CPU in the process's total only.
                total_s = _stat(f"/proc/{pid}/stat")[2]
                roles["worker_ray"] = 0.0
                for tid in os.listdir(f"/proc/{pid}/task"):
                    name, _, cpu_s = _stat(f"/proc/{pid}/task/{tid}/stat")
                    if not name.startswith("ray::"):
                        roles["worker_ray"] += cpu_s
                roles["task"] = total_s - roles["worker_ray"]
            else:
                roles[kind] = _stat(f"/proc/{pid}/stat")[2]
        except (OSError, IndexError):
            continue
        out.by_pid[pid] = (kind, roles)
        if kind == "daemon":
            out.daemon_names[pid] = _daemon_name(cmds.get(pid, ""))
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    out.reaped_s = reaped.ru_utime + reaped.ru_stime
    return out


def cpu_by_role(before: Snapshot, after: Snapshot) -> dict[str, float]:
    """CPU seconds each role spent between two snapshots (``vanished``: Ray processes gone since ``before``)."""
    spent = {
        "driver": 0.0,
        "reaped": after.reaped_s - before.reaped_s,
        "task": 0.0,
        "worker_ray": 0.0,
        "daemon": 0.0,
        "other": 0.0,
    }
    for pid, (_, roles) in after.by_pid.items():
        earlier = before.by_pid.get(pid, ("", {}))[1]
        for role, cpu_s in roles.items():
            spent[role] += cpu_s - earlier.get(role, 0.0)
    spent["vanished"] = sum(
        1 for pid, (kind, _) in before.by_pid.items() if kind != "other" and pid not in after.by_pid
    )
    return spent


def daemon_cpu_by_name(before: Snapshot, after: Snapshot) -> dict[str, float]:
    """CPU seconds each of Ray's daemons spent between two snapshots, by name (``raylet``, ``gcs_server``, ...)."""
    spent: dict[str, float] = {}
    for pid, name in after.daemon_names.items():
        cpu_s = after.by_pid[pid][1]["daemon"] - before.by_pid.get(pid, ("", {}))[1].get("daemon", 0.0)
        spent[name] = spent.get(name, 0.0) + cpu_s
    return spent


def idle_cpu(seconds: float) -> dict:
    """What Ray's daemons and idle workers spend while no task runs."""
    before = snapshot()
    time.sleep(seconds)
    after = snapshot()
    spent = cpu_by_role(before, after)
    return {
        "seconds": seconds,
        "daemon_cores": spent["daemon"] / seconds,
        "daemon_cores_by_name": {k: round(v / seconds, 5) for k, v in daemon_cpu_by_name(before, after).items()},
        "worker_cores": (spent["task"] + spent["worker_ray"]) / seconds,
        "workers": sum(1 for kind, _ in after.by_pid.values() if kind == "ray_worker"),
    }


def model_cores(
    rounds: list[dict], idle: dict, corpus_bytes: int, *, measured_cpus: int, cores: int = 64, unit_mib: float = 64.0
) -> dict:
    """Ray's daemons on a node of ``cores`` cores converting units of ``unit_mib`` MiB: a model, computed.

    From this run: the daemons' idle rate, their CPU per unit beyond it, and
    the tasks' CPU per input byte, which sets the units a second on ``cores``
    busy cores. Bounds: the per-node daemons (raylet, agents, log monitor)
    cost what they cost here at ``measured_cpus`` workers (low), or that
    times ``cores / measured_cpus`` (high: linear in the workers); the head's
    (GCS, monitor, dashboard) stay as measured.
    """
    runs = [r["ray2"] for r in rounds]
    per_unit = statistics.median(
        max(0.0, r["daemon_cpu_s"] - idle["daemon_cores"] * r["seconds"]) / r["units"] for r in runs
    )
    task_s_per_byte = statistics.median(r["task_cpu_s_per_mtok"] * r["num_tokens"] / 1e6 / corpus_bytes for r in runs)
    unit_cpu_s = task_s_per_byte * unit_mib * 2**20
    units_per_s = cores / unit_cpu_s
    head = sum(v for k, v in idle["daemon_cores_by_name"].items() if k in ("gcs_server", "monitor", "dashboard"))
    node = idle["daemon_cores"] - head
    low = idle["daemon_cores"] + per_unit * units_per_s
    high = head + node * cores / measured_cpus + per_unit * units_per_s
    return {
        "computed": True,
        "cores": cores,
        "unit_mib": unit_mib,
        "unit_task_cpu_s": round(unit_cpu_s, 1),
        "units_per_s": round(units_per_s, 3),
        "daemon_cpu_s_per_unit": round(per_unit, 4),
        "daemon_cores": [round(low, 4), round(high, 4)],
        "daemons_share_of_node": [round(low / cores, 5), round(high / cores, 5)],
    }


def _package_file() -> str:
    import zephon_stream

    return zephon_stream.__file__


def check_workers_code() -> str:
    """The zephon_stream Ray's workers import, refused unless it is this process's.

    A Ray worker puts its driver's working directory first on its
    sys.path, ahead of PYTHONPATH: run from inside another checkout, the
    workers would convert with that checkout's code.
    """
    import ray

    theirs, ours = ray.get(ray.remote(num_cpus=1)(_package_file).remote()), _package_file()
    if theirs != ours:
        raise SystemExit(
            f"Ray's workers import {theirs}, this process {ours}: run from a folder without a zephon_stream/"
        )
    print(f"zephon_stream in the driver and Ray's workers: {ours}")
    return ours
