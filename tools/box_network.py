"""The network of a cluster in a box (tools/cluster_box.py): a bridge, a namespace per node, and their teardown.

Run by path, this file is also the box's *keeper*, a process that waits under the servers' guard
(``zephon_stream/storage/lifetime.py``) and tears the box's network down when
told to stop, or when the guard finds the process that made the box gone
(SIGKILL included)::

    python tools/box_network.py keep NAME      # until SIGTERM, then tear NAME down
    python tools/box_network.py teardown NAME  # now
    python tools/box_network.py sweep          # every box whose owner is gone

A box ``NAME`` (``zb`` and 4 hex digits, unique on the machine) owns the
bridge ``NAMEbr``, one namespace ``NAMEnI`` per node and the host end
``NAMEvI`` of each node's veth pair (the node's end is its ``eth0``); every
name fits Linux's 15 characters. Its addresses are one /24 of 198.18.0.0/15,
the range set aside for network benchmarks: the bridge ``.1``, node ``i``
``.(10 + i)``. Subnets are handed out under a machine-wide lock and recorded
in ``REGISTRY/NAME.json`` with the owner's pid and start time, so two boxes
(two test workers) never share names or addresses, and ``sweep`` finds the
boxes whose owner and keeper were both killed.
"""

from __future__ import annotations

import fcntl
import glob
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def process_stat(pid: int) -> Any:
    """``lifetime.process_stat``, imported when first needed.

    The command line says why it cannot make a box (not root) before the package (and numpy) load.
    """
    from zephon_stream.storage.lifetime import process_stat as stat

    return stat(pid)


def process_start_ticks(pid: int) -> int | None:
    """``lifetime.process_start_ticks``, imported when first needed (as ``process_stat``)."""
    from zephon_stream.storage.lifetime import process_start_ticks as ticks

    return ticks(pid)


REGISTRY = "/run/zephon-box"
NAME_PREFIX = "zb"
NETWORK = ipaddress.ip_network("198.18.0.0/15")
FIRST_NODE_HOST = 10
# A neighbour that does not exist: packets routed through it are lost
# silently, as in a real partition (a blackhole route fails at once instead).
DEAD_NEIGHBOUR_HOST = 254
DEAD_NEIGHBOUR_MAC = "02:00:00:00:00:fe"
KILL_DEADLINE_S = 10.0


class BoxUnavailable(RuntimeError):
    """This machine cannot make a box (not root, no namespaces, a command missing): one line says why."""


def ip(*args: str, check: bool = True) -> str:
    """``ip ARGS`` and its output; raises RuntimeError naming the command and ip's message."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip() or f'exit {done.returncode}'}")
    return done.stdout


def unavailable() -> str | None:
    """Why this machine cannot make a box, in one line; None when it can."""
    if not sys.platform.startswith("linux"):
        return f"a box needs Linux network namespaces (this is {sys.platform})"
    if os.geteuid() != 0:
        return "a box needs root (network namespaces, bridges, mounts): run as root"
    missing = [c for c in ("ip", "nsenter", "unshare", "mount", "hostname", "sleep") if shutil.which(c) is None]
    if missing:
        return f"a box needs the commands {', '.join(missing)} (iproute2, util-linux)"
    probe = f"{NAME_PREFIX}probe{os.getpid() % 100000}"
    try:
        ip("netns", "add", probe)
    except RuntimeError as exc:
        return f"network namespaces are not available here ({exc})"
    ip("netns", "del", probe, check=False)
    return None


class BoxNames:
    """The names and addresses of box ``name`` whose subnet is ``198.18.0.0/15``'s /24 number ``subnet``."""

    def __init__(self, name: str, subnet: int) -> None:
        self.name = name
        self.subnet = subnet
        self.network = list(NETWORK.subnets(new_prefix=24))[subnet]
        self.bridge = f"{name}br"
        self.bridge_address = str(self.network[1])
        self.dead_neighbour = str(self.network[DEAD_NEIGHBOUR_HOST])

    def netns(self, node: int) -> str:
        return f"{self.name}n{node}"

    def veth(self, node: int) -> str:
        return f"{self.name}v{node}"

    def address(self, node: int) -> str:
        return str(self.network[FIRST_NODE_HOST + node])


