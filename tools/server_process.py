"""One object-store server as a child process: start, wait until it answers, stop by pid.

The launchers in ``tools/seaweedfs.py``, ``tools/fake_gcs.py`` and
``tools/azurite.py`` subclass ``LoopbackServer``, which holds what they share
(data folder, port, start/stop/kill/restart, context manager); each gives its
command line, readiness probe, buckets and client options. ``ServerProcess``
runs the command. ``kill()`` SIGKILLs the server and ``restart()`` starts the
same command again, on the same ports and data folder, which is how tests
simulate a server that dies under a running job and comes back.

No server outlives the process that started it, whatever kills that process:
each runs under the guard of ``zephon_stream/storage/lifetime.py``, which
stops it (and removes a temporary data folder) once its starter is gone, and
a temporary data folder records its owner, so that ``sweep_orphaned`` at the
next test session removes what a guard killed with it left.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess as sp
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, ClassVar, TypeVar

# The helper EmbeddedS3 uses too; tools import the library, never the reverse.
from zephon_stream.storage.embedded_s3 import exported_env
from zephon_stream.storage.lifetime import guarded_command, kill_group, mark_owner

SERVER_DIR_PREFIXES = ("zs-seaweedfs-", "zs-azurite-", "zs-fake-gcs-", "zs-ray-")
"""The temporary folders of the servers tools/ start (``sweep_orphaned`` takes them)."""

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


def installed_command(name: str, missing: str) -> str:
    """The path of command ``name``, on the PATH or beside this interpreter.

    pip puts a package's commands beside the interpreter, which is not
    on the PATH when a virtual environment's python runs without being activated.

    Raises:
        FileNotFoundError: ``missing`` (what to install).
    """
    path = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if path is None:
        raise FileNotFoundError(missing)
    return path


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
        remove_on_orphan: a folder removed with the server when this
            process dies without stopping it.

    ``pid`` is the guard's: it leads the process group that holds the server
    and whatever the server starts.
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
        remove_on_orphan: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self._ready = ready
        self.log_path = log_path
        self._env = env
        self._start_timeout_s = start_timeout_s
        self._remove_on_orphan = remove_on_orphan
        self._process: sp.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> ServerProcess:
        """Start the command and wait until ``ready()`` holds.

        Raises:
            ServerStartError: it exited, or did not answer within the timeout
                (it is stopped then); the message holds the end of its log.
        """
        if self.running:
            return self
        with open(self.log_path, "ab") as log:
            # A new session, so a Ctrl-C meant for the caller's terminal
            # does not reach the server before the caller stops it in order.
            # The guard leads a group of its own, so kill_group reaches what the server starts.
            self._process = sp.Popen(
                guarded_command(self.argv, remove_on_orphan=self._remove_on_orphan),
                stdin=sp.DEVNULL,
                stdout=log,
                stderr=sp.STDOUT,
                env=self._env,
                start_new_session=True,
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
        """SIGTERM the server (its guard passes it on), SIGKILL its group if it
        is still there after a while, and reap it."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            except sp.TimeoutExpired:
                pass
        # Also what a server that exited left running in its group.
        kill_group(process.pid)
        process.wait(timeout=STOP_TIMEOUT_S)

    def kill(self) -> None:
        """SIGKILL the server and everything in its group (no shutdown at all) and reap it; its data stay."""
        process, self._process = self._process, None
        if process is None:
            return
        kill_group(process.pid)
        process.wait(timeout=STOP_TIMEOUT_S)

    def restart(self) -> ServerProcess:
        """Start the same command again (same ports, same data) and wait until it answers."""
        self.kill()
        return self.start()


_Server = TypeVar("_Server", bound="LoopbackServer")


