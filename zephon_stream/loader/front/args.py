"""The loader's arguments checked before anything is opened."""

from __future__ import annotations

from typing import Any

import torch

from zephon_stream.errors import ConfigError
from zephon_stream.loader.delivery.widen import BATCH_LAYOUTS

PIPELINE_MODES = ("process", "threads")


def resolve_rank_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """``(rank, world_size)``: both given, else torch.distributed's, else ``(0, 1)``."""
    if rank is not None and world_size is not None:
        return int(rank), int(world_size)
    if rank is not None or world_size is not None:
        raise ConfigError(f"pass both rank and world_size or neither (got rank={rank}, world_size={world_size})")
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def check_loader_args(
    *, rank: int, world_size: int, scheduled: bool, pipeline: str, batch_layout: str = "rows", **args: Any
) -> None:
    """Raise ``ConfigError`` naming the first bad argument and its value.

    ``args`` are the loader's keyword arguments of the same names. With a
    schedule (``scheduled``) the phases give seq_len, batch, lanes and
    window, so those may not be passed as well.
    """
    if scheduled:
        given = {n: args[n] for n in ("seq_len", "local_batch_size", "lanes", "window") if args[n] is not None}
        if given:
            raise ConfigError(f"with a schedule, each phase gives these; do not pass them too (got {given})")
    elif args["end_after_phase"] is not None:
        raise ConfigError(f"end_after_phase={args['end_after_phase']} needs a schedule")
    sizes = ["seq_len", "local_batch_size"] if not scheduled else []
    sizes += ["prefetch_steps", "num_fetch_threads", "num_decode_threads"]
    for name, value in [(n, args[n]) for n in sizes] + [("world_size", world_size)]:
        if not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name} must be an int >= 1 (got {value!r})")
    if not 0 <= rank < world_size:
        raise ConfigError(f"rank {rank} is outside world_size {world_size}")
    for name, low in (("max_steps", 0), ("max_epochs", 1), ("epochs_stream", 0)):
        if args[name] is not None and (not isinstance(args[name], int) or args[name] < low):
            raise ConfigError(f"{name} must be an int >= {low} (got {args[name]!r})")
    if pipeline not in PIPELINE_MODES:
        raise ConfigError(f"pipeline must be one of {PIPELINE_MODES} (got {pipeline!r})")
    if batch_layout not in BATCH_LAYOUTS:
        raise ConfigError(f"batch_layout must be one of {BATCH_LAYOUTS} (got {batch_layout!r})")
    nice = args["helper_nice"]
    if not isinstance(nice, int) or not 0 <= nice <= 19:
        raise ConfigError(f"helper_nice must be an int in [0, 19] (got {nice!r})")
