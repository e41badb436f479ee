"""How a rest's ranges are delimited (docs/ORDER.md, "Schedules"): kept as made,
never merged, each converted on its own at a seq_len change; and what the slot
of an epoch index is when short blocks hold no sample."""

from __future__ import annotations

import numpy as np

from zephon_stream.plan.mixture import OrderConfig
from zephon_stream.plan.order import GlobalOrder
from zephon_stream.plan.rest import EpochRest, EpochSlots, LaneBase
from zephon_stream.plan.shape import StreamShape

# Two short blocks hold no sample at seq_len 16 (3 and 9 tokens), one holds one (20).
SHAPE = StreamShape.from_counts("fp", 65, [65] * 12 + [20, 9, 3])


def lane_rest(starts, ends):
    order = GlobalOrder([SHAPE], OrderConfig(seed=1, seq_len=16, lanes=4, window=0, weights=(1,)))
    return EpochRest.from_ranges(LaneBase(order=order, stream=0, epoch=0, global_lanes=np.arange(4)), starts, ends)


def test_ranges_are_kept_as_made_and_a_selection_splits_at_each_of_them():
    rest = lane_rest([0, 10], [10, 20])
    assert rest.starts.tolist() == [0, 10] and rest.cum.tolist() == [0, 10, 20]
    picked = rest.select(np.array([5]), np.array([15]))
    assert picked.starts.tolist() == [5, 10] and picked.cum.tolist() == [0, 5, 10]


def test_each_range_converts_on_its_own_and_the_slot_of_an_index_skips_empty_short_blocks():
    slots = EpochSlots.of(SHAPE, 16)
    full = 12 * 4  # 12 full blocks of 4 samples, then short blocks of 1, 0 and 0 samples
    assert slots.ceil_slot(np.array([0, 1, 4, full, full + 1])).tolist() == [0, 1, 1, 12, 15]
    # Epoch index full+1 is the total: the slots holding nothing start there too; the result is the count.
    converted = lane_rest([2, 9], [9, 13]).at_seq_len(EpochSlots.of(SHAPE, 32), seed=1, stream=0)
    # [2, 9) starts inside block 0 (skipped) and ends inside block 2 (read whole);
    # [9, 13) starts inside block 2 (skipped) and ends at block 3's end.
    assert converted.base.lo.tolist() == [1, 3] and converted.base.hi.tolist() == [3, 4]
