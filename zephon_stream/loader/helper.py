"""The loader's helper process: runs one rank's pipeline outside the trainer.

Started by loader/process.py as a fresh interpreter that imports this module
and calls ``main([.., CONTROL_FD, NICE, SCHEMES])``. It loads the client
libraries of its streams' URL schemes (s3fs and botocore's models took 0.5 s
at the first S3 read), takes its niceness (where the helper and the trainer
share a core, the trainer goes first; the helper works ahead in the time the
trainer leaves), and says it is ready, then
receives a ``ProducerSpec`` and the batch ring's descriptor over the
control socket, maps the ring, and runs the pipeline on
its own threads. The thread that assembles a step also reports it, in a few
packed bytes (:func:`encode`) after their length (:func:`frame`; the trainer
reads them with :class:`MessageReader`); the consumer hands slots back through
the ring's ``returned`` flags. A pipeline error is sent, pickled, at the step it
hit.

It never outlives the trainer: when the control socket closes (the trainer
closed the loader, exited or was killed), it exits at once. It imports no
torch, so it starts in a fraction of a second, and it ignores SIGINT: a
Ctrl-C in the terminal is the trainer's to handle.
"""

from __future__ import annotations

import os
import pickle
import signal
import socket
import struct
import sys
import traceback
from multiprocessing.connection import Connection
from multiprocessing.reduction import recvfds

from zephon_stream.loader.liveness import hold
from zephon_stream.loader.pipeline import EndOfData, ReadyStep
from zephon_stream.loader.producer import ProducerSpec, start_pipeline
from zephon_stream.loader.ring import SharedRing
from zephon_stream.storage.cloud_clients import warm_client_library


# NOTE: a message is one kind byte and its body: a step's index, cursor and
# slot packed (and its data sha256 in hex, when the audit log wants it), the
# end of a finite run, or a pickled error. On the socket each message follows
# its length (``frame``).
_STEP, _END, _ERROR = b"s", b"e", b"x"
# NOTE: sent once, before the spec is read: the interpreter and the
# pipeline's modules are loaded, so a run given now starts at once.
READY = b"r"
_STEP_FIELDS = struct.Struct("<qqq")
_STEP_KIND, _STEP_END = _STEP[0], 1 + _STEP_FIELDS.size
_LENGTH = struct.Struct("<I")


def frame(message: bytes) -> bytes:
    """``message`` as it goes on the socket: its length, then itself."""
    return _LENGTH.pack(len(message)) + message


class MessageReader:
    """Framed messages from a stream socket, one ``recv`` for as many as have
    arrived (the trainer's step makes one system call here, not two).

    Args:
        sock: the trainer's end of the control socket.
    """

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buffer = bytearray()
        self._at = 0  # NOTE: where the next message starts in the buffer

    def read(self) -> bytes:
        """The next message, waiting for it.

        Raises:
            EOFError: the other end closed the socket.
        """
        while True:
            message = self._take()
            if message is not None:
                return message
            self._receive(0)

    def poll(self) -> bytes | None:
        """The next message if it has arrived, else None (never waits).

        Raises:
            EOFError: the other end closed the socket.
        """
        message = self._take()
        if message is None:
            try:
                self._receive(socket.MSG_DONTWAIT)
            except BlockingIOError:
                return None
            message = self._take()
        return message

    def _take(self) -> bytes | None:
        buffer, at = self._buffer, self._at
        if len(buffer) - at >= _LENGTH.size:
            (size,) = _LENGTH.unpack_from(buffer, at)
            start = at + _LENGTH.size
            end = start + size
            if len(buffer) >= end:
                message = bytes(buffer[start:end])
                # NOTE: an offset, not a deletion at the front per message;
                # the buffer is emptied when all of it has been read.
                if end == len(buffer):
                    buffer.clear()
                    self._at = 0
                else:
                    self._at = end
                return message
        return None

    def _receive(self, flags: int) -> None:
        chunk = self._sock.recv(1 << 16, flags)
        if not chunk:
            raise EOFError("the loader's helper closed its control socket")
        if self._at:
            del self._buffer[: self._at]
            self._at = 0
        self._buffer += chunk


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


def _wake_until_the_trainer_hangs_up(control: socket.socket, ring: SharedRing | None) -> None:
    # NOTE: the trainer sends a byte when it hands a slot back to a pipeline
    # waiting for one (loader/free_slots.py ``hand_back``).
    while True:
        try:
            woken = control.recv(256)
        except InterruptedError:
            continue
        except OSError:
            woken = b""
        if not woken:
            break
        if ring is not None:
            ring.slot_returned.set()
    # NOTE: the trainer closed the loader or is gone; nothing here holds
    # state worth saving: the ring has no name to unlink.
    os._exit(0)


def serve(conn: Connection, control: socket.socket) -> None:
    """Say it is ready; run the pipeline the first message describes; report each step."""
    control.sendall(frame(READY))
    spec: ProducerSpec = conn.recv()
    (ring_fd,) = recvfds(control, 1)

    def emit(item: ReadyStep | EndOfData | BaseException) -> None:
        try:
            control.sendall(frame(encode(item)))
        except OSError:
            os._exit(0)  # NOTE: the trainer is gone; there is no one to tell

    ring = None
    try:
        ring = SharedRing.attach(fd=ring_fd, num_slots=spec.num_slots, layout=spec.slot_layout)
        # NOTE: held by this (main) thread until the process ends; the
        # trainer reads it at every step to know this process lives.
        hold(ring.address() + ring.helper_lock_offset)
        start_pipeline(spec, sources=spec.open_sources(), ring=ring, emit=emit)
    except BaseException as exc:  # noqa: BLE001 - reported to the trainer
        emit(exc)
    # NOTE: the pipeline's thread reports every step; this one passes on the
    # trainer's wake-ups until it closes the socket.
    _wake_until_the_trainer_hangs_up(control, ring)


def main(argv: list[str]) -> None:
    """Entry point: ``CONTROL_FD NICE SCHEMES`` (schemes comma-separated, maybe none)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    control_fd, nice, schemes = int(argv[1]), int(argv[2]), argv[3]
    for scheme in filter(None, schemes.split(",")):
        try:
            warm_client_library(scheme)
        except ImportError:
            pass  # NOTE: the store that needs it says so, naming the extra to install
    os.nice(nice)
    try:
        serve(Connection(control_fd), socket.socket(fileno=os.dup(control_fd)))
    except (EOFError, OSError):
        # NOTE: the trainer went away mid-message; there is no one to tell.
        os._exit(0)


if __name__ == "__main__":
    main(sys.argv)
