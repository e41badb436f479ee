"""torchrun worker of the crash-resume scenario (gloo, CPU).

Streams ``--steps`` global steps, optionally after loading a checkpoint. After
each step rank 0 appends ``STEP HASH`` (the union of every rank's rows, see
``union_sha256``) to ``--hashes``, then every rank saves the loader with
torch.distributed.checkpoint into ``--ckpt-root/step<K>``; once all ranks have
saved, rank 0 writes ``COMMITTED`` into that folder. The scenario SIGKILLs the
job at a random step and resumes from the last committed checkpoint.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch.distributed as dist
import torch.distributed.checkpoint as dcp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.reliability.common import batch_rows  # noqa: E402
from zephon_stream import StreamingLoader  # noqa: E402
from zephon_stream.loader import union_sha256  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--seq-len", type=int, required=True)
    parser.add_argument("--global-batch", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--resume", default=None, help="checkpoint folder to load first")
    parser.add_argument("--ckpt-root", required=True)
    parser.add_argument("--hashes", required=True)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    loader = StreamingLoader(
        args.data,
        seq_len=args.seq_len,
        local_batch_size=args.global_batch // world,
        seed=args.seed,
        num_fetch_threads=2,
    )
    if args.resume:
        dcp.load({"dataloader": loader}, checkpoint_id=args.resume)
    out = open(args.hashes, "a") if rank == 0 else None
    for _ in range(args.steps):
        rows = batch_rows(next(loader))
        gathered = [None] * world
        dist.all_gather_object(gathered, rows)
        step = loader.position // args.global_batch
        if out is not None:
            out.write(f"{step - 1} {union_sha256(gathered)}\n")
            out.flush()
        folder = os.path.join(args.ckpt_root, f"step{step}")
        dcp.save({"dataloader": loader}, checkpoint_id=folder)
        dist.barrier()
        if rank == 0:
            Path(folder, "COMMITTED").write_text(str(step))
    loader.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
