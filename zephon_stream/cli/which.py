"""``zephon-stream which``: the samples, blocks, shards and documents of a global step."""

from __future__ import annotations

import argparse
import json
from typing import Any

STEP_NUMBERING = (
    "Steps count from 0: step N is the global batch a job reads after N steps, the loader's `step` "
    "before it and the `step` of its audit log and of the demo's tables; a phase's start_step counts "
    "the same way. TorchTitan counts its train steps from 1 and takes --accumulation batches per train "
    "step: its train step S is steps (S-1)*A to S*A-1 here; --torchtitan-step S looks it up."
)


def register(subparsers: Any) -> None:
    from zephon_stream.cli import PACKING_CHOICES, bounded_int

    seed = bounded_int(0, 2**64 - 1)
    positive = bounded_int(1)

    parser = subparsers.add_parser(
        "which",
        help="show which datasets, shards, blocks and source documents made up a global step",
        description=(
            "Derive, from the manifests and the order settings alone, the samples of global "
            "step N and where each came from, and the schedule phase the step is in. The settings "
            "must be the training job's: either --schedule, or seed, seq_len, global batch, lanes "
            "(default: the global batch), window and weights for a job of one phase. " + STEP_NUMBERING
        ),
    )
    parser.add_argument("datasets", nargs="+", metavar="DATASET", help="dataset roots, in mixture order")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--step",
        type=bounded_int(0, why="steps count from 0 (the first batch is step 0)"),
        help="global step N, counted from 0 (the first batch is step 0)",
    )
    where.add_argument(
        "--torchtitan-step",
        type=bounded_int(1, why="TorchTitan counts its train steps from 1"),
        metavar="S",
        help="TorchTitan train step S, counted from 1: shows its --accumulation steps",
    )
    where.add_argument("--positions", metavar="START:END", help="a global position range instead of a step")
    parser.add_argument(
        "--schedule",
        metavar="FILE",
        help='JSON schedule: {"seed": S, "phases": [{"start_step": 0, "global_batch": B, '
        '"seq_len": L, "lanes": C, "window": 0, "weights": [...]}, ...]} (or the phases list alone), '
        "in a file or inline",
    )
    parser.add_argument("--seq-len", type=positive, help="tokens per sample input (without --schedule)")
    parser.add_argument("--global-batch", type=positive, help="samples per global step B (without --schedule)")
    parser.add_argument("--seed", type=seed, default=0, help="order seed (default 0)")
    parser.add_argument("--lanes", type=positive, help="lanes C (default: the global batch)")
    parser.add_argument("--window", type=bounded_int(0), default=0, help="window-shuffle samples (0: one block)")
    parser.add_argument("--weights", nargs="+", metavar="W", help="stream weights (default: equal)")
    parser.add_argument(
        "--accumulation",
        type=positive,
        default=1,
        metavar="A",
        help="batches per TorchTitan train step (its gradient_accumulation_steps; default 1)",
    )
    parser.add_argument(
        "--packing",
        choices=PACKING_CHOICES,
        default="concat",
        help="the loader's packing (default concat: windows); best_fit names each row's pieces, each with its "
        "document, its place in it and whether it is the whole document or a head, tail or middle part",
    )
    parser.add_argument(
        "--state",
        metavar="FILE",
        help="a run's loader state (its state_dict() as JSON, or a torch.distributed.checkpoint folder): the "
        "order's settings and the run's history come from it, so a step is named as that run read it, after "
        "global batch changes and skipped steps",
    )
    parser.add_argument(
        "--state-key",
        metavar="KEY",
        help="with --state: the key of the loader state, where a checkpoint holds several (dotted, e.g. dataloader)",
    )
    parser.add_argument("--world-size", type=positive, help="also show the rank that reads each sample")
    parser.add_argument("--text", action="store_true", help="decode each sample's text (best_fit: the packed row)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--storage-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="fsspec option (s3fs, gcsfs, adlfs; repeatable)",
    )
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
            start_step=0,
            global_batch=args.global_batch,
            seq_len=args.seq_len,
            lanes=args.lanes or args.global_batch,
            window=args.window,
            weights=tuple(args.weights or ()),
        )
        return args.seed, [phase]
    try:
        # Inline JSON too, so one printed command line (the demo's) is all it takes.
        inline = args.schedule.lstrip().startswith(("{", "["))
        data = json.loads(args.schedule if inline else Path(args.schedule).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--schedule {args.schedule}: cannot read a JSON schedule: {exc}") from exc
    seed = args.seed
    if isinstance(data, dict):
        seed = data.get("seed", seed)
        data = data.get("phases")
    if not isinstance(data, list):
        raise ConfigError(f"--schedule {args.schedule}: expected a list of phases, got {data!r}")
    return seed, [SchedulePhase.from_dict(p, where=f"schedule phase {k}") for k, p in enumerate(data)]


def _steps(args: argparse.Namespace) -> list[int] | None:
    """The global steps (from 0) asked for, or None for --positions."""
    if args.torchtitan_step is not None:
        first = (args.torchtitan_step - 1) * args.accumulation
        return list(range(first, first + args.accumulation))
    if args.step is not None:
        return [args.step]
    return None


def _positions(args: argparse.Namespace) -> tuple[int, int]:
    from zephon_stream.errors import ConfigError

    try:
        start, end = (int(v) for v in args.positions.split(":"))
    except ValueError as exc:
        raise ConfigError(f"--positions must be START:END, got {args.positions!r}") from exc
    return start, end


def _torchtitan(step: int, accumulation: int) -> str:
    """Where TorchTitan counts ``step``: its train step (from 1) and, with accumulation, which batch of it."""
    train_step, batch = divmod(step, accumulation)
    if accumulation == 1:
        return f"TorchTitan train step {train_step + 1} without accumulation"
    return f"TorchTitan train step {train_step + 1}, batch {batch + 1} of {accumulation}"


def run(args: argparse.Namespace) -> int:
    from zephon_stream.reader import DatasetReader
    from zephon_stream.reader.provenance import range_provenance, schedule_for, step_provenance
    from zephon_stream.storage import parse_storage_options

    options = parse_storage_options(args.storage_option)
    settings = _state_settings(args)
    seed, phases = (settings.seed, settings.phases) if settings else _phases(args)
    steps = _steps(args)
    readers = []
    try:
        for url in args.datasets:
            readers.append(DatasetReader.open(url, options))
        order = schedule_for(readers, phases, seed)
        if settings is not None and steps is not None:
            return _run_state(args, readers, order, settings, steps)
        if steps is None:
            start, end = _positions(args)
            samples = range_provenance(readers, order, start, end, text=args.text, packing=args.packing)
            found = [(None, start, end, samples)]
        else:
            found = []
            for step in steps:
                start = order.position_of_step(step)
                end = start + order.phase_at_step(step).global_batch
                samples = step_provenance(
                    readers, order, step, world_size=args.world_size, text=args.text, packing=args.packing
                )
                found.append((step, start, end, samples))
    finally:
        for reader in readers:
            reader.close()
    described = [_described(order, seed, args.packing, *item) for item in found]
    if args.json:
        if args.torchtitan_step is None:
            print(json.dumps(described[0], sort_keys=True))
        else:
            print(
                json.dumps(
                    {"torchtitan_step": args.torchtitan_step, "accumulation": args.accumulation, "steps": described},
                    sort_keys=True,
                )
            )
        return 0
    if args.torchtitan_step is not None:
        steps_text = f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]} to {steps[-1]}"
        print(
            f"TorchTitan train step {args.torchtitan_step} (accumulation {args.accumulation}) is {steps_text} "
            "(counted from 0)"
        )
    for item, out in zip(found, described):
        _print_step(out, item[3], args.accumulation)
    if steps is not None and settings is None:
        print(
            "note: steps are numbered as if the run read every step since step 0 at these settings; a run that "
            "changed its global batch or skipped steps read other samples at some steps: pass --state FILE"
        )
    return 0