def registered() -> dict[str, dict]:
    entries = {}
    for file in sorted(os.listdir(REGISTRY)) if os.path.isdir(REGISTRY) else []:
        if file.endswith(".json"):
            try:
                with open(os.path.join(REGISTRY, file)) as record:
                    entries[file[: -len(".json")]] = json.load(record)
            except (OSError, ValueError):
                continue
    return entries


def _used_subnets() -> set[int]:
    """The /24s of 198.18.0.0/15 that an interface of the host, or a registered box, already holds."""
    used = {entry.get("subnet") for entry in registered().values()}
    for line in ip("-4", "-o", "addr", "show").splitlines():
        for word in line.split():
            if "/" in word and word[0].isdigit():
                address = ipaddress.ip_interface(word).ip
                if address in NETWORK:
                    used.add((int(address) - int(NETWORK.network_address)) >> 8)
    return used


def allocate(folder: str) -> BoxNames:
    """Pick a free name and /24, make the bridge with its address and register the box, under the machine's lock.

    Args:
        folder: the box's folder, recorded so that ``sweep`` can remove it.

    Raises:
        RuntimeError: every /24 of 198.18.0.0/15 is taken.
    """
    os.makedirs(REGISTRY, mode=0o700, exist_ok=True)
    with open(os.path.join(REGISTRY, "lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        taken = set(registered())
        name = f"{NAME_PREFIX}{os.urandom(2).hex()}"
        while name in taken:
            name = f"{NAME_PREFIX}{os.urandom(2).hex()}"
        used = _used_subnets()
        # 198.18.0.0/24 is left to hand-made bridges (docs show it).
        subnet = next((s for s in range(1, 512) if s not in used), None)
        if subnet is None:
            raise RuntimeError("every /24 of 198.18.0.0/15 is in use by a box or an interface")
        box = BoxNames(name, subnet)
        record = {"subnet": subnet, "folder": folder, "pid": os.getpid(), "ticks": process_start_ticks(os.getpid())}
        with open(os.path.join(REGISTRY, f"{name}.json"), "w") as out:
            json.dump(record, out)
        try:
            ip("link", "add", box.bridge, "type", "bridge")
            ip("addr", "add", f"{box.bridge_address}/24", "dev", box.bridge)
            ip("link", "set", box.bridge, "up")
        except BaseException:
            teardown(name)
            raise
    return box


def add_leftovers(name: str, patterns: list[str]) -> None:
    """Record file patterns (a server's sockets in /tmp) that box ``name``'s teardown removes."""
    path = os.path.join(REGISTRY, f"{name}.json")
    with open(path) as record:
        entry = json.load(record)
    entry["leftovers"] = [*entry.get("leftovers", []), *patterns]
    with open(path + ".new", "w") as out:
        json.dump(entry, out)
    os.replace(path + ".new", path)


def add_node(box: BoxNames, node: int) -> None:
    """Namespace ``node``, its veth pair on the bridge, its address on ``eth0``, and its loopback up."""
    netns, veth = box.netns(node), box.veth(node)
    ip("netns", "add", netns)
    ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns)
    ip("link", "set", veth, "master", box.bridge, "up")
    ip("-n", netns, "addr", "add", f"{box.address(node)}/24", "dev", "eth0")
    ip("-n", netns, "link", "set", "eth0", "up")
    ip("-n", netns, "link", "set", "lo", "up")


def set_link(box: BoxNames, node: int, up: bool) -> None:
    """Bring node ``node``'s link (the host end of its veth) up or down: down, nothing reaches it or leaves it."""
    ip("link", "set", box.veth(node), "up" if up else "down")


def cut_store(box: BoxNames, node: int) -> None:
    """Route node ``node``'s packets to the bridge's address through the neighbour that does not exist."""
    netns = box.netns(node)
    ip(
        "-n",
        netns,
        "neigh",
        "replace",
        box.dead_neighbour,
        "lladdr",
        DEAD_NEIGHBOUR_MAC,
        "dev",
        "eth0",
        "nud",
        "permanent",
    )
    ip("-n", netns, "route", "add", f"{box.bridge_address}/32", "via", box.dead_neighbour, "dev", "eth0")


def heal_store(box: BoxNames, node: int) -> None:
    ip("-n", box.netns(node), "route", "del", f"{box.bridge_address}/32")


def netns_pids(netns: str) -> list[int]:
    """The processes whose network namespace is ``netns`` (``ip netns pids``), zombies left out."""
    return [int(pid) for pid in ip("netns", "pids", netns, check=False).split() if not _zombie(int(pid))]


def _zombie(pid: int) -> bool:
    stat = process_stat(pid)
    return stat is None or stat.state == "Z"


def kill_netns(netns: str) -> int:
    """SIGKILL every process in ``netns`` until none is left; how many were killed.

    Raises:
        RuntimeError: processes are still there after ``KILL_DEADLINE_S``.
    """
    killed: set[int] = set()
    deadline = time.monotonic() + KILL_DEADLINE_S
    while True:
        pids = [pid for pid in netns_pids(netns) if pid != os.getpid()]
        if not pids:
            return len(killed)
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes {pids} of {netns} outlived SIGKILL for {KILL_DEADLINE_S:.0f}s")
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except ProcessLookupError:
                pass
        time.sleep(0.02)


def box_netns(name: str) -> list[str]:
    """The namespaces of box ``name`` that exist."""
    listed = [line.split()[0] for line in ip("netns", "list", check=False).splitlines() if line.strip()]
    return [ns for ns in listed if ns.startswith(f"{name}n") and ns[len(name) + 1 :].isdigit()]


def box_links(name: str) -> list[str]:
    """The host's links of box ``name`` that exist: the host ends of its veths, then its bridge."""
    names = [line.split()[0].split("@")[0] for line in ip("-br", "link", check=False).splitlines() if line.strip()]
    veths = [n for n in names if n.startswith(f"{name}v") and n[len(name) + 1 :].isdigit()]
    return veths + [n for n in names if n == f"{name}br"]


def teardown(name: str) -> None:
    """Kill every process of box ``name``'s nodes, delete its veths, bridge and namespaces, the files it
    recorded (``add_leftovers``) and its registry entry. Safe to repeat; what is already gone is skipped."""
    for netns in box_netns(name):
        kill_netns(netns)
    # A veth goes with its namespace only once the kernel has destroyed it, later and on its own time;
    # deleting the host end removes the pair at once.
    for link in box_links(name):
        ip("link", "del", link, check=False)
    for netns in box_netns(name):
        ip("netns", "del", netns, check=False)
    for pattern in registered().get(name, {}).get("leftovers", []):
        for path in glob.glob(pattern):
            os.unlink(path)
    try:
        os.unlink(os.path.join(REGISTRY, f"{name}.json"))
    except FileNotFoundError:
        pass


def sweep() -> list[str]:
    """Tear down the boxes whose owner no longer runs (owner and keeper both killed), folders included."""
    swept = []
    for name, entry in registered().items():
        pid, ticks = entry.get("pid"), entry.get("ticks")
        if isinstance(pid, int) and process_start_ticks(pid) == ticks:
            continue
        teardown(name)
        if entry.get("folder"):
            shutil.rmtree(entry["folder"], ignore_errors=True)
        swept.append(name)
    return swept


def keep(name: str) -> int:
    """Wait until SIGTERM, SIGINT or SIGHUP, then tear box ``name`` down."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    # The teardown must fit in the guard's grace after SIGTERM: what it imports is loaded now.
    process_stat(os.getpid())
    print(f"keeping box {name}", flush=True)
    while not stop.wait(1.0):
        pass
    teardown(name)
    print(f"box {name} torn down", flush=True)
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["keep"] and len(argv) == 2:
        return keep(argv[1])
    if argv[:1] == ["teardown"] and len(argv) == 2:
        teardown(argv[1])
        return 0
    if argv == ["sweep"]:
        print("\n".join(sweep()))
        return 0
    print("usage: box_network.py keep NAME | teardown NAME | sweep", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