class LoopbackServer:
    """A server launched on ``host`` with its data in a folder, as a context manager.

    Subclasses set ``_server_name``, ``_dir_prefix`` and ``_log_name`` and give
    ``_binary``, ``_argv``, ``_ready``, ``_populate`` (buckets or containers
    made once it answers) and ``env``; ``_pick_ports``, ``_process_env`` and
    ``_temp_root`` have defaults.

    Args:
        data_dir: where the data live; None makes a temporary folder, removed
            by ``stop()``. A given folder is kept.
        port: the port clients use; 0 picks a free one.
        host: the address to bind.
    """

    _server_name: ClassVar[str]  # in the child process's messages (``"fake-gcs-server"``)
    _dir_prefix: ClassVar[str]  # of a temporary data folder
    _log_name: ClassVar[str]  # the server's log, in the data folder

    def __init__(self, *, data_dir: str | os.PathLike[str] | None, port: int, host: str) -> None:
        self._host = host
        self._requested_port = port
        self._owns_dir = data_dir is None
        self._data_dir = Path(data_dir) if data_dir is not None else None
        self._port = 0
        self._process: ServerProcess | None = None

    @property
    def data_dir(self) -> Path:
        if self._data_dir is None:
            raise RuntimeError(f"{type(self).__name__} is not started")
        return self._data_dir

    @property
    def port(self) -> int:
        return self._port

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def endpoint_url(self) -> str:
        if not self._port:
            raise RuntimeError(f"{type(self).__name__} is not started")
        return f"http://{self._host}:{self._port}"

    def env(self) -> dict[str, str]:
        """Variables that point a client in a child process at this server."""
        raise NotImplementedError

    def exported_env(self) -> contextlib.AbstractContextManager[None]:
        """Set ``env()`` in this process while the block runs."""
        return exported_env(self.env())

    def _binary(self) -> str:
        """The server's executable; raises FileNotFoundError with an install hint."""
        raise NotImplementedError

    def _argv(self, binary: str) -> list[str]:
        """The command line (data folder and ports are chosen by then)."""
        raise NotImplementedError

    def _ready(self) -> bool:
        """Whether the server answers."""
        raise NotImplementedError

    def _populate(self) -> None:
        """Create what the constructor asked for, once the server answers."""

    def _pick_ports(self) -> None:
        self._port = self._requested_port or free_ports(1, self._host)[0]

    def _process_env(self) -> dict[str, str] | None:
        return None

    def _temp_root(self) -> str | None:
        """Where a temporary data folder is made (None: the temporary folder)."""
        return None

    def start(self: _Server) -> _Server:
        """Start the server, wait until it answers, and create its buckets.

        Raises:
            FileNotFoundError: the server is not installed (before any folder is made).
            ServerStartError: it exited or did not answer (the message quotes its log).
        """
        if self._process is not None and self._process.running:
            return self
        binary = self._binary()
        if self._data_dir is None:
            self._data_dir = Path(tempfile.mkdtemp(prefix=self._dir_prefix, dir=self._temp_root()))
            mark_owner(self._data_dir)
        self._data_dir.mkdir(parents=True, exist_ok=True)
        self._pick_ports()
        self._process = ServerProcess(
            name=f"{self._server_name} on {self._host}:{self._port}",
            argv=self._argv(binary),
            ready=self._ready,
            log_path=self._data_dir / self._log_name,
            env=self._process_env(),
            remove_on_orphan=self._data_dir if self._owns_dir else None,
        )
        try:
            self._process.start()
            self._populate()
        except BaseException:
            self.stop()
            raise
        return self

    def kill(self) -> None:
        """SIGKILL the server; ports and data are kept for ``restart()``."""
        if self._process is not None:
            self._process.kill()

    def restart(self: _Server) -> _Server:
        """Start the server again on the same ports and data (after ``kill()`` or not)."""
        if self._process is None:
            raise RuntimeError(f"{type(self).__name__} was never started")
        self._process.restart()
        return self

    def stop(self) -> None:
        """Stop the server; a temporary data folder is removed."""
        if self._process is not None:
            self._process.stop()
            self._process = None
        if self._owns_dir and self._data_dir is not None:
            shutil.rmtree(self._data_dir, ignore_errors=True)
            self._data_dir = None
        self._port = 0

    def __enter__(self: _Server) -> _Server:
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        where = f"{self._host}:{self._port} pid {self.pid}" if self._port else "stopped"
        return f"{type(self).__name__}({where})"


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

    SIGTERM is caught from before the start, so one sent as soon as the
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
