"""torchrun worker: stream a dataset, checkpoint the loader with DCP, resume.

``--mode save``: run until the largest ``--save-steps`` step, saving
``{"dataloader": loader}`` with torch.distributed.checkpoint after each listed
step into ``--ckpt/step<k>``; then keep the pipeline busy for a few steps and
end the process abruptly (``os._exit``), as a killed job would.

``--mode resume``: for each listed step, load ``--ckpt/step<k>`` into the
loader (at this world size) and read ``--steps`` more steps.

Each rank writes ``--out/<tag>_rank<r>.npz`` per phase: ``positions``
``[steps, rows]``, ``input`` and ``labels`` ``[steps, rows, seq_len]``.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from zephon_stream import StreamingLoader


def dump(out: Path, tag: str, rank: int, batches: list[dict]) -> None:
    np.savez(
        out / f"{tag}_rank{rank}.npz",
        positions=np.stack([b["sample_positions"].numpy() for b in batches]),
        input=np.stack([b["input"].numpy() for b in batches]),
        labels=np.stack([b["labels"].numpy() for b in batches]),
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("save", "resume"), required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--seq-len", type=int, required=True)
    parser.add_argument("--global-batch", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save-steps", type=int, nargs="+", required=True)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--ckpt", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    out = Path(args.out)
    loader = StreamingLoader(
        args.data,
        seq_len=args.seq_len,
        local_batch_size=args.global_batch // world,
        seed=args.seed,
        num_fetch_threads=2,
    )
    assert (loader.rank, loader.world_size) == (rank, world)
    if args.mode == "save":
        batches = []
        for step in range(1, max(args.save_steps) + 1):
            batches.append(next(loader))
            if step in args.save_steps:
                dcp.save({"dataloader": loader}, checkpoint_id=os.path.join(args.ckpt, f"step{step}"))
        dump(out, f"save_w{world}", rank, batches)
        for _ in range(3):
            next(loader)
        dist.barrier()
        # No close(), no process-group teardown: the job dies with its
        # prefetch threads running, like a killed job.
        os._exit(0)
    for step in args.save_steps:
        dcp.load({"dataloader": loader}, checkpoint_id=os.path.join(args.ckpt, f"step{step}"))
        assert loader.state_dict()["position"] == step * args.global_batch
        dump(out, f"resume_w{world}_from{step}", rank, [next(loader) for _ in range(args.steps)])
    loader.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
