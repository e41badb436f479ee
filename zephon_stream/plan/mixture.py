"""Order configuration and the split of lanes among weighted streams."""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from zephon_stream.errors import ConfigError

Weight = int | float | str | Fraction


@dataclass(frozen=True, slots=True, kw_only=True)
class OrderConfig:
    """Everything besides the datasets that fixes the global order.

    Attributes:
        seed: key of every permutation, in ``[0, 2**64)``.
        seq_len: tokens per sample input (a sample holds ``seq_len + 1`` tokens).
        lanes: number of lanes ``C``; the loader defaults it to the first
            global batch size and records it in the state.
        window: samples per window shuffle; ``0`` means one full block's
            samples of each stream. Clamped to each stream's lane length.
        weights: one weight per stream (ints, decimal strings, fractions or
            floats, which are read through their shortest decimal form);
            empty means equal weights.
    """

    seed: int = 0
    seq_len: int
    lanes: int
    window: int = 0
    weights: tuple[Weight, ...] = ()


def parse_weight(weight: Weight, *, where: str) -> Fraction:
    """Read one weight exactly (``0.1`` is one tenth, not its binary neighbour)."""
    try:
        value = Fraction(repr(weight)) if isinstance(weight, float) else Fraction(weight)
    except (TypeError, ValueError, ZeroDivisionError) as exc:
        raise ConfigError(f"{where}: weight {weight!r} is not a number") from exc
    if value < 0:
        raise ConfigError(f"{where}: weight must be >= 0, got {weight!r}")
    return value


def canonical_weights(weights: tuple[Weight, ...], num_streams: int) -> tuple[str, ...]:
    """Weights as canonical strings (``"1"``, ``"7/10"``), the form kept in the state.

    Raises:
        ConfigError: wrong count, a negative or non-numeric weight, or all zero.
    """
    if not weights:
        weights = (1,) * num_streams
    if len(weights) != num_streams:
        raise ConfigError(f"{num_streams} streams but {len(weights)} weights: {list(weights)!r}")
    values = [parse_weight(w, where=f"stream {s}") for s, w in enumerate(weights)]
    if sum(values) == 0:
        raise ConfigError(f"every stream weight is 0: {list(weights)!r}")
    return tuple(str(v) for v in values)


def same_proportions(a: list[str] | tuple[str, ...], b: list[str] | tuple[str, ...]) -> bool:
    """Whether two weight lists split lanes alike: the same streams, each the same share of the total.

    The order reads weights only through ``w / sum(w)``, so ``10:4:2``
    is ``5:2:1``; a state keeps the strings it was given and is compared by share.
    """
    if len(a) != len(b):
        return False
    try:
        x, y = [Fraction(w) for w in a], [Fraction(w) for w in b]
    except (TypeError, ValueError, ZeroDivisionError):
        return list(a) == list(b)
    total_x, total_y = sum(x), sum(y)
    if not total_x or not total_y:
        return x == y
    return all(u / total_x == v / total_y for u, v in zip(x, y))


def split_lanes(weights: tuple[str, ...], lanes: int) -> list[int]:
    """Lanes per stream by the largest-remainder method.

    Stream ``s`` gets ``floor(C * w_s / sum(w))`` lanes, and the lanes left go
    one each to the streams with the largest fractional parts (ties: lower
    stream index first).

    Raises:
        ConfigError: a stream with a positive weight would get no lane.
    """
    values = [Fraction(w) for w in weights]
    total = sum(values)
    quotas = [lanes * v / total for v in values]
    counts = [math.floor(q) for q in quotas]
    left = lanes - sum(counts)
    by_remainder = sorted(range(len(values)), key=lambda s: (-(quotas[s] - counts[s]), s))
    for s in by_remainder[:left]:
        counts[s] += 1
    for s, (value, count) in enumerate(zip(values, counts)):
        if value > 0 and count == 0:
            raise ConfigError(
                f"stream {s}: weight {weights[s]} of {total} gets no lane out of {lanes}; "
                f"raise the lanes to at least {math.ceil(total / value)} or the weight"
            )
    return counts


def lane_map(counts: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Assign each global lane to a stream, spreading each stream's lanes evenly.

    The ``j``-th lane of stream ``s`` (of ``C_s``) has the ideal place
    ``(j + 1/2) / C_s``; global lanes take these places in increasing order,
    ties going to the lower stream index.

    Returns:
        ``(lane_stream, lane_index)``: for each global lane, its stream and its
        index among that stream's lanes.
    """
    total = sum(counts)
    streams = [s for s, c in enumerate(counts) if c]
    if len(streams) == 1:
        lane_stream = np.full(total, streams[0], dtype=np.int64)
        return lane_stream, np.arange(total, dtype=np.int64)
    # Exact integer keys: (2j + 1) / (2 C_s) scaled by 2 * lcm of the counts.
    scale = math.lcm(*(counts[s] for s in streams))
    places = sorted(((2 * j + 1) * (scale // counts[s]), s, j) for s in streams for j in range(counts[s]))
    lane_stream = np.fromiter((s for _, s, _ in places), dtype=np.int64, count=total)
    lane_index = np.fromiter((j for _, _, j in places), dtype=np.int64, count=total)
    return lane_stream, lane_index