def _state_settings(args: argparse.Namespace) -> Any:
    """The settings a --state gives (None without one); refuses flags it replaces."""
    from zephon_stream.cli.which_state import load_state, run_settings
    from zephon_stream.errors import ConfigError

    if args.state is None:
        return None
    given = [flag for flag, value in (("--schedule", args.schedule), ("--seq-len", args.seq_len),
                                      ("--global-batch", args.global_batch), ("--lanes", args.lanes),
                                      ("--weights", args.weights), ("--world-size", args.world_size))
             if value is not None]  # fmt: skip
    if given:
        raise ConfigError(
            f"with --state the settings come from the run's state (and it does not record a world "
            f"size); drop {', '.join(given)}"
        )
    settings = run_settings(load_state(args.state, args.state_key))
    if args.packing != "concat" and args.packing != settings.packing:
        raise ConfigError(f"--packing {args.packing}, but the state's run read with packing {settings.packing!r}")
    args.packing = settings.packing
    return settings


def _run_state(args: argparse.Namespace, readers: list[Any], order: Any, settings: Any, steps: list[int]) -> int:
    """Each step as the run of ``--state`` read it, or why it did not."""
    from zephon_stream.cli.which_state import step_reads
    from zephon_stream.reader.provenance import range_provenance

    found = []
    for read in step_reads(order, settings, steps):
        if read.position is None:
            found.append(({"step": read.step, "read": False, "reason": read.reason}, []))
            continue
        samples = range_provenance(readers, order, read.position, read.end, text=args.text, packing=args.packing)
        out = _described(order, settings.seed, args.packing, None, read.position, read.end, samples)
        found.append((out | {"step": read.step, "read": True}, samples))
    if args.json:
        described = [out for out, _ in found]
        print(json.dumps(described[0] if len(described) == 1 else {"steps": described}, sort_keys=True))
        return 0
    for out, samples in found:
        if not out["read"]:
            print(f"step {out['step']} (from 0): not read by this run: {out['reason']}")
            continue
        print(f"step {out['step']} of the run of the state, read at its cursor {out['positions'][0]}:")
        _print_step(out | {"step": None}, samples, args.accumulation)
    return 0


