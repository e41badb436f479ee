"""One local Ray head for the whole test session, and the driver processes that use it.

Loaded as a pytest plugin by tests/conftest.py. No test process is a Ray
driver or runs a Ray daemon: Ray ends a driver whose node fails ("connection
to the plasma store is failed. Terminate the process"), and a driver inside
a pytest-xdist worker took the worker and every fixture it held with it.

- ``ray_instance``: ``tools/ray_head.py``'s ``RayHead`` (``ray start --head
  --block``, 2 CPUs, no dashboard, usage reporting off, every port free on
  loopback), under the guard that stops it when the worker dies. Drivers in
  other processes connect to ``RayInstance.address``.
- ``ray_driver``: runs a function in a driver process connected to the head
  (``RayDriver.call`` / ``submit``); its result or exception comes back. When
  Ray ends that process (its node failed), the call raises
  ``RayDriverLost`` naming the exit and where the node's logs are, that test
  fails, and the next test gets a head and a driver that run: a head found
  dead is started again.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import multiprocessing
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# tools/ is not installed; the repository root on sys.path makes it importable.
_REPO_ROOT = str(Path(__file__).resolve().parent.parent)
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)

from tools.ray_head import RayHead  # noqa: E402

RAY_TEST_CPUS = 2


class RayDriverLost(RuntimeError):
    """The driver process ended under a call: Ray ends its drivers when their node fails."""


@dataclasses.dataclass
class RayInstance:
    """The session's Ray head.

    Attributes:
        head: the running ``RayHead``.
    """

    head: RayHead

    @property
    def address(self) -> str:
        """Its GCS address, for drivers in other processes."""
        return self.head.address

    @property
    def temp_dir(self) -> Path:
        """Its session files."""
        return self.head.data_dir

    def worker_pids(self, title: str) -> list[int]:
        """This instance's worker processes whose title starts with ``title`` (``ray::convert_unit_task``)."""
        return self.head.worker_pids(title)

    def child_env(self) -> dict[str, str]:
        """This process's environment for a driver or a CLI run in a child process."""
        env = {**os.environ, **self.head.env()}
        env["PYTHONPATH"] = os.pathsep.join([_REPO_ROOT, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        return env

    def head_log_tail(self, num_lines: int = 12) -> str:
        """The end of ``ray start``'s output, which names a Ray process that exited unexpectedly."""
        try:
            lines = (self.head.data_dir / "ray-start.log").read_text(errors="replace").splitlines()
        except (OSError, RuntimeError):
            return "(no log)"
        # The raylet's periodic dumps of its counters tell nothing about an exit.
        lines = [line for line in lines if line.strip() and not line.startswith("[state-dump]")]
        return "\n".join(lines[-num_lines:])

    def ensure_running(self) -> bool:
        """Start the head again if it died; whether it had to."""
        if self.head.pid is not None and self.head.group_pids() and self.head.raylet_pid() is not None:
            return False
        self.head.stop()
        self.head.start()
        return True


def _connect(address: str, env: dict[str, str]) -> None:
    """The driver process's start: this test session's environment, then Ray connected to the head."""
    os.environ.update(env)
    import ray

    ray.init(address=address, log_to_driver=False)


def _run(function: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    return function(*args, **kwargs)


class RayDriver:
    """A Ray driver in a process of its own: functions run there, their results come back pickled.

    Functions must be importable by name (module-level) and their arguments
    and results picklable; an exception the function raises is raised again
    here.
    """

    def __init__(self, instance: RayInstance) -> None:
        self._instance = instance
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None

    def submit(self, function: Callable[..., Any], /, *args: Any, **kwargs: Any) -> DriverCall:
        """Start ``function(*args, **kwargs)`` in the driver; its future (``result()`` raises ``RayDriverLost``)."""
        if self._pool is None:
            self._pool = concurrent.futures.ProcessPoolExecutor(
                max_workers=1,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_connect,
                initargs=(self._instance.address, self._instance.child_env()),
            )
        return DriverCall(self._pool.submit(_run, function, args, kwargs), self)

    def call(self, function: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """``function(*args, **kwargs)`` run in the driver, waited for."""
        return self.submit(function, *args, **kwargs).result()

    def lost(self, cause: BaseException) -> RayDriverLost:
        """The error for a driver that ended; the next call starts a new one."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        return RayDriverLost(
            f"the Ray driver process ended during the call ({cause}); Ray ends its drivers when their node "
            f"fails. The head's log ends:\n{self._instance.head_log_tail()}"
        )

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


class DriverCall:
    """A call running in the driver; ``result()`` names a lost driver as ``RayDriverLost``."""

    def __init__(self, inner: concurrent.futures.Future, driver: RayDriver) -> None:
        self._inner, self._driver = inner, driver

    def done(self) -> bool:
        return self._inner.done()

    def result(self, timeout: float | None = None) -> Any:
        try:
            return self._inner.result(timeout)
        except concurrent.futures.process.BrokenProcessPool as exc:
            raise self._driver.lost(exc) from None


@pytest.fixture(scope="session")
def ray_instance() -> Iterator[RayInstance]:
    """The session's local Ray head (2 CPUs), in processes of its own."""
    with RayHead(num_cpus=RAY_TEST_CPUS) as head:
        yield RayInstance(head=head)


@pytest.fixture(scope="session")
def _ray_session_driver(ray_instance: RayInstance) -> Iterator[RayDriver]:
    driver = RayDriver(ray_instance)
    try:
        yield driver
    finally:
        driver.close()


@pytest.fixture
def ray_driver(ray_instance: RayInstance, _ray_session_driver: RayDriver) -> RayDriver:
    """A driver process connected to the session's head, started again with the head if the head died."""
    if ray_instance.ensure_running():
        _ray_session_driver.close()
    return _ray_session_driver


@dataclasses.dataclass(frozen=True)
class DatasetContents:
    """What a dataset holds, apart from where its blocks end.

    Attributes:
        tokens: the whole token stream.
        documents: ``(source, record, token_start, token_end)`` of each document, in stream order.
        sources: the manifest's per-source accounting.
        rejects: the lines of ``rejects.jsonl``.
        problems: what ``verify`` found (nothing, for a sound dataset).
    """

    tokens: object
    documents: list[tuple[str, int, int, int]]
    sources: tuple
    rejects: list[bytes]
    problems: tuple


def dataset_contents(url: str, storage_options: dict | None = None) -> DatasetContents:
    """Read back a committed dataset's token stream, documents, accounting and rejects, and verify it."""
    from zephon_stream.reader import DatasetReader
    from zephon_stream.reader.verify import verify_dataset

    with DatasetReader.open(url, storage_options) as reader:
        manifest = reader.manifest
        documents = [(d.source, d.record, d.token_start, d.token_end) for d in reader.documents(0, manifest.num_tokens)]
        return DatasetContents(
            tokens=reader.read_tokens(0, manifest.num_tokens),
            documents=documents,
            sources=manifest.sources,
            rejects=reader.store.read(manifest.rejects_path).splitlines(),
            problems=verify_dataset(reader, workers=2).problems,
        )


def assert_same_contents(got: DatasetContents, want: DatasetContents) -> None:
    """Equal token streams, document boundaries and sources, accounting and rejects; both verified."""
    import numpy as np

    assert got.problems == () and want.problems == ()
    assert len(got.tokens) == len(want.tokens)
    assert np.array_equal(got.tokens, want.tokens)
    assert got.documents == want.documents
    assert got.sources == want.sources
    assert got.rejects == want.rejects


def folder_bytes(root: Path) -> dict[str, bytes]:
    """Every file below ``root`` by its relative path."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


RAY_UNIT_BYTES = 96 * 1024
RAY_BLOCK_TOKENS = 4097
RAY_BLOCKS_PER_SHARD = 4


@dataclasses.dataclass(frozen=True)
class RayInputs:
    """Inputs of every kind a unit is cut from, all real text from the stdlib sources.

    Attributes:
        root: the folder holding them.
        paths: the inputs, in input order: small ``.py`` files (grouped into
            units), a JSONL file with bad records (cut into byte ranges), a
            ``.jsonl.gz`` (one unit) and a Parquet file of small row groups
            (cut into runs of them).
    """

    root: Path
    paths: tuple[str, ...]


@pytest.fixture(scope="session")
def ray_inputs(stdlib_corpus, tmp_path_factory: pytest.TempPathFactory) -> RayInputs:
    import gzip
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path_factory.mktemp("ray_inputs")
    texts = stdlib_corpus.texts
    paths = []
    for i, text in enumerate(texts[:24]):
        path = root / f"a{i:03d}.py"
        path.write_text(text, encoding="utf-8")
        paths.append(str(path))
    lines = [json.dumps({"text": t}) for t in texts[24:64]]
    lines[5] = "{not json"
    lines[11] = json.dumps({"text": ""})
    lines[17] = json.dumps({"body": "no text field"})
    jsonl = root / "b.jsonl"
    jsonl.write_text("\n".join(lines) + "\n", encoding="utf-8")
    gz = root / "c.jsonl.gz"
    gz.write_bytes(gzip.compress("".join(json.dumps({"text": t}) + "\n" for t in texts[64:74]).encode(), mtime=0))
    parquet = root / "d.parquet"
    pq.write_table(pa.table({"text": list(texts[74:104])}), parquet, row_group_size=4)
    paths += [str(jsonl), str(gz), str(parquet)]
    return RayInputs(root=root, paths=tuple(paths))
