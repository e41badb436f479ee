"""``zephon-stream which``: the samples, blocks, shards and documents of a global step."""

from __future__ import annotations

import argparse
import json
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "which",
        help="show which datasets, shards, blocks and source documents made up a global step",
        description=(
            "Derive, from the manifests and the order settings alone, the samples of global "
            "step N (positions [N*B, (N+1)*B)) and where each came from. The settings must be "
            "the training job's: seed, seq_len, lanes (default: the global batch), window and "
            "weights."
        ),
    )
    parser.add_argument("datasets", nargs="+", metavar="DATASET", help="dataset roots, in mixture order")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--step", type=int, help="global step N (a constant global batch from step 0)")
    where.add_argument(
        "--positions", metavar="START:END", help="a global position range instead of a step"
    )
    parser.add_argument("--seq-len", type=int, required=True, help="tokens per sample input")
    parser.add_argument("--global-batch", type=int, required=True, help="samples per global step B")
    parser.add_argument("--seed", type=int, default=0, help="order seed (default 0)")
    parser.add_argument("--lanes", type=int, help="lanes C (default: the global batch)")
    parser.add_argument("--window", type=int, default=0, help="window-shuffle samples (0: one block)")
    parser.add_argument("--weights", nargs="+", metavar="W", help="stream weights (default: equal)")
    parser.add_argument("--world-size", type=int, help="also show the rank that reads each sample")
    parser.add_argument("--text", action="store_true", help="decode each sample's text")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--storage-option", action="append", default=[], metavar="KEY=VALUE",
        help="fsspec/s3fs option (repeatable)",
    )  # fmt: skip
    parser.set_defaults(handler=run)


def _range(args: argparse.Namespace) -> tuple[int, int]:
    from zephon_stream.errors import ConfigError
    from zephon_stream.provenance import step_range

    if args.step is not None:
        return step_range(args.step, args.global_batch)
    try:
        start, end = (int(v) for v in args.positions.split(":"))
    except ValueError as exc:
        raise ConfigError(f"--positions must be START:END, got {args.positions!r}") from exc
    return start, end


def run(args: argparse.Namespace) -> int:
    from zephon_stream.plan import OrderConfig
    from zephon_stream.provenance import order_for, provenance
    from zephon_stream.reader import DatasetReader
    from zephon_stream.storage import parse_storage_options

    options = parse_storage_options(args.storage_option)
    config = OrderConfig(
        seed=args.seed,
        seq_len=args.seq_len,
        lanes=args.lanes or args.global_batch,
        window=args.window,
        weights=tuple(args.weights or ()),
    )
    start, end = _range(args)
    readers = [DatasetReader.open(url, options) for url in args.datasets]
    try:
        order = order_for(readers, config)
        world = args.world_size if args.step is not None else None
        samples = provenance(readers, order, start, end, world_size=world, text=args.text)
    finally:
        for reader in readers:
            reader.close()
    if args.json:
        print(json.dumps({
            "step": args.step, "positions": [start, end], "seq_len": args.seq_len,
            "global_batch": args.global_batch, "lanes": order.lanes, "seed": args.seed,
            "samples": [s.to_dict() for s in samples],
        }, sort_keys=True))  # fmt: skip
        return 0
    title = f"step {args.step}: " if args.step is not None else ""
    print(f"{title}positions [{start}, {end}), seq_len {args.seq_len}, lanes {order.lanes}, "
          f"seed {args.seed}")  # fmt: skip
    for s in samples:
        rank = "" if s.rank is None else f" rank {s.rank}"
        print(f"position {s.position}{rank}: stream {s.stream} {s.dataset} {s.shard_path} "
              f"block {s.block} (#{s.block_in_shard} in shard) sample {s.sample} "
              f"tokens [{s.token_start}, {s.token_start + s.num_tokens})")  # fmt: skip
        for d in s.documents:
            print(f"    {d.source} record {d.record}: sample tokens "
                  f"[{d.sample_token_start}, {d.sample_token_end})")  # fmt: skip
        if s.text is not None:
            for line in s.text.splitlines() or [""]:
                print(f"    | {line}")
    return 0
