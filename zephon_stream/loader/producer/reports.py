"""What a helper process reports to the trainer, and how the trainer reads it in order.

A helper reports each step it finished, the end of a finite run, or the error
its pipeline hit at a step. Steps are posted in the ring's header
(loader/ring/step_board.py) where the machine allows; everything else is a message
on the control socket: one kind byte and its body, after its length
(:func:`frame`). The trainer reads both with :class:`HelperReports`, which
keeps the helper's order: a helper posts its steps before it sends what ends
them.
"""

from __future__ import annotations

import os
import pickle
import select
import socket
import struct
import traceback

from zephon_stream.loader.producer.pipeline import EndOfData, ReadyStep
from zephon_stream.loader.ring.step_board import StepBoard, fence

# A message is one kind byte and its body: a step's index, cursor and
# slot packed (and its data sha256 in hex, when the audit log wants it), the
# end of a finite run, or a pickled error. On the socket each message follows
# its length (``frame``).
_STEP, _END, _ERROR = b"s", b"e", b"x"
# Sent once, before the spec is read: the interpreter and the
# pipeline's modules are loaded, so a run given now starts at once.
READY = b"r"
# Sent after a post the trainer waits for (loader/ring/step_board.py).
WAKE = b"k"
# The bounded sleep of a trainer waiting for a report: the first, and
# the longest after doubling. A report wakes it at once.
_SLEEP_FIRST_S = 0.002
_SLEEP_MAX_S = 0.02
_STEP_FIELDS = struct.Struct("<qqq")
_STEP_KIND, _STEP_END = _STEP[0], 1 + _STEP_FIELDS.size
_LENGTH = struct.Struct("<I")


def frame(message: bytes) -> bytes:
    """``message`` as it goes on the socket: its length, then itself."""
    return _LENGTH.pack(len(message)) + message


class MessageReader:
    """Framed messages from a stream socket, one ``recv`` for as many as have
    arrived.

    Args:
        sock: the trainer's end of the control socket.
    """

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buffer = bytearray()
        self._at = 0  # Where the next message starts in the buffer

    def poll(self) -> bytes | None:
        """The next message if it has arrived, else None (never waits).

        Raises:
            EOFError: the other end closed the socket.
        """
        message = self.take()
        if message is None and self.fill():
            message = self.take()
        return message

    def take(self) -> bytes | None:
        """The next message already received whole, else None (no system call)."""
        buffer, at = self._buffer, self._at
        if len(buffer) - at >= _LENGTH.size:
            (size,) = _LENGTH.unpack_from(buffer, at)
            start = at + _LENGTH.size
            end = start + size
            if len(buffer) >= end:
                message = bytes(buffer[start:end])
                # An offset, not a deletion at the front per message;
                # the buffer is emptied when all of it has been read.
                if end == len(buffer):
                    buffer.clear()
                    self._at = 0
                else:
                    self._at = end
                return message
        return None

    def fill(self) -> bool:
        """Receive what has arrived, in one ``recv`` (never waits); whether anything had.

        Raises:
            EOFError: the other end closed the socket.
        """
        try:
            chunk = self._sock.recv(1 << 16, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return False
        if not chunk:
            raise EOFError("the loader's helper closed its control socket")
        if self._at:
            del self._buffer[: self._at]
            self._at = 0
        self._buffer += chunk
        return True


def encode(item: ReadyStep | EndOfData | BaseException) -> bytes:
    """One message to the trainer."""
    if isinstance(item, ReadyStep):
        return _STEP + _STEP_FIELDS.pack(item.index, item.cursor, item.slot) + item.data_sha256.encode()
    if isinstance(item, EndOfData):
        return _END
    return _ERROR + pickle.dumps(portable_error(item))


def decode(message: bytes) -> ReadyStep | EndOfData | BaseException:
    """What :func:`encode` sent."""
    if message[0] == _STEP_KIND:
        index, cursor, slot = _STEP_FIELDS.unpack_from(message, 1)
        digest = message[_STEP_END:].decode() if len(message) > _STEP_END else ""
        return ReadyStep(index, cursor, slot, digest)
    kind = message[:1]
    if kind == _END:
        return EndOfData()
    assert kind == _ERROR, kind
    return pickle.loads(message[1:])


def portable_error(exc: BaseException) -> BaseException:
    """``exc`` with a note of where it was raised, or a RuntimeError carrying
    its text when it cannot be pickled."""
    exc.add_note(f"(raised in the loader's helper process, pid {os.getpid()})")
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - anything unpicklable travels as text
        text = "".join(traceback.format_exception(exc)).rstrip()
        return RuntimeError(f"loader helper process (pid {os.getpid()}): {type(exc).__name__}: {exc}\n{text}")


class HelperReports:
    """A helper's reports as the trainer reads them: posted steps and socket messages, in the helper's order.

    Args:
        sock: the trainer's end of the control socket.
    """

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._reader = MessageReader(sock)
        self.board: StepBoard | None = None  # The run's, once it starts
        self.posts = False  # Whether the helper posts its steps on the board (else sends them)
        # What was received and not taken yet: an end or error that came
        # while steps posted before it were unread, or one :meth:`sent` looked at.
        self._stashed: ReadyStep | EndOfData | BaseException | None = None
        self._sleep_s = _SLEEP_FIRST_S  # Doubles while one wait goes on

    def ready(self) -> bool:
        """Whether the helper said it is ready (never waits); its first message.

        Raises:
            EOFError: the helper closed the socket.
        """
        message = self._reader.poll()
        assert message in (None, READY), message[:1]
        return message is not None

    def take(self) -> int | ReadyStep | EndOfData | BaseException | None:
        """The next report: a posted step's slot, or what was sent and received; None when there is none yet.

        No system call: :meth:`sleep` receives.
        """
        board = self.board
        if board is not None:
            slot = board.take()
            if slot is not None:
                return slot
        if not self.sent():
            return None
        item, self._stashed = self._stashed, None
        if board is not None and type(item) is not ReadyStep and board.posted():
            # The helper posts its steps before it sends what ends them
            # (the end, an error at a later step): those come first.
            self._stashed = item
            return board.take()
        return item

    def sleep(self) -> None:
        """Wait a while for a report and receive what came: 2 ms, twice as
        long at each sleep of the same wait, at most 20 ms.

        Raises:
            EOFError: the helper closed the socket.
        """
        if not self.posts:
            # Steps come over the socket; most often one has arrived.
            if self._reader.fill():
                return
        else:
            # Say so on the board, so that a post sends a byte; the
            # fence keeps the flag's store before the count's load (the
            # helper fences between its count and its look at the flag).
            board = self.board
            board.waiting[0] = 1
            fence()
            if board.posted():
                return
        timeout_s, self._sleep_s = self._sleep_s, min(2 * self._sleep_s, _SLEEP_MAX_S)
        if select.select((self._sock,), (), (), timeout_s)[0]:
            self._reader.fill()

    def sent(self) -> bool:
        """Whether something sent was received and not taken yet (kept for :meth:`take`); no system call."""
        while self._stashed is None:
            message = self._reader.take()
            if message is None:
                return False
            if message != WAKE and message != READY:  # READY when nobody asked ready() first
                self._stashed = decode(message)
        return True

    def done_waiting(self) -> None:
        """The trainer has its report: a post need not send a byte, and the next wait sleeps short again."""
        self._sleep_s = _SLEEP_FIRST_S
        if self.posts:
            self.board.waiting[0] = 0
