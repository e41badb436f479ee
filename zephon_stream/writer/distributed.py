"""Conversion as the ranks of an existing launcher (torchrun, Slurm, ...).

Each rank converts a deterministic, contiguous share of the expanded inputs
into its own part, ``OUTPUT/part-RRRRR-of-WWWWW/``, a complete dataset of its
own; ``merge_parts`` then joins the parts under ``OUTPUT`` into one manifest
without copying a shard. Because the shares are contiguous runs of the input
order, the merged token stream and document index are the ones a single
process would have written (only the block boundaries differ: each part ends
with its own short block).

No rank talks to another: a rank needs only its rank, the world size and the
input list, so any launcher that sets the usual variables works.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from zephon_stream.errors import ConfigError
from zephon_stream.storage import expand_inputs, join_url

PART_PREFIX = "part-"
_PART_NAME = re.compile(r"^part-(?P<rank>\d{5,})-of-(?P<world>\d{5,})$")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class LauncherRank:
    """This process's place among the ranks of a launcher.

    Attributes:
        rank: 0-based rank.
        world_size: number of ranks.
        source: the environment variables it was read from (for messages).
    """

    rank: int
    world_size: int
    source: str


def _int_var(env: Mapping[str, str], name: str) -> int:
    text = env[name]
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"environment variable {name}={text!r} is not an integer") from None


def launcher_rank(env: Mapping[str, str] | None = None) -> LauncherRank | None:
    """Read the rank and world size a launcher set, if any.

    Checked in order: ``RANK``/``WORLD_SIZE`` (torchrun, most MPI-style
    launchers), a Slurm array (``SLURM_ARRAY_TASK_ID`` counted from
    ``SLURM_ARRAY_TASK_MIN``, ``SLURM_ARRAY_TASK_COUNT``), then Slurm tasks
    (``SLURM_PROCID``/``SLURM_NTASKS``, as under ``srun``).

    Returns:
        The rank, or None when no launcher variables are set.

    Raises:
        ConfigError: variables that are not integers, or a rank outside
            ``[0, world_size)``.
    """
    env = os.environ if env is None else env
    found: LauncherRank | None = None
    if "RANK" in env and "WORLD_SIZE" in env:
        found = LauncherRank(
            rank=_int_var(env, "RANK"), world_size=_int_var(env, "WORLD_SIZE"), source="RANK/WORLD_SIZE"
        )
    elif "SLURM_ARRAY_TASK_ID" in env and "SLURM_ARRAY_TASK_COUNT" in env:
        first = _int_var(env, "SLURM_ARRAY_TASK_MIN") if "SLURM_ARRAY_TASK_MIN" in env else 0
        found = LauncherRank(
            rank=_int_var(env, "SLURM_ARRAY_TASK_ID") - first,
            world_size=_int_var(env, "SLURM_ARRAY_TASK_COUNT"),
            source="SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT",
        )
    elif "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        found = LauncherRank(
            rank=_int_var(env, "SLURM_PROCID"),
            world_size=_int_var(env, "SLURM_NTASKS"),
            source="SLURM_PROCID/SLURM_NTASKS",
        )
    if found is None:
        return None
    if found.world_size < 1 or not 0 <= found.rank < found.world_size:
        raise ConfigError(f"launcher variables {found.source}: rank {found.rank} is outside [0, {found.world_size})")
    return found


def part_name(rank: int, world_size: int) -> str:
    """Folder of rank ``rank``'s part, relative to the output: ``part-00001-of-00003``."""
    if not 0 <= rank < world_size:
        raise ConfigError(f"rank {rank} is outside [0, {world_size})")
    return f"{PART_PREFIX}{rank:05d}-of-{world_size:05d}"


def parse_part_name(name: str) -> tuple[int, int] | None:
    """``(rank, world_size)`` of a part folder name, or None if it is not one."""
    match = _PART_NAME.match(name)
    if match is None:
        return None
    return int(match.group("rank")), int(match.group("world"))


def rank_share(inputs: Sequence[str], rank: int, world_size: int) -> list[str]:
    """The contiguous run of ``inputs`` that rank ``rank`` converts.

    The first ``len(inputs) % world_size`` ranks take one input more, so the
    shares differ by at most one file and concatenate back to ``inputs``.

    Raises:
        ConfigError: fewer inputs than ranks (a rank would have nothing to write).
    """
    if len(inputs) < world_size:
        raise ConfigError(
            f"{world_size} ranks but only {len(inputs)} input files: each rank converts whole "
            "files, so use at most as many ranks as files"
        )
    base, extra = divmod(len(inputs), world_size)
    start = rank * base + min(rank, extra)
    return list(inputs[start : start + base + (rank < extra)])


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class RankAssignment:
    """What one rank writes: its share of the inputs and its part's URL."""

    rank: LauncherRank
    inputs: list[str]
    output: str
    num_inputs_total: int


def assign_rank_work(
    inputs: Sequence[str],
    output: str,
    *,
    storage_options: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    expand: Callable[[Sequence[str], Mapping[str, Any] | None], list[str]] | None = None,
) -> RankAssignment | None:
    """Turn a ``write`` invocation into this rank's share, when run under a launcher.

    Args:
        inputs: the input patterns as given to ``write``.
        output: the dataset URL as given to ``write``; parts go below it.
        storage_options: options for listing remote inputs.
        env: the environment to read (``os.environ`` by default).
        expand: turns the patterns into the list of inputs to share out
            (default ``expand_inputs``; token inputs keep companions together).

    Returns:
        This rank's inputs and part URL, or None when there is no launcher or
        it runs a single rank (then ``write`` writes ``output`` itself).
    """
    launcher = launcher_rank(env)
    if launcher is None or launcher.world_size == 1:
        return None
    expanded = (expand or expand_inputs)(inputs, storage_options)
    return RankAssignment(
        rank=launcher,
        inputs=rank_share(expanded, launcher.rank, launcher.world_size),
        output=join_url(output, part_name(launcher.rank, launcher.world_size)),
        num_inputs_total=len(expanded),
    )
