"""Delivery: ring slots -> the tensors the consumer receives, in the trainer's process.

What the trainer does per step is kept to: take a slot, start its copy (CUDA)
or wrap it (CPU), hand the tensors over.

On CPU the consumer gets ``int64`` tensors that are views of the slot, without
a copy, in the batch layout the loader was built with (``"rows"`` or
``"tokens"``, loader/delivery/widen.py); the 1-D views of ``"tokens"`` are
made with the slot's other tensors, once. A slot goes back to the producer
once nothing refers to it any more, that is once the consumer has dropped
every tensor (or view) of that batch. A consumer that keeps more than
``max_held`` batches gets copies of the further ones (in the same layout), so
it can keep batches as long as it likes without stalling the ring.

With CUDA the ring is registered as pinned memory. Per step one transfer moves
the slot's narrow part (token windows at the stored width, EOS ids, sample
positions) on a side stream, kernels on that stream widen it to ``input``,
``labels`` and ``positions``, and the consumer's stream waits on an event:
the copy overlaps compute and the host never waits for it. A slot goes back
to the producer once its transfer has finished and, with host labels, once
the consumer has dropped its views and its stream has run past any copy it
queued from them (loader/delivery/handback.py).
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Mapping

import numpy as np
import torch

from zephon_stream.loader.delivery.handback import SlotReturns
from zephon_stream.loader.delivery.slot_views import SlotViews, cached_views_available, slot_tensors
from zephon_stream.loader.delivery.widen import laid_out, widen
from zephon_stream.loader.ring.row_documents import host_scalars
from zephon_stream.loader.ring.shared_ring import WIDE_KEYS, SharedRing

BATCH_KEYS = ("input", "labels", "positions", "sample_positions")
# Batches a CPU consumer may keep without a copy: the current step and
# the one before.
MAX_HELD_BATCHES = 2
# With CUDA host labels, slots whose views the consumer has dropped but
# whose release event (loader/delivery/handback.py) has not completed yet: a consumer
# whose stream runs behind by that many steps still gets views, not copies.
# Also covers the event recorded on an idle stream and queried at once.
PENDING_RELEASE_SLOTS = 2


def resolve_device(device: str | torch.device | None) -> torch.device:
    """The device batches go to; CUDA falls back to CPU (with a warning) when absent.

    Raises:
        ValueError: a device other than CPU and CUDA, or ``"cuda"`` without an
            index that would pick another GPU than ``LOCAL_RANK``'s (see
            :func:`cuda_index`).
    """
    if device is None:
        return torch.device("cpu")
    resolved = torch.device(device)
    if resolved.type == "cuda" and not torch.cuda.is_available():
        warnings.warn("device='cuda' requested but CUDA is not available; delivering CPU tensors", stacklevel=3)
        return torch.device("cpu")
    if resolved.type not in ("cpu", "cuda"):
        raise ValueError(f"device {device!r}: only 'cpu' and 'cuda' are supported")
    if resolved.type == "cuda" and resolved.index is None:
        index = cuda_index(
            device_count=torch.cuda.device_count(), current_device=torch.cuda.current_device(), env=os.environ
        )
        resolved = torch.device("cuda", index)
    return resolved


def cuda_index(*, device_count: int, current_device: int, env: Mapping[str, str]) -> int:
    """The GPU that ``device="cuda"`` (no index) means: the current device.

    Args:
        device_count: CUDA devices visible to this process.
        current_device: ``torch.cuda.current_device()``.
        env: the environment (``LOCAL_RANK`` is read from it).

    Raises:
        ValueError: ``LOCAL_RANK`` is set (torchrun), more than one GPU is
            visible and the current device is not ``LOCAL_RANK``: a script
            that builds the loader before ``torch.cuda.set_device`` would send
            every rank's batches to the same GPU.
    """
    local_rank = env.get("LOCAL_RANK")
    if local_rank is None or device_count <= 1:
        return current_device
    try:
        wanted = int(local_rank)
    except ValueError:
        raise ValueError(
            f"LOCAL_RANK={local_rank!r} is not an integer; pass device='cuda:N' to choose the GPU"
        ) from None
    if wanted != current_device:
        raise ValueError(
            f"device='cuda' names no GPU and the current CUDA device is {current_device}, but LOCAL_RANK is "
            f"{wanted} with {device_count} GPUs visible: every rank would deliver to GPU {current_device}. Call "
            f"torch.cuda.set_device({wanted}) before building the loader, or pass device='cuda:{wanted}'."
        )
    return current_device


class CpuDelivery:
    """Slots handed over as CPU tensors without a copy.

    Args:
        ring: the batch ring (its layout holds all three wide arrays).
        max_held: batches the consumer may keep before it gets copies.
        batch_layout: ``"rows"`` or ``"tokens"`` (the per-token arrays as 1-D views).

    Attributes:
        held: slots handed over as views, in order, not handed back yet.
        done: slots handed over as copies, to hand back at the next reclaim.
        views: each slot's tensors once made (None before), or None throughout
            where torch does not tell a storage's use count.
        cached: whether slots' tensors are made once and kept (``views``).
    """

    def __init__(self, *, ring: SharedRing, max_held: int = MAX_HELD_BATCHES, batch_layout: str = "rows") -> None:
        assert ring.layout.wide_keys == WIDE_KEYS
        self._ring = ring
        self.max_held = max_held
        self.held: list[int] = []
        self.done: list[int] = []
        # The arrays each slot hands over, made once. A tensor the
        # consumer holds (or any view of it) keeps one reference to its array,
        # so the arrays' reference counts say when a slot is free again. Under
        # "tokens" the per-token arrays are 1-D views, so the tensors made
        # from them (and a slot's steps' views) are 1-D from the start.
        self._arrays: list[dict[str, np.ndarray]] = []
        for index in range(ring.num_slots):
            slot = ring.slot(index)
            arrays = {**slot.wide, "sample_positions": slot.sample_positions, **slot.packing}
            self._arrays.append(laid_out(arrays, batch_layout))
        # Each slot's tensors, made at its first delivery (loader/delivery/slot_views.py).
        self.views: list[SlotViews | None] = [None] * ring.num_slots
        self.cached = cached_views_available()

    def _slot_views(self, index: int, steps_per_slot: int) -> SlotViews:
        views = self.views[index]
        if views is None or views.steps_per_slot != steps_per_slot:
            views = self.views[index] = SlotViews(self._arrays[index], steps_per_slot, self._ring.slab(index))
        return views

    def deliver(self, index: int) -> dict[str, torch.Tensor]:
        """The consumer's tensors for slot ``index`` (a slot of one step)."""
        if not self.cached:
            return self.deliver_steps(index, steps_per_slot=1, steps=1)[0]
        views = self.views[index]
        if views is None or views.steps_per_slot != 1:
            views = self._slot_views(index, 1)
        if len(self.held) < self.max_held:
            self.held.append(index)
            return dict(views.whole)
        self.done.append(index)
        return {key: tensor.clone() for key, tensor in views.whole.items()}

    def deliver_steps(self, index: int, *, steps_per_slot: int, steps: int) -> list[dict[str, torch.Tensor]]:
        """The consumer's tensors for the first ``steps`` of the ``steps_per_slot`` steps slot ``index`` holds."""
        if self.cached:
            views = self._slot_views(index, steps_per_slot)
            whole, per_step = views.whole, views.steps
        else:
            whole, per_step = slot_tensors(self._arrays[index], steps_per_slot)
        batches = [dict(step) for step in per_step[:steps]] if per_step else [dict(whole)]
        if len(self.held) < self.max_held:
            self.held.append(index)
            return batches
        # The consumer keeps earlier batches; these are copied so the
        # slot can go back to the producer.
        self.done.append(index)
        return [{key: tensor.clone() for key, tensor in batch.items()} for batch in batches]

    def _in_use(self, index: int) -> bool:
        views = self.views[index]
        if views is not None:
            return views.in_use()
        # 3 = the dict's entry, the loop variable and getrefcount's argument.
        return any(sys.getrefcount(array) > 3 for array in self._arrays[index].values())

    def reclaim(self) -> list[int]:
        """Slots the consumer no longer refers to, handed back once each."""
        free, self.done = self.done, []
        views = self.views
        for index in tuple(self.held):
            slot = views[index]
            if not (slot.in_use() if slot is not None else self._in_use(index)):
                self.held.remove(index)
                free.append(index)
        return free

    def settle(self) -> tuple[int, ...]:
        """Before a new producer starts: the slots still held (the rest are
        free for it, including those not yet handed back)."""
        self.done = []
        return tuple(self.held)

    def close(self) -> None:
        """Drop this delivery's arrays (batches the consumer holds stay valid)."""
        self.held, self.done, self._arrays, self.views = [], [], [], []


