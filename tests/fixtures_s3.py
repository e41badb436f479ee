"""S3 fixtures: one moto server on loopback per test session, a fresh bucket per test.

Loaded as a pytest plugin by tests/conftest.py. While the server runs, the
standard AWS variables in ``os.environ`` point at it, so child processes
(torchrun ranks, CLI subprocesses) reach it without extra options.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from zephon_stream.storage.embedded_s3 import EmbeddedS3

# tools/ is not installed; the repository root on sys.path lets tests
# and fixtures `import tools.fault_proxy` however pytest was started.
_REPO_ROOT = str(Path(__file__).resolve().parent.parent)
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)

from tools.fault_proxy import FaultProxy  # noqa: E402

_bucket_numbers = itertools.count()


@dataclasses.dataclass(frozen=True)
class S3Env:
    """Where a test's S3 data lives and how to reach it.

    Attributes:
        bucket: the bucket name (fresh for each test).
        endpoint_url: the moto server, ``http://127.0.0.1:PORT``.
        storage_options: s3fs options (dummy key/secret, endpoint, region);
            a fresh copy each time it is read.
        env: AWS variables for child processes.
        server: the running ``EmbeddedS3``.
    """

    bucket: str
    endpoint_url: str
    server: EmbeddedS3

    @property
    def storage_options(self) -> dict[str, Any]:
        return self.server.storage_options()

    @property
    def env(self) -> dict[str, str]:
        return self.server.env()

    def options_via(self, endpoint_url: str) -> dict[str, Any]:
        """Storage options that reach this server through another endpoint (a proxy)."""
        return {**self.server.storage_options(), "endpoint_url": endpoint_url}

    def url(self, prefix: str = "") -> str:
        """``s3://BUCKET/PREFIX`` (``s3://BUCKET`` for an empty prefix)."""
        prefix = prefix.strip("/")
        return f"s3://{self.bucket}/{prefix}" if prefix else f"s3://{self.bucket}"


@pytest.fixture(scope="session")
def s3_server() -> Iterator[EmbeddedS3]:
    """The session's moto server; AWS_* variables point at it while it runs."""
    with EmbeddedS3() as server, server.exported_env():
        yield server


@pytest.fixture
def s3_bucket(s3_server: EmbeddedS3) -> S3Env:
    """A fresh, empty bucket on the session's server."""
    name = f"zs-test-{next(_bucket_numbers)}-{uuid.uuid4().hex[:8]}"
    s3_server.create_bucket(name)
    return S3Env(bucket=name, endpoint_url=s3_server.endpoint_url, server=s3_server)


@pytest.fixture
def s3_url(s3_bucket: S3Env) -> Callable[[str], str]:
    """``s3_url("prefix")`` -> ``s3://<this test's bucket>/prefix``."""
    return s3_bucket.url


@pytest.fixture
def s3_options(s3_bucket: S3Env) -> dict[str, Any]:
    """Storage options reaching the session's server (same bucket as ``s3_bucket``)."""
    return s3_bucket.storage_options


@pytest.fixture
def blob(s3_bucket: S3Env) -> bytes:
    """A 2 MiB object ``data/blob.bin`` on the clean server, and its bytes."""
    from zephon_stream.storage import open_store

    payload = os.urandom(2 << 20)
    with open_store(s3_bucket.url("data"), s3_bucket.storage_options) as store:
        store.write_atomic("blob.bin", payload)
    return payload


@pytest.fixture
def fault_proxy(s3_server: EmbeddedS3) -> Iterator[Callable[..., FaultProxy]]:
    """``fault_proxy(rates={...}, seed=..., latency_s=...)`` -> a started FaultProxy
    in front of the session's server; every proxy made is stopped after the test.
    Reach S3 through it with ``s3_bucket.options_via(proxy.endpoint_url)``."""
    made: list[FaultProxy] = []

    def make(**kwargs: Any) -> FaultProxy:
        proxy = FaultProxy(upstream=s3_server.endpoint_url, **kwargs).start()
        made.append(proxy)
        return proxy

    yield make
    for proxy in made:
        proxy.stop()
