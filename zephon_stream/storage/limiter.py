"""A store's request-rate limiter (the rate it keeps: ``request_rate.py``) and where it keeps its record.

``Limiter`` is what the retry layer calls: ``ticket()`` before each attempt,
``wait_s()`` until the ticket's turn, ``throttled()`` at a throttling answer.
Its record lives in one of two places:

- ``SharedRecord``: a small file in the node cache's folder
  (``node-cache-limits/<digest of the store's key>``, ``storage/node_cache.py``),
  mapped into every process of the node that reads the store. Updates hold an
  ``fcntl.flock`` on the file, which the kernel releases when its holder dies,
  so a rank SIGKILLed in the middle of an update never leaves the others
  waiting. An update writes a full copy of the record into the slot not in use,
  with its CRC, then flips one byte to name it: a holder killed before the flip
  leaves the record as it was, one killed after leaves the new one; a copy whose
  CRC does not match is never read. The file goes with the node cache's other
  files, removed by its last user.
- ``LocalRecord``: the same record in this process's memory, for a store that
  has no node cache to share it through.

Before any throttling answer the request path reads one byte: byte 0 of
the mapped file (or an attribute), written only once the record says ``on``.
No lock, no system call. A lock is taken per attempt only while the limiter is
on, that is while the store throttles and for ``request_rate.QUIET_S`` after.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import mmap
import os
import struct
import threading
import time
import zlib
from collections.abc import Callable
from typing import TypeVar

from zephon_stream.storage import request_rate
from zephon_stream.storage.request_rate import RateRecord, Throttled, Ticket

T = TypeVar("T")

# The record's fields in the dataclass's order, each as its type packs;
# the bool is padded to 8 bytes so that the floats after it stay aligned.
_FIELD_CODES = {"bool": "B7x", "float": "d", "int": "Q"}
_FIELD_TYPES = {"bool": bool, "float": float, "int": int}
_RECORD_FIELDS = dataclasses.fields(RateRecord)
# A type's name, whether the dataclass's annotations are strings or not.
_TYPE_NAMES = tuple(getattr(field.type, "__name__", field.type) for field in _RECORD_FIELDS)
_FIELDS = struct.Struct("<" + "".join(_FIELD_CODES[name] for name in _TYPE_NAMES))
_CRC = struct.Struct("<I")
_SLOT_BYTES = 128
_SLOTS = (128, 256)  # Byte 0 says on, byte 1 which slot holds the record
FILE_BYTES = 384
O_FLAGS = os.O_CLOEXEC | os.O_NOFOLLOW

# Checked once, here: a field added to the record must still fit its
# slot, or every process of a node would read a torn one.
if _FIELDS.size + _CRC.size > _SLOT_BYTES or _SLOTS[-1] + _SLOT_BYTES > FILE_BYTES:
    raise RuntimeError(
        f"the request-rate record packs to {_FIELDS.size} bytes and its CRC to {_CRC.size}: more than "
        f"a slot of {_SLOT_BYTES} bytes, or slots {_SLOTS} past a file of {FILE_BYTES}"
    )


def pack_record(record: RateRecord) -> bytes:
    """The record's fields, then their CRC: one slot's bytes."""
    fields = _FIELDS.pack(*(getattr(record, field.name) for field in _RECORD_FIELDS))
    return fields + _CRC.pack(zlib.crc32(fields))


def unpack_record(blob: bytes) -> RateRecord | None:
    """The record in one slot's bytes, or None when its CRC does not match (never written, or torn)."""
    fields = blob[: _FIELDS.size]
    (crc,) = _CRC.unpack_from(blob, _FIELDS.size)
    if zlib.crc32(fields) != crc:
        return None
    values = zip(_RECORD_FIELDS, _TYPE_NAMES, _FIELDS.unpack(fields))
    return RateRecord(**{field.name: _FIELD_TYPES[name](value) for field, name, value in values})


def limiter_file_name(key: str) -> str:
    """The file name of the record of the store ``key`` names (a digest: no endpoint or bucket in a file name)."""
    return "limit-" + hashlib.blake2b(key.encode(), digest_size=16).hexdigest()


class LocalRecord:
    """The record in this process's memory."""

    def __init__(self) -> None:
        self._record = RateRecord()
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def is_on(self) -> bool:
        return self._record.on

    def update(self, change: Callable[[RateRecord], T]) -> T:
        if self._pid != os.getpid():
            # A lock held by another thread at a fork stays held in the child.
            self._lock, self._pid = threading.Lock(), os.getpid()
        with self._lock:
            return change(self._record)

    def close(self) -> None:
        pass


