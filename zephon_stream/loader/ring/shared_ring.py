"""The batch ring: slots of shared memory the producer fills and the consumer reads.

A slot holds one step of one rank. Its first part is what device delivery
copies in one transfer: the ``L + 1``-token window of every row at the stored
token width (``tokens``), the EOS id of each row (``eos``) and the global
position of each row (``sample_positions``). After it come the ``int64``
arrays the producer widens on the host for consumers that want them
(``input``, ``labels``, ``positions``; which ones is the layout's choice).

The memory is anonymous (``memfd_create`` where the platform has it, an
unlinked temporary file elsewhere): it has no name in ``/dev/shm``, so
nothing is left behind however the processes sharing it end. It is passed to
the helper process as a file descriptor.

A small header in front of the slots holds the producer's counters, so the
consumer reads them without a message, one ``returned`` flag per slot, a
``producer_waiting`` count, the helper's liveness lock (loader/ring/liveness.py)
and the steps a helper finished (loader/ring/step_board.py). The consumer sets a
slot's flag when it is done with the slot and the producer clears it when it
takes the slot to fill. Handing
a slot back is then one byte written, not a message: no system call in the
trainer's step, unless the producer waits for a slot (a whole ring ahead)
and the count of hand-backs it asked to be woken after runs out; then the
consumer wakes it (``notify``; loader/ring/free_slots.py ``FreeSlots``).
"""

from __future__ import annotations

import dataclasses
import mmap
import os
import sys
import tempfile
import threading

import numpy as np

from zephon_stream.loader.ring.liveness import LOCK_BYTES
from zephon_stream.loader.ring.row_documents import PackingSpec, packing_offsets, packing_views
from zephon_stream.loader.ring.step_board import StepBoard, board_bytes

WIDE_KEYS = ("input", "labels", "positions")
_ALIGN = 64
# float64 counters written by the producer after each step; see
# loader/producer/stats.py for their order.
HEADER_COUNTERS = 32


def _align(offset: int) -> int:
    return -(-offset // _ALIGN) * _ALIGN


def _lock_offset(num_slots: int) -> int:
    return _align(HEADER_COUNTERS * 8 + num_slots + 1)


def _board_offset(num_slots: int) -> int:
    return _lock_offset(num_slots) + LOCK_BYTES


def _header_bytes(num_slots: int) -> int:
    return _board_offset(num_slots) + board_bytes(num_slots)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SlotLayout:
    """Byte layout of one slot.

    Attributes:
        rows: samples per step on this rank.
        seq_len: ``L``.
        token_dtype: the stored token dtype (``<u2`` or ``<u4``).
        wide_keys: the ``int64 [rows, L]`` arrays the producer writes too,
            a subset of ``("input", "labels", "positions")`` in that order.
        packing: cross-document targets and whether the slot holds the
            document outputs (loader/ring/row_documents.py), in the part device delivery copies.
    """

    rows: int
    seq_len: int
    token_dtype: str
    wide_keys: tuple[str, ...]
    packing: PackingSpec = PackingSpec()

    def __post_init__(self) -> None:
        assert all(key in WIDE_KEYS for key in self.wide_keys), self.wide_keys
        assert self.wide_keys == tuple(k for k in WIDE_KEYS if k in self.wide_keys), "keep WIDE_KEYS order"

    @property
    def tokens_bytes(self) -> int:
        """Bytes of the narrow ``[rows, L + 1]`` windows."""
        return self.rows * (self.seq_len + 1) * np.dtype(self.token_dtype).itemsize

    def offsets(self) -> dict[str, int]:
        """Byte offset of each array within the slot, by name."""
        out = {"tokens": 0}
        offset = _align(self.tokens_bytes)
        for name in ("eos", "sample_positions"):
            out[name] = offset
            offset += self.rows * 8
        if self.packing.outputs:
            out["packing"] = offset
            offset = packing_offsets(offset, self.rows, self.seq_len)["end"]
        out["device_end"] = offset
        offset = _align(offset)
        for key in self.wide_keys:
            out[key] = offset
            offset = _align(offset + self.rows * self.seq_len * 8)
        out["end"] = _align(offset)
        return out

    @property
    def device_bytes(self) -> int:
        """Bytes of the first part (tokens, eos, sample positions, document
        outputs when on): what device delivery transfers per step."""
        return self.offsets()["device_end"]

    @property
    def slot_bytes(self) -> int:
        """Bytes of one slot, aligned."""
        return self.offsets()["end"]


@dataclasses.dataclass(slots=True)
class Slot:
    """Numpy views of one slot.

    Attributes:
        index: the slot's index in the ring.
        slab: the whole slot as bytes; any view of the slot keeps it referenced.
        tokens: ``[rows, L + 1]`` token windows at the stored width.
        eos: ``int64 [rows]`` EOS id of each row's stream.
        sample_positions: ``int64 [rows]`` global position of each row.
        wide: ``int64 [rows, L]`` arrays by key (the layout's ``wide_keys``).
        packing: the document outputs by key (loader/ring/row_documents.py), empty when off.
    """

    index: int
    slab: np.ndarray
    tokens: np.ndarray
    eos: np.ndarray
    sample_positions: np.ndarray
    wide: dict[str, np.ndarray]
    packing: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)


