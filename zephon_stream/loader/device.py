"""Delivery: host batches -> the tensors the consumer receives.

On CPU each step gets fresh arrays that become the consumer's tensors without
a copy (the consumer may keep them as long as it likes). With CUDA, batches are
assembled into a ring of pinned host buffers; the producer thread starts a
non-blocking copy to the device on a side stream and records an event; the
consumer's stream waits on that event, so the copy overlaps compute and the
host never blocks on it. A ring slot is refilled only after its copy finished.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

import numpy as np
import torch

from zephon_stream.loader.assembler import HostBatch

BATCH_KEYS = ("input", "labels", "positions", "sample_positions")


def resolve_device(device: str | torch.device | None) -> torch.device:
    """The device batches go to; CUDA falls back to CPU (with a warning) when absent."""
    if device is None:
        return torch.device("cpu")
    resolved = torch.device(device)
    if resolved.type == "cuda" and not torch.cuda.is_available():
        warnings.warn("device='cuda' requested but CUDA is not available; delivering CPU tensors", stacklevel=3)
        return torch.device("cpu")
    if resolved.type not in ("cpu", "cuda"):
        raise ValueError(f"device {device!r}: only 'cpu' and 'cuda' are supported")
    if resolved.type == "cuda" and resolved.index is None:
        resolved = torch.device("cuda", torch.cuda.current_device())
    return resolved


class CpuDelivery:
    """Host batches handed over as CPU tensors without a copy, from recycled slabs.

    Each batch lives in one slab (``input``, ``labels``, ``positions`` and
    ``sample_positions`` are views of it). A slab is reused only when nothing
    but the pool refers to it any more, that is once the consumer has dropped
    every tensor (or view) of that batch; until then the consumer may keep its
    tensors as long as it likes. Reuse matters: a fresh multi-MiB array per
    step costs more in page faults than assembling the batch.

    Args:
        rows: local batch size.
        seq_len: ``L``.
        max_slabs: slabs kept for reuse; a batch past that uses fresh memory.
    """

    def __init__(self, *, rows: int, seq_len: int, max_slabs: int) -> None:
        self._rows = rows
        self._seq_len = seq_len
        self._max_slabs = max_slabs
        self._slabs: list[np.ndarray] = []

    @property
    def ring_bytes(self) -> int:
        """Pinned host memory held by the delivery itself (none on CPU)."""
        return 0

    def _slab(self) -> np.ndarray:
        for index in range(len(self._slabs)):
            # NOTE: 2 = the pool's list entry + getrefcount's argument; any view
            # or tensor the consumer still holds keeps a reference to the slab.
            if sys.getrefcount(self._slabs[index]) == 2:
                return self._slabs[index]
        slab = np.empty(3 * self._rows * self._seq_len + self._rows, np.int64)
        if len(self._slabs) < self._max_slabs:
            self._slabs.append(slab)
        return slab

    def acquire(self) -> HostBatch:
        """Buffers for the next step (producer thread)."""
        slab = self._slab()
        size = self._rows * self._seq_len
        shape = (self._rows, self._seq_len)
        return HostBatch(
            input=slab[:size].reshape(shape),
            labels=slab[size : 2 * size].reshape(shape),
            positions=slab[2 * size : 3 * size].reshape(shape),
            sample_positions=slab[3 * size :],
        )

    def publish(self, batch: HostBatch) -> Any:
        """Turn assembled buffers into the item queued for the consumer."""
        return {key: torch.from_numpy(getattr(batch, key)) for key in BATCH_KEYS}

    def receive(self, item: Any) -> dict[str, torch.Tensor]:
        """The consumer-side batch (consumer thread)."""
        return item

    def close(self) -> None:
        """Forget the pool (batches the consumer still holds stay valid)."""
        self._slabs = []


class _PinnedSlot:
    __slots__ = ("tensors", "batch", "copied")

    def __init__(self, rows: int, seq_len: int) -> None:
        self.tensors = {
            key: torch.empty((rows,) if key == "sample_positions" else (rows, seq_len), dtype=torch.int64, pin_memory=True)
            for key in BATCH_KEYS
        }
        self.batch = HostBatch(**{key: tensor.numpy() for key, tensor in self.tensors.items()})
        self.copied: torch.cuda.Event | None = None


class CudaDelivery:
    """Pinned host ring plus side-stream copies to one CUDA device.

    Args:
        device: the target CUDA device.
        rows: local batch size.
        seq_len: ``L``.
        depth: ring slots. A slot is reusable once its copy has finished
            (the device tensors are separate), so 2-3 slots keep the copy
            of one step overlapped with the assembly of the next.
    """

    def __init__(self, *, device: torch.device, rows: int, seq_len: int, depth: int) -> None:
        assert device.type == "cuda" and device.index is not None
        self.device = device
        with torch.cuda.device(device):
            self.copy_stream = torch.cuda.Stream(device=device)
        self._slots = [_PinnedSlot(rows, seq_len) for _ in range(depth)]
        self._next = 0

    @property
    def ring_bytes(self) -> int:
        """Pinned host bytes held by the ring."""
        return sum(t.numel() * t.element_size() for slot in self._slots for t in slot.tensors.values())

    def slots_pinned(self) -> bool:
        """Whether every host buffer of the ring is page-locked."""
        return all(t.is_pinned() for slot in self._slots for t in slot.tensors.values())

    def acquire(self) -> HostBatch:
        """The next ring slot, once the copy that last read it has finished."""
        slot = self._slots[self._next]
        if slot.copied is not None:
            slot.copied.synchronize()
            slot.copied = None
        return slot.batch

    def publish(self, batch: HostBatch) -> Any:
        """Start the non-blocking host-to-device copy of the current slot."""
        slot = self._slots[self._next]
        assert slot.batch is batch, "publish() must follow acquire() for the same slot"
        self._next = (self._next + 1) % len(self._slots)
        with torch.cuda.device(self.device), torch.cuda.stream(self.copy_stream):
            on_device = {key: t.to(self.device, non_blocking=True) for key, t in slot.tensors.items()}
            event = torch.cuda.Event()
            event.record(self.copy_stream)
        slot.copied = event
        return on_device, event

    def receive(self, item: Any) -> dict[str, torch.Tensor]:
        """Make the consumer's current stream wait for the copy, then hand over."""
        on_device, event = item
        consumer = torch.cuda.current_stream(self.device)
        consumer.wait_event(event)
        for tensor in on_device.values():
            # NOTE: the tensors were allocated on the copy stream; tell the
            # caching allocator the consumer's stream uses them too.
            tensor.record_stream(consumer)
        return on_device

    def close(self) -> None:
        """Wait for copies in flight, then release the pinned ring."""
        for slot in self._slots:
            if slot.copied is not None:
                slot.copied.synchronize()
        self._slots = []


def make_delivery(device: torch.device, *, rows: int, seq_len: int, depth: int) -> CpuDelivery | CudaDelivery:
    """The delivery for ``device`` (from :func:`resolve_device`).

    Args:
        depth: pinned ring slots (CUDA) or recycled slabs (CPU).
    """
    if device.type == "cuda":
        return CudaDelivery(device=device, rows=rows, seq_len=seq_len, depth=depth)
    return CpuDelivery(rows=rows, seq_len=seq_len, max_slabs=depth)


def host_batch_bytes(rows: int, seq_len: int) -> int:
    """Bytes of one HostBatch."""
    return 3 * rows * seq_len * np.dtype(np.int64).itemsize + rows * np.dtype(np.int64).itemsize
