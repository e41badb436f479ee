r"""Train under TorchElastic: every start goes on from the newest complete checkpoint, at its world size.

    zephon-stream write 'zephon_stream/**/*.py' --output ./out/ds --tokenizer bytes
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --standalone --nproc-per-node=2 --max-restarts=3 \
        examples/torchelastic/train.py --data ./out/ds --ckpt-dir ./out/elastic --steps 40

torchrun starts this script again after a failure or when nodes leave or join; each start loads
model, optimizer and loader from the newest complete checkpoint, whatever world size this round of
the rendezvous gave it (the global batch must divide by it), and trains the samples that come next.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pathlib
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful
from torch.nn.parallel import DistributedDataParallel

from zephon_stream import StreamingLoader

CHECKPOINT_PREFIX = "step-"


class ModelAndOptimizer(Stateful):
    """The model's and the optimizer's states, as torch.distributed.checkpoint saves and loads them.

    get_state_dict keys the optimizer's state by parameter name and creates it when no step has run
    yet, so dcp.load has tensors to fill; set_state_dict puts both back. A plain
    optimizer.state_dict() is empty before the first step, and dcp.load then restores no optimizer
    state at all, without a word.
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict:
        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        return {"model": model_state, "optim": optim_state}

    def load_state_dict(self, state: dict) -> None:
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


def newest_complete_checkpoint(root: pathlib.Path) -> pathlib.Path | None:
    """The newest ``step-N`` folder that holds ``.metadata``, which DCP writes once every rank has saved."""
    complete = [path for path in root.glob(CHECKPOINT_PREFIX + "*") if (path / ".metadata").exists()]
    return max(complete, key=lambda path: int(path.name[len(CHECKPOINT_PREFIX) :]), default=None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="dataset root (local folder or s3://...)")
    parser.add_argument("--ckpt-dir", required=True, type=pathlib.Path, help="where step-N checkpoints go")
    parser.add_argument("--steps", type=int, required=True, help="train until this many global steps are done")
    parser.add_argument("--ckpt-every", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--global-batch", type=int, default=4, help="fixed; every world size must divide it")
    parser.add_argument("--record", type=pathlib.Path, help="rank 0 appends each step's losses and rows as JSON here")
    parser.add_argument(
        "--timeout-s",
        type=float,
        default=600.0,
        help="how long a collective waits for a peer: a node cut off is noticed after this",
    )
    args = parser.parse_args()

    # gloo's default is 30 minutes: the survivors of a node whose link was cut would wait that long.
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout_s))  # "nccl" on GPUs
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    loader = StreamingLoader(args.data, seq_len=args.seq_len, local_batch_size=args.global_batch // world, seed=0)
    vocab_size = loader.manifests[0][1].tokenizer.vocab_size
    model = torch.nn.Sequential(torch.nn.Embedding(vocab_size, 32), torch.nn.Linear(32, vocab_size))
    model = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    # The loader is a Stateful too: its state is the global cursor, the same on every rank.
    state = {"train": ModelAndOptimizer(model, optimizer), "dataloader": loader}
    args.ckpt_dir.mkdir(parents=True, exist_ok=True)
    newest = newest_complete_checkpoint(args.ckpt_dir)
    if newest is not None:
        dcp.load(state, checkpoint_id=str(newest))  # saved at any world size
    if rank == 0:
        print(f"world size {world}: step {loader.step} from {newest or 'scratch'}", flush=True)

    for step in range(loader.step, args.steps):
        batch = next(loader)
        logits = model(batch["input"])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if args.record is not None:
            # Each row's global sample position and a digest of its tokens, from every rank.
            rows = {
                int(p): hashlib.sha256(row.numpy().tobytes()).hexdigest()[:16]
                for p, row in zip(batch["sample_positions"], batch["input"])
            }
            gathered = [None] * world
            dist.all_gather_object(gathered, (rows, loss.item()))
            if rank == 0:
                record = {
                    "step": step,
                    "world_size": world,
                    "losses": [value for _, value in gathered],
                    "rows": {p: h for r, _ in gathered for p, h in r.items()},
                }
                with args.record.open("a") as log:
                    log.write(json.dumps(record) + "\n")
        if (step + 1) % args.ckpt_every == 0:
            dcp.save(state, checkpoint_id=str(args.ckpt_dir / f"{CHECKPOINT_PREFIX}{step + 1:08d}"))
            if rank == 0:
                print(f"step {step + 1}: loss {loss.item():.4f}, checkpoint saved", flush=True)
    loader.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
