"""Hostile manifests and loader states, opened through the public load path."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tools.reliability.common import check, copy_dataset
from tools.reliability.hostile_base import (
    BATCH,
    SEQ_LEN,
    Outcome,
    raw_manifest,
    read_epoch,
    try_load,
    write_manifest,
    write_raw,
)


def case_manifest_mutations(dataset: Path, work: Path, tries: int, rng: random.Random) -> Outcome:
    """Random byte edits, cuts and insertions in a real manifest, opened by the loader."""
    outcome = Outcome()
    base = (dataset / "manifest").read_bytes()
    clean = read_epoch(str(dataset), max_steps=3)
    root = copy_dataset(dataset, work / "mutated")
    for _ in range(tries):
        data = bytearray(base)
        for _ in range(rng.randint(1, 6)):
            kind = rng.random()
            at = rng.randrange(len(data))
            if kind < 0.6:
                data[at] = rng.randrange(256)
            elif kind < 0.8:
                data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 9)))
            else:
                del data[at:]
                if not data:
                    break
        (root / "manifest").write_bytes(bytes(data))
        try:
            got = read_epoch(str(root), max_steps=3)
        except Exception as exc:  # noqa: BLE001 - every error is classified
            outcome.refuse(exc)
        else:
            # An edit of a field the data does not depend on (a source
            # name, a document count); the data read must be unchanged.
            check(got == clean, f"a mutated manifest was accepted and changed the data: {bytes(data)[:200]!r}")
            outcome.accept()
    return outcome


def case_manifest_fields(dataset: Path, work: Path, tries: int, rng: random.Random) -> Outcome:
    """Huge counts and sizes, negative and overlapping offsets, unknown versions,
    escaping paths and other schemes, and huge msgpack headers."""
    from zephon_stream.errors import PathEscapeError, VersionError

    outcome = Outcome()
    root = copy_dataset(dataset, work / "fields")
    edits: list[tuple[str, Callable[[dict], None], type | None]] = [
        ("num_blocks 2**63", lambda o: o.update(num_blocks=2**63), None),
        ("num_tokens 2**64-1", lambda o: o.update(num_tokens=2**64 - 1), None),
        ("block_tokens 2**40", lambda o: o.update(block_tokens=2**40), None),
        ("blocks_per_shard 2**62", lambda o: o.update(blocks_per_shard=2**62), None),
        ("shard num_tokens 2**62", lambda o: o["shards"][0].update(num_tokens=2**62), None),
        ("shard num_bytes 2**50", lambda o: o["shards"][0].update(num_bytes=2**50), None),
        ("negative offset", lambda o: o["shards"][0]["block_offsets"].__setitem__(1, -5), None),
        (
            "overlapping offsets",
            lambda o: o["shards"][0]["block_offsets"].__setitem__(2, o["shards"][0]["block_offsets"][1] - 10),
            None,
        ),
        ("offsets past the object", lambda o: o["shards"][0]["block_offsets"].__setitem__(-1, 2**45), None),
        ("10**6 block offsets", lambda o: o["shards"][0].update(block_offsets=list(range(0, 10**6))), None),
        ("version 2.0", lambda o: o.update(version=[2, 0]), VersionError),
        ("version 999.1", lambda o: o.update(version=[999, 1]), VersionError),
        ("version 0.9", lambda o: o.update(version=[0, 9]), None),
        ("version as text", lambda o: o.update(version="1.0"), None),
        ("format name", lambda o: o.update(format="parquet"), None),
        ("vocab 2**40", lambda o: o["tokenizer"].update(vocab_size=2**40), None),
        ("path ../x", lambda o: o["shards"][0].update(path="../x.zst"), PathEscapeError),
        (
            "path shards/../../etc/passwd",
            lambda o: o["shards"][0].update(path="shards/../../etc/passwd"),
            PathEscapeError,
        ),
        ("absolute path", lambda o: o["shards"][0].update(path="/etc/passwd"), PathEscapeError),
        ("s3:// path", lambda o: o["shards"][0].update(path="s3://other-bucket/x.zst"), PathEscapeError),
        ("file:// path", lambda o: o["shards"][0].update(path="file:///etc/passwd"), PathEscapeError),
        ("http:// path", lambda o: o["shards"][0].update(path="http://169.254.169.254/latest"), PathEscapeError),
        ("index path ..", lambda o: o["shards"][0].update(index_path="../../x.idx"), PathEscapeError),
        ("rejects path absolute", lambda o: o.update(rejects_path="/etc/shadow"), PathEscapeError),
        ("NUL in path", lambda o: o["shards"][0].update(path="shards/a\x00b.zst"), None),
        ("shards not a list", lambda o: o.update(shards={"a": 1}), None),
        ("shard as string", lambda o: o["shards"].__setitem__(0, "x" * 10**6), None),
        ("deep nesting", lambda o: o.update(sources=_nested(200)), None),
    ]
    for name, edit, expected in edits:
        obj = raw_manifest(dataset)
        edit(obj)
        write_raw(root, obj)
        try:
            try_load(str(root))
        except Exception as exc:  # noqa: BLE001
            check(expected is None or isinstance(exc, expected), f"{name}: {type(exc).__name__} instead of {expected}")
            outcome.refuse(exc)
        else:
            raise AssertionError(f"manifest with {name} was accepted")
    for name, data in (
        ("array32 of 2**32-1 items", b"\xdd\xff\xff\xff\xff"),
        ("map32 of 2**32-1 items", b"\xdf\xff\xff\xff\xff" + b"\xc0" * 16),
        ("bin32 of 4 GiB", b"\xc6\xff\xff\xff\xff" + b"\x00" * 64),
        ("str32 of 4 GiB", b"\xdb\xff\xff\xff\xff" + b"a" * 64),
        ("1000 nested arrays", b"\x91" * 1000 + b"\xc0"),
        ("empty", b""),
    ):
        (root / "manifest").write_bytes(data)
        try:
            try_load(str(root))
        except Exception as exc:  # noqa: BLE001
            outcome.refuse(exc)
        else:
            raise AssertionError(f"manifest {name} was accepted")
    return outcome


def _nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


def case_huge_block_range(dataset: Path, work: Path, tries: int, rng: random.Random) -> Outcome:
    """A self-consistent manifest whose block claims 1 TiB of a small shard."""
    from zephon_stream.errors import TruncatedObjectError
    from zephon_stream.format.manifest import Manifest

    outcome = Outcome()
    root = copy_dataset(dataset, work / "huge")
    manifest = Manifest.load(str(root))
    # The last block of the first (full) shard: a full block, read in epoch 1.
    index = 0
    shard = manifest.shards[index]
    check(shard.num_blocks == manifest.blocks_per_shard, "the first shard is not full")
    data = (root / shard.path).read_bytes()
    offsets = list(shard.block_offsets)
    offsets[-1] = 2**40
    shards = list(manifest.shards)
    shards[index] = dataclasses.replace(shard, num_bytes=2**40, block_offsets=tuple(offsets))
    new = Manifest.create(
        tokenizer=manifest.tokenizer,
        block_tokens=manifest.block_tokens,
        blocks_per_shard=manifest.blocks_per_shard,
        shards=shards,
        sources=manifest.sources,
    )
    write_manifest(root, new)
    assert len(data) < 2**40
    try:
        try_load(str(root))
    except Exception as exc:  # noqa: BLE001
        check(isinstance(exc, TruncatedObjectError), f"1 TiB block: {type(exc).__name__}: {exc}")
        outcome.refuse(exc, must_name=shard.path)
    else:
        raise AssertionError("a 1 TiB block range was read without error")
    return outcome


def case_hostile_state(dataset: Path, work: Path, tries: int, rng: random.Random) -> Outcome:
    """Loader states that are not this run's: huge, negative, wrong types, unknown versions."""
    from zephon_stream import StreamingLoader
    from zephon_stream.plan.state import OPTIONAL_KEYS

    outcome = Outcome()
    with StreamingLoader(str(dataset), seq_len=SEQ_LEN, local_batch_size=BATCH) as loader:
        good = loader.state_dict()
        edits = [
            {"position": 2**70},
            {"position": -1},
            {"position": "12"},
            {"position": 1.5},
            {"version": 99},
            {"seed": -3},
            {"lanes": 0},
            {"seq_len": 2**40},
            {"streams": []},
            {"streams": "x"},
            {"packing": "bogus"},
            {"packing": 1},
            {"history": "x"},
            {"history": ["{not json"]},
            {"history": ['{"step": 1}']},
            {"history": [7]},
        ]
        for edit in edits:
            state = {**good, **edit}
            try:
                loader.load_state_dict(state)
                next(loader)
            except Exception as exc:  # noqa: BLE001
                outcome.refuse(exc)
            else:
                raise AssertionError(f"loader state with {edit} was accepted")
        for key in list(good):
            state = {k: v for k, v in good.items() if k != key}
            if key in OPTIONAL_KEYS:
                # A state written before the key existed: loads, as its documented default.
                loader.load_state_dict(state)
                check(loader.state_dict()["packing"] == "concat", f"a state without {key!r} loaded as another packing")
                continue
            try:
                loader.load_state_dict(state)
            except Exception as exc:  # noqa: BLE001
                outcome.refuse(exc)
            else:
                raise AssertionError(f"loader state without {key!r} was accepted")
    return outcome
