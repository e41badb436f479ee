"""Resume at another world size, each peer as ranks under torchrun (gloo): what happens to the batches.

bench_peers.py runs ``peer_resume(lib, data, ...)``: global batches of W=1
for ``2 * steps`` against W=2 for ``steps``, whose state then resumes W=3
for ``steps`` more; each global batch is compared with W=1's, in order and
as a set. Each rank runs this module (``python -m benchmarks.peer_resume``,
from the repository root).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import sys
from typing import Any

import numpy as np

from benchmarks.peer_passes import import_mosaic

REPO = pathlib.Path(__file__).resolve().parent.parent


def resume_worker(args: argparse.Namespace) -> None:
    """One rank: read ``--steps`` global batches with a peer, from a saved state if given.

    Rank 0 writes the per-step global batch (each sample's sha256, rank order)
    and, after the ``first`` phase, the peer's state, pickled.
    """
    import pickle

    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    local_batch = args.global_batch // world_size
    state = None
    if args.state_in:
        with open(args.state_in, "rb") as f:
            state = pickle.load(f)
    if args.lib == "mosaic":
        base = import_mosaic()
        dataset = base.StreamingDataset(local=args.data, shuffle=True, batch_size=local_batch, num_canonical_nodes=1)
        if state is not None:
            dataset.load_state_dict(state)
        items = iter(dataset)

        def next_batch() -> list[np.ndarray]:
            return [next(items)["tokens"] for _ in range(local_batch)]

    else:
        from litdata import StreamingDataLoader, StreamingDataset, TokensLoader

        dataset = StreamingDataset(args.data, item_loader=TokensLoader(block_size=args.seq_len + 1), shuffle=True)
        loader = StreamingDataLoader(dataset, batch_size=local_batch, num_workers=0)
        if state is not None:
            loader.load_state_dict(state)
        batches = iter(loader)

        def next_batch() -> list[np.ndarray]:
            return [row.numpy().astype(np.uint16) for row in next(batches)]

    steps = []
    for _ in range(args.steps):
        local = [hashlib.sha256(np.ascontiguousarray(row).tobytes()).hexdigest()[:16] for row in next_batch()]
        gathered: list[Any] = [None] * world_size
        dist.all_gather_object(gathered, local)
        steps.append([h for part in gathered for h in part])
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(steps, f)
        if args.state_out:
            if args.lib == "mosaic":
                saved = dataset.state_dict(num_samples=args.steps * args.global_batch, from_beginning=False)
            else:
                saved = loader.state_dict()
            with open(args.state_out, "wb") as f:
                pickle.dump(saved, f)
    dist.barrier()
    dist.destroy_process_group()


def peer_resume(lib: str, data: str, seq_len: int, work: pathlib.Path, steps: int = 10) -> str:
    """W=1 for ``2 * steps`` against W=2 for ``steps`` then W=3 from its state: what happens."""
    import subprocess

    def launch(world_size: int, count: int, name: str, state_in: str = "", state_out: str = "") -> list[list[str]]:
        out = work / f"{lib}-{name}.json"
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world_size}",
                   "--module", "benchmarks.peer_resume", "--resume-worker", lib, "--data", data,
                   "--steps", str(count), "--seq-len", str(seq_len),
                   "--out", str(out), "--state-in", state_in, "--state-out", state_out]  # fmt: skip
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=600, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}
        )
        if done.returncode != 0:
            errors = [line for line in done.stdout.splitlines() + done.stderr.splitlines() if "Error" in line]
            raise RuntimeError(f"W={world_size} {name}: " + (errors[-1] if errors else f"exit {done.returncode}")[:300])
        return json.loads(out.read_text())

    state = str(work / f"{lib}-state.pkl")
    want = launch(1, 2 * steps, "reference")
    got = launch(2, steps, "first", state_out=state)
    try:
        got += launch(3, steps, "second", state_in=state)
    except RuntimeError as exc:
        return f"resume at W=3 from a W=2 state failed: {exc}"
    identical = sum(a == b for a, b in zip(got, want))
    same_set = sum(sorted(a) == sorted(b) for a, b in zip(got, want))
    flat = [h for batch in got for h in batch]
    repeats = len(flat) - len(set(flat))
    reference = [h for batch in want for h in batch]
    missing = len(set(reference) - set(flat))
    return (
        f"{identical}/{len(want)} global batches identical to W=1 in order, {same_set}/{len(want)} with the same "
        f"samples; {repeats} repeated samples (W=1: {len(reference) - len(set(reference))}), "
        f"{missing} of W=1's samples never read"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--resume-worker", choices=("mosaic", "litdata"), required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--seq-len", type=int, required=True)
    parser.add_argument("--global-batch", type=int, default=6)
    parser.add_argument("--out", required=True)
    parser.add_argument("--state-in", default="")
    parser.add_argument("--state-out", default="")
    args = parser.parse_args()
    args.lib = args.resume_worker
    resume_worker(args)


if __name__ == "__main__":
    sys.exit(main())
