"""Ranks started without torchrun share their node's one read of the dataset's metadata, counted at the store.

Three nodes of a box (tools/cluster_box.py), two rank processes each, started
as plain processes with the variables their launcher sets: Slurm's ``srun``
on node 0, Open MPI's ``mpirun`` on node 1, none on node 2. The store's proxy
counts each node's GETs by its address: nodes 0 and 1 read each metadata
object once (their ranks share the node cache in the node's /dev/shm), node 2
once a rank. Every rank's first batch is the one a single process reads for
that rank, and no node keeps anything in /tmp or /dev/shm afterwards.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

from cluster_helpers import needs_box
from tools.cluster_box import Box
from zephon_stream import StreamingLoader
from zephon_stream.storage.copy import copy_dataset

READER = Path(__file__).parent / "dist_cluster" / "node_reader.py"
RANKS_PER_NODE = 2
LAUNCHERS = [
    lambda local, rank, world: {
        "SLURM_JOB_ID": "7",
        "SLURM_STEP_ID": "0",
        "SLURM_NODEID": "0",
        "SLURM_LOCALID": str(local),
        "SLURM_PROCID": str(rank),
        "SLURM_NTASKS": str(world),
        "SLURM_STEP_TASKS_PER_NODE": f"{RANKS_PER_NODE}(x2)",
    },
    lambda local, rank, world: {
        "OMPI_COMM_WORLD_LOCAL_SIZE": str(RANKS_PER_NODE),
        "OMPI_COMM_WORLD_LOCAL_RANK": str(local),
        "OMPI_COMM_WORLD_RANK": str(rank),
    },
    lambda local, rank, world: {},
]


@needs_box
def test_ranks_started_by_srun_or_mpirun_read_the_metadata_once_a_node(small_dataset, tmp_path) -> None:
    world = RANKS_PER_NODE * len(LAUNCHERS)
    with Box(len(LAUNCHERS)) as box:
        copy_dataset(small_dataset.url, "s3://data/ds", dst_options=box.store.direct_options())
        out = box.shared / "out"
        out.mkdir()
        procs = []
        for node, launcher in enumerate(LAUNCHERS):
            for local in range(RANKS_PER_NODE):
                rank = node * RANKS_PER_NODE + local
                argv = [sys.executable, str(READER), "s3://data/ds", str(rank), str(world), str(out)]
                procs.append(
                    box.run(
                        node,
                        argv,
                        env=launcher(local, rank, world),
                        stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT,
                        text=True,
                    )
                )
        outputs = [proc.communicate(timeout=180)[0] for proc in procs]
        assert [proc.returncode for proc in procs] == [0] * world, outputs
        got = {r["rank"]: r for r in (json.loads(p.read_text()) for p in out.glob("rank*.json"))}
        requests = box.store.requests()
        nodes = [node.address for node in box.nodes]
        leftovers = [box.leftovers(node) for node in range(len(LAUNCHERS))]

    assert [got[r]["node_cache"] is not None for r in range(world)] == [True] * 4 + [False] * 2
    metadata = {}
    for request in requests:
        if request.method == "GET" and request.status in (200, 206) and "/shards/" not in request.key:
            per_node = metadata.setdefault(request.client, {})
            read = (request.key, request.byte_range)
            per_node[read] = per_node.get(read, 0) + 1
    assert set(metadata) == set(nodes) and metadata[nodes[0]], metadata
    # The same objects and ranges on every node: once on the recognised nodes, once a rank on the other.
    assert metadata[nodes[0]] == metadata[nodes[1]] == dict.fromkeys(metadata[nodes[0]], 1)
    assert metadata[nodes[2]] == dict.fromkeys(metadata[nodes[0]], RANKS_PER_NODE)
    assert leftovers == [[], [], []]
    for rank in range(world):
        with StreamingLoader(
            small_dataset.url,
            seq_len=32,
            local_batch_size=2,
            rank=rank,
            world_size=world,
            seed=0,
            pipeline="threads",
            node_cache=False,
        ) as alone:
            batch = next(alone)
        assert got[rank]["sha256"] == hashlib.sha256(batch["input"].numpy().tobytes()).hexdigest()
