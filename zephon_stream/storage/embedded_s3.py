"""An S3 server on loopback (moto) for tests, benchmarks and the demo.

``EmbeddedS3`` runs moto in a thread of this process by default. With
``subprocess=True`` it runs ``python -m moto.server`` in a child process: the
server then does not compete for this process's GIL and serves other
processes too; it stops with this process, however that ends (a guard,
``lifetime.py``). Buckets live in the server's memory and vanish with it.

moto reads a whole object for every ranged GET (about 3 ms per MiB of
object on a busy 2-core machine), so a range read costs time proportional to
the object, not the range. Benchmarks against it should keep shards small or
compare against a baseline that pays the same cost.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import subprocess as sp
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

from zephon_stream.storage.lifetime import guarded_command, kill_group

logger = logging.getLogger("zephon_stream.storage")

DUMMY_KEY = "testing-key-id"
DUMMY_SECRET = "testing-secret-value"
DEFAULT_REGION = "us-east-1"
_START_TIMEOUT_S = 60.0


def _port_is_free(host: str, port: int) -> bool:
    """Whether a server could listen on ``host:port`` now, as the OS decides it
    for one that sets ``SO_REUSEADDR`` (moto's werkzeug server does)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # Without SO_REUSEADDR the bind fails while connections of an
        # earlier server on the port linger in TIME-WAIT (a minute after a
        # demo), though nothing listens and the server itself would bind; with
        # it, only a listening socket (or one bound without it) refuses us.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
            sock.listen(1)
        except OSError:
            return False
    return True


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


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


class EmbeddedS3:
    """A moto S3 server on 127.0.0.1, as a context manager.

    Args:
        port: port to listen on; 0 picks a free one. A requested port that
            another socket listens on is reported once (a warning on the
            ``zephon_stream.storage`` logger) and a free one is used instead.
        subprocess: run the server as a child process instead of a thread.
        host: address to bind (loopback by default).
    """

    def __init__(self, *, port: int = 0, subprocess: bool = False, host: str = "127.0.0.1") -> None:
        self._host = host
        self._requested_port = port
        self._subprocess = subprocess
        self._port = 0
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._process: sp.Popen[bytes] | None = None
        self._client: Any = None
        self._client_lock = threading.Lock()

    @property
    def port(self) -> int:
        return self._port

    @property
    def endpoint_url(self) -> str:
        if not self._port:
            raise RuntimeError("EmbeddedS3 is not started")
        return f"http://{self._host}:{self._port}"

    def storage_options(self) -> dict[str, Any]:
        """s3fs options reaching this server with its dummy credentials."""
        return {
            "key": DUMMY_KEY,
            "secret": DUMMY_SECRET,
            "endpoint_url": self.endpoint_url,
            "client_kwargs": {"region_name": DEFAULT_REGION},
        }

    def env(self) -> dict[str, str]:
        """AWS variables that point a child process (or s3fs) at this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": DUMMY_KEY,
            "AWS_SECRET_ACCESS_KEY": DUMMY_SECRET,
            "AWS_DEFAULT_REGION": DEFAULT_REGION,
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    @contextlib.contextmanager
    def exported_env(self) -> Iterator[None]:
        """Point this process's AWS variables at the server while the block
        runs (child processes inherit them), then restore the old values."""
        with exported_env(self.env()):
            yield

    def _pick_port(self) -> int:
        port = self._requested_port
        if port and not _port_is_free(self._host, port):
            port_new = _free_port(self._host)
            logger.warning(
                "embedded S3: port %d on %s is in use; serving on port %d instead", port, self._host, port_new
            )
            return port_new
        return port

    def start(self) -> EmbeddedS3:
        """Start the server and wait until it answers."""
        if self._port:
            return self
        port = self._pick_port()
        if self._subprocess:
            self._start_process(port or _free_port(self._host))
        else:
            self._start_thread(port)
        self._wait_ready()
        return self

    def _start_thread(self, port: int) -> None:
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
        from werkzeug.serving import WSGIRequestHandler, make_server

        class QuietHandler(WSGIRequestHandler):
            def log_request(self, *args: Any, **kwargs: Any) -> None:
                pass

        app = DomainDispatcherApplication(create_backend_app)
        # The server is bound here, in the caller's thread, so a bind
        # failure raises instead of leaving a thread that never gets ready.
        self._server = make_server(self._host, port, app, threaded=True, request_handler=QuietHandler)
        self._port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="embedded-s3", daemon=True)
        self._thread.start()

    def _start_process(self, port: int) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        # Under a guard that stops it if this process dies without stop() (lifetime.py).
        self._process = sp.Popen(
            guarded_command([sys.executable, "-m", "moto.server", "-H", self._host, "-p", str(port)]),
            stdout=sp.DEVNULL,
            stderr=sp.DEVNULL,
            env=env,
            start_new_session=True,
        )
        self._port = port

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + _START_TIMEOUT_S
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            if self._process is not None and self._process.poll() is not None:
                port = self._port
                self._port = 0
                raise RuntimeError(
                    f"embedded S3: moto server exited with code {self._process.returncode} "
                    f"on {self._host}:{port} (port taken or moto missing?)"
                )
            try:
                with urllib.request.urlopen(f"{self.endpoint_url}/moto-api/", timeout=2):
                    return
            except Exception as exc:  # noqa: BLE001 - polled until the deadline
                last_error = exc
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"embedded S3: no answer on {self._host} within {_START_TIMEOUT_S:.0f}s ({last_error})")

    def stop(self) -> None:
        """Stop the server; its buckets are gone."""
        with self._client_lock:
            if self._client is not None:
                self._client.close()
                self._client = None
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except sp.TimeoutExpired:
                pass
            kill_group(self._process.pid)
            self._process.wait(timeout=10)
            self._process = None
        self._port = 0

    def client(self) -> Any:
        """A botocore S3 client for this server (bucket admin in tests and tools)."""
        import botocore.session
        from botocore.config import Config

        session = botocore.session.get_session()
        return session.create_client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=DUMMY_KEY,
            aws_secret_access_key=DUMMY_SECRET,
            region_name=DEFAULT_REGION,
            config=Config(retries={"total_max_attempts": 3, "mode": "standard"}),
        )

    def create_bucket(self, name: str) -> str:
        """Create bucket ``name`` (existing is fine) and return ``s3://name``."""
        with self._client_lock:
            if self._client is None:
                self._client = self.client()
            client = self._client
        try:
            client.create_bucket(Bucket=name)
        except client.exceptions.BucketAlreadyOwnedByYou:
            pass
        return f"s3://{name}"

    def __enter__(self) -> EmbeddedS3:
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        where = f"{self._host}:{self._port}" if self._port else "stopped"
        mode = "subprocess" if self._subprocess else "thread"
        return f"EmbeddedS3({where}, {mode})"
