"""A node of a cluster in a box (tools/cluster_box.py): its names, and how it is made of namespaces.

A node is a network namespace (made by tools/box_network.py) plus a mount, UTS and IPC namespace of its
own, held by a *holder* process (``sleep``) that every command on the node enters (``nsenter``): the node
is up while its holder runs, and what it mounted (its /tmp and /dev/shm) goes with the last of its
processes.
"""

from __future__ import annotations

import os
import shlex
import subprocess as sp
import sys
import threading
from pathlib import Path
from typing import Any

from tools import box_network as net

REPO_ROOT = Path(__file__).resolve().parent.parent


class Node:
    """One node of a box: its hostname ``node<i>``, address, namespace, the host end of its link, and its
    *holder* (the process whose namespaces every command on the node enters; the node is up while it runs)."""

    def __init__(self, names: net.BoxNames, index: int) -> None:
        self.index = index
        self.hostname = f"node{index}"
        self.address = names.address(index)
        self.netns = names.netns(index)
        self.veth = names.veth(index)
        self.holder: sp.Popen[bytes] | None = None
        self.processes: list[sp.Popen[Any]] = []

    @property
    def up(self) -> bool:
        return self.holder is not None and self.holder.poll() is None

    def __repr__(self) -> str:
        return f"Node({self.hostname} {self.address} {'up' if self.up else 'down'})"


def visible_paths(shared: Path) -> list[Path]:
    """What every node must see at the same path under its own /tmp: the shared folder, the interpreter,
    the repository."""
    paths = sorted({Path(os.path.realpath(p)) for p in (shared, sys.prefix, sys.base_prefix, REPO_ROOT)})
    under_tmp = [p for p in paths if p.is_relative_to("/tmp") and p != Path("/tmp")]
    return [p for p in under_tmp if not any(p != q and p.is_relative_to(q) for q in under_tmp)]


def boot_script(node: Node, hosts: Path, stage: Path, keep: list[Path], tmpfs_bytes: int) -> str:
    """The shell lines that make a node of a fresh mount, UTS and IPC namespace, then hold it (``sleep``)."""
    q = shlex.quote
    lines = [
        "set -e",
        f"mount --bind {q(str(hosts))} /etc/hosts",
        f"mount -t tmpfs -o size={tmpfs_bytes},mode=1777 zbtmp {q(str(stage))}",
    ]
    for path in keep:
        inside = stage / path.relative_to("/tmp")
        lines += [f"mkdir -p {q(str(inside))}", f"mount --bind {q(str(path))} {q(str(inside))}"]
    # The tmpfs is filled first and then moved over /tmp, with what is bound into it: once it
    # covers /tmp, the paths to bind would be hidden.
    lines += [
        f"mount --move {q(str(stage))} /tmp",
        f"mount -t tmpfs -o size={tmpfs_bytes},mode=1777 zbshm /dev/shm",
        f"hostname {node.hostname}",
        "echo ready",
        "exec sleep infinity",
    ]
    return "\n".join(lines)


def read_line(proc: sp.Popen[bytes], timeout_s: float) -> str:
    """The first line ``proc`` writes, or "" once it exits or ``timeout_s`` passes."""
    out: list[bytes] = []
    reader = threading.Thread(target=lambda: out.append(proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    reader.join(timeout_s)
    return out[0].decode().strip() if out else ""
