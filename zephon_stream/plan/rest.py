"""The rest of a stream's epoch in progress at a schedule boundary, and how it is read.

docs/ORDER.md ("Schedules") specifies it. At a boundary a stream's lanes have
read the same number of lane steps of its current epoch, give or take one. What
they have not read yet is a list of index ranges into a *base* sequence:

- ``LaneBase``: the epoch as one phase cut it into lanes. Index ``u`` is lane
  step ``u mod m`` of the stream's lane ``u div m``, so ``u`` is also the
  unshuffled epoch index, and it is read through that phase's window shuffle.
- ``BlockBase``: after a seq_len change, a list of block-slot ranges of the
  epoch's block order, each block's samples at the new seq_len permuted within
  the block (key ``TAG_REST_BLOCK, seed, stream, epoch, slot, seq_len``).

The next phase reads the ranges concatenated, cut into its own lanes; a later
boundary inside the same epoch only selects sub-ranges again, so the base never
nests.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from zephon_stream.plan.order import GlobalOrder
from zephon_stream.plan.permutation import (
    TAG_BLOCKS,
    TAG_REST_BLOCK,
    KeyedPermutation,
    derive_key,
    derive_key_int,
    permute,
)
from zephon_stream.plan.shape import StreamShape

# Below this many samples numpy's per-call overhead dominates a block
# lookup; one step of one rank is a handful of samples.
_SMALL = 64
_BLOCK_CACHE = 65536


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class EpochSlots:
    """Epoch index <-> (block slot, sample) of one stream at one seq_len.

    Slots ``[0, F)`` are the permuted full blocks, slots ``[F, N)`` the short
    blocks in id order, as in step 1 of the order of one stream.
    """

    shape: StreamShape
    seq_len: int
    samples_per_block: int
    cum: np.ndarray
    cum_list: list[int] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "cum_list", self.cum.tolist())

    @classmethod
    def of(cls, shape: StreamShape, seq_len: int) -> EpochSlots:
        """The slots of ``shape`` at ``seq_len``."""
        counts = shape.short_block_samples(seq_len)
        cum = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        return cls(shape=shape, seq_len=seq_len, samples_per_block=shape.samples_per_full_block(seq_len), cum=cum)

    def short_cum(self) -> np.ndarray:
        """Samples of the short blocks before each short block, then their total."""
        return self.cum

    def slot_start(self, slots: np.ndarray) -> np.ndarray:
        """Epoch index of the first sample of each slot (``S`` for slot ``N``)."""
        slots = np.asarray(slots, dtype=np.int64)
        full = self.shape.num_full_blocks
        short = self.short_cum()[np.maximum(slots - full, 0)]
        return np.minimum(slots, full) * self.samples_per_block + short

    def slot_of(self, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(slot, sample in block)`` of epoch indices."""
        index = np.asarray(index, dtype=np.int64)
        spb, full = self.samples_per_block, self.shape.num_full_blocks
        in_full = index < full * spb
        slot = np.where(in_full, index // max(spb, 1), 0)
        sample = np.where(in_full, index % max(spb, 1), 0)
        if not in_full.all():
            cum = self.short_cum()
            rest = index - full * spb
            k = np.searchsorted(cum, rest, side="right") - 1
            slot = np.where(in_full, slot, full + k)
            sample = np.where(in_full, sample, rest - cum[np.minimum(k, cum.size - 1)])
        return slot, sample

    def slot_start_int(self, slot: int) -> int:
        """``slot_start`` of one slot, on Python ints."""
        full = self.shape.num_full_blocks
        return min(slot, full) * self.samples_per_block + self.cum_list[max(slot - full, 0)]

    def slot_of_int(self, index: int) -> tuple[int, int]:
        """``slot_of`` one epoch index, on Python ints."""
        spb, full = self.samples_per_block, self.shape.num_full_blocks
        if index < full * spb:
            return divmod(index, spb)
        rest = index - full * spb
        k = bisect.bisect_right(self.cum_list, rest) - 1
        return full + k, rest - self.cum_list[k]

    def ceil_slot(self, index: np.ndarray) -> np.ndarray:
        """The slot that holds each epoch index, plus one when the index is not its slot's first sample.

        The slot that holds index ``i`` is the one whose samples include it;
        a short block holding no sample at this seq_len holds no index, so it
        is never the slot of ``i`` even where it starts at ``i`` (several
        slots may start at one index: the one returned is the last of them,
        the one holding ``i``). For ``i`` = the epoch's total, the result is
        the slot count.
        """
        slot, sample = self.slot_of(index)
        return slot + (sample > 0)


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class LaneBase:
    """Epoch ``epoch`` of stream ``stream`` as ``order`` cut it into lanes.

    Attributes:
        order: the phase's order (its seq_len, lanes and window).
        stream: stream index.
        epoch: the stream's epoch.
        global_lanes: the global lane of each of the stream's lanes in ``order``.
    """

    order: GlobalOrder
    stream: int
    epoch: int
    global_lanes: np.ndarray
    lane_list: list[int] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "lane_list", self.global_lanes.tolist())

    @property
    def seq_len(self) -> int:
        return self.order.config.seq_len

    def addresses_small(self, index: list[int]) -> list[tuple[int, int]]:
        """``addresses`` of a few base indices, with one call into the order."""
        m, lanes = self.order.streams[self.stream].lane_length, self.order.lanes
        positions = [(self.epoch * m + u % m) * lanes + self.lane_list[u // m] for u in index]
        _, block, sample = self.order.sample_at(np.array(positions, dtype=np.int64))
        return list(zip(block.tolist(), sample.tolist()))

    def addresses(self, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(block, sample)`` read at base indices (lane ``u div m``, step ``u mod m``)."""
        m = self.order.streams[self.stream].lane_length
        lane, step = np.divmod(np.asarray(index, dtype=np.int64), m)
        positions = (self.epoch * m + step) * self.order.lanes + self.global_lanes[lane]
        _, block, sample = self.order.sample_at(positions)
        return block, sample

    def epoch_index(self, index: np.ndarray) -> np.ndarray:
        """Unshuffled epoch index at ``seq_len``: the base index itself."""
        return np.asarray(index, dtype=np.int64)


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class BlockBase:
    """Block-slot ranges of epoch ``epoch``, each block's samples permuted at ``seq_len``.

    The permutation maps each block's base indices onto themselves, so
    the unread part of the base stays a list of index ranges at any later
    boundary; within a block the samples are read in shuffled order, as the
    window shuffle of an ordinary epoch would.

    Attributes:
        slots: ``EpochSlots`` at ``seq_len``.
        seed: order seed.
        stream: stream index.
        epoch: the stream's epoch (its block permutation).
        lo, hi: slot ranges ``[lo, hi)``, disjoint, each holding samples.
        cum: base index of each range's first sample, then the total.
        block_of_slot: slot -> block id (cached; full slots permuted by the epoch's key).
        sample_permutation: slot -> the ``KeyedPermutation`` of its samples (cached).
    """

    slots: EpochSlots
    seed: int
    stream: int
    epoch: int
    lo: np.ndarray
    hi: np.ndarray
    cum: np.ndarray
    block_of_slot: Callable[[int], int]
    sample_permutation: Callable[[int], KeyedPermutation]
    lo_list: list[int] = field(init=False)
    cum_list: list[int] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "lo_list", self.lo.tolist())
        object.__setattr__(self, "cum_list", self.cum.tolist())

    @classmethod
    def from_ranges(
        cls, slots: EpochSlots, *, seed: int, stream: int, epoch: int, lo: np.ndarray, hi: np.ndarray
    ) -> BlockBase:
        counts = slots.slot_start(hi) - slots.slot_start(lo)
        keep = counts > 0
        lo, hi, counts = lo[keep], hi[keep], counts[keep]
        cum = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        shape = slots.shape
        full = shape.num_full_blocks
        permutation = KeyedPermutation(max(full, 1), derive_key_int(TAG_BLOCKS, seed, stream, epoch))
        adjusted = (shape.short_ids - np.arange(shape.short_ids.size)).tolist()
        short_ids = shape.short_ids.tolist()

        def block_of_slot(slot: int) -> int:
            if slot >= full:
                return short_ids[slot - full]
            block = permutation(slot)
            return block + bisect.bisect_right(adjusted, block)

        spb = slots.samples_per_block
        short_samples = shape.short_block_samples(slots.seq_len).tolist()

        def sample_permutation(slot: int) -> KeyedPermutation:
            count = spb if slot < full else short_samples[slot - full]
            key = derive_key_int(TAG_REST_BLOCK, seed, stream, epoch, slot, slots.seq_len)
            return KeyedPermutation(max(count, 1), key)

        return cls(
            slots=slots,
            seed=seed,
            stream=stream,
            epoch=epoch,
            lo=lo,
            hi=hi,
            cum=cum,
            block_of_slot=functools.lru_cache(maxsize=_BLOCK_CACHE)(block_of_slot),
            sample_permutation=functools.lru_cache(maxsize=_BLOCK_CACHE)(sample_permutation),
        )

    @property
    def seq_len(self) -> int:
        return self.slots.seq_len

    def epoch_index(self, index: np.ndarray) -> np.ndarray:
        index = np.asarray(index, dtype=np.int64)
        k = np.searchsorted(self.cum, index, side="right") - 1
        return self.slots.slot_start(self.lo[k]) + index - self.cum[k]

    def addresses_small(self, index: list[int]) -> list[tuple[int, int]]:
        """``addresses`` of a few base indices, on Python ints and cached permutations."""
        out = []
        for u in index:
            k = bisect.bisect_right(self.cum_list, u) - 1
            slot, j = self.slots.slot_of_int(self.slots.slot_start_int(self.lo_list[k]) + u - self.cum_list[k])
            out.append((self.block_of_slot(slot), self.sample_permutation(slot)(j)))
        return out

    def addresses(self, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        index = np.asarray(index, dtype=np.int64)
        if index.size <= _SMALL:
            out = np.array(self.addresses_small(index.ravel().tolist()), dtype=np.int64).reshape(-1, 2)
            return out[:, 0].reshape(index.shape), out[:, 1].reshape(index.shape)
        slot, sample = self.slots.slot_of(self.epoch_index(index))
        shape = self.slots.shape
        counts = np.full(slot.shape, self.slots.samples_per_block, dtype=np.int64)
        short = slot >= shape.num_full_blocks
        if short.any():
            counts[short] = shape.short_block_samples(self.seq_len)[slot[short] - shape.num_full_blocks]
        key = derive_key(TAG_REST_BLOCK, self.seed, self.stream, self.epoch, slot, self.seq_len)
        sample = permute(sample, counts, key)
        full = shape.num_full_blocks
        block = np.empty_like(slot)
        in_full = slot < full
        if in_full.any():
            key = derive_key_int(TAG_BLOCKS, self.seed, self.stream, self.epoch)
            ids = permute(slot[in_full], full, key)
            adjusted = shape.short_ids - np.arange(shape.short_ids.size)
            block[in_full] = ids + np.searchsorted(adjusted, ids, side="right")
        if not in_full.all():
            block[~in_full] = shape.short_ids[slot[~in_full] - full]
        return block, sample


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class EpochRest:
    """The unread rest of one stream's epoch: ranges of a base, read concatenated.

    Attributes:
        base: a ``LaneBase`` or ``BlockBase``.
        starts: base index of each range.
        cum: index in the concatenation of each range's start, then the total.
    """

    base: LaneBase | BlockBase
    starts: np.ndarray
    cum: np.ndarray
    starts_list: list[int] = field(init=False)
    cum_list: list[int] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "starts_list", self.starts.tolist())
        object.__setattr__(self, "cum_list", self.cum.tolist())

    @classmethod
    def from_ranges(cls, base: LaneBase | BlockBase, lo: np.ndarray, hi: np.ndarray) -> EpochRest:
        lo, hi = np.asarray(lo, dtype=np.int64), np.asarray(hi, dtype=np.int64)
        keep = hi > lo
        lo, hi = lo[keep], hi[keep]
        cum = np.concatenate([[0], np.cumsum(hi - lo)]).astype(np.int64)
        return cls(base=base, starts=lo, cum=cum)

    @property
    def epoch(self) -> int:
        return self.base.epoch

    @property
    def seq_len(self) -> int:
        return self.base.seq_len

    @property
    def total(self) -> int:
        """Samples left in the rest."""
        return int(self.cum[-1])

    def base_index(self, index: np.ndarray) -> np.ndarray:
        """Base index of concatenation indices."""
        index = np.asarray(index, dtype=np.int64)
        k = np.searchsorted(self.cum, index, side="right") - 1
        return self.starts[k] + index - self.cum[k]

    def addresses_small(self, index: list[int]) -> list[tuple[int, int]]:
        """``(block, sample)`` at a few concatenation indices, on Python ints."""
        base = []
        for t in index:
            k = bisect.bisect_right(self.cum_list, t) - 1
            base.append(self.starts_list[k] + t - self.cum_list[k])
        return self.base.addresses_small(base)

    def addresses(self, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(block, sample)`` at concatenation indices."""
        return self.base.addresses(self.base_index(index))

    def select(self, lo: np.ndarray, hi: np.ndarray) -> EpochRest:
        """The sub-ranges ``[lo, hi)`` of the concatenation, in that order, as a new rest."""
        base_lo, base_hi = self._split(lo, hi)
        return EpochRest.from_ranges(self.base, base_lo, base_hi)

    def _split(self, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Concatenation ranges -> base ranges, split where the concatenation jumps.

        Split at every range of this rest, even where one range ends at
        the base index the next begins, and never merged: a later seq_len
        change converts each range on its own (docs/ORDER.md).
        """
        lo, hi = np.asarray(lo, dtype=np.int64), np.asarray(hi, dtype=np.int64)
        keep = hi > lo
        lo, hi = lo[keep], hi[keep]
        first = np.searchsorted(self.cum, lo, side="right") - 1
        last = np.searchsorted(self.cum, hi - 1, side="right") - 1
        pieces = last - first + 1
        owner = np.repeat(np.arange(lo.size), pieces)
        k = np.repeat(first, pieces) + (np.arange(owner.size) - np.repeat(np.cumsum(pieces) - pieces, pieces))
        a = np.maximum(lo[owner], self.cum[k])
        b = np.minimum(hi[owner], self.cum[k + 1])
        return self.starts[k] + a - self.cum[k], self.starts[k] + b - self.cum[k]

    def at_seq_len(self, slots: EpochSlots, *, seed: int, stream: int) -> EpochRest:
        """This rest in whole blocks at another seq_len (docs/ORDER.md, "seq_len changes").

        Each range ``[a, b)`` of unshuffled epoch indices becomes the slots
        ``[ceil_slot(a), ceil_slot(b))``: a block a range starts inside is
        skipped, a block it ends inside is read whole.
        """
        base_lo, base_hi = self.starts, self.starts + np.diff(self.cum)
        old = self.base.slots if isinstance(self.base, BlockBase) else EpochSlots.of(slots.shape, self.seq_len)
        epoch_lo = self.base.epoch_index(base_lo)
        # base_hi - 1 is inside the range; + 1 gives its exclusive end.
        epoch_hi = self.base.epoch_index(base_hi - 1) + 1
        lo, hi = old.ceil_slot(epoch_lo), old.ceil_slot(epoch_hi)
        keep = hi > lo
        block_base = BlockBase.from_ranges(slots, seed=seed, stream=stream, epoch=self.epoch, lo=lo[keep], hi=hi[keep])
        return EpochRest.from_ranges(block_base, block_base.cum[:-1], block_base.cum[1:])
