"""The global order: global position -> (stream, block, sample-in-block).

docs/ORDER.md specifies every step; this module is its implementation.
"""

from __future__ import annotations

import bisect
import functools
from dataclasses import dataclass

import numpy as np

from zephon_stream.errors import ConfigError
from zephon_stream.plan.mixture import OrderConfig, canonical_weights, lane_map, split_lanes
from zephon_stream.plan.permutation import (
    TAG_BLOCKS,
    TAG_WINDOW,
    KeyedPermutation,
    derive_key,
    derive_key_int,
    permute,
)
from zephon_stream.plan.shape import StreamShape
from zephon_stream.plan.slicing import BlockPlan, RankSlice, blocks_for, rank_slice
from zephon_stream.plan.state import LoaderState

# Below this many positions numpy's per-call overhead dominates, so the
# order is computed with Python ints and small caches instead (same results).
SMALL_BATCH = 64
_KEY_CACHE = 4096
_BLOCK_CACHE = 65536


@dataclass(frozen=True, slots=True)
class StreamPlan:
    """Derived per-stream sizes of the order (see docs/ORDER.md).

    Attributes:
        index: stream index in the mixture.
        shape: the stream's block token counts.
        lanes: lanes ``C_s`` this stream owns.
        samples_per_block: samples in a full block (``spb``).
        full_blocks: number of full blocks ``F``.
        stream_samples: samples in one pass over every block, ``S``, before
            the lane cut (formerly ``epoch_samples``, still an alias).
        lane_length: samples per lane per epoch, ``m = S // C_s``.
        window: window-shuffle size ``w``, in ``[1, m]``.
    """

    index: int
    shape: StreamShape
    lanes: int
    samples_per_block: int
    full_blocks: int
    stream_samples: int
    lane_length: int
    window: int

    @property
    def samples_read_per_epoch(self) -> int:
        """Samples read per epoch after the lane cut: ``C_s * m`` (``S - C_s * m`` are skipped)."""
        return self.lanes * self.lane_length

    @property
    def used_samples(self) -> int:
        """Old name of ``samples_read_per_epoch``."""
        return self.samples_read_per_epoch

    @property
    def epoch_samples(self) -> int:
        """Old name of ``stream_samples`` (``S``, before the lane cut)."""
        return self.stream_samples


