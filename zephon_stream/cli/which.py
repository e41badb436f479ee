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
            "step N and where each came from, and the schedule phase the step is in. The settings "
            "must be the training job's: either --schedule, or seed, seq_len, global batch, lanes "
            "(default: the global batch), window and weights for a job of one phase."
        ),
    )
    parser.add_argument("datasets", nargs="+", metavar="DATASET", help="dataset roots, in mixture order")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--step", type=int, help="global step N")
    where.add_argument(
        "--positions", metavar="START:END", help="a global position range instead of a step"
    )
    parser.add_argument(
        "--schedule", metavar="FILE",
        help='JSON schedule: {"seed": S, "phases": [{"start_step": 0, "global_batch": B, '
        '"seq_len": L, "lanes": C, "window": 0, "weights": [...]}, ...]} (or the phases list alone)',
    )  # fmt: skip
    parser.add_argument("--seq-len", type=int, help="tokens per sample input (without --schedule)")
    parser.add_argument("--global-batch", type=int, help="samples per global step B (without --schedule)")
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


def _phases(args: argparse.Namespace) -> tuple[int, list[Any]]:
    """The seed and the schedule's phases, from --schedule or the one-phase flags."""
    from pathlib import Path

    from zephon_stream.errors import ConfigError
    from zephon_stream.plan import SchedulePhase

    if args.schedule is None:
        if args.seq_len is None or args.global_batch is None:
            raise ConfigError("pass --seq-len and --global-batch, or --schedule FILE")
        phase = SchedulePhase(
            start_step=0, global_batch=args.global_batch, seq_len=args.seq_len,
            lanes=args.lanes or args.global_batch, window=args.window,
            weights=tuple(args.weights or ()),
        )  # fmt: skip
        return args.seed, [phase]
    try:
        data = json.loads(Path(args.schedule).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--schedule {args.schedule}: cannot read a JSON schedule: {exc}") from exc
    seed = args.seed
    if isinstance(data, dict):
        seed = data.get("seed", seed)
        data = data.get("phases")
    if not isinstance(data, list):
        raise ConfigError(f"--schedule {args.schedule}: expected a list of phases, got {data!r}")
    return seed, [SchedulePhase.from_dict(p, where=f"schedule phase {k}") for k, p in enumerate(data)]


def _range(args: argparse.Namespace, order: Any) -> tuple[int, int]:
    from zephon_stream.errors import ConfigError

    if args.step is not None:
        phase = order.phase_at_step(args.step)
        start = order.position_of_step(args.step)
        return start, start + phase.global_batch
    try:
        start, end = (int(v) for v in args.positions.split(":"))
    except ValueError as exc:
        raise ConfigError(f"--positions must be START:END, got {args.positions!r}") from exc
    return start, end


def run(args: argparse.Namespace) -> int:
    from zephon_stream.provenance import range_provenance, schedule_for, step_provenance
    from zephon_stream.reader import DatasetReader
    from zephon_stream.storage import parse_storage_options

    options = parse_storage_options(args.storage_option)
    seed, phases = _phases(args)
    readers = [DatasetReader.open(url, options) for url in args.datasets]
    try:
        order = schedule_for(readers, phases, seed)
        start, end = _range(args, order)
        if args.step is not None:
            samples = step_provenance(readers, order, args.step, world_size=args.world_size, text=args.text)
        else:
            samples = range_provenance(readers, order, start, end, text=args.text)
    finally:
        for reader in readers:
            reader.close()
    phase = order.phase_at_step(args.step) if args.step is not None else order.phase_at_position(start)
    spec = phase.spec
    described = {
        "index": phase.index, "start_step": spec.start_step, "end_step": order.phase_end_step(phase.index),
        "global_batch": spec.global_batch, "seq_len": spec.seq_len, "lanes": phase.order.lanes,
        "window": phase.order.config.window, "weights": list(phase.order.weights),
    }  # fmt: skip
    if args.json:
        print(json.dumps({
            "step": args.step, "positions": [start, end], "seq_len": spec.seq_len,
            "global_batch": spec.global_batch, "lanes": phase.order.lanes, "seed": seed,
            "phase": described, "samples": [s.to_dict() for s in samples],
        }, sort_keys=True))  # fmt: skip
        return 0
    title = f"step {args.step}: " if args.step is not None else ""
    print(f"{title}positions [{start}, {end}), seq_len {spec.seq_len}, lanes {phase.order.lanes}, "
          f"seed {seed}")  # fmt: skip
    until = "on" if described["end_step"] is None else f"to {described['end_step'] - 1}"
    print(f"phase {phase.index} (steps {spec.start_step} {until}): global batch {spec.global_batch}, "
          f"window {described['window']}, weights {described['weights']}")  # fmt: skip
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
