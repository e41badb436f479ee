"""One rank of the demo training job: ``torchrun ... -m zephon_stream.demo.train``.

Every rank streams its slice of each global batch from the dataset, trains a
replica of the tiny transformer under DDP (gloo, CPU) and checkpoints model,
optimizer and loader state together with torch.distributed.checkpoint. On
start it resumes from the newest complete checkpoint in ``--ckpt-dir``, at
whatever world size it is launched with.

Rank 0 appends one JSON object a line to ``--events``: a ``start`` event, one
``step`` event per step (loss, timing, a hash of the whole global batch, the
loader's counters summed over ranks) and a ``checkpoint`` event once a
checkpoint is complete on every rank. Steps count from 0, as the loader's
``step``, its audit log and ``zephon-stream which --step`` count them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import sys
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from zephon_stream import StreamingLoader
from zephon_stream.demo.model import ModelConfig, TinyTransformer

CHECKPOINT_PREFIX = "step-"
# DCP's coordinator writes `.metadata` after every rank has written its
# data, so its presence marks a checkpoint a kill cannot have left half-done.
CHECKPOINT_COMPLETE = ".metadata"


# How long a held worker (--hold-after) waits to be killed.
_HOLD_LIMIT_S = 600


def checkpoint_dir(root: pathlib.Path, steps_done: int) -> pathlib.Path:
    """Folder of the checkpoint taken once ``steps_done`` steps are trained (steps 0 to steps_done - 1)."""
    return root / f"{CHECKPOINT_PREFIX}{steps_done:08d}"


def latest_checkpoint(root: pathlib.Path) -> tuple[int, pathlib.Path] | None:
    """``(steps_done, folder)`` of the newest complete checkpoint under ``root``, if any."""
    found = []
    for path in root.glob(f"{CHECKPOINT_PREFIX}*"):
        if (path / CHECKPOINT_COMPLETE).exists():
            found.append((int(path.name[len(CHECKPOINT_PREFIX) :]), path))
    return max(found) if found else None


def save_checkpoint(
    path: pathlib.Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    loader: StreamingLoader,
    *,
    steps_done: int,
) -> None:
    """Save model, optimizer, loader state and steps done with torch.distributed.checkpoint (all ranks)."""
    # Imported here so a run that never checkpoints does not pay for it at start-up.
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state, "loader": loader, "progress": {"steps_done": steps_done}}
    dcp.save(state, checkpoint_id=str(path))


def load_checkpoint(
    path: pathlib.Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, loader: StreamingLoader
) -> int:
    """Load a checkpoint saved at any world size into this rank; return its steps done."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state, "loader": loader, "progress": {"steps_done": -1}}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return int(state["progress"]["steps_done"])


