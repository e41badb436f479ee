"""The processes of this machine as ``/proc`` shows them: a server's process group, whether a pid runs.

The launchers start each server under a guard that leads a process group of
its own (``zephon_stream/storage/lifetime.py``); tests and ``tools/ray_head.py``
find what a server started, or check that nothing of it is left, by its group.
"""

from __future__ import annotations

import os
from collections.abc import Iterator


def processes() -> Iterator[tuple[int, int, str, str]]:
    """``(pid, process group, state, command name)`` of every process this user can read (``/proc``)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                head, tail = stat.read().rsplit(b")", 1)
        except OSError:
            continue
        fields = tail.split()
        yield int(entry), int(fields[2]), fields[0].decode(), head.split(b"(", 1)[1].decode(errors="replace")


def process_group(leader: int) -> list[int]:
    """The processes, zombies left out, of the group ``leader`` leads (a guarded server's, ``lifetime.py``)."""
    return sorted(pid for pid, group, state, _ in processes() if group == leader and state != "Z")


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False
