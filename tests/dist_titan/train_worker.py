"""torchrun worker: train a tiny causal transformer on ZephonDataLoader batches.

Plain torch DDP over gloo on CPU (TorchTitan's trainer needs CUDA), with
TorchTitan's optimizer container, LR scheduler container and
``CheckpointManager`` saving the model, optimizer, scheduler, train state and
the dataloader every ``--save-step`` steps, as its trainer does.

``--resume`` loads the checkpoint of step ``--save-step`` first. Rank 0 writes
``--out``: ``{"losses": {step: global mean loss}}``.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from titan_setup import as_rows, build_checkpointer, init_gloo, trainer_keywords, write_json
from zephon_stream.integrations.torchtitan import ZephonDataLoader


class TinyCausalLM(nn.Module):
    """Token + document-position embeddings, two causal encoder layers, LM head."""

    def __init__(self, *, vocab_size: int, seq_len: int, dim: int = 32, layers: int = 2, heads: int = 2) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab_size, dim)
        self.pos_embeddings = nn.Embedding(seq_len, dim)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True, norm_first=True)
            for _ in range(layers)
        )
        self.norm = nn.LayerNorm(dim)
        self.output = nn.Linear(dim, vocab_size)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq_len), persistent=False)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens) + self.pos_embeddings(positions)
        for layer in self.layers:
            h = layer(h, src_mask=self.mask, is_causal=True)
        return self.output(self.norm(h))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--vocab-size", type=int, required=True)
    parser.add_argument("--seq-len", type=int, required=True)
    parser.add_argument("--global-batch", type=int, required=True)
    parser.add_argument("--ckpt", required=True)
    parser.add_argument("--save-step", type=int, required=True)
    parser.add_argument("--total-steps", type=int, required=True)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    rank, world = init_gloo()
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    model = TinyCausalLM(vocab_size=args.vocab_size, seq_len=args.seq_len)
    loader = ZephonDataLoader.Config(dataset_path=args.dataset, seed=7, prefetch_steps=2).build(
        dp_world_size=world, dp_rank=rank, tokenizer=None, **trainer_keywords(args.seq_len, args.global_batch // world)
    )
    checkpointer, optimizers, lr_schedulers, train_state = build_checkpointer(
        folder=args.ckpt, interval=args.save_step, dataloader=loader, model=model
    )
    if args.resume:
        assert checkpointer.load(step=args.save_step)
        assert train_state.step == args.save_step
    ddp_model = DistributedDataParallel(model)

    losses = {}
    batches = iter(loader)
    while train_state.step < args.total_steps:
        train_state.step += 1
        input_dict, labels = next(batches)
        # TorchTitan main's batches are 1-D; this model takes rows.
        labels = as_rows(labels, args.seq_len)
        logits = ddp_model(as_rows(input_dict["input"], args.seq_len), as_rows(input_dict["positions"], args.seq_len))
        # As TorchTitan does: the summed loss over the global count of
        # valid labels (input EOS labels are ignored, so ranks count
        # differently); DDP averages gradients over the ranks, hence x world.
        valid = (labels != -100).sum()
        torch.distributed.all_reduce(valid)
        loss_sum = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction="sum")
        (loss_sum / valid * world).backward()
        optimizers.step()
        lr_schedulers.step()
        optimizers.zero_grad()
        global_loss = loss_sum.detach().clone()
        torch.distributed.all_reduce(global_loss)
        losses[str(train_state.step)] = global_loss.item() / valid.item()
        checkpointer.save(curr_step=train_state.step)
    checkpointer.close()
    loader.close()
    if rank == 0:
        write_json(args.out, {"world": world, "losses": losses})
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
