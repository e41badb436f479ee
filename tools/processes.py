"""The processes of this machine as ``/proc`` shows them: a server's process group, whether a pid runs.

The launchers start each server under a guard that leads a process group of
its own (``zephon_stream/storage/lifetime.py``); tests and ``tools/ray_head.py``
find what a server started, or check that nothing of it is left, by its group.
``/proc`` is read by ``lifetime.py`` (``process_stat``, ``processes``), once
for the package and its tools.
"""

from __future__ import annotations

from zephon_stream.storage.lifetime import ProcessStat, process_stat, processes

__all__ = ["ProcessStat", "alive", "process_group", "process_stat", "processes"]


def process_group(leader: int) -> list[int]:
    """The processes, zombies left out, of the group ``leader`` leads (a guarded server's, ``lifetime.py``)."""
    return sorted(stat.pid for stat in processes() if stat.group == leader and stat.state != "Z")


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    stat = process_stat(pid)
    return stat is not None and stat.state != "Z"