class CudaDelivery:
    """Narrow copies from the pinned ring to one CUDA device, widened there.

    Args:
        ring: the batch ring; registered as pinned memory here.
        device: the target CUDA device.
        host_keys: keys delivered as CPU tensors instead (TorchTitan's trainer
            counts valid ``labels`` on the CPU); the ring's layout holds them wide.
        batch_layout: ``"rows"`` or ``"tokens"`` (views of the widened rows, and of the host keys).
    """

    def __init__(
        self, *, ring: SharedRing, device: torch.device, host_keys: tuple[str, ...] = (), batch_layout: str = "rows"
    ) -> None:
        assert device.type == "cuda" and device.index is not None
        assert set(host_keys) <= set(ring.layout.wide_keys)
        self.device = device
        self._ring = ring
        self._host_keys = host_keys
        self._batch_layout = batch_layout
        self._registered = False
        with torch.cuda.device(device):
            self.copy_stream = torch.cuda.Stream(device=device)
            array = ring.as_array()
            # 1 = cudaHostRegisterPortable: pinned for every CUDA context.
            status = torch.cuda.cudart().cudaHostRegister(array.ctypes.data, array.nbytes, 1)
            if int(status) != 0:
                raise RuntimeError(
                    f"cudaHostRegister of the {array.nbytes}-byte batch ring failed (status {int(status)})"
                )
        self._registered = True
        self._ring_tensor = torch.from_numpy(array)
        self._returns = SlotReturns(
            referenced=ring.slot_in_use,
            record_release=self._record_release,
            max_viewed=MAX_HELD_BATCHES + PENDING_RELEASE_SLOTS,
        )

    def slots_pinned(self) -> bool:
        """Whether the ring is page-locked memory as CUDA sees it."""
        return bool(self._ring_tensor.is_pinned())

    def deliver(self, index: int) -> dict[str, torch.Tensor]:
        """Start slot ``index``'s copy and widening; the consumer's stream waits for them."""
        start, _ = self._ring.slot_range(index)
        host = self._ring_tensor[start : start + self._ring.layout.device_bytes]
        with torch.cuda.device(self.device), torch.cuda.stream(self.copy_stream):
            raw = host.to(self.device, non_blocking=True)
            copied = torch.cuda.Event()
            copied.record(self.copy_stream)
            batch = widen(raw, self._ring.layout, self._batch_layout)
            ready = torch.cuda.Event()
            ready.record(self.copy_stream)
        consumer = torch.cuda.current_stream(self.device)
        consumer.wait_event(ready)
        for tensor in batch.values():
            # Allocated on the copy stream; the caching allocator must
            # know the consumer's stream uses them too.
            tensor.record_stream(consumer)
        # As on CPU, a consumer that keeps more batches (TorchTitan keeps
        # a whole step's microbatches under gradient accumulation) gets copies
        # of the host keys, so the ring never runs dry under it.
        viewed = self._returns.add(index, copied=copied, host_keys=bool(self._host_keys))
        if self._ring.layout.packing.outputs:
            batch.update(host_scalars(self._ring.slot(index).packing))
        if self._host_keys:
            host = laid_out(self._ring.slot(index).wide, self._batch_layout)
            for key in self._host_keys:
                host_tensor = torch.from_numpy(host[key])
                batch[key] = host_tensor if viewed else host_tensor.clone()
        return batch

    def _record_release(self) -> torch.cuda.Event:
        # The consumer dropped its views of a slot; copies it queued from
        # them (labels.to(device, non_blocking=True)) are on its stream.
        released = torch.cuda.Event()
        released.record(torch.cuda.current_stream(self.device))
        return released

    def reclaim(self) -> list[int]:
        """Slots whose copy has finished and, with host keys, whose views the
        consumer has dropped and whose stream has run past them. All but the
        last delivered copy are waited for, so the producer always has slots
        to fill (loader/delivery/handback.py)."""
        return self._returns.reclaim()

    def settle(self) -> tuple[int, ...]:
        """Before a new producer starts: wait for copies in flight; the slots
        still held (host views the consumer keeps, or its copies from them
        still queued)."""
        return self._returns.settle()

    def close(self) -> None:
        """Wait for copies in flight and, if host views were handed out, for
        the consumer's stream (it may still be copying from them); then
        unregister the ring."""
        self._returns.wait()
        if self._returns.views_handed_out:
            torch.cuda.current_stream(self.device).synchronize()
        if self._registered:
            torch.cuda.cudart().cudaHostUnregister(self._ring.as_array().ctypes.data)
            self._registered = False
        self._ring_tensor = None  # type: ignore[assignment]