def batch_hash(inputs: torch.Tensor, labels: torch.Tensor) -> str:
    """sha256 (first 16 hex digits) of a global batch's input and label tokens."""
    digest = hashlib.sha256()
    digest.update(inputs.contiguous().numpy().tobytes())
    digest.update(labels.contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


# Values every rank holds alike (the global cursor), not per-rank counts.
_SHARED_KEYS = frozenset({"position"})


def sum_counters(per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    """Sum each rank's numeric counters; keep rank 0's shared and other values."""
    total: dict[str, Any] = {}
    for counters in per_rank:
        for key, value in counters.items():
            if key not in _SHARED_KEYS and isinstance(value, (int, float)) and not isinstance(value, bool):
                total[key] = total.get(key, 0) + value
            else:
                total.setdefault(key, value)
    return total


def resume_point(loader: StreamingLoader) -> dict[str, Any]:
    """Where in the dataset the next step starts: shard, block and sample of its first
    sample, and how many of its samples start inside a block rather than at its head."""
    order = loader.schedule or loader.order
    seq_len = loader.seq_len
    if loader.schedule is not None:
        phase = loader.schedule.phase_at_position(loader.position)
        positions = np.arange(loader.position, loader.position + phase.global_batch)
        seq_len = phase.spec.seq_len
    else:
        positions = np.arange(loader.position, loader.position + loader.global_batch_size)
    streams, blocks, samples = order.sample_at(positions)
    manifest = loader.manifests[int(streams[0])][1].manifest
    shard, block_in_shard = manifest.block_location(int(blocks[0]))
    return {
        "position": loader.position,
        "shard": manifest.shards[shard].path,
        "block_in_shard": block_in_shard,
        "blocks_in_shard": manifest.shards[shard].num_blocks,
        "sample_in_block": int(samples[0]),
        "samples_in_block": (manifest.block_num_tokens(int(blocks[0])) - 1) // seq_len,
        "mid_block_samples": int((samples > 0).sum()),
        "batch_samples": len(positions),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m zephon_stream.demo.train")
    parser.add_argument("--data", required=True, nargs="+", help="dataset URL(s) (local folder or s3://)")
    parser.add_argument("--schedule", help="JSON list of the loader's phases (then --seq-len is the first phase's)")
    parser.add_argument("--events", required=True, type=pathlib.Path, help="JSON-lines event log (rank 0 appends)")
    parser.add_argument("--ckpt-dir", required=True, type=pathlib.Path)
    parser.add_argument("--pid-dir", type=pathlib.Path, help="each rank writes rank-R.pid here")
    parser.add_argument("--steps", type=int, required=True, help="steps to train: steps 0 to N-1 (steps count from 0)")
    parser.add_argument("--ckpt-every", type=int, default=0, help="checkpoint every N steps (0: never)")
    parser.add_argument(
        "--hold-after",
        type=int,
        default=0,
        help="once this many steps are done, stop and wait to be killed (the demo's crash point; 0: never)",
    )
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--global-batch", type=int, default=12)
    parser.add_argument("--vocab-size", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--packing", default="concat", help="the loader's packing: concat or best_fit")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    return parser.parse_args(argv)


class _Log:
    """Rank 0's JSON-lines log; a no-op on other ranks."""

    def __init__(self, path: pathlib.Path, enabled: bool) -> None:
        self._file = open(path, "a", encoding="utf-8") if enabled else None

    def write(self, **record: Any) -> None:
        if self._file is not None:
            self._file.write(json.dumps({**record, "time": time.time()}, default=str) + "\n")
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


def build_loader(args: argparse.Namespace, rank: int, world_size: int) -> StreamingLoader:
    """This rank's loader, as the job's arguments describe it (its schedule or one phase, its packing)."""
    if args.schedule:
        return StreamingLoader(
            args.data,
            schedule=json.loads(args.schedule),
            rank=rank,
            world_size=world_size,
            seed=args.seed,
            packing=args.packing,
        )
    return StreamingLoader(
        args.data[0],
        seq_len=args.seq_len,
        local_batch_size=args.global_batch // world_size,
        rank=rank,
        world_size=world_size,
        seed=args.seed,
        packing=args.packing,
    )


def train(args: argparse.Namespace) -> None:
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if args.global_batch % world_size:
        raise ValueError(f"--global-batch {args.global_batch} is not divisible by world size {world_size}")
    # One thread per rank: a tiny model gains little from more, and on a
    # busy machine spinning OpenMP threads make a step many times slower.
    torch.set_num_threads(1)
    if args.pid_dir is not None:
        args.pid_dir.mkdir(parents=True, exist_ok=True)
        (args.pid_dir / f"rank-{rank}.pid").write_text(str(os.getpid()))

    schedule = json.loads(args.schedule) if args.schedule else None
    max_seq_len = max(p["seq_len"] for p in schedule) if schedule else args.seq_len
    torch.manual_seed(args.seed)
    model = TinyTransformer(
        ModelConfig(
            vocab_size=args.vocab_size,
            dim=args.dim,
            num_layers=args.layers,
            num_heads=args.heads,
            max_seq_len=max_seq_len,
        )
    )
    ddp_model = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    loader = build_loader(args, rank, world_size)
    log = _Log(args.events, enabled=rank == 0)

    # A checkpoint of N steps done resumes at step N (steps count from 0).
    start_step = 0
    found = latest_checkpoint(args.ckpt_dir)
    if found is not None:
        start_step, path = found
        loaded = load_checkpoint(path, ddp_model, optimizer, loader)
        assert loaded == start_step, (loaded, start_step)
    log.write(
        event="start",
        world_size=world_size,
        start_step=start_step,
        resumed=found is not None,
        packing=loader.state_dict()["packing"],
    )

    batches = iter(loader)
    last = time.perf_counter()
    for step in range(start_step, args.steps):
        # The event's step is the loader's, so `zephon-stream which --step` finds it.
        assert loader.step == step, (loader.step, step)
        phase = loader.phase
        batch = next(batches)
        tokens_per_step = loader.global_batch_size * loader.seq_len
        loss = next_token_loss(ddp_model, batch["input"], batch["labels"])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

        gathered = _gather_batch(batch["input"], batch["labels"], world_size)
        loss = loss.detach()
        dist.all_reduce(loss)
        counters: list[Any] = [None] * world_size
        dist.all_gather_object(counters, loader.stats())
        now = time.perf_counter()
        step_s, last = now - last, now
        if rank == 0:
            log.write(
                event="step",
                step=step,
                phase=phase,
                world_size=world_size,
                loss=loss.item() / world_size,
                step_s=step_s,
                tokens_per_s=tokens_per_step / step_s,
                hash=batch_hash(*gathered),
                loader=sum_counters(counters),
                state=loader.state_dict(),
                progress=loader.progress(),
            )
        steps_done = step + 1
        if args.ckpt_every and steps_done % args.ckpt_every == 0:
            save_checkpoint(
                checkpoint_dir(args.ckpt_dir, steps_done), ddp_model, optimizer, loader, steps_done=steps_done
            )
            dist.barrier()
            log.write(
                event="checkpoint",
                step=step,
                steps_done=steps_done,
                world_size=world_size,
                resume_at=resume_point(loader),
            )
            last = time.perf_counter()
        if steps_done == args.hold_after:
            # The demo kills the job here, between checkpoints, as a
            # crash would; holding makes the crash point exact however fast
            # the steps run. The bound ends a job whose killer went away.
            log.write(event="holding", step=step, world_size=world_size)
            time.sleep(_HOLD_LIMIT_S)
            raise SystemExit(f"held after step {step} for {_HOLD_LIMIT_S} s and was not killed")
    log.write(event="done", steps_done=args.steps, world_size=world_size)
    loader.close()
    log.close()
    dist.destroy_process_group()


def next_token_loss(model: torch.nn.Module, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy of ``model`` (called through DDP so gradients sync)."""
    logits = model(inputs)
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())


def _gather_batch(inputs: torch.Tensor, labels: torch.Tensor, world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    # Rank r holds piece r of the global batch in (lane, q) order, so the
    # rank-order concatenation is the global batch whatever the world size.
    out = []
    for local in (inputs, labels):
        parts = [torch.empty_like(local) for _ in range(world_size)]
        dist.all_gather(parts, local.contiguous())
        out.append(torch.cat(parts))
    return out[0], out[1]


def main(argv: list[str] | None = None) -> int:
    train(parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
