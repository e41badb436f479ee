"""How many ranks of the job share this node, as the launcher that started them says it.

The ranks of one node share the node cache and, through it, one request-rate
limiter per store (``node_cache.py``). A node is the ranks of one machine
however they were started, and each launcher says so in variables of its own:

==============================  =========================================================================
launcher                        variable read (the first one set wins, in this order)
==============================  =========================================================================
torchrun (TorchElastic)         ``LOCAL_WORLD_SIZE``
Open MPI ``mpirun``             ``OMPI_COMM_WORLD_LOCAL_SIZE``
MPICH / Intel MPI (Hydra)       ``MPI_LOCALNRANKS``
MVAPICH2                        ``MV2_COMM_WORLD_LOCAL_SIZE``
Cray PMI                        ``PMI_LOCAL_SIZE``
HPE PALS (PBS ``mpiexec``)      ``PALS_LOCAL_SIZE``
Slurm ``srun``                  ``SLURM_STEP_TASKS_PER_NODE`` (else ``SLURM_TASKS_PER_NODE``) at this
                                node's place ``SLURM_NODEID``, else ``SLURM_NTASKS_PER_NODE``; only in
                                a task ``srun`` started (``SLURM_STEP_ID`` or ``SLURM_LOCALID`` set)
==============================  =========================================================================

torchrun comes first because it is often started by another launcher (one
``srun`` task a node, each running torchrun): the variables of the outer
launcher then count torchruns, not ranks. An MPI launcher comes before Slurm
for the same reason (``mpirun`` inside a Slurm allocation sees the
allocation's variables). Counting too many is harmless (a node cache for one
process), too few is not (each rank reads the metadata itself and meets the
store with a limiter of its own), so a launcher recognised with a count of 1
still counts as one rank a node.

``storage`` never imports torch; this module reads the environment only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import NamedTuple

from zephon_stream.errors import ConfigError

LOCAL_SIZE_VARIABLES = (
    ("torchrun", "LOCAL_WORLD_SIZE"),
    ("Open MPI", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("MPICH/Intel MPI", "MPI_LOCALNRANKS"),
    ("MVAPICH2", "MV2_COMM_WORLD_LOCAL_SIZE"),
    ("Cray PMI", "PMI_LOCAL_SIZE"),
    ("PALS", "PALS_LOCAL_SIZE"),
)
"""(launcher, variable) pairs whose variable holds this node's rank count, in the order they are read."""

_SLURM_TASK_MARKERS = ("SLURM_STEP_ID", "SLURM_LOCALID")
_TASKS_ENTRY = re.compile(r"(\d+)(?:\(x(\d+)\))?")


class NodeRanks(NamedTuple):
    """This node's rank count and where it was read.

    Attributes:
        count: ranks of the job on this node.
        launcher: the launcher recognised (``"torchrun"``, ``"Slurm"``, ``"Open MPI"``, ...).
        source: the variables read, as ``NAME=value`` (for messages).
    """

    count: int
    launcher: str
    source: str


def _count(name: str, raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r}: not an integer") from None
    if value < 1:
        raise ConfigError(f"{name}={raw!r}: a node runs at least one rank")
    return value


def slurm_tasks_per_node(name: str, raw: str) -> list[int]:
    """Expand Slurm's tasks-per-node list, ``"2(x3),1"`` -> ``[2, 2, 2, 1]``.

    Raises:
        ConfigError: ``raw`` is not such a list (named with ``name``).
    """
    counts: list[int] = []
    for entry in raw.split(","):
        match = _TASKS_ENTRY.fullmatch(entry.strip())
        if match is None:
            raise ConfigError(f"{name}={raw!r}: expected counts like '2(x3),1' (entry {entry!r})")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def _slurm(env: Mapping[str, str]) -> NodeRanks | None:
    if not any(env.get(marker, "").strip() for marker in _SLURM_TASK_MARKERS):
        return None
    for name in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        raw = env.get(name, "").strip()
        if not raw:
            continue
        counts = slurm_tasks_per_node(name, raw)
        node_raw = env.get("SLURM_NODEID", "0").strip() or "0"
        try:
            node = int(node_raw)
        except ValueError:
            raise ConfigError(f"SLURM_NODEID={node_raw!r}: not an integer") from None
        if not 0 <= node < len(counts):
            raise ConfigError(f"SLURM_NODEID={node} is not a place in {name}={raw!r} ({len(counts)} nodes)")
        return NodeRanks(counts[node], "Slurm", f"{name}={raw} at SLURM_NODEID={node}")
    raw = env.get("SLURM_NTASKS_PER_NODE", "").strip()
    if raw:
        return NodeRanks(_count("SLURM_NTASKS_PER_NODE", raw), "Slurm", f"SLURM_NTASKS_PER_NODE={raw}")
    return None


def node_ranks(env: Mapping[str, str]) -> NodeRanks | None:
    """This node's rank count as its launcher says it (the table above); None when no launcher is recognised.

    Raises:
        ConfigError: the variable that decides is not a positive integer (or list of them), naming it.
    """
    for launcher, name in LOCAL_SIZE_VARIABLES:
        raw = env.get(name, "").strip()
        if raw:
            return NodeRanks(_count(name, raw), launcher, f"{name}={raw}")
    return _slurm(env)


__all__ = ["LOCAL_SIZE_VARIABLES", "NodeRanks", "node_ranks", "slurm_tasks_per_node"]
