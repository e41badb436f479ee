"""A node is recognised however its ranks were started (torchrun, Slurm's srun, mpirun), so that they share
the node cache and its limiter (storage/node_ranks.py, storage/node_cache.py).

The launchers' variables are checked one by one here; the real thing, processes
started without torchrun on nodes of a box reading a dataset's metadata once a
node, is in tests/test_cluster_nodes.py.
"""

from __future__ import annotations

import os

import pytest

from zephon_stream.errors import ConfigError
from zephon_stream.storage.node_cache import node_cache_root
from zephon_stream.storage.node_ranks import node_ranks, slurm_tasks_per_node

SHARED = os.path.join("/dev/shm" if os.path.isdir("/dev/shm") else "", f"zephon-node-cache-{os.getuid()}")

# What each launcher sets in a rank's environment on the second of three nodes (4 ranks a node).
LAUNCHED = {
    "torchrun": {"LOCAL_WORLD_SIZE": "4", "LOCAL_RANK": "1", "GROUP_RANK": "1"},
    "Open MPI": {"OMPI_COMM_WORLD_LOCAL_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_SIZE": "12"},
    "MPICH/Intel MPI": {"MPI_LOCALNRANKS": "4", "MPI_LOCALRANKID": "1", "PMI_RANK": "5", "PMI_SIZE": "12"},
    "MVAPICH2": {"MV2_COMM_WORLD_LOCAL_SIZE": "4", "MV2_COMM_WORLD_LOCAL_RANK": "1"},
    "Cray PMI": {"PMI_LOCAL_SIZE": "4", "PMI_LOCAL_RANK": "1", "PMI_RANK": "5", "PMI_SIZE": "12"},
    "PALS": {"PALS_LOCAL_SIZE": "4", "PALS_LOCAL_RANKID": "1", "PALS_RANKID": "5"},
    "Slurm": {
        "SLURM_JOB_ID": "77",
        "SLURM_STEP_ID": "0",
        "SLURM_LOCALID": "1",
        "SLURM_PROCID": "5",
        "SLURM_NODEID": "1",
        "SLURM_NTASKS": "12",
        "SLURM_STEP_TASKS_PER_NODE": "4(x3)",
        "SLURM_TASKS_PER_NODE": "4(x3)",
    },
}


@pytest.mark.parametrize("launcher", sorted(LAUNCHED))
def test_each_launcher_s_variables_give_the_node_s_rank_count_and_the_shared_folder(launcher: str) -> None:
    ranks = node_ranks(LAUNCHED[launcher])
    assert ranks is not None and (ranks.count, ranks.launcher) == (4, launcher)
    assert node_cache_root(LAUNCHED[launcher]) == SHARED


def test_without_a_launcher_or_with_one_rank_a_node_nothing_is_shared() -> None:
    assert node_ranks({}) is None and node_cache_root({}) is None
    assert node_cache_root({"LOCAL_WORLD_SIZE": "1"}) is None
    assert node_cache_root({"OMPI_COMM_WORLD_LOCAL_SIZE": "1"}) is None
    # A batch script's own environment holds the allocation, but no task srun started.
    assert node_ranks({"SLURM_JOB_ID": "77", "SLURM_TASKS_PER_NODE": "8(x2)", "SLURM_NODEID": "0"}) is None


def test_slurm_reads_this_node_s_place_in_the_step_s_tasks_per_node() -> None:
    env = {
        "SLURM_STEP_ID": "3",
        "SLURM_NODEID": "2",
        "SLURM_STEP_TASKS_PER_NODE": "3(x2),1",
        "SLURM_TASKS_PER_NODE": "8(x3)",
    }
    assert node_ranks(env).count == 1  # The step's own layout, not the allocation's
    assert node_ranks({**env, "SLURM_NODEID": "1"}).count == 3
    assert node_ranks({"SLURM_LOCALID": "0", "SLURM_NODEID": "1", "SLURM_TASKS_PER_NODE": "2,6"}).count == 6
    assert node_ranks({"SLURM_LOCALID": "0", "SLURM_NTASKS_PER_NODE": "8"}).count == 8
    assert slurm_tasks_per_node("X", "2(x3),1,4(x1)") == [2, 2, 2, 1, 4]


def test_a_launcher_inside_another_is_counted_by_the_one_that_started_the_ranks() -> None:
    # One srun task a node, each running torchrun with 8 ranks; mpirun inside a Slurm allocation.
    torchrun_under_srun = {**LAUNCHED["Slurm"], "SLURM_STEP_TASKS_PER_NODE": "1(x3)", "LOCAL_WORLD_SIZE": "8"}
    assert node_ranks(torchrun_under_srun)[:2] == (8, "torchrun")
    mpirun_in_allocation = {
        "SLURM_JOB_ID": "77",
        "SLURM_TASKS_PER_NODE": "16(x2)",
        "SLURM_NODEID": "0",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
    }
    assert node_ranks(mpirun_in_allocation)[:2] == (4, "Open MPI")
    assert node_cache_root({**LAUNCHED["Slurm"], "ZEPHON_NODE_CACHE": "/somewhere"}) == "/somewhere"


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"LOCAL_WORLD_SIZE": "eight"}, "LOCAL_WORLD_SIZE='eight': not an integer"),
        ({"OMPI_COMM_WORLD_LOCAL_SIZE": "0"}, "OMPI_COMM_WORLD_LOCAL_SIZE='0': a node runs at least one rank"),
        ({"SLURM_STEP_ID": "0", "SLURM_STEP_TASKS_PER_NODE": "4(x)"}, "SLURM_STEP_TASKS_PER_NODE='4(x)'"),
        (
            {"SLURM_STEP_ID": "0", "SLURM_NODEID": "3", "SLURM_STEP_TASKS_PER_NODE": "4(x2)"},
            "SLURM_NODEID=3 is not a place in SLURM_STEP_TASKS_PER_NODE='4(x2)' (2 nodes)",
        ),
    ],
)
def test_a_launcher_variable_that_is_not_a_count_is_refused_by_name(env: dict, named: str) -> None:
    with pytest.raises(ConfigError, match=named.replace("(", r"\(").replace(")", r"\)")):
        node_cache_root(env)