def make_delivery(
    device: torch.device, *, ring: SharedRing, host_keys: tuple[str, ...] = (), batch_layout: str = "rows"
) -> CpuDelivery | CudaDelivery:
    """The delivery for ``device`` (from :func:`resolve_device`), in ``batch_layout``."""
    if device.type == "cuda":
        return CudaDelivery(ring=ring, device=device, host_keys=host_keys, batch_layout=batch_layout)
    return CpuDelivery(ring=ring, batch_layout=batch_layout)


def ring_wide_keys(device: torch.device, host_keys: tuple[str, ...]) -> tuple[str, ...]:
    """The int64 arrays the producer widens on the host for ``device``."""
    if device.type == "cpu":
        return WIDE_KEYS
    return tuple(key for key in WIDE_KEYS if key in host_keys)


def ring_slots(prefetch_steps: int, *, host_views: bool = False) -> int:
    """Slots the ring needs: the steps queued ahead, the one being assembled,
    the ones the consumer holds as views (CPU tensors, or CUDA host labels),
    the one just delivered (on CUDA, its copy may be in flight) and, with
    CUDA host labels (``host_views``), those waiting for their release event."""
    return prefetch_steps + 1 + MAX_HELD_BATCHES + 1 + (PENDING_RELEASE_SLOTS if host_views else 0)