class GlobalOrder:
    """Maps global sample positions to sample addresses, as a pure function.

    Small queries (a rank's step) run on Python ints with bounded caches of
    prepared permutations (thread-safe ``functools.lru_cache``); large ones are
    vectorized. Both give the same addresses.

    Args:
        shapes: one ``StreamShape`` per stream, in mixture order.
        config: the frozen order configuration.
        lanes_default: where the user set no lanes, what set ``config.lanes``
            instead and what to lower, for the message of a stream with fewer
            samples per epoch than its lanes (e.g. ``"the global batch of 64
            (...), ...; lower local_batch_size or seq_len"``); None: the
            user set them, and the message says to lower the lanes.

    Raises:
        ConfigError: an impossible config (no lane for a weighted stream, a
            stream with fewer samples per epoch than lanes, bad sizes...).
    """

    def __init__(self, shapes: list[StreamShape], config: OrderConfig, *, lanes_default: str | None = None) -> None:
        if not shapes:
            raise ConfigError("the order needs at least one stream")
        if config.seq_len < 1:
            raise ConfigError(f"seq_len must be >= 1, got {config.seq_len}")
        if config.lanes < 1:
            raise ConfigError(f"lanes must be >= 1, got {config.lanes}")
        if config.window < 0:
            raise ConfigError(f"window must be >= 0 (0 = one block), got {config.window}")
        if not 0 <= config.seed < 2**64:
            raise ConfigError(f"seed must lie in [0, 2**64), got {config.seed}")
        self.shapes = list(shapes)
        self.config = config
        self._lanes_default = lanes_default
        self.weights = canonical_weights(tuple(config.weights), len(shapes))
        self.lane_counts = split_lanes(self.weights, config.lanes)
        self.lane_stream, self.lane_index = lane_map(self.lane_counts)
        self.streams = [self._plan_stream(s) for s in range(len(shapes))]
        self._lane_stream_list = self.lane_stream.tolist()
        self._lane_index_list = self.lane_index.tolist()
        self._short_adjusted = [(p.shape.short_ids - np.arange(p.shape.short_ids.size)).tolist() for p in self.streams]
        self._short_cum = [
            np.concatenate([[0], np.cumsum(p.shape.short_block_samples(config.seq_len))]).tolist() for p in self.streams
        ]
        self._window_permutation_cached = functools.lru_cache(maxsize=_KEY_CACHE)(self._window_permutation)
        self._block_permutation_cached = functools.lru_cache(maxsize=64)(self._block_permutation)
        self._block_of_slot = functools.lru_cache(maxsize=_BLOCK_CACHE)(self._compute_block)

    def __reduce__(self) -> tuple[type, tuple[list[StreamShape], OrderConfig]]:
        # The order is a pure function of its shapes and config; a copy
        # (the loader's helper process gets one) rebuilds its caches.
        return (GlobalOrder, (self.shapes, self.config))

    def _plan_stream(self, s: int) -> StreamPlan:
        shape, lanes, seq_len = self.shapes[s], self.lane_counts[s], self.config.seq_len
        stream_samples = shape.stream_samples(seq_len)
        spb = shape.samples_per_full_block(seq_len)
        lane_length = stream_samples // lanes if lanes else 0
        if lanes and lane_length == 0:
            reason = shape.no_samples_reason(seq_len) or self._too_few_samples(stream_samples, lanes)
            raise ConfigError(f"stream {s} ({shape.label}): {reason}")
        window = self.config.window or spb
        return StreamPlan(
            index=s,
            shape=shape,
            lanes=lanes,
            samples_per_block=spb,
            full_blocks=shape.num_full_blocks,
            stream_samples=stream_samples,
            lane_length=lane_length,
            window=max(1, min(window, lane_length)),
        )

    def _too_few_samples(self, stream_samples: int, lanes: int) -> str:
        counted = f"{stream_samples} samples of seq_len {self.config.seq_len} per epoch, fewer than"
        if self._lanes_default is None:
            return f"{counted} its {lanes} lanes; lower the lanes or seq_len"
        # The user set no lanes: the message names what they did set.
        share = "" if lanes == self.config.lanes else f"its share, {lanes} lanes, of "
        return f"{counted} {share}{self._lanes_default}"

    @property
    def lanes(self) -> int:
        """Total lanes ``C``."""
        return self.config.lanes

    def sample_at(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Addresses of the samples at global positions.

        Args:
            positions: non-negative integer array.

        Returns:
            ``(stream, block, sample)`` ``int64`` arrays shaped like ``positions``;
            the sample's tokens are ``[sample * seq_len, sample * seq_len + seq_len + 1)``
            of the block.
        """
        positions = np.asarray(positions, dtype=np.int64)
        if positions.size and int(positions.min()) < 0:
            raise ConfigError(f"positions must be >= 0, got {int(positions.min())}")
        if positions.size <= SMALL_BATCH:
            flat = [self._address_int(p) for p in positions.ravel().tolist()]
            out = np.array(flat, dtype=np.int64).reshape(-1, 3)
            return tuple(out[:, k].reshape(positions.shape) for k in range(3))
        return self._addresses_vectorized(positions)

    # -- the small path: Python ints, cached window keys and block slots --

    def _window_permutation(self, s: int, epoch: int, lane: int, window: int) -> tuple[int, KeyedPermutation]:
        plan = self.streams[s]
        lane_start = lane * plan.lane_length
        start = max(window * plan.window, lane_start)
        end = min(window * plan.window + plan.window, lane_start + plan.lane_length)
        key = derive_key_int(TAG_WINDOW, self.config.seed, s, epoch, lane, window)
        return start, KeyedPermutation(end - start, key)

    def _block_permutation(self, s: int, epoch: int) -> KeyedPermutation:
        key = derive_key_int(TAG_BLOCKS, self.config.seed, s, epoch)
        return KeyedPermutation(self.streams[s].full_blocks, key)

    def _compute_block(self, s: int, epoch: int, slot: int) -> int:
        full = self._block_permutation_cached(s, epoch)(slot)
        return full + bisect.bisect_right(self._short_adjusted[s], full)

    def _address_int(self, p: int) -> tuple[int, int, int]:
        lane, q = p % self.config.lanes, p // self.config.lanes
        s, j = self._lane_stream_list[lane], self._lane_index_list[lane]
        plan = self.streams[s]
        epoch, r = divmod(q, plan.lane_length)
        unshuffled = j * plan.lane_length + r
        start, permutation = self._window_permutation_cached(s, epoch, j, unshuffled // plan.window)
        i = start + permutation(unshuffled - start)
        spb = plan.samples_per_block
        if i < plan.full_blocks * spb:
            slot, sample = divmod(i, spb)
            return s, self._block_of_slot(s, epoch, slot), sample
        rest = i - plan.full_blocks * spb
        cum = self._short_cum[s]
        k = bisect.bisect_right(cum, rest) - 1
        return s, int(plan.shape.short_ids[k]), rest - cum[k]

    # -- the vectorized path --

    def _addresses_vectorized(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        flat = positions.ravel()
        lanes = self.config.lanes
        lane, q = flat % lanes, flat // lanes
        stream, j = self.lane_stream[lane], self.lane_index[lane]
        block = np.empty_like(flat)
        sample = np.empty_like(flat)
        for plan in self.streams:
            if not plan.lanes:
                continue
            sel = np.flatnonzero(stream == plan.index)
            if sel.size == 0:
                continue
            block[sel], sample[sel] = self._stream_addresses(plan, q[sel], j[sel])
        shape = positions.shape
        return stream.reshape(shape), block.reshape(shape), sample.reshape(shape)

    def _stream_addresses(self, plan: StreamPlan, q: np.ndarray, j: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        s, seed, m, w = plan.index, self.config.seed, plan.lane_length, plan.window
        epoch = q // m
        unshuffled = j * m + q % m
        window = unshuffled // w
        start = np.maximum(window * w, j * m)
        size = np.minimum(window * w + w, j * m + m) - start
        key = derive_key(TAG_WINDOW, seed, s, epoch, j, window)
        i = start + permute(unshuffled - start, size, key)
        spb = plan.samples_per_block
        full_samples = plan.full_blocks * spb
        block = np.empty_like(i)
        sample = np.empty_like(i)
        full = i < full_samples
        if full.any():
            slot = i[full] // spb
            key = derive_key(TAG_BLOCKS, seed, s, epoch[full])
            ids = permute(slot, plan.full_blocks, key)
            adjusted = np.asarray(self._short_adjusted[s], dtype=np.int64)
            block[full] = ids + np.searchsorted(adjusted, ids, side="right")
            sample[full] = i[full] % spb
        if not full.all():
            rest = i[~full] - full_samples
            cum = np.asarray(self._short_cum[s], dtype=np.int64)
            k = np.searchsorted(cum, rest, side="right") - 1
            block[~full] = plan.shape.short_ids[k]
            sample[~full] = rest - cum[k]
        return block, sample

    def rank_slice(self, position: int, global_batch: int, world_size: int, rank: int) -> RankSlice:
        """Rank ``rank``'s share of the step covering ``[position, position + global_batch)``.

        Raises:
            ConfigError: ``world_size`` does not divide ``global_batch``, or a bad rank.
        """
        return rank_slice(self, position, global_batch, world_size, rank)

    def blocks_for(self, position: int, global_batch: int, world_size: int, rank: int, steps: int) -> BlockPlan:
        """Blocks rank ``rank`` reads in ``steps`` steps from ``position``, in first-use order."""
        return blocks_for(self, position, global_batch, world_size, rank, steps)

    def state(self, position: int) -> LoaderState:
        """The resumable state at cursor ``position``."""
        return LoaderState(
            position=int(position),
            seed=self.config.seed,
            seq_len=self.config.seq_len,
            lanes=self.config.lanes,
            window=self.config.window,
            weights=list(self.weights),
            lane_counts=list(self.lane_counts),
            fingerprints=[shape.fingerprint for shape in self.shapes],
        )

    def progress(self, position: int) -> list[dict]:
        """Per-stream progress after ``position`` samples were consumed, for logs.

        Returns:
            One dict per stream: ``stream``, ``fingerprint``, ``lanes``,
            ``epoch`` (the epoch its lanes are in: they differ by at most one
            step, and a lane that took the epoch's last step stays in it until
            all have), ``samples`` (consumed in total), ``samples_in_epoch``
            (of ``epoch``, in ``[0, samples_read_per_epoch]``), ``samples_read_per_epoch`` (after the
            lane cut), ``stream_samples`` (one pass over every block, before
            the cut) and ``lane_steps_per_epoch``. ``epoch_samples`` is the
            old name of ``samples_read_per_epoch``, kept as an alias.
        """
        lanes = self.config.lanes
        done, extra = divmod(int(position), lanes)
        ahead = np.bincount(self.lane_stream[:extra], minlength=len(self.streams))
        out = []
        for plan in self.streams:
            samples = plan.lanes * done + int(ahead[plan.index])
            epoch = done // plan.lane_length if plan.lanes else 0
            out.append(
                {
                    "stream": plan.index,
                    "fingerprint": plan.shape.fingerprint,
                    "lanes": plan.lanes,
                    "epoch": epoch,
                    "samples": samples,
                    "samples_in_epoch": samples - epoch * plan.samples_read_per_epoch,
                    "samples_read_per_epoch": plan.samples_read_per_epoch,
                    "epoch_samples": plan.samples_read_per_epoch,
                    "stream_samples": plan.stream_samples,
                    "lane_steps_per_epoch": plan.lane_length,
                }
            )
        return out
