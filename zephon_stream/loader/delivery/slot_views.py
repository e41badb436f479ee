"""The CPU tensors of each ring slot, made once and handed over again each time the slot comes round.

A torch tensor costs 1.5-2 us to make (``from_numpy``, or one view of
``unbind``), and at tiny steps that was most of the trainer's ``next()``: four
keys a step, and in a slot of 16 steps 64 views. A slot always holds the same
bytes at the same place, so its tensors (and its steps' views) are made the
first time the slot is delivered and kept; the consumer gets fresh dicts of
the same tensors.

What tells that the consumer is done with a slot: nothing outside this cache
refers to any of its tensors (their Python reference counts) or to their
memory (the use count of each tensor's storage, which counts every tensor
made from it, views of views and ``detach()`` included). Both are compared
with what they were when the cache was made. Where torch does not offer the
storage's use count, tensors are made afresh at each delivery, as before.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

import numpy as np
import torch

# torch's own count of the references to a storage (c10 intrusive_ptr
# use_count); private, hence looked up, with the uncached way as the fallback.
_storage_use_count = getattr(torch._C, "_storage_Use_Count", None)


def _views_of(slab: np.ndarray, arrays: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """``arrays`` (views of ``slab``) as views of one tensor over ``slab``: they share one storage."""
    base = torch.from_numpy(slab)
    start = slab.__array_interface__["data"][0]
    out = {}
    for key, array in arrays.items():
        offset = array.__array_interface__["data"][0] - start
        assert array.flags.c_contiguous and offset >= 0 and offset + array.nbytes <= slab.nbytes, key
        dtype = torch.from_numpy(np.empty(0, array.dtype)).dtype
        out[key] = base[offset : offset + array.nbytes].view(dtype).view(array.shape)
    return out


def slot_tensors(
    arrays: Mapping[str, np.ndarray], steps_per_slot: int, slab: np.ndarray | None = None
) -> tuple[dict[str, torch.Tensor], list[dict[str, torch.Tensor]]]:
    """The slot's arrays as tensors, and each step's views of them when the
    slot holds several steps. With ``slab`` (the slot's bytes, which the
    arrays view) every tensor is a view of one storage over it."""
    whole = (
        _views_of(slab, arrays) if slab is not None else {key: torch.from_numpy(array) for key, array in arrays.items()}
    )
    if steps_per_slot == 1:
        return whole, []
    keys = list(whole)
    # A slot's steps are its rows in step order, so in either batch
    # layout ([rows, L], or 1-D with the rows end to end) a step is an equal,
    # contiguous stretch of dim 0. One unbind per key (a torch slice per step and key cost ~2.5 us,
    # split ~15% more than unbind).
    parts = [whole[key].unflatten(0, (steps_per_slot, -1)).unbind(0) for key in keys]
    return whole, [dict(zip(keys, views)) for views in zip(*parts)]


class SlotViews:
    """The tensors of one slot: the whole slot's, and each step's views when the slot holds several steps.

    Args:
        arrays: the slot's arrays by key (views of ``slab``).
        steps_per_slot: consecutive steps the slot holds, rows in step order.
        slab: the slot's bytes.
    """

    def __init__(self, arrays: Mapping[str, np.ndarray], steps_per_slot: int, slab: np.ndarray) -> None:
        self.steps_per_slot = steps_per_slot
        # Every tensor of the slot views one storage, so one use count
        # says whether any view of any of them is still held.
        self.whole, self.steps = slot_tensors(arrays, steps_per_slot, slab)
        self._tensors = (*self.whole.values(), *(t for step in self.steps for t in step.values()))
        # The storage's address, taken once (making a storage object
        # per check cost ~0.3 us); it stays valid while the tensors here hold
        # the storage. No storage object is kept: a consumer's own storage
        # object (the same Python object while one is alive) must count as a use.
        self._cdata = next(iter(self.whole.values())).untyped_storage()._cdata
        self._idle_refs = list(map(sys.getrefcount, self._tensors))
        self._idle_uses = _storage_use_count(self._cdata)

    def in_use(self) -> bool:
        """Whether anything outside this cache refers to the slot's tensors or their memory."""
        # Counted as in __init__ (the tuple and the call's argument), so
        # only references from outside differ; the storage's use count then
        # covers views made from the tensors.
        return (
            list(map(sys.getrefcount, self._tensors)) != self._idle_refs
            or _storage_use_count(self._cdata) != self._idle_uses
        )


def cached_views_available() -> bool:
    """Whether this torch tells a storage's use count (else every delivery makes its tensors afresh)."""
    return _storage_use_count is not None
