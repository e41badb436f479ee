"""One object-store server as a child process: start, wait until it answers, stop by pid.

The launchers in ``tools/seaweedfs.py``, ``tools/fake_gcs.py`` and
``tools/azurite.py`` build a command line and a readiness probe; this module
runs it. ``kill()`` SIGKILLs the server and ``restart()`` starts the same
command again, on the same ports and data folder, which is how tests simulate
a server that dies under a running job and comes back.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess as sp
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any
from pathlib import Path

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0


class ServerStartError(RuntimeError):
    """The server exited or did not answer in time; the message quotes its log."""


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports free on ``host`` right now (all held until all are chosen)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((host, 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _log_tail(path: Path, num_lines: int = 20) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(lines[-num_lines:]) or "(empty log)"


class ServerProcess:
    """A command run as a child process, with its output in ``log_path``.

    Args:
        name: what the server is, for messages (``"SeaweedFS"``).
        argv: the command line.
        ready: returns True once the server answers; polled after start.
        log_path: where stdout and stderr go (appended across restarts).
        env: the child's environment (default: this process's).
        start_timeout_s: how long ``start`` waits for ``ready``.
    """

    def __init__(
        self,
        *,
        name: str,
        argv: Sequence[str],
        ready: Callable[[], bool],
        log_path: Path,
        env: dict[str, str] | None = None,
        start_timeout_s: float = START_TIMEOUT_S,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self._ready = ready
        self.log_path = log_path
        self._env = env
        self._start_timeout_s = start_timeout_s
        self._process: sp.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> "ServerProcess":
        """Start the command and wait until ``ready()`` holds.

        Raises:
            ServerStartError: it exited, or did not answer within the timeout
                (it is stopped then); the message holds the end of its log.
        """
        if self.running:
            return self
        with open(self.log_path, "ab") as log:
            # NOTE: a new session, so a Ctrl-C meant for the caller's terminal
            # does not reach the server before the caller stops it in order.
            self._process = sp.Popen(
                self.argv, stdin=sp.DEVNULL, stdout=log, stderr=sp.STDOUT, env=self._env, start_new_session=True
            )
        deadline = time.monotonic() + self._start_timeout_s
        while time.monotonic() < deadline:
            code = self._process.poll()
            if code is not None:
                self._process = None
                raise ServerStartError(
                    f"{self.name} exited with code {code} at start; its log {self.log_path} ends:\n"
                    f"{_log_tail(self.log_path)}"
                )
            try:
                if self._ready():
                    return self
            except Exception:  # noqa: BLE001 - polled until the deadline
                pass
            time.sleep(0.1)
        self.stop()
        raise ServerStartError(
            f"{self.name} did not answer within {self._start_timeout_s:.0f}s; its log {self.log_path} ends:\n"
            f"{_log_tail(self.log_path)}"
        )

    def stop(self) -> None:
        """SIGTERM the server, SIGKILL it if it is still there after a while, and reap it."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except sp.TimeoutExpired:
            process.kill()
            process.wait(timeout=STOP_TIMEOUT_S)

    def kill(self) -> None:
        """SIGKILL the server (no shutdown at all) and reap it; its data stay."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=STOP_TIMEOUT_S)

    def restart(self) -> "ServerProcess":
        """Start the same command again (same ports, same data) and wait until it answers."""
        self.kill()
        return self.start()


@contextlib.contextmanager
def exported_env(values: dict[str, str]) -> Iterator[None]:
    """Set ``values`` in ``os.environ`` while the block runs (child processes
    inherit them), then restore what was there."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def answers_http(url: str, timeout_s: float = 2.0) -> bool:
    """Whether anything answers HTTP at ``url`` (an error status counts: the server is up)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s):
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


def serve_until_signalled(server: Any, *, name: str, lines: Callable[[], Iterable[str]]) -> int:
    """A launcher's ``__main__``: start ``server``, print ``lines()``, serve until
    SIGTERM or Ctrl-C, stop it. Returns the exit code (1: it could not start).

    NOTE: SIGTERM is caught from before the start, so one sent as soon as the
    lines appear still stops the server instead of orphaning it.
    """
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        try:
            server.start()
        except (FileNotFoundError, RuntimeError) as exc:
            print(exc, file=sys.stderr)
            return 1
        try:
            for line in lines():
                print(line, flush=True)
            while not stop.wait(0.5):
                pass
        except KeyboardInterrupt:
            pass
        finally:
            server.stop()
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(f"{name} stopped", flush=True)
    return 0
