"""torchrun worker: save a TorchTitan checkpoint at one dp degree, resume at another.

``--mode save``: build ``ZephonDataLoader`` through its Config as TorchTitan's
trainer does, run ``--save-step`` steps, save through TorchTitan's
``CheckpointManager``. With ``--titan-ckpt``, do the same with TorchTitan's
own loader (0.3.0: ``ParallelAwareDataloader``; main: ``GrainDataLoader``
over ``--titan-corpus``).

``--mode resume``: build the loaders at this world size, load the checkpoint
through the manager, run ``--steps`` more steps; for TorchTitan's own loader,
record the error its ``load_state_dict`` raises.

Each rank writes ``--out/rank<r>.json``: per step, its rows as
``[global sample position, sha256 of input+labels]``.
"""

from __future__ import annotations

import argparse
import os

import torch
from torchtitan.components.tokenizer import HuggingFaceTokenizer

from titan_setup import (
    TITAN,
    build_checkpointer,
    init_gloo,
    row_digests,
    titan_own_loader,
    trainer_keywords,
    write_json,
)
from zephon_stream.integrations.torchtitan import ZephonDataLoader


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("save", "resume"), required=True)
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--tokenizer-dir", required=True)
    parser.add_argument("--seq-len", type=int, required=True)
    parser.add_argument("--global-batch", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ckpt", required=True)
    parser.add_argument("--titan-ckpt")
    parser.add_argument("--titan-corpus", help="a JSONL corpus for TorchTitan main's own loader")
    parser.add_argument("--save-step", type=int, required=True)
    parser.add_argument("--steps", type=int, default=0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    rank, world = init_gloo()
    assert args.global_batch % world == 0
    local_batch = args.global_batch // world
    tokenizer = HuggingFaceTokenizer.Config().build(tokenizer_path=args.tokenizer_dir)
    config = ZephonDataLoader.Config(dataset_path=args.dataset, seed=args.seed, prefetch_steps=2)
    # The keywords the installed TorchTitan's trainer passes (0.3.0 adds snapshot_every_n_steps).
    extra = {} if TITAN.flat_batches else {"snapshot_every_n_steps": args.save_step}
    loader = config.build(
        dp_world_size=world, dp_rank=rank, tokenizer=tokenizer, **trainer_keywords(args.seq_len, local_batch), **extra
    )
    checkpointer, _, _, train_state = build_checkpointer(
        folder=args.ckpt, interval=args.save_step, dataloader=loader, model=torch.nn.Linear(4, 4)
    )
    report: dict = {"rank": rank, "world": world, "steps": {}}

    first_step = 0
    if args.mode == "resume":
        assert checkpointer.load(step=args.save_step), "no checkpoint found"
        assert train_state.step == args.save_step, (train_state.step, args.save_step)
        first_step = args.save_step
    num_steps = args.save_step if args.mode == "save" else args.steps

    batches = iter(loader)
    for step in range(first_step, first_step + num_steps):
        input_dict, labels = next(batches)
        assert set(input_dict) == {"input", "positions"}, sorted(input_dict)
        shape = (local_batch * args.seq_len,) if TITAN.flat_batches else (local_batch, args.seq_len)
        assert input_dict["input"].shape == shape == labels.shape
        assert input_dict["input"].dtype == torch.int64 == labels.dtype
        rows = zip(loader.last_sample_positions.tolist(), row_digests(input_dict["input"], labels, args.seq_len))
        report["steps"][str(step)] = [list(row) for row in rows]
    if args.mode == "save":
        train_state.step = args.save_step
        assert checkpointer.save(curr_step=args.save_step)
    checkpointer.close()
    loader.close()

    if args.titan_ckpt:
        titan_loader = titan_own_loader(
            rank=rank,
            world=world,
            seq_len=args.seq_len,
            rows=local_batch,
            tokenizer=tokenizer,
            corpus_jsonl=args.titan_corpus,
        )
        titan_checkpointer, _, _, titan_state = build_checkpointer(
            folder=args.titan_ckpt, interval=args.save_step, dataloader=titan_loader, model=torch.nn.Linear(4, 4)
        )
        if args.mode == "save":
            titan_batches = iter(titan_loader)
            for _ in range(args.save_step):
                next(titan_batches)
            titan_state.step = args.save_step
            assert titan_checkpointer.save(curr_step=args.save_step)
        else:
            try:
                titan_checkpointer.load(step=args.save_step)
                report["titan_error"] = None
            except Exception as exc:  # noqa: BLE001 - the test asserts the exact type and message
                report["titan_error"] = [type(exc).__name__, str(exc)]
        titan_checkpointer.close()

    write_json(os.path.join(args.out, f"rank{rank}.json"), report)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