def _anonymous_fd(size: int) -> int:
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("zephon-ring", os.MFD_CLOEXEC)
    else:  # pragma: no cover - non-Linux
        with tempfile.TemporaryFile() as handle:
            fd = os.dup(handle.fileno())
    os.ftruncate(fd, size)
    return fd


class SharedRing:
    """``num_slots`` slots of ``layout`` in one anonymous shared mapping.

    Use :meth:`create` in the consumer and :meth:`attach` in the producer's
    process with the descriptor the consumer passed.
    """

    def __init__(self, *, fd: int, num_slots: int, layout: SlotLayout) -> None:
        self.fd = fd
        self.num_slots = num_slots
        self.layout = layout
        self._slot_bytes = layout.slot_bytes
        self._base = _header_bytes(num_slots)
        self.nbytes = self._base + num_slots * self._slot_bytes
        self._map = mmap.mmap(fd, self.nbytes)
        self._array = np.frombuffer(self._map, np.uint8)
        self.counters = self._array[: HEADER_COUNTERS * 8].view(np.float64)
        self.returned = self._array[HEADER_COUNTERS * 8 : HEADER_COUNTERS * 8 + num_slots]
        self.producer_waiting = self._array[HEADER_COUNTERS * 8 + num_slots : HEADER_COUNTERS * 8 + num_slots + 1]
        # The same bytes (every ``returned`` flag, then
        # ``producer_waiting``) for the consumer's hand-back, once a step: a
        # memoryview's item access is a few instructions, a numpy scalar's
        # goes through numpy's type machinery.
        self.flags = memoryview(self._map)[HEADER_COUNTERS * 8 : HEADER_COUNTERS * 8 + num_slots + 1]
        # The helper's liveness lock (loader/ring/liveness.py) and its lock
        # word, which the trainer reads at every step.
        self.helper_lock_offset = _lock_offset(num_slots)
        self.helper_lock_word = memoryview(self._map)[self.helper_lock_offset : self.helper_lock_offset + 4].cast("i")
        # The steps a helper process finished (loader/ring/step_board.py).
        board = _board_offset(num_slots)
        self.board = StepBoard(memoryview(self._map)[board : board + board_bytes(num_slots)], num_slots)
        # set when a slot comes back while the producer waits. In one
        # process the consumer sets it (``notify``); a helper process's ring
        # has it set by the thread that reads the consumer's wake-ups, and the
        # consumer's ``notify`` is then a byte sent to the helper.
        self.slot_returned = threading.Event()
        self.notify = self.slot_returned.set
        self._offsets = layout.offsets()
        # One array per slot over the mapping itself (not a slice of
        # another array), so that every view of a slot refers to its slab and
        # the slab's reference count tells whether anyone still holds the slot.
        self._slabs = [self._new_slab(i) for i in range(num_slots)]

    def _new_slab(self, index: int) -> np.ndarray:
        offset = self._base + index * self._slot_bytes
        return np.frombuffer(self._map, np.uint8, count=self._slot_bytes, offset=offset)

    @staticmethod
    def size_bytes(*, num_slots: int, layout: SlotLayout) -> int:
        """Bytes of a ring of ``num_slots`` slots of ``layout`` (header included)."""
        return _header_bytes(num_slots) + num_slots * layout.slot_bytes

    @classmethod
    def create(cls, *, num_slots: int, layout: SlotLayout) -> SharedRing:
        """A new ring, zero-filled."""
        size = cls.size_bytes(num_slots=num_slots, layout=layout)
        return cls(fd=_anonymous_fd(size), num_slots=num_slots, layout=layout)

    @classmethod
    def attach(cls, *, fd: int, num_slots: int, layout: SlotLayout) -> SharedRing:
        """Map the ring another process created (``fd`` is inherited)."""
        return cls(fd=fd, num_slots=num_slots, layout=layout)

    def address(self) -> int:
        """The mapping's start address (for ``cudaHostRegister``)."""
        return int(self._array.ctypes.data)

    def slot(self, index: int) -> Slot:
        """Fresh numpy views of slot ``index``."""
        return self._views(index, self._slabs[index])

    def producer_slots(self) -> list[Slot]:
        """Views of every slot for the producer to keep: they hold a slab of
        their own, so they never count as the consumer's references to a
        slot (see :meth:`slab`)."""
        return [self._views(i, self._new_slab(i)) for i in range(self.num_slots)]

    def _views(self, index: int, slab: np.ndarray) -> Slot:
        layout, offsets = self.layout, self._offsets
        rows, width = layout.rows, layout.seq_len + 1
        tokens = slab[: layout.tokens_bytes].view(layout.token_dtype).reshape(rows, width)
        eos = slab[offsets["eos"] : offsets["eos"] + rows * 8].view(np.int64)
        positions = slab[offsets["sample_positions"] : offsets["sample_positions"] + rows * 8].view(np.int64)
        wide = {
            key: slab[offsets[key] : offsets[key] + rows * layout.seq_len * 8]
            .view(np.int64)
            .reshape(rows, layout.seq_len)
            for key in layout.wide_keys
        }
        packing = {}
        if layout.packing.outputs:
            start = packing_offsets(offsets["packing"], rows, layout.seq_len)
            packing = packing_views(slab, start, rows, layout.seq_len)
        return Slot(
            index=index, slab=slab, tokens=tokens, eos=eos, sample_positions=positions, wide=wide, packing=packing
        )

    def slab(self, index: int) -> np.ndarray:
        """Slot ``index`` as bytes (its reference count counts its views)."""
        return self._slabs[index]

    def slot_in_use(self, index: int) -> bool:
        """Whether anything outside the ring (a view, or a tensor over one)
        still refers to slot ``index``; the producer's own views do not count."""
        # 2 = the ring's list entry and getrefcount's argument.
        return sys.getrefcount(self._slabs[index]) > 2

    def slot_range(self, index: int) -> tuple[int, int]:
        """``(start, end)`` byte offsets of slot ``index`` within the mapping."""
        start = self._base + index * self._slot_bytes
        return start, start + self._slot_bytes

    def as_array(self) -> np.ndarray:
        """The whole mapping as ``uint8`` (for registration and device copies)."""
        return self._array

    def close(self) -> None:
        """Unmap and close the descriptor. Views still held elsewhere keep the
        mapping alive until they go (the descriptor is closed regardless)."""
        self.counters = None  # type: ignore[assignment]
        self.returned = None  # type: ignore[assignment]
        self.producer_waiting = None  # type: ignore[assignment]
        for view in (self.flags, self.helper_lock_word):
            if view is not None:
                view.release()
        self.flags = self.helper_lock_word = None  # type: ignore[assignment]
        if self.board is not None:
            self.board.release()
            self.board = None  # type: ignore[assignment]
        self._array = None  # type: ignore[assignment]
        self._slabs = []
        try:
            self._map.close()
        except BufferError:
            # A consumer still holds a batch that views the ring; the
            # mapping goes with the last such view.
            pass
        self._map = None  # type: ignore[assignment]
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