class SharedRecord:
    """The record in a file every process of the node maps (see the module docstring).

    Args:
        path: the file, in a folder of this user that outlives none of its users
            (the node cache's ``node-cache-limits``).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._pid = -1
        self._fd = -1
        self._map: mmap.mmap | None = None
        self._lock = threading.Lock()
        self._open()

    def _open(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | O_FLAGS, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                # Zeros fail the CRC, so a new file reads as a fresh record (off).
                if os.fstat(fd).st_size < FILE_BYTES:
                    os.ftruncate(fd, FILE_BYTES)
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
            self._map = mmap.mmap(fd, FILE_BYTES)
        except BaseException:
            os.close(fd)
            raise
        self._fd, self._pid = fd, os.getpid()

    def is_on(self) -> bool:
        view = self._map
        try:
            return view is not None and view[0] == 1
        except ValueError:  # Closed by another thread meanwhile
            return False

    def update(self, change: Callable[[RateRecord], T]) -> T:
        """Run ``change`` on the record under the node's lock and store what it leaves."""
        if self._pid != os.getpid() and self._map is not None:
            # A forked child shares its parent's open file, and with it
            # the parent's flock: it opens the file again to lock on its own
            # (and a lock held by another thread at the fork stays held).
            inherited, self._lock = self._map, threading.Lock()
            os.close(self._fd)
            self._open()
            inherited.close()
        with self._lock:
            view = self._map
            if view is None:
                # Closed (its store closed) under an operation still in
                # flight: that operation goes on as if the limiter were off.
                return change(RateRecord())
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                current = view[1] & 1
                record = unpack_record(view[_SLOTS[current] : _SLOTS[current] + _SLOT_BYTES])
                if record is None:
                    record = unpack_record(view[_SLOTS[1 - current] : _SLOTS[1 - current] + _SLOT_BYTES])
                record = record or RateRecord()
                result = change(record)
                self._write(view, 1 - current, record)
                return result
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    @staticmethod
    def _write(view: mmap.mmap, slot: int, record: RateRecord) -> None:
        blob = pack_record(record)
        view[_SLOTS[slot] : _SLOTS[slot] + len(blob)] = blob
        view[1] = slot  # The flip: the new copy is whole before anyone is told to read it
        view[0] = 1 if record.on else 0

    def close(self) -> None:
        with self._lock:
            view, self._map = self._map, None
            if view is not None:
                view.close()
            if self._fd >= 0 and self._pid == os.getpid():
                os.close(self._fd)
            self._fd = -1


class Limiter:
    """A store's request-rate limiter (``request_rate.py``) over its record (shared by the node, or this process's).

    Args:
        record: ``SharedRecord`` or ``LocalRecord``.
        clock: monotonic seconds, one clock for every process of the node.
    """

    def __init__(self, record: SharedRecord | LocalRecord, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.record = record
        self._clock = clock

    @property
    def shared(self) -> bool:
        """Whether the record is the node's (a file) rather than this process's."""
        return isinstance(self.record, SharedRecord)

    def ticket(self) -> Ticket | None:
        """A ticket for one request, or None when the limiter is off (one byte read, nothing else)."""
        if not self.record.is_on():
            return None
        now = self._clock()
        return self.record.update(lambda record: request_rate.take(record, now))

    def wait_s(self, ticket: Ticket) -> float:
        """Seconds until ``ticket`` may go at the rate now; 0: go."""
        now = self._clock()
        return self.record.update(lambda record: request_rate.wait_s(record, ticket, now))

    def throttled(self, sent_at: float) -> Throttled:
        """A throttling answer to a request sent at ``sent_at`` (``-inf``: before it had a ticket)."""
        now = self._clock()
        return self.record.update(lambda record: request_rate.throttled(record, now, sent_at))

    def now(self) -> float:
        return self._clock()

    def snapshot(self) -> RateRecord:
        """A copy of the record (tests, diagnostics)."""
        return self.record.update(dataclasses.replace)

    def close(self) -> None:
        self.record.close()


__all__ = ["FILE_BYTES", "Limiter", "LocalRecord", "SharedRecord", "limiter_file_name", "pack_record", "unpack_record"]
