"""A rank started without torchrun (as srun or mpirun start them): it opens the dataset with the default node
cache, takes its first batch, writes what it got, and closes only once every rank has its batch, so that the
ranks of a node are open together (the last one of a node to close removes the node's cache).

    python node_reader.py URL RANK WORLD_SIZE OUT_DIR
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

from zephon_stream import StreamingLoader

WAIT_S = 120


def main() -> None:
    url, rank, world, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
    # On threads: the node cache is shared the same way by a helper process, at twice the processes.
    with StreamingLoader(
        url, seq_len=32, local_batch_size=2, rank=rank, world_size=world, seed=0, pipeline="threads"
    ) as loader:
        batch = next(loader)
        cache = loader._node_cache
        record = {
            "rank": rank,
            "sha256": hashlib.sha256(batch["input"].numpy().tobytes()).hexdigest(),
            "positions": [int(p) for p in batch["sample_positions"]],
            "node_cache": None if cache is None else cache.root,
        }
        (out / f"rank{rank}.json").write_text(json.dumps(record))
        deadline = time.monotonic() + WAIT_S
        while len(list(out.glob("rank*.json"))) < world and time.monotonic() < deadline:
            time.sleep(0.05)


if __name__ == "__main__":
    main()
