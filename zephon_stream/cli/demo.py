"""``zephon-stream demo``: convert, stream into a torchrun job, kill it, resume at another world size."""

from __future__ import annotations

import argparse
from typing import Any


def _world_sizes(text: str) -> tuple[int, int]:
    try:
        sizes = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected two integers like 2,1, got {text!r}") from None
    if len(sizes) != 2:
        raise argparse.ArgumentTypeError(f"expected two world sizes (before,after the kill), got {text!r}")
    if min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"world sizes must be >= 1 (got {text!r})")
    return sizes  # type: ignore[return-value]


def register(subparsers: Any) -> None:
    from zephon_stream.cli import PACKING_CHOICES, bounded_int
    from zephon_stream.demo.orchestrate import DemoConfig
    from zephon_stream.format.spec import MAX_BLOCK_TOKENS, MIN_BLOCK_TOKENS

    defaults = DemoConfig()
    positive = bounded_int(1)
    parser = subparsers.add_parser(
        "demo",
        help="convert a real corpus, train as torchrun ranks streaming from S3, kill, resume at another world size",
        description=(
            "Converts the Python standard library sources (or --input files) into a dataset on an "
            "embedded S3 server (or --store), trains a small transformer as W ranks under torchrun "
            "streaming from it, SIGKILLs the job after a checkpoint, resumes at another world size, "
            "and checks every step's data against an uninterrupted reference run. Exits 1 if any "
            "step's data differ. Steps count from 0, as the loader's step, its audit log and "
            "`zephon-stream which --step` count them: the demo's step N is `which --step N` with the "
            "demo's settings (--seq-len, --global-batch, --seed)."
        ),
    )
    add = parser.add_argument
    add(
        "--steps",
        type=positive,
        metavar="N",
        default=defaults.steps,
        help="training steps per run, steps 0 to N-1 (default %(default)s)",
    )
    add(
        "--world-sizes",
        type=_world_sizes,
        default=defaults.world_sizes,
        metavar="W1,W2",
        help=f"ranks before the kill, ranks after the resume (default {','.join(map(str, defaults.world_sizes))})",
    )
    add(
        "--reference-world-size",
        type=positive,
        default=defaults.reference_world_size,
        help="ranks of the reference run (default %(default)s)",
    )
    add(
        "--kill-after",
        type=positive,
        metavar="N",
        help="steps checkpointed before the kill: the job is killed after the checkpoint of steps 0 to N-1 "
        "and resumes at step N (default: mid-run)",
    )
    add(
        "--ckpt-every",
        type=positive,
        default=defaults.ckpt_every,
        help="steps between checkpoints (default %(default)s)",
    )
    add("--seq-len", type=positive, default=defaults.seq_len, help="tokens per sample (default %(default)s)")
    add(
        "--global-batch",
        type=positive,
        default=defaults.global_batch,
        help="samples per step over all ranks (default %(default)s)",
    )
    add(
        "--block-tokens",
        type=bounded_int(MIN_BLOCK_TOKENS, MAX_BLOCK_TOKENS),
        default=defaults.block_tokens,
        help="tokens per block (default %(default)s)",
    )
    add(
        "--blocks-per-shard",
        type=positive,
        default=defaults.blocks_per_shard,
        help="blocks per shard (default %(default)s)",
    )
    add(
        "--input",
        action="append",
        default=[],
        metavar="PATH",
        help="file or glob to convert (repeatable; default: the stdlib's top-level .py files)",
    )
    add(
        "--store",
        help="local folder or store prefix (s3://, gs://, az://) for the dataset, kept; the demo ends with "
        "the `which` line for it (default: an embedded S3 server)",
    )
    add(
        "--s3-port",
        type=bounded_int(0, 65535),
        default=defaults.s3_port,
        help="port tried first for the embedded S3 server (default %(default)s)",
    )
    add("--workdir", help="folder for checkpoints and logs (default: a temporary folder)")
    add("--keep", action="store_true", help="keep the temporary workdir")
    add("--plot", metavar="PATH", help="write a PNG of loss and tokens/s per step, the resize marked")
    add("--seed", type=bounded_int(0, 2**64 - 1), default=defaults.seed, help="data order and model init seed")
    parser.add_argument(
        "--schedule",
        action="store_true",
        help="train on a data schedule: pretrain, anneal on a new mixture with a second dataset (the kill and "
        "resize fall inside it), long context at twice --seq-len",
    )
    parser.add_argument(
        "--packing",
        choices=PACKING_CHOICES,
        default=defaults.packing,
        help="how the loader fills each block's rows, in every run (default %(default)s: windows; best_fit: rows "
        "of whole documents); the verdict is the same: every step's data as the reference's",
    )
    parser.add_argument(
        "--torchft",
        action="store_true",
        help="instead: three torchft replica groups under a real lighthouse, one SIGKILLed and restarted, one "
        "leaving, one failing a commit; samples lost and repeated against torchft's DistributedSampler (exit 1 "
        "if any is lost or repeated; 20 steps; needs the torchft extra)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.torchft:
        import sys

        from zephon_stream.errors import ConfigError

        if args.packing != "concat":
            raise ConfigError("--packing belongs to the kill-and-resize demo; --torchft runs its own loaders")

        from zephon_stream.demo.torchft_demo import run_torchft_demo

        return run_torchft_demo(workdir=args.workdir, out=sys.stdout)
    from zephon_stream.demo.orchestrate import DemoConfig, run_demo

    config = DemoConfig(
        steps=args.steps,
        world_sizes=args.world_sizes,
        reference_world_size=args.reference_world_size,
        kill_after=args.kill_after,
        ckpt_every=args.ckpt_every,
        seq_len=args.seq_len,
        global_batch=args.global_batch,
        inputs=args.input,
        store=args.store,
        s3_port=args.s3_port,
        workdir=args.workdir,
        keep=args.keep,
        block_tokens=args.block_tokens,
        blocks_per_shard=args.blocks_per_shard,
        seed=args.seed,
        schedule=args.schedule,
        packing=args.packing,
    )
    return run_demo(config, plot=args.plot)
