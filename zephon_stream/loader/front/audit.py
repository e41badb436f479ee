"""Audit log: one JSON line per consumed step, and the comparison of two logs.

Rank 0 appends, for each step it hands to the consumer, the cursor before the
step, a fingerprint of the whole global batch's sample addresses (computed from
the plan, so it needs no communication and does not depend on the world size)
and a hash of rank 0's own rows. Two runs of the same config agree on every
address fingerprint; where they differ is where their data diverged.

A local log is appended to and flushed every step. An object store cannot
append, so a remote log is rewritten whole every ``flush_every`` steps and on
close.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Iterable
from typing import Any

import numpy as np

from zephon_stream.storage import is_local_url, local_path, open_store

AUDIT_FORMAT = "zephon-stream audit log"
AUDIT_VERSION = 1


def union_sha256(rows: Iterable[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> str:
    """sha256 of one global step from every rank's rows.

    Args:
        rows: per rank, ``(sample_positions, input, labels)`` as arrays.

    The rows are sorted by global sample position before hashing, so runs at
    different world sizes or local batch sizes compare bit for bit.

    Raises:
        ValueError: two ranks returned the same global position.
    """
    positions, inputs, labels = [], [], []
    for pos, inp, lab in rows:
        positions.append(np.asarray(pos, dtype="<i8"))
        inputs.append(np.asarray(inp, dtype="<i8"))
        labels.append(np.asarray(lab, dtype="<i8"))
    pos = np.concatenate(positions)
    order = np.argsort(pos, kind="stable")
    if np.unique(pos).size != pos.size:
        raise ValueError("two ranks returned the same global sample position")
    digest = hashlib.sha256()
    digest.update(pos[order].tobytes())
    digest.update(np.concatenate(inputs)[order].tobytes())
    digest.update(np.concatenate(labels)[order].tobytes())
    return digest.hexdigest()


def addresses_sha256(positions: np.ndarray, streams: np.ndarray, blocks: np.ndarray, samples: np.ndarray) -> str:
    """Fingerprint of a set of sample addresses, independent of their order.

    Rows are sorted by global position, then ``(position, stream, block,
    sample)`` is hashed as int64 little-endian.
    """
    order = np.argsort(positions, kind="stable")
    table = np.stack([np.asarray(a, dtype="<i8")[order] for a in (positions, streams, blocks, samples)], axis=1)
    return hashlib.sha256(np.ascontiguousarray(table).tobytes()).hexdigest()


def _split_url(url: str) -> tuple[str, str]:
    url = str(url)
    if is_local_url(url):
        path = os.path.abspath(local_path(url))
        return os.path.dirname(path), os.path.basename(path)
    parent, _, name = url.rstrip("/").rpartition("/")
    if not name or "://" not in parent + "/":
        raise ValueError(f"audit log URL {url!r} names no object")
    return parent, name


class AuditLog:
    """Appends step records to a JSON-lines log.

    Args:
        url: a local path (or ``file://``) or an object URL (``s3://b/run.jsonl``).
        header: written as the first record of a new log (config, fingerprints).
        storage_options: fsspec options for a remote log.
        flush_every: steps between rewrites of a remote log.
    """

    def __init__(
        self,
        url: str,
        *,
        header: dict[str, Any],
        storage_options: dict[str, Any] | None = None,
        flush_every: int = 100,
    ) -> None:
        self.url = str(url)
        self._flush_every = max(1, flush_every)
        self._file = None
        self._store = None
        self._lines: list[str] = []
        self._unflushed = 0
        head = json.dumps(
            {"kind": "header", "format": AUDIT_FORMAT, "version": AUDIT_VERSION, **header}, sort_keys=True
        )
        if is_local_url(self.url):
            path = os.path.abspath(local_path(self.url))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            new = not os.path.exists(path) or os.path.getsize(path) == 0
            self._file = open(path, "a", encoding="utf-8")
            self._write_line(head) if new else self._write_line(
                json.dumps({"kind": "resume", **header}, sort_keys=True)
            )
        else:
            parent, self._name = _split_url(self.url)
            self._store = open_store(parent, storage_options)
            if self._store.exists(self._name):
                self._lines = self._store.read(self._name).decode("utf-8").splitlines()
                self._lines.append(json.dumps({"kind": "resume", **header}, sort_keys=True))
            else:
                self._lines = [head]
            self._unflushed = 1

    def _write_line(self, line: str) -> None:
        assert self._file is not None
        self._file.write(line + "\n")
        self._file.flush()

    def append(self, record: dict[str, Any], kind: str = "step") -> None:
        """Add one record (``{"kind": "step", ...}``; ``kind="skip"`` for steps skipped)."""
        line = json.dumps({"kind": kind, **record}, sort_keys=True)
        if self._file is not None:
            self._write_line(line)
            return
        self._lines.append(line)
        self._unflushed += 1
        if self._unflushed >= self._flush_every:
            self.flush()

    def flush(self) -> None:
        """Make every record so far durable (rewrites a remote log)."""
        if self._file is not None:
            self._file.flush()
        elif self._store is not None and self._unflushed:
            self._store.write_atomic(self._name, ("\n".join(self._lines) + "\n").encode("utf-8"))
            self._unflushed = 0

    def close(self) -> None:
        """Flush and release the file or store."""
        if self._file is not None:
            self._file.close()
            self._file = None
        elif self._store is not None:
            self.flush()
            self._store.close()
            self._store = None


def read_audit_log(url: str, storage_options: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every record of a log, in file order."""
    parent, name = _split_url(url)
    with open_store(parent, storage_options) as store:
        text = store.read(name).decode("utf-8")
    records = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"audit log {url} line {number}: not JSON ({exc})") from None
    return records


@dataclasses.dataclass(frozen=True, slots=True)
class Divergence:
    """The first step where two logs disagree.

    Attributes:
        step: the global step.
        field: which value differs ("cursor", "addresses_sha256", "data_sha256").
        value_a: that value in the first log.
        value_b: that value in the second log.
    """

    step: int
    field: str
    value_a: Any
    value_b: Any


def steps_by_index(records: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Step records keyed by step; a step logged again after a resume keeps its last record."""
    return {int(r["step"]): r for r in records if r.get("kind") == "step"}


def first_divergence(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> tuple[Divergence | None, int]:
    """Compare two logs over the steps both hold.

    The rank-0 data hash is compared only where both runs had the same world
    size and local batch (otherwise rank 0 read different rows by design).

    Returns:
        The first divergence (or None) and the number of steps compared.
    """
    steps_a, steps_b = steps_by_index(a), steps_by_index(b)
    common = sorted(set(steps_a) & set(steps_b))
    for step in common:
        ra, rb = steps_a[step], steps_b[step]
        fields = ["cursor", "addresses_sha256"]
        if (ra.get("world_size"), ra.get("local_batch_size")) == (rb.get("world_size"), rb.get("local_batch_size")):
            fields.append("data_sha256")
        for field in fields:
            if ra.get(field) != rb.get(field):
                return Divergence(step, field, ra.get(field), rb.get(field)), common.index(step) + 1
    return None, len(common)
