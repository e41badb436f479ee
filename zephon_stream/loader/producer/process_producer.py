"""The trainer's side of the helper process: start it, take its steps, stop it.

The helper is a fresh interpreter (``subprocess``, not ``fork``: a forked
trainer would copy CUDA state, locks held by other threads and gigabytes of
address space). It inherits one descriptor, its end of a socket pair for
control messages, and is started when the loader is made, so its interpreter
and imports load while the trainer builds its model; ``start`` then sends the
spec and passes the anonymous batch ring's descriptor over the socket. The
helper posts each step it finished in the ring's header (loader/ring/step_board.py;
on machines without x86's memory order, and with the audit log's digests, it
sends a few packed bytes instead), and slots go back through the ring's
``returned`` flags: the trainer's step makes no system call, and the bytes of
the batch never pass through a socket. What ends a run (its end, an error)
comes over the socket.

A helper that dies (killed, out of memory) closes its socket end: the next
``get`` raises :class:`HelperProcessError` naming the process, how it ended
and the step that was due, and every later call raises it again. Slots it
had not announced are never read.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from multiprocessing.connection import Connection
from multiprocessing.reduction import sendfds
from pathlib import Path

from zephon_stream.errors import HelperProcessError
from zephon_stream.loader.producer.pipeline import EndOfData, ReadyStep
from zephon_stream.loader.producer.reports import HelperReports
from zephon_stream.loader.producer.spec import ProducerSpec
from zephon_stream.loader.ring.shared_ring import SharedRing

# How long close() waits for the helper to exit on its own after the
# control socket closes, before it is killed.
_EXIT_WAIT_S = 5.0
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[3])
_GONE_FLAGS = os.WEXITED | os.WNOHANG | os.WNOWAIT
_LAUNCH = "import sys; from zephon_stream.loader.producer.helper_main import main; main(sys.argv)"


def _how_it_ended(returncode: int | None) -> str:
    if returncode is None:
        return "closed its control socket but is still running"
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with status {returncode}"


class ProcessProducer:
    """A helper process, started at once; :meth:`start` gives it its pipeline.

    Args:
        nice: niceness the helper adds to itself once loaded.
        schemes: URL schemes of the streams it will read (``s3``, ``gs``, ...):
            their client libraries are loaded before it says it is ready.

    Raises:
        HelperProcessError: the helper could not be started.
    """

    def __init__(self, *, nice: int = 0, schemes: tuple[str, ...] = ()) -> None:
        self._start = self._start_step = self._sent_steps = 0
        self._global_batch = self._slot_batch = 1
        self._error: BaseException | None = None
        self._ended = False
        self._started = False
        self._ready = False
        self._lock_word: memoryview | None = None
        ours, theirs = socket.socketpair()
        env = dict(os.environ)
        # The helper imports this very copy of zephon_stream, installed or not.
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
        try:
            self._process = subprocess.Popen(
                # The niceness is taken after the imports: at niceness
                # 10 beside a trainer busy on its first steps (served by
                # threads meanwhile) the imports took 1.2-1.7 s instead of
                # 0.3-0.5 s. -P keeps the working directory off sys.path, so
                # the helper imports the trainer's copy of zephon_stream.
                [sys.executable, "-P", "-c", _LAUNCH, str(theirs.fileno()), str(int(nice)), ",".join(schemes)],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                env=env,
            )
        except OSError as exc:
            ours.close()
            raise HelperProcessError(f"could not start the loader's helper process ({sys.executable}): {exc}") from exc
        finally:
            theirs.close()
        self._socket = ours
        self._pid = self._process.pid
        self._conn = Connection(os.dup(ours.fileno()))  # Sends the spec; steps come through the reader
        self._reports = HelperReports(ours)

    def ready(self) -> bool:
        """Whether the helper has loaded its interpreter and modules (never waits).

        Raises:
            HelperProcessError: the helper is gone.
        """
        if not self._ready:
            try:
                self._ready = self._reports.ready()
            except (EOFError, OSError):
                self._fail("while it was starting")
        return self._ready

    def start(self, spec: ProducerSpec, *, ring: SharedRing) -> None:
        """Send the helper ``spec`` and the ring's descriptor; it starts producing."""
        assert not self._started, "a helper runs one pipeline"
        self._started = True
        self._start, self._start_step = spec.start, spec.start_step
        self._global_batch, self._slot_batch = spec.layout.global_batch, spec.slot_batch
        try:
            self._conn.send(spec)
            sendfds(self._socket, [ring.fd])
        except OSError:
            self._fail("before it received its configuration")
        ring.notify = self._wake
        self._lock_word = ring.helper_lock_word
        self._reports.board, self._reports.posts = ring.board, spec.post_steps

    def _wake(self) -> None:
        # A lost wake-up only delays the helper by its bounded wait; a
        # helper that is gone shows at the next get().
        try:
            self._socket.send(b"w", socket.MSG_DONTWAIT)
        except OSError:
            pass

    def reaped(self) -> bool:
        """Whether the helper has exited and been reaped (never waits)."""
        return self._process.poll() is not None

    @property
    def reports(self) -> HelperReports:
        """What the helper reported (loader/producer/reports.py)."""
        return self._reports

    @property
    def pid(self) -> int:
        """The helper's process id."""
        return self._process.pid

    def _fail(self, when: str) -> None:
        try:
            returncode = self._process.wait(timeout=_EXIT_WAIT_S)
        except subprocess.TimeoutExpired:
            returncode = None
        self._error = HelperProcessError(
            f"the loader's helper process (pid {self._process.pid}) {_how_it_ended(returncode)} {when}; "
            "no batch was taken from a slot it had not finished"
        )
        raise self._error

    def _gone(self) -> bool:
        # The helper's main thread holds its liveness lock while it
        # lives (loader/ring/liveness.py): its pid in the lock word, read without
        # a system call. Else (not locked yet, or its holder died) the kernel
        # is asked, without reaping; _fail reaps.
        if self._lock_word is not None and self._lock_word[0] == self._pid:
            return False
        try:
            return os.waitid(os.P_PID, self._process.pid, _GONE_FLAGS) is not None
        except ChildProcessError:
            return True  # Already reaped

    def _due(self, cursor: int | None = None) -> str:
        if cursor is None:
            # The step after the last taken, posted or sent.
            board = self._reports.board
            taken = board.taken if board is not None else 0
            cursor = self._start + (taken + self._sent_steps) * self._slot_batch
        step = self._start_step + (cursor - self._start) // self._global_batch
        return f"while step {step} (global cursor {cursor}) was due"

    def check_alive(self, cursor: int) -> None:
        """Raise if the helper is gone, naming the step at ``cursor`` as due
        (a step of a slot already taken: a dead helper raises at the next
        step all the same)."""
        if self._error is not None:
            raise self._error
        if self._gone():
            self._fail(self._due(cursor))

    def get(self) -> ReadyStep | EndOfData:
        """The next step the helper finished, waiting for it.

        Raises:
            HelperProcessError: the helper is gone.
            Exception: the error the helper's pipeline hit at this step.
        """
        assert self._started, "start() first"
        if self._error is not None:
            raise self._error
        if self._ended:
            return EndOfData()
        # A dead helper raises at the next step even when steps it
        # finished before it died are still posted (its liveness lock read
        # here, else one waitid; no wait).
        lock_word = self._lock_word
        if (lock_word is None or lock_word[0] != self._pid) and self._gone():
            self._fail(self._due())
        reports = self._reports
        try:
            while (item := reports.take()) is None:
                reports.sleep()
        except (EOFError, OSError):
            self._fail(self._due())
        reports.done_waiting()
        if type(item) is int:
            return self.posted_step(item)
        if type(item) is ReadyStep:
            self._sent_steps += 1
            return item
        if isinstance(item, EndOfData):
            self._ended = True
            return item
        self._error = item
        raise self._error

    def posted_step(self, slot: int) -> ReadyStep:
        """The step of the board's post taken last, in ``slot``."""
        index = self._reports.board.taken - 1
        return ReadyStep(index, self._start + index * self._slot_batch, slot, "")

    def close(self, *, wait: bool = True) -> None:
        """Close the control socket, which ends the helper; reap it (idempotent).

        With ``wait=False`` the helper is left to exit on its own; a later
        ``close()`` reaps it.
        """
        self._lock_word = self._reports.board = None  # The ring it views is released after this
        self._reports.posts = False
        if self._conn is not None:
            self._conn.close()
            self._socket.close()
            self._conn = None  # type: ignore[assignment]
        if not self._started and self._process.returncode is None:
            # A helper never given a run holds nothing but its socket;
            # one still loading would notice the close only once its imports
            # are done (up to a second or more on a busy machine).
            self._process.kill()
        if wait and self._process.returncode is None:
            try:
                self._process.wait(timeout=_EXIT_WAIT_S)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
