"""Full integrity check of a committed dataset: every byte re-hashed, every block decoded.

Unlike the loader, which checks only the blocks it reads, this walks every
shard, block and sidecar and keeps going past problems so one run lists
them all.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from zephon_stream.errors import FormatError, ObjectMissingError, StorageError, TruncatedObjectError
from zephon_stream.format.block import decode_block
from zephon_stream.reader.dataset import DatasetReader

PROBLEM_KINDS = ("missing", "truncated", "corrupt", "unreadable")


@dataclass(frozen=True)
class Problem:
    """One thing wrong with one object.

    Attributes:
        path: the object, relative to the dataset root.
        kind: one of ``PROBLEM_KINDS``.
        message: what is wrong, naming the offset or block and both values.
    """

    path: str
    kind: str
    message: str

    def __str__(self) -> str:
        return f"{self.kind.upper()}: {self.message}"


@dataclass(frozen=True)
class VerifyReport:
    """What ``verify_dataset`` checked and what it found."""

    url: str
    num_shards: int
    num_blocks_checked: int
    bytes_checked: int
    problems: tuple[Problem, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


def _classify(exc: Exception) -> str:
    if isinstance(exc, ObjectMissingError):
        return "missing"
    if isinstance(exc, TruncatedObjectError):
        return "truncated"
    if isinstance(exc, FormatError):
        return "corrupt"
    return "unreadable"


def _check_shard(
    reader: DatasetReader, shard_index: int, progress: Callable[[int], None]
) -> tuple[list[Problem], int, int]:
    """Problems of one shard and its sidecar, blocks decoded, shard bytes read."""
    m = reader.manifest
    shard = m.shards[shard_index]
    first_block = int(m.shard_first_block[shard_index])
    problems: list[Problem] = []
    checked = bytes_read = 0
    try:
        size = reader.store.size(shard.path)
    except (ObjectMissingError, StorageError) as exc:
        progress(shard.num_bytes)
        problems.append(Problem(shard.path, _classify(exc), f"shard {shard.path}: {exc}"))
        return problems, checked, bytes_read
    if size < shard.num_bytes:
        problems.append(
            Problem(
                shard.path,
                "truncated",
                f"shard {shard.path}: truncated at byte {size}, manifest says {shard.num_bytes} bytes",
            )
        )
    elif size > shard.num_bytes:
        problems.append(
            Problem(
                shard.path,
                "corrupt",
                f"shard {shard.path}: {size} bytes, manifest says {shard.num_bytes} "
                f"({size - shard.num_bytes} extra bytes)",
            )
        )
    digest = hashlib.sha256()
    all_read = True
    for local in range(shard.num_blocks):
        start, end = shard.block_offsets[local], shard.block_offsets[local + 1]
        where = f"shard {shard.path} block {local} (bytes {start}..{end})"
        if end > size:
            lost = shard.num_blocks - local
            problems.append(
                Problem(
                    shard.path,
                    "truncated",
                    f"{where}: past the end of the object at byte {size}; "
                    f"{lost} block(s) {local}..{shard.num_blocks - 1} lost",
                )
            )
            progress(shard.num_bytes - start)
            break
        try:
            frame = reader.store.read_range(shard.path, start, end)
        except (FormatError, ObjectMissingError, StorageError) as exc:
            all_read = False
            problems.append(Problem(shard.path, _classify(exc), f"{where}: {exc}"))
            progress(end - start)
            continue
        bytes_read += len(frame)
        digest.update(frame)
        try:
            decode_block(frame, num_tokens=m.block_num_tokens(first_block + local), dtype=m.np_dtype, where=where)
            checked += 1
        except FormatError as exc:
            problems.append(Problem(shard.path, _classify(exc), str(exc)))
        progress(end - start)
    else:
        if all_read and size == shard.num_bytes and digest.hexdigest() != shard.sha256:
            problems.append(
                Problem(
                    shard.path,
                    "corrupt",
                    f"shard {shard.path}: sha256 mismatch (expected {shard.sha256}, got {digest.hexdigest()})",
                )
            )
    try:
        index = reader.read_doc_index(shard_index)
        if shard_index == 0 and m.num_tokens and (index.num_documents == 0 or int(index.doc_starts[0]) != 0):
            problems.append(
                Problem(
                    shard.index_path,
                    "corrupt",
                    f"document index {shard.index_path}: the first shard must start a document at token 0",
                )
            )
    except (FormatError, ObjectMissingError, StorageError) as exc:
        message = str(exc)
        if not message.startswith(f"document index {shard.index_path}"):
            message = f"document index {shard.index_path}: {message}"
        problems.append(Problem(shard.index_path, _classify(exc), message))
    return problems, checked, bytes_read


def _check_rejects(reader: DatasetReader) -> list[Problem]:
    m = reader.manifest
    path = m.rejects_path
    try:
        data = reader.store.read(path)
    except (ObjectMissingError, StorageError) as exc:
        return [Problem(path, _classify(exc), f"rejects list {path}: {exc}")]
    lines = [line for line in data.split(b"\n") if line.strip()]
    problems = []
    if len(lines) != m.num_rejected:
        problems.append(
            Problem(
                path, "corrupt", f"rejects list {path}: {len(lines)} lines, manifest says num_rejected {m.num_rejected}"
            )
        )
    for number, line in enumerate(lines):
        try:
            if not isinstance(json.loads(line), dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            message = f"rejects list {path}: line {number + 1} is not a JSON object ({exc})"
            problems.append(Problem(path, "corrupt", message))
            break
    return problems


def verify_dataset(
    reader: DatasetReader,
    *,
    workers: int = 4,
    progress: Callable[[int], None] | None = None,
) -> VerifyReport:
    """Re-hash every shard, decode every block, check every sidecar and the rejects list.

    Args:
        reader: the opened dataset (its manifest is already validated).
        workers: shards checked concurrently (zstd and sha256 release the GIL).
        progress: called with each count of shard bytes checked.

    Returns:
        The report; ``problems`` lists every problem found, in manifest order.
    """
    m = reader.manifest
    report = progress or (lambda _n: None)
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        results = list(pool.map(lambda i: _check_shard(reader, i, report), range(m.num_shards)))
    problems = [p for shard_problems, _, _ in results for p in shard_problems]
    problems.extend(_check_rejects(reader))
    return VerifyReport(
        url=reader.url,
        num_shards=m.num_shards,
        num_blocks_checked=sum(blocks for _, blocks, _ in results),
        bytes_checked=sum(num_bytes for _, _, num_bytes in results),
        problems=tuple(problems),
    )
