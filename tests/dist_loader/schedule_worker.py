"""torchrun worker: a scheduled run checkpointed with DCP, killed, and resumed.

``--mode save``: read ``--save-step`` steps, save ``{"dataloader": loader}``
with torch.distributed.checkpoint into ``--ckpt``, read a few more steps and
end the process abruptly (``os._exit``), as a killed job would.

``--mode resume``: load ``--ckpt`` at this world size and read ``--steps``
more steps (they may cross phase boundaries, where the batch's shape changes).

Each rank writes ``--out/<mode>_w<world>_rank<r>.npz`` with, per step ``k``,
``positions_k``, ``input_k`` and ``labels_k``.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from zephon_stream import StreamingLoader


def dump(path: Path, batches: list[dict]) -> None:
    arrays = {}
    for k, batch in enumerate(batches):
        arrays[f"positions_{k}"] = batch["sample_positions"].numpy()
        arrays[f"input_{k}"] = batch["input"].numpy()
        arrays[f"labels_{k}"] = batch["labels"].numpy()
    np.savez(path, steps=len(batches), **arrays)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("save", "resume"), required=True)
    parser.add_argument("--data", nargs="+", required=True)
    parser.add_argument("--schedule", required=True, help="JSON list of phases")
    parser.add_argument("--save-step", type=int, required=True)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--ckpt", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    loader = StreamingLoader(args.data, schedule=json.loads(args.schedule), num_fetch_threads=2)
    path = Path(args.out) / f"{args.mode}_w{world}_rank{rank}.npz"
    if args.mode == "save":
        batches = [next(loader) for _ in range(args.save_step)]
        dcp.save({"dataloader": loader}, checkpoint_id=args.ckpt)
        dump(path, batches)
        for _ in range(3):
            next(loader)
        dist.barrier()
        # No close(), no process-group teardown: the job dies with its
        # helper running, like a killed job.
        os._exit(0)
    dcp.load({"dataloader": loader}, checkpoint_id=args.ckpt)
    assert loader.step == args.save_step, (loader.step, args.save_step)
    dump(path, [next(loader) for _ in range(args.steps)])
    loader.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
