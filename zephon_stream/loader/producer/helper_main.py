"""The loader's helper process: runs one rank's pipeline outside the trainer.

Started by loader/producer/process_producer.py as a fresh interpreter that imports this module
and calls ``main([.., CONTROL_FD, NICE, SCHEMES])``. It loads the client
libraries of its streams' URL schemes (s3fs and botocore's models took 0.5 s
at the first S3 read), takes its niceness (where the helper and the trainer
share a core, the trainer goes first; the helper works ahead in the time the
trainer leaves), and says it is ready, then
receives a ``ProducerSpec`` and the batch ring's descriptor over the
control socket, maps the ring, and runs the pipeline on
its own threads. The thread that assembles a step also reports it: posted in
the ring's header (loader/ring/step_board.py), or where that is off, sent over the
socket (loader/producer/reports.py); the consumer hands slots back through the ring's
``returned`` flags. A pipeline error is sent, pickled, at the step it hit, and
the end of a finite run as one byte.

It never outlives the trainer: when the control socket closes (the trainer
closed the loader, exited or was killed), it exits at once. It imports no
torch, so it starts in a fraction of a second, and it ignores SIGINT: a
Ctrl-C in the terminal is the trainer's to handle.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from multiprocessing.connection import Connection
from multiprocessing.reduction import recvfds

from zephon_stream.loader.producer.pipeline import EndOfData, ReadyStep
from zephon_stream.loader.producer.reports import READY, WAKE, encode, frame
from zephon_stream.loader.producer.spec import ProducerSpec, start_pipeline
from zephon_stream.loader.ring.liveness import hold
from zephon_stream.loader.ring.shared_ring import SharedRing
from zephon_stream.loader.ring.step_board import StepBoard
from zephon_stream.storage.cloud_clients import warm_client_library


def _wake_until_the_trainer_hangs_up(control: socket.socket, ring: SharedRing | None) -> None:
    # The trainer sends a byte when it hands a slot back to a pipeline
    # waiting for one (loader/ring/free_slots.py ``hand_back``).
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
    # The trainer closed the loader or is gone; nothing here holds
    # state worth saving: the ring has no name to unlink.
    os._exit(0)


def serve(conn: Connection, control: socket.socket) -> None:
    """Say it is ready; run the pipeline the first message describes; report each step."""
    control.sendall(frame(READY))
    spec: ProducerSpec = conn.recv()
    (ring_fd,) = recvfds(control, 1)
    board: StepBoard | None = None

    def emit(item: ReadyStep | EndOfData | BaseException) -> None:
        try:
            if board is not None and type(item) is ReadyStep and not item.data_sha256:
                # Steps come in order, the k-th in the run's k-th slot of steps.
                assert item.index == board.count[0], (item.index, board.count[0])
                if board.post(item.slot):
                    control.sendall(frame(WAKE))
                return
            control.sendall(frame(encode(item)))
        except OSError:
            os._exit(0)  # The trainer is gone; there is no one to tell

    ring = None
    try:
        ring = SharedRing.attach(fd=ring_fd, num_slots=spec.num_slots, layout=spec.slot_layout)
        # Held by this (main) thread until the process ends; the
        # trainer reads it at every step to know this process lives.
        hold(ring.address() + ring.helper_lock_offset)
        if spec.post_steps:
            board = ring.board
        start_pipeline(spec, sources=spec.open_sources(), ring=ring, emit=emit)
    except BaseException as exc:  # noqa: BLE001 - reported to the trainer
        emit(exc)
    # The pipeline's thread reports every step; this one passes on the
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
            pass  # The store that needs it says so, naming the extra to install
    os.nice(nice)
    try:
        serve(Connection(control_fd), socket.socket(fileno=os.dup(control_fd)))
    except (EOFError, OSError):
        # The trainer went away mid-message; there is no one to tell.
        os._exit(0)


if __name__ == "__main__":
    main(sys.argv)
