"""Azure Blob Storage on loopback: Azurite's blob service on a free port, data in a folder.

Azurite comes from npm. ``azurite_blob_binary()`` uses ``azurite-blob`` from
``$AZURITE_BLOB``, the PATH, or a cache folder (``$ZEPHON_AZURITE_DIR``,
default ``~/.cache/zephon-stream/azurite-VERSION``), and installs it there with
``npm install`` when none is found; node and npm must be on the PATH.

It always runs with ``--disableTelemetry``: without it Azurite contacts an
outside telemetry host at start. It serves the published development account
(``devstoreaccount1``) and checks request signatures against its key.

    python tools/azurite.py --container data
"""

from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import subprocess as sp
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools.server_process import LoopbackServer, answers_http, serve_until_signalled

AZURITE_VERSION = "3.37.0"
ACCOUNT_NAME = "devstoreaccount1"
# Azurite's published development key (in Azure's docs), not a secret.
ACCOUNT_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
# Azurite saves its metadata (which blobs exist) every 5 s; a blob
# written less than this before a SIGKILL is gone after the restart.
METADATA_SAVE_INTERVAL_S = 5.0
INSTALL_HINT = f"install node and npm (Azurite is then installed with: npm install azurite@{AZURITE_VERSION})"
_NPM_INSTALL_TIMEOUT_S = 600.0


def azurite_install_dir() -> Path:
    """Where Azurite is installed when it is not on the PATH."""
    configured = os.environ.get("ZEPHON_AZURITE_DIR")
    if configured:
        return Path(configured)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "zephon-stream" / f"azurite-{AZURITE_VERSION}"


def azurite_blob_binary(*, install: bool = True) -> str:
    """The path of ``azurite-blob``, installed with npm into the cache folder if missing.

    Raises:
        FileNotFoundError: not found and ``install`` is False, or npm is missing;
            the message says what to install.
        RuntimeError: ``npm install`` failed (its output is quoted).
    """
    for candidate in (os.environ.get("AZURITE_BLOB"), shutil.which("azurite-blob")):
        if candidate:
            return candidate
    folder = azurite_install_dir()
    binary = folder / "node_modules" / ".bin" / "azurite-blob"
    if binary.exists():
        return str(binary)
    if not install:
        raise FileNotFoundError(f"azurite-blob not found in {folder} or on PATH; {INSTALL_HINT}")
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        raise FileNotFoundError(f"azurite-blob not found and node/npm are missing; {INSTALL_HINT}")
    folder.mkdir(parents=True, exist_ok=True)
    # Test sessions started at once would otherwise run npm into the same
    # folder together; the second one waits and then finds the binary.
    with open(folder / ".install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not binary.exists():
            result = sp.run(
                [npm, "install", "--prefix", str(folder), "--no-audit", "--no-fund", f"azurite@{AZURITE_VERSION}"],
                capture_output=True,
                text=True,
                timeout=_NPM_INSTALL_TIMEOUT_S,
            )
            if result.returncode != 0 or not binary.exists():
                raise RuntimeError(
                    f"npm install azurite@{AZURITE_VERSION} into {folder} failed (code {result.returncode}):\n"
                    f"{(result.stdout + result.stderr)[-2000:]}"
                )
    return str(binary)


def connection_string(blob_endpoint: str, account_key: str = ACCOUNT_KEY) -> str:
    """An Azure connection string for the development account at ``blob_endpoint``."""
    return (
        f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT_NAME};AccountKey={account_key};"
        f"BlobEndpoint={blob_endpoint.rstrip('/')}/{ACCOUNT_NAME};"
    )


class Azurite(LoopbackServer):
    """Azurite's blob service on 127.0.0.1, as a context manager.

    ``start()`` installs Azurite first if it is missing (FileNotFoundError
    when it cannot be).

    Args:
        data_dir: where blobs and metadata live; None makes a temporary
            folder, removed by ``stop()``. A given folder is kept.
        port: the blob port; 0 picks a free one.
        containers: containers created once the server answers.
        host: the address to bind.
    """

    _server_name = "Azurite"
    _dir_prefix = "zs-azurite-"
    _log_name = "azurite.log"

    def __init__(
        self,
        *,
        data_dir: str | os.PathLike[str] | None = None,
        port: int = 0,
        containers: Iterable[str] = (),
        host: str = "127.0.0.1",
    ) -> None:
        super().__init__(data_dir=data_dir, port=port, host=host)
        self._containers = list(containers)

    def connection_string(self, endpoint_url: str | None = None) -> str:
        """The development account's connection string, via ``endpoint_url`` (a proxy) if given."""
        return connection_string(endpoint_url or self.endpoint_url)

    def storage_options(self) -> dict[str, Any]:
        """adlfs options reaching this server."""
        return {"connection_string": self.connection_string()}

    def env(self) -> dict[str, str]:
        """Variables that point adlfs in a child process at this server."""
        return {"AZURE_STORAGE_CONNECTION_STRING": self.connection_string()}

    def _binary(self) -> str:
        return azurite_blob_binary()

    def _argv(self, binary: str) -> list[str]:
        workspace = self.data_dir / "workspace"
        workspace.mkdir(parents=True, exist_ok=True)
        return [
            binary,
            "--blobHost", self._host,
            "--blobPort", str(self._port),
            "--location", str(workspace),
            "--silent",
            "--skipApiVersionCheck",
            "--loose",
            "--disableTelemetry",
        ]  # fmt: skip

    def _ready(self) -> bool:
        return answers_http(f"{self.endpoint_url}/{ACCOUNT_NAME}?comp=list")

    def _populate(self) -> None:
        for container in self._containers:
            self.create_container(container)

    def kill(self) -> None:
        """SIGKILL the server; port and data are kept for ``restart()``.

        Blobs written within ``METADATA_SAVE_INTERVAL_S`` before are lost.
        """
        super().kill()

    def create_container(self, name: str) -> str:
        """Create container ``name`` (existing is fine) and return ``az://name``."""
        from azure.core.exceptions import ResourceExistsError
        from azure.storage.blob import BlobServiceClient

        with BlobServiceClient.from_connection_string(self.connection_string()) as client:
            try:
                client.create_container(name)
            except ResourceExistsError:
                pass
        return f"az://{name}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run Azurite (Azure Blob) on 127.0.0.1 until interrupted.")
    parser.add_argument("--port", type=int, default=0, help="blob port (0: a free one)")
    parser.add_argument("--dir", default=None, help="data folder, kept (default: a temporary one, removed)")
    parser.add_argument("--container", action="append", default=[], help="container to create (repeatable)")
    args = parser.parse_args(argv)
    server = Azurite(data_dir=args.dir, port=args.port, containers=args.container)

    def lines() -> list[str]:
        head = f"Azurite blob on {server.endpoint_url}, pid {server.pid}, data in {server.data_dir}"
        return [head, *(f"export {name}='{value}'" for name, value in server.env().items())]

    return serve_until_signalled(server, name="Azurite", lines=lines)


if __name__ == "__main__":
    sys.exit(main())
