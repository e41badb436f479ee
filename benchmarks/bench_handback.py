"""What handing back slots whose host labels were viewed costs the trainer per step.

With ``host_labels=True`` on CUDA a slot goes back to the producer only once
an event recorded on the consumer's stream after the views were dropped has
completed (loader/delivery/handback.py). Per step that adds, in the trainer's thread:
one event recorded on the consumer's stream and its query, and the
bookkeeping of ``SlotReturns``. Measured over a real ring, per step (add a
delivered slot, hand the consumer its labels, the consumer drops them,
reclaim), in the same run:

- ``before``: the hand-back this replaces (the slot went back as soon as the
  views were dropped), the baseline;
- ``release events (host)``: ``SlotReturns`` with events that are already
  complete: the Python bookkeeping alone (any machine);
- ``release events (cuda)``: ``torch.cuda.Event`` recorded on the current
  stream, what CUDA delivery records (with CUDA only);
- ``clone``: the other way to make host labels safe, a copy of the labels
  every step (no views).

Each configuration runs ``--repeats`` times, interleaved; the best time per
step counts. The last printed line is one JSON object with the figures.

    python benchmarks/bench_handback.py [--rows 8 --seq-len 4096 --steps 20000]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from zephon_stream.loader import (
    MAX_HELD_BATCHES,
    PENDING_RELEASE_SLOTS,
    SharedRing,
    SlotLayout,
    SlotReturns,
    ring_slots,
)


class _Done:
    """An event that has completed (the copy ran long ago)."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


def _cuda_release() -> torch.cuda.Event:
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream())
    return event


class _Before:
    """The hand-back ``SlotReturns`` replaced: a viewed slot went back as soon
    as the consumer dropped its views (kept here as the baseline)."""

    def __init__(self, *, referenced, max_viewed: int) -> None:
        self._referenced = referenced
        self._max_viewed = max_viewed
        self._in_flight: list[tuple[int, _Done, bool]] = []

    def add(self, index: int, *, copied, host_keys: bool) -> bool:
        viewed = host_keys and sum(held for _, _, held in self._in_flight) < self._max_viewed
        self._in_flight.append((index, copied, viewed))
        return viewed

    def reclaim(self) -> list[int]:
        free, keep = [], []
        last = len(self._in_flight) - 1
        for position, (index, copied, viewed) in enumerate(self._in_flight):
            done = copied.query()
            if not done and position < last:
                copied.synchronize()
                done = True
            if done and (not viewed or not self._referenced(index)):
                free.append(index)
            else:
                keep.append((index, copied, viewed))
        self._in_flight = keep
        return free


def steps_us(ring: SharedRing, returns, *, steps: int, clone: bool) -> tuple[float, float]:
    """Microseconds per step (add a delivered slot, hand the consumer its
    labels, a view of the slot or a clone, the consumer drops them, reclaim)
    and the share of steps whose labels were views."""
    done = _Done()
    started = time.perf_counter()
    index, views = 0, 0
    for _ in range(steps):
        viewed = returns.add(index, copied=done, host_keys=not clone)
        views += viewed
        # Fresh views each step, as CUDA delivery makes them; views kept
        # across steps would hold every slot.
        labels = torch.from_numpy(ring.slot(index).wide["labels"])
        if not viewed:
            labels = labels.clone()
        del labels
        returns.reclaim()
        index = (index + 1) % ring.num_slots
    return (time.perf_counter() - started) / steps * 1e6, views / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    layout = SlotLayout(rows=args.rows, seq_len=args.seq_len, token_dtype="<u4", wide_keys=("labels",))
    ring = SharedRing.create(num_slots=ring_slots(4, host_views=True), layout=layout)
    referenced = ring.slot_in_use
    # The hand-back this replaces allowed MAX_HELD_BATCHES views; CUDA
    # delivery now allows the pending releases too. Both never run dry here.
    max_viewed = MAX_HELD_BATCHES + PENDING_RELEASE_SLOTS
    configs = {
        "before": lambda: _Before(referenced=referenced, max_viewed=max_viewed),
        "release events (host)": lambda: SlotReturns(
            referenced=referenced, record_release=_Done, max_viewed=max_viewed
        ),
        "clone": lambda: _Before(referenced=referenced, max_viewed=max_viewed),
    }
    if torch.cuda.is_available():
        configs["release events (cuda)"] = lambda: SlotReturns(
            referenced=referenced, record_release=_cuda_release, max_viewed=max_viewed
        )
    else:
        print("no CUDA device: release events measured with host events only (the Python bookkeeping)")
    best = {name: float("inf") for name in configs}
    viewed = {}
    try:
        for _ in range(args.repeats):
            for name, make in configs.items():
                took, viewed[name] = steps_us(ring, make(), steps=args.steps, clone=name == "clone")
                best[name] = min(best[name], took)
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
    finally:
        ring.close()

    baseline = best["before"]
    label_bytes = args.rows * args.seq_len * 8
    print(
        f"labels {args.rows} x {args.seq_len} int64 ({label_bytes / 2**20:.2f} MiB), {args.steps} steps, "
        f"best of {args.repeats}"
    )
    for name, took in best.items():
        print(
            f"  {name:24s} {took:8.2f} us/step   {took - baseline:+8.2f} us against before   "
            f"labels viewed at {viewed[name]:.0%} of steps"
        )
    figures = {
        "rows": args.rows,
        "seq_len": args.seq_len,
        "before_us_per_step": round(baseline, 3),
        **{
            f"{name.replace(' ', '_').replace('(', '').replace(')', '')}_added_us_per_step": round(took - baseline, 3)
            for name, took in best.items()
            if name != "before"
        },
        "viewed_share": {name: round(share, 3) for name, share in viewed.items()},
        "cuda": torch.cuda.is_available(),
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
