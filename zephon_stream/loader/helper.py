"""The loader's helper process: runs one rank's pipeline outside the trainer.

Started by loader/process.py as ``python -m zephon_stream.loader.helper
CONTROL_FD``, it receives a ``ProducerSpec`` and then the batch ring's
descriptor over the control socket, maps the ring, runs the pipeline on its own threads and reports each
finished step as ``("step", index, cursor, slot, data_sha256)``; the
consumer hands slots back through the ring's ``returned`` flags. A pipeline
error is sent as ``("error", exception)`` at the step it hit.

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
import sys
import threading
import traceback
from multiprocessing.connection import Connection
from multiprocessing.reduction import recvfds

from zephon_stream.loader.pipeline import EndOfData
from zephon_stream.loader.producer import ProducerSpec, start_pipeline
from zephon_stream.loader.ring import SharedRing


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


def _exit_when_the_trainer_hangs_up(conn: Connection) -> None:
    try:
        conn.recv_bytes()
    except (EOFError, OSError):
        pass
    # NOTE: the trainer closed the loader or is gone (no message is ever sent
    # this way); nothing here holds state worth saving: the ring has no name
    # to unlink.
    os._exit(0)


def serve(conn: Connection, control: socket.socket) -> None:
    """Run the pipeline the first message describes; report each step."""
    spec: ProducerSpec = conn.recv()
    (ring_fd,) = recvfds(control, 1)
    if spec.helper_nice:
        # NOTE: where the helper and the trainer share a core, the trainer
        # goes first; the helper works ahead in the time the trainer leaves.
        os.nice(spec.helper_nice)
    try:
        ring = SharedRing.attach(fd=ring_fd, num_slots=spec.num_slots, layout=spec.slot_layout)
        pipeline = start_pipeline(spec, sources=spec.open_sources(), ring=ring)
    except BaseException as exc:  # noqa: BLE001 - reported to the trainer
        conn.send(("error", portable_error(exc)))
        _exit_when_the_trainer_hangs_up(conn)
    threading.Thread(
        target=_exit_when_the_trainer_hangs_up, args=(conn,), name="zephon-helper-control", daemon=True
    ).start()
    while True:
        try:
            ready = pipeline.get()
        except BaseException as exc:  # noqa: BLE001 - raised again in the trainer at this step
            conn.send(("error", portable_error(exc)))
            break
        if isinstance(ready, EndOfData):
            conn.send(("end",))
            break
        conn.send(("step", ready.index, ready.cursor, ready.slot, ready.data_sha256))
    # NOTE: the control thread exits the process when the trainer closes the socket.
    threading.Event().wait()


def main(argv: list[str]) -> None:
    """Entry point: ``CONTROL_FD``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    control_fd = int(argv[1])
    try:
        serve(Connection(control_fd), socket.socket(fileno=os.dup(control_fd)))
    except (EOFError, OSError):
        # NOTE: the trainer went away mid-message; there is no one to tell.
        os._exit(0)


if __name__ == "__main__":
    main(sys.argv)
