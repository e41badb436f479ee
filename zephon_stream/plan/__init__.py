"""The global order: a pure function from one integer cursor to sample addresses.

Standard library, numpy and ``zephon_stream.errors`` only; no I/O, no torch.
docs/ORDER.md specifies the order exactly. The API::

    shape = StreamShape.from_counts(fingerprint, block_tokens, counts)   # or
    shape = StreamShape(fingerprint=..., block_tokens=..., num_blocks=...,
                        short_ids=[...], short_counts=[...])
    order = GlobalOrder([shape, ...], OrderConfig(seed=0, seq_len=2048, lanes=C,
                                                  window=0, weights=("1",)))
    stream, block, sample = order.sample_at(positions)       # int64 arrays
    piece = order.rank_slice(P, B, W, r)   # RankSlice(positions, stream, block, sample)
    plan = order.blocks_for(P, B, W, r, steps)  # BlockPlan(stream, block, first_step,
                                                #           last_step, samples)
    state = order.state(P)                 # LoaderState; .to_dict() / .from_dict()
    LoaderState.from_dict(d).validate(order.state(0))   # StateMismatchError per field
    order.progress(P)                      # per-stream epoch and samples, for logs

A schedule (docs/ORDER.md, "Schedules") changes the mixture, batch, lanes or
seq_len at given steps; each phase is a ``GlobalOrder`` read on from where
every stream stood::

    order = ScheduleOrder(shapes, [SchedulePhase(start_step=0, global_batch=B0, seq_len=L0),
                                   SchedulePhase(start_step=N1, global_batch=B1, seq_len=L1,
                                                 weights=(...))], seed=0)
    piece = order.rank_slice(step, W, r)   # PhaseSlice(phase, first_step, positions, ...)
    pieces = order.rank_steps(step, k, W, r)   # one PhaseSlice per phase, [steps, rows]
    state = order.state(P)                 # ScheduleState v2; .from_dict(d).validate(order)
    EvalOrder(shapes, seq_len).rank_slice(t, B, W, r)   # evaluation: sequential, padded

A sample ``(stream, block, sample)`` is tokens
``[sample * seq_len, sample * seq_len + seq_len + 1)`` of that block.
"""

from zephon_stream.plan.evaluation import EvalOrder, EvalSlice
from zephon_stream.plan.mixture import OrderConfig, canonical_weights, lane_map, split_lanes
from zephon_stream.plan.order import GlobalOrder, StreamPlan
from zephon_stream.plan.permutation import derive_key, derive_key_int, permute, permute_int
from zephon_stream.plan.schedule import PhaseSlice, SchedulePhase, StreamCarry
from zephon_stream.plan.schedule_order import ScheduleOrder
from zephon_stream.plan.schedule_state import SCHEDULE_STATE_VERSION, ScheduleState
from zephon_stream.plan.shape import StreamShape
from zephon_stream.plan.slicing import BlockPlan, RankSlice, rank_positions, step_positions
from zephon_stream.plan.state import STATE_VERSION, LoaderState

__all__ = [
    "SCHEDULE_STATE_VERSION",
    "STATE_VERSION",
    "BlockPlan",
    "EvalOrder",
    "EvalSlice",
    "GlobalOrder",
    "LoaderState",
    "OrderConfig",
    "PhaseSlice",
    "RankSlice",
    "ScheduleOrder",
    "SchedulePhase",
    "ScheduleState",
    "StreamCarry",
    "StreamPlan",
    "StreamShape",
    "canonical_weights",
    "derive_key",
    "derive_key_int",
    "lane_map",
    "permute",
    "permute_int",
    "rank_positions",
    "split_lanes",
    "step_positions",
]
