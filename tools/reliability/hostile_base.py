"""Shared pieces of the hostile-input cases: the outcome counter and the
public load path every case goes through (the loader reading an epoch)."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import Any

from tools.reliability.common import check, step_hashes

SEQ_LEN = 256
BATCH = 8


class Outcome:
    """Counts of one case: tries, refused with a clear error, accepted
    (valid input, correct output), corruptions detected, example messages."""

    def __init__(self) -> None:
        self.tries = self.refused = self.accepted = self.detected = self.verify_detected = 0
        self.examples: list[str] = []

    def refuse(self, exc: BaseException, *, must_name: str | None = None) -> None:
        from zephon_stream.errors import ZephonError

        check(isinstance(exc, ZephonError), f"not a library error: {type(exc).__name__}: {exc}")
        check(must_name is None or must_name in str(exc), f"error does not name {must_name!r}: {exc}")
        self.tries += 1
        self.refused += 1
        if len(self.examples) < 3:
            self.examples.append(f"{type(exc).__name__}: {str(exc)[:300]}")

    def accept(self) -> None:
        self.tries += 1
        self.accepted += 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "tries": self.tries,
            "refused": self.refused,
            "accepted": self.accepted,
            "detected": self.detected,
            "verify_detected": self.verify_detected,
            "examples": self.examples,
        }


def read_epoch(url: str, max_steps: int | None = None) -> list[str]:
    from zephon_stream import StreamingLoader

    out = []
    with StreamingLoader(url, seq_len=SEQ_LEN, local_batch_size=BATCH, num_fetch_threads=2) as loader:
        steps = max_steps if max_steps is not None else epoch_steps(loader)
        out = step_hashes(loader, steps)
    return out


def epoch_steps(loader: Any) -> int:
    return max(1, loader.order.streams[0].lane_length * loader.lanes // loader.global_batch_size)


def try_load(url: str) -> None:
    """Open the dataset with the loader and read one epoch."""
    read_epoch(url)


def raw_manifest(root: Path) -> dict[str, Any]:
    """The manifest's map in the layout of format 1.0 (the dataset at ``root`` is rewritten so first).

    The hostile manifests edit the 1.0 layout, every entry inline; a
    1.1 header's own hostile cases are in tests/test_format_index.py.
    """
    import msgpack

    from zephon_stream.format.manifest import Manifest

    manifest = Manifest.load(str(root))
    if manifest.version != (1, 0):
        write_manifest(root, dataclasses.replace(manifest, version=(1, 0)))
    return msgpack.unpackb((root / "manifest").read_bytes(), raw=False, strict_map_key=False)


def write_raw(root: Path, obj: Any) -> None:
    import msgpack

    (root / "manifest").write_bytes(msgpack.packb(obj, use_bin_type=True))


def write_manifest(root: Path, manifest: Any) -> None:
    """Commit ``manifest`` at ``root``: its index objects (format 1.1), then the manifest."""
    from zephon_stream.storage import open_store

    with open_store(str(root)) as store:
        manifest.write(store)


def rewrite_shard(root: Path, shard_index: int, data: bytes, offsets: list[int]) -> None:
    """Replace one shard's bytes and offsets, with a manifest made consistent
    again (sizes, sha256, totals, fingerprint), so only the shard is hostile."""
    from zephon_stream.format.manifest import Manifest

    manifest = Manifest.load(str(root))
    shard = manifest.shards[shard_index]
    (root / shard.path).write_bytes(data)
    shards = list(manifest.shards)
    shards[shard_index] = dataclasses.replace(
        shard, num_bytes=len(data), sha256=hashlib.sha256(data).hexdigest(), block_offsets=tuple(offsets)
    )
    new = Manifest.create(
        tokenizer=manifest.tokenizer,
        block_tokens=manifest.block_tokens,
        blocks_per_shard=manifest.blocks_per_shard,
        shards=shards,
        sources=manifest.sources,
        rejects_path=manifest.rejects_path,
    )
    write_manifest(root, new)
