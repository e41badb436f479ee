"""torchrun worker of the TorchElastic tests (gloo, CPU): train the demo's tiny
transformer under DDP and resume from the newest DCP checkpoint on every start.

``torchrun --max-restarts=N`` (and a membership change) starts the same command
again; the worker then finds the newest complete checkpoint in ``--ckpt-dir``
and loads model, optimizer and loader from it, at whatever world size this
round of the rendezvous gave it. The checkpoint is
``{"model", "optim", "loader", "progress"}`` through
``zephon_stream.demo.train.save_checkpoint`` (the loader is a torch Stateful).

Rank 0 appends one JSON object a line to ``--events``: ``start`` (world size,
restart count, the step it starts at), one ``step`` per step (the sorted global
sample positions, ``union_sha256`` of every rank's rows, the loss), ``checkpoint``
once a checkpoint is complete, ``holding`` and ``done``.

``--hold-after K``: once K steps are done, stop and wait (to be killed, or for
the agent to restart the group) -- once per K for the whole job: a marker file in
``--ckpt-dir`` keeps a restarted group from holding at K again. Holding makes the
point where a test kills or grows the job exact however fast the steps run.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from zephon_stream import StreamingLoader
from zephon_stream.demo.model import ModelConfig, TinyTransformer
from zephon_stream.demo.train import (
    checkpoint_dir,
    latest_checkpoint,
    load_checkpoint,
    next_token_loss,
    save_checkpoint,
)
from zephon_stream.loader.front.audit import union_sha256

# A held worker whose killer went away ends by itself.
HOLD_LIMIT_S = 120


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--events", required=True, type=pathlib.Path)
    parser.add_argument("--ckpt-dir", required=True, type=pathlib.Path)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--ckpt-every", type=int, required=True)
    parser.add_argument("--hold-after", type=int, nargs="*", default=[])
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--global-batch", type=int, default=6)
    parser.add_argument("--vocab-size", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    model = TinyTransformer(
        ModelConfig(vocab_size=args.vocab_size, dim=16, num_layers=1, num_heads=2, max_seq_len=args.seq_len)
    )
    ddp_model = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    loader = StreamingLoader(
        args.data,
        seq_len=args.seq_len,
        local_batch_size=args.global_batch // world,
        rank=rank,
        world_size=world,
        seed=args.seed,
        num_fetch_threads=1,
    )
    args.ckpt_dir.mkdir(parents=True, exist_ok=True)
    events = open(args.events, "a", encoding="utf-8") if rank == 0 else None

    def log(**record) -> None:
        if events is not None:
            events.write(json.dumps({**record, "pid": os.getpid(), "time": time.time()}) + "\n")
            events.flush()

    start_step = 0
    found = latest_checkpoint(args.ckpt_dir)
    if found is not None:
        start_step, path = found
        assert load_checkpoint(path, ddp_model, optimizer, loader) == start_step
    log(
        event="start",
        world_size=world,
        start_step=start_step,
        restart_count=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
    )

    for step in range(start_step, args.steps):
        batch = next(loader)
        loss = next_token_loss(ddp_model, batch["input"], batch["labels"])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        rows = (batch["sample_positions"].numpy(), batch["input"].numpy(), batch["labels"].numpy())
        gathered = [None] * world
        dist.all_gather_object(gathered, rows)
        loss = loss.detach()
        dist.all_reduce(loss)
        positions = sorted(int(p) for r in gathered for p in r[0])
        log(
            event="step",
            step=step,
            world_size=world,
            positions=positions,
            hash=union_sha256(gathered),
            loss=loss.item() / world,
        )
        steps_done = step + 1
        if steps_done % args.ckpt_every == 0:
            save_checkpoint(
                checkpoint_dir(args.ckpt_dir, steps_done), ddp_model, optimizer, loader, steps_done=steps_done
            )
            dist.barrier()
            log(event="checkpoint", steps_done=steps_done, world_size=world)
        if steps_done in args.hold_after:
            marker = args.ckpt_dir / f"held-{steps_done}"
            held = marker.exists()
            dist.barrier()
            if not held:
                if rank == 0:
                    marker.touch()
                log(event="holding", steps_done=steps_done, world_size=world)
                # A held group keeps talking, as training would: a peer
                # that dies makes the next barrier fail, and the agent restarts.
                until = time.monotonic() + HOLD_LIMIT_S
                while time.monotonic() < until:
                    dist.barrier()
                    time.sleep(0.2)
                raise SystemExit(f"held after {steps_done} steps for {HOLD_LIMIT_S} s and was not stopped")
    log(event="done", world_size=world)
    loader.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