def _described(
    order: Any, seed: int, packing: str, step: int | None, start: int, end: int, samples: list[Any]
) -> dict[str, Any]:
    """One step's (or position range's) JSON object (``packing`` in it when not concat,
    whose keys stay as they were)."""
    phase = order.phase_at_step(step) if step is not None else order.phase_at_position(start)
    spec = phase.spec
    return {
        "step": step,
        "positions": [start, end],
        "seq_len": spec.seq_len,
        "global_batch": spec.global_batch,
        "lanes": phase.order.lanes,
        "seed": seed,
        "phase": {
            "index": phase.index,
            "start_step": spec.start_step,
            "end_step": order.phase_end_step(phase.index),
            "global_batch": spec.global_batch,
            "seq_len": spec.seq_len,
            "lanes": phase.order.lanes,
            "window": phase.order.config.window,
            "weights": list(phase.order.weights),
        },
        "samples": [s.to_dict() for s in samples],
    } | ({} if packing == "concat" else {"packing": packing})


def _print_step(out: dict[str, Any], samples: list[Any], accumulation: int) -> None:
    phase = out["phase"]
    title = "" if out["step"] is None else f"step {out['step']} (from 0; {_torchtitan(out['step'], accumulation)}): "
    start, end = out["positions"]
    packing = f", packing {out['packing']}" if "packing" in out else ""
    print(
        f"{title}positions [{start}, {end}), seq_len {out['seq_len']}, lanes {out['lanes']}, seed {out['seed']}"
        f"{packing}"
    )
    until = "on" if phase["end_step"] is None else f"to {phase['end_step'] - 1}"
    print(
        f"phase {phase['index']} (steps {phase['start_step']} {until}): global batch {phase['global_batch']}, "
        f"window {phase['window']}, weights {phase['weights']}"
    )
    for s in samples:
        if s.packing != "concat":
            _print_row(s)
            continue
        rank = "" if s.rank is None else f" rank {s.rank}"
        print(
            f"position {s.position}{rank}: stream {s.stream} {s.dataset} {s.shard_path} "
            f"block {s.block} (#{s.block_in_shard} in shard) sample {s.sample} "
            f"dataset tokens [{s.token_start}, {s.token_start + s.num_tokens})"
        )
        for d in s.documents:
            # Both counts, so an excerpt that starts mid-document is not
            # read as the document's first tokens.
            print(
                f"    {d.source} record {d.record}: document tokens [{d.document_token_start}, "
                f"{d.document_token_end}) of {d.num_tokens} = sample tokens "
                f"[{d.sample_token_start}, {d.sample_token_end})"
            )
        if s.text is not None:
            print(f"    text of sample tokens [0, {s.num_tokens}):")
            for line in s.text.splitlines() or [""]:
                print(f"    | {line}")


def _print_row(s: Any) -> None:
    """A packed sample: its row's pieces in row order, its label, its text."""
    rank = "" if s.rank is None else f" rank {s.rank}"
    pieces = f"{len(s.documents)} piece" + ("" if len(s.documents) == 1 else "s")
    print(
        f"position {s.position}{rank}: stream {s.stream} {s.dataset} {s.shard_path} "
        f"block {s.block} (#{s.block_in_shard} in shard) row {s.sample}, {pieces}"
    )
    for k, d in enumerate(s.documents):
        print(
            f"    piece {k}: sample tokens [{d.sample_token_start}, {d.sample_token_end}) = {d.source} record "
            f"{d.record}: document tokens [{d.document_token_start}, {d.document_token_end}) of {d.num_tokens} "
            f"({d.cut})"
        )
    label = s.label
    print(
        f"    label: sample token {s.num_tokens - 1} = {label.source} record {label.record}: document token "
        f"{label.document_token} of {label.token_end - label.token_start}"
    )
    if s.text is not None:
        print(f"    text of the packed row, sample tokens [0, {s.num_tokens}):")
        for line in s.text.splitlines() or [""]:
            print(f"    | {line}")
