"""One local Ray instance for the whole test session, shared by every Ray test.

Loaded as a pytest plugin by tests/conftest.py. Starting Ray costs about 9 s
and 1.4 GB here, so there is one: ``ray.init(num_cpus=2)``, no dashboard,
usage reporting off, its session files in a temporary folder removed at the
end. Tests pass ``RayInstance.address`` to drivers they start as processes.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

RAY_TEST_CPUS = 2


@dataclasses.dataclass(frozen=True)
class RayInstance:
    """The session's Ray instance.

    Attributes:
        address: its GCS address, for drivers in other processes.
        temp_dir: its session files.
        raylet_pid: the raylet's process id (worker processes are its children).
    """

    address: str
    temp_dir: Path
    raylet_pid: int

    def worker_pids(self, title: str) -> list[int]:
        """This instance's worker processes whose title starts with ``title`` (``ray::convert_unit_task``)."""
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat", "rb") as stat:
                    ppid = int(stat.read().rsplit(b")", 1)[1].split()[1])
                with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                    command = cmdline.read()
            except (OSError, ValueError, IndexError):
                continue
            if ppid == self.raylet_pid and command.startswith(title.encode()):
                found.append(int(entry))
        return found


@pytest.fixture(scope="session")
def ray_instance() -> Iterator[RayInstance]:
    """The session's local Ray instance (2 CPUs)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # NOTE: as the engine's own local instance: workers at the test's niceness, not Ray's 15.
    os.environ.setdefault("RAY_worker_niceness", "0")
    import ray

    # NOTE: a short folder: Ray's socket paths must fit in 107 bytes.
    temp_dir = Path(tempfile.mkdtemp(prefix="zs-ray-", dir="/tmp"))
    ray.init(num_cpus=RAY_TEST_CPUS, include_dashboard=False, log_to_driver=False, _temp_dir=str(temp_dir))
    try:
        node = ray._private.worker._global_node
        raylet_pid = node.all_processes[ray._private.ray_constants.PROCESS_TYPE_RAYLET][0].process.pid
        yield RayInstance(address=ray.get_runtime_context().gcs_address, temp_dir=temp_dir, raylet_pid=raylet_pid)
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


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
    from zephon_stream.verify import verify_dataset

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
