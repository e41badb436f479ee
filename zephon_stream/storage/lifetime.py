"""Child servers that die with the process that started them, and folders swept after a killed run.

A server started as a plain child (SeaweedFS, Azurite, fake-gcs-server, a
moto server process, a Ray head) outlives its parent when the parent is
killed: it is re-parented and serves on, holding its port and its folder.
``guarded_command(argv)`` wraps its command line in a guard: this file, run
by path in an isolated interpreter (standard library only, so it starts in
tens of milliseconds), which starts the command as its child and then

- waits for it and exits with its exit code, as the command would;
- passes SIGTERM, SIGINT and SIGHUP on to it (a caller's ``stop()``);
- checks twice a second whether its own parent is still the process that
  started it. The parent's death, however it died (SIGKILL included),
  re-parents the guard; the guard then stops the command (SIGTERM, SIGKILL
  after ``ORPHAN_GRACE_S``), SIGKILLs whatever else is left in its process
  group, removes the folder named by ``remove_on_orphan``, and exits.

Start the guarded command in a session of its own (``start_new_session``):
the guard then leads a process group holding the command and everything it
starts, so ``kill_group(pid)`` ends all of them at once.

Why not ``PR_SET_PDEATHSIG``: it fires when the *thread* that forked the
child ends, not the process, so a server restarted from a short-lived thread
would die with that thread; and it covers only the direct child, not what
the child starts (a Ray head's raylet and workers).

For a guard that was itself SIGKILLed (an operator's ``kill -9`` of the whole
group, a machine that lost power), ``mark_owner(folder)`` records who made a
folder, and ``sweep_orphaned(root, prefixes)`` removes the folders whose
maker no longer lives: the next run's start calls it.

The processes of the machine as ``/proc`` shows them (``process_stat``,
``processes``) are read here, once for the package and its tools: a pid's
start time, a guarded server's process group, whether a pid still runs.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple

POLL_S = 0.5
ORPHAN_GRACE_S = 3.0
OWNER_FILE = ".zs-owner"
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def guarded_command(argv: Sequence[str], *, remove_on_orphan: str | os.PathLike[str] | None = None) -> list[str]:
    """``argv`` run under a guard that stops it when the caller's process dies.

    Args:
        argv: the command line.
        remove_on_orphan: a folder the guard removes after stopping the
            command because its parent died (a temporary data folder).
    """
    guard = [sys.executable, "-I", "-S", os.path.abspath(__file__), "--parent", str(os.getpid())]
    if remove_on_orphan is not None:
        guard += ["--remove-on-orphan", os.fspath(remove_on_orphan)]
    return [*guard, "--", *argv]


def kill_group(pid: int, sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to the process group that ``pid`` leads (a guard started in a new session)."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


class ProcessStat(NamedTuple):
    """One process as ``/proc/PID/stat`` shows it.

    Attributes:
        pid: the process id.
        command: its command name (field 2, at most 15 bytes of it).
        state: its state letter (field 3: ``R``, ``S``, ``Z`` for a zombie, ...).
        parent: its parent's pid (field 4).
        group: its process group (field 5).
        start_ticks: when it started, in clock ticks since boot (field 22): a
            pid and its start time name one process, a pid alone may be reused.
    """

    pid: int
    command: str
    state: str
    parent: int
    group: int
    start_ticks: int


def process_stat(pid: int) -> ProcessStat | None:
    """What ``/proc/PID/stat`` says of ``pid``; None if it is gone (or cannot be read)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            head, tail = stat.read().rsplit(b")", 1)
        # The command name, in parentheses, may hold spaces and ")": the
        # fields after the last ")" start at field 3 (state).
        fields = tail.split()
        return ProcessStat(
            pid=pid,
            command=head.split(b"(", 1)[1].decode(errors="replace"),
            state=fields[0].decode(),
            parent=int(fields[1]),
            group=int(fields[2]),
            start_ticks=int(fields[19]),
        )
    except (OSError, ValueError, IndexError):
        return None


def processes() -> Iterator[ProcessStat]:
    """Every process this user can read in ``/proc``."""
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := process_stat(int(entry))) is not None:
            yield stat


def process_start_ticks(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks since boot; None if it is gone (``ProcessStat.start_ticks``)."""
    stat = process_stat(pid)
    return None if stat is None else stat.start_ticks


def mark_owner(folder: str | os.PathLike[str], pid: int | None = None) -> None:
    """Record in ``folder`` that the process ``pid`` (default: this one) made it and uses it."""
    pid = os.getpid() if pid is None else pid
    with open(os.path.join(folder, OWNER_FILE), "w") as record:
        record.write(f"{pid} {process_start_ticks(pid)}\n")


def owner_lives(folder: str | os.PathLike[str]) -> bool | None:
    """Whether the process that marked ``folder`` still runs; None when it holds no readable record."""
    try:
        with open(os.path.join(folder, OWNER_FILE)) as record:
            pid_text, ticks_text = record.read().split()
        pid, ticks = int(pid_text), int(ticks_text)
    except (OSError, ValueError):
        return None
    return process_start_ticks(pid) == ticks


def sweep_orphaned(root: str | os.PathLike[str], prefixes: Iterable[str]) -> list[str]:
    """Remove the folders in ``root`` named ``PREFIX*`` whose marked owner is gone.

    A folder without a record is left alone: it may belong to a process
    that is making it right now, or to something else.

    Returns:
        The paths removed.
    """
    prefixes = tuple(prefixes)
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return []
    removed = []
    for name in names:
        path = os.path.join(root, name)
        if name.startswith(prefixes) and os.path.isdir(path) and owner_lives(path) is False:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


# -- the guard (this file run as a script) ----------------------------------


def _wait_or_orphaned(child: subprocess.Popen, parent: int) -> int | None:
    """The child's exit code once it exits; None as soon as this process's parent is not ``parent``."""
    pidfd = _pidfd(child.pid)
    try:
        while True:
            if pidfd is not None:
                select.select([pidfd], [], [], POLL_S)
                code = child.poll()
            else:
                try:
                    code = child.wait(timeout=POLL_S)
                except subprocess.TimeoutExpired:
                    code = None
            if code is not None:
                return code
            if os.getppid() != parent:
                return None
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _stop_orphaned(child: subprocess.Popen, folder: str | None) -> None:
    child.terminate()
    try:
        child.wait(timeout=ORPHAN_GRACE_S)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
    # What the command started (a raylet, its workers) shares the
    # guard's group; the guard goes with them.
    for sig in _FORWARDED:
        signal.signal(sig, signal.SIG_DFL)
    if os.getpgid(0) == os.getpid():
        os.killpg(os.getpid(), signal.SIGKILL)


def _main(args: list[str]) -> int:
    parent, folder = os.getppid(), None
    # The caller names itself: a caller that died before this line ran
    # has already re-parented the guard, and getppid() alone would not tell.
    if args[:1] == ["--parent"]:
        parent, args = int(args[1]), args[2:]
    if args[:1] == ["--remove-on-orphan"]:
        folder, args = args[1], args[2:]
    if args[:1] != ["--"] or len(args) < 2:
        print("usage: lifetime.py [--parent PID] [--remove-on-orphan DIR] -- COMMAND...", file=sys.stderr)
        return 2
    child = subprocess.Popen(args[1:], stdin=subprocess.DEVNULL)
    for sig in _FORWARDED:
        signal.signal(sig, lambda number, frame: child.poll() is None and child.send_signal(number))
    code = _wait_or_orphaned(child, parent)
    if code is None:
        _stop_orphaned(child, folder)
        return 1
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
