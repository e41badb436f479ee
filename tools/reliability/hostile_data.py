"""Hostile shard bytes and writer inputs: bit flips, frame header flips, frames
past their size, truncations, tiny datasets, long documents, NUL bytes and
invalid UTF-8."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from tools.reliability.common import check, copy_dataset, step_hashes
from tools.reliability.hostile_base import BATCH, SEQ_LEN, Outcome, read_epoch, rewrite_shard, try_load


def _block_of(manifest: Any, shard_index: int, offset: int) -> int:
    offsets = manifest.shards[shard_index].block_offsets
    return max(i for i in range(len(offsets) - 1) if offsets[i] <= offset)


def case_bit_flips(dataset: Path, work: Path, tries: int, rng: random.Random) -> Outcome:
    """One flipped bit at a random offset of a random shard, per try: the loader
    must stop with an error naming the shard and block before returning any
    wrong step, and verify must list the shard."""
    from zephon_stream.format.manifest import Manifest
    from zephon_stream.reader import DatasetReader
    from zephon_stream.reader.verify import verify_dataset

    outcome = Outcome()
    manifest = Manifest.load(str(dataset))
    clean = read_epoch(str(dataset))
    root = copy_dataset(dataset, work / "flipped")
    for _ in range(tries):
        index = rng.randrange(manifest.num_shards)
        shard = manifest.shards[index]
        original = (root / shard.path).read_bytes()
        offset = rng.randrange(len(original))
        data = bytearray(original)
        data[offset] ^= 1 << rng.randrange(8)
        (root / shard.path).write_bytes(bytes(data))
        block = _block_of(manifest, index, offset)
        got: list[str] = []
        try:
            from zephon_stream import StreamingLoader

            with StreamingLoader(str(root), seq_len=SEQ_LEN, local_batch_size=BATCH, num_fetch_threads=2) as loader:
                for _ in range(len(clean)):
                    got += step_hashes(loader, 1)
        except Exception as exc:  # noqa: BLE001
            check(got == clean[: len(got)], f"{shard.path} bit flip at byte {offset}: wrong data before the error")
            outcome.refuse(exc, must_name=f"{shard.path} block {block - 0}")
            outcome.detected += 1
        else:
            # A flip in a frame's window descriptor or unused header bit
            # decodes to the same tokens (the checksum covers content only):
            # harmless to training, and verify still catches it by sha256.
            check(got == clean, f"{shard.path} bit flip at byte {offset} (block {block}): WRONG DATA delivered")
            outcome.tries += 1
            outcome.accepted += 1
        with DatasetReader.open(str(root)) as reader:
            report = verify_dataset(reader, workers=1)
        outcome.verify_detected += 1
        check(
            {p.path for p in report.problems} == {shard.path},
            f"verify after a flip in {shard.path}: {[str(p) for p in report.problems]}",
        )
        (root / shard.path).write_bytes(original)
    return outcome


def case_frame_header_flips(dataset: Path, work: Path, tries: int, rng: random.Random) -> Outcome:
    """Every bit of every frame header byte of a dataset with the default block
    size (2**20 + 1 tokens), read back through ``read_block``: each flip is
    refused, or decodes to the identical tokens (then only verify's sha256
    sees it); never different tokens."""
    import numpy as np

    from tools.reliability.common import stdlib_corpus
    from zephon_stream import read_block, write_dataset
    from zephon_stream.format.manifest import Manifest
    from zephon_stream.reader import DatasetReader
    from zephon_stream.reader.verify import verify_dataset

    outcome = Outcome()
    files = stdlib_corpus(work / "corpus", num_files=400, stride=2)
    root = work / "default_blocks"
    write_dataset([str(p) for p in files], str(root), tokenizer="bytes", progress=False)
    manifest = Manifest.load(str(root))
    check(manifest.num_blocks >= 2, "the default-block dataset has fewer than 2 blocks")
    clean = read_block(str(root), 0)
    path, start, end = manifest.block_byte_range(0)
    data = (root / path).read_bytes()
    for byte in range(start + 4, start + 14):
        for bit in range(8):
            flipped = bytearray(data)
            flipped[byte] ^= 1 << bit
            (root / path).write_bytes(bytes(flipped))
            try:
                got = read_block(str(root), 0)
            except Exception as exc:  # noqa: BLE001
                outcome.refuse(exc, must_name=path)
                outcome.detected += 1
            else:
                check(bool(np.array_equal(got, clean)), f"{path} header byte {byte - start} bit {bit}: WRONG tokens")
                outcome.tries += 1
                outcome.accepted += 1
                with DatasetReader.open(str(root)) as reader:
                    problems = verify_dataset(reader, workers=1).problems
                check({p.path for p in problems} == {path}, f"verify missed header byte {byte - start} bit {bit}")
                outcome.verify_detected += 1
    (root / path).write_bytes(data)
    return outcome


def case_frame_past_declared_size(dataset: Path, work: Path, tries: int, rng: random.Random) -> Outcome:
    """A block frame whose header declares the manifest's size but whose content
    is longer (checksum valid), in a manifest otherwise consistent."""
    import numpy as np
    import zstandard

    from zephon_stream.errors import CorruptBlockError
    from zephon_stream.format.manifest import Manifest
    from zephon_stream.reader import DatasetReader
    from zephon_stream.reader.verify import verify_dataset

    outcome = Outcome()
    manifest = Manifest.load(str(dataset))
    for t in range(tries):
        root = copy_dataset(dataset, work / f"bomb{t}")
        index = rng.randrange(manifest.num_shards - 1)  # full shards only: full blocks
        shard = manifest.shards[index]
        data = (root / shard.path).read_bytes()
        block = rng.randrange(shard.num_blocks)
        declared = manifest.block_tokens * 2
        extra = rng.choice((2, 64, 4096, 1 << 20))
        tokens = np.arange(manifest.block_tokens + extra // 2, dtype="<u2") % 256
        frame = bytearray(
            zstandard.ZstdCompressor(write_checksum=True, write_content_size=True).compress(tokens.tobytes())
        )
        descriptor = frame[4]
        size_field = {0: 1 if descriptor & 0x20 else 0, 1: 2, 2: 4, 3: 8}[descriptor >> 6]
        at = 5 if descriptor & 0x20 else 6
        value = declared - 256 if size_field == 2 else declared
        frame[at : at + size_field] = value.to_bytes(size_field, "little")
        assert zstandard.frame_content_size(bytes(frame[:18])) == declared
        offsets = list(shard.block_offsets)
        start, end = offsets[block], offsets[block + 1]
        new_data = data[:start] + bytes(frame) + data[end:]
        delta = len(frame) - (end - start)
        offsets = offsets[: block + 1] + [o + delta for o in offsets[block + 1 :]]
        rewrite_shard(root, index, new_data, offsets)
        try:
            try_load(str(root))
        except Exception as exc:  # noqa: BLE001
            check(isinstance(exc, CorruptBlockError), f"frame past its size: {type(exc).__name__}: {exc}")
            outcome.refuse(exc, must_name=f"{shard.path} block {block}")
            outcome.detected += 1
        else:
            raise AssertionError(f"{shard.path} block {block}: a frame decoding {extra} bytes past its size was read")
        with DatasetReader.open(str(root)) as reader:
            report = verify_dataset(reader, workers=1)
        check({p.path for p in report.problems} == {shard.path}, f"verify: {[str(p) for p in report.problems]}")
    return outcome


def case_truncated_objects(dataset: Path, work: Path, tries: int, rng: random.Random) -> Outcome:
    """Shards cut short, a missing shard, a cut manifest, a cut sidecar."""
    from zephon_stream.errors import ObjectMissingError, TruncatedObjectError
    from zephon_stream.format.manifest import Manifest
    from zephon_stream.reader import DatasetReader
    from zephon_stream.reader.verify import verify_dataset

    outcome = Outcome()
    manifest = Manifest.load(str(dataset))
    for t in range(tries):
        root = copy_dataset(dataset, work / f"cut{t}")
        shard = manifest.shards[rng.randrange(manifest.num_shards)]
        data = (root / shard.path).read_bytes()
        keep = rng.randrange(len(data))
        (root / shard.path).write_bytes(data[:keep])
        try:
            try_load(str(root))
        except Exception as exc:  # noqa: BLE001
            check(isinstance(exc, TruncatedObjectError), f"cut shard: {type(exc).__name__}: {exc}")
            outcome.refuse(exc, must_name=shard.path)
            outcome.detected += 1
        else:
            raise AssertionError(f"{shard.path} cut to {keep} of {len(data)} bytes was read")
        with DatasetReader.open(str(root)) as reader:
            kinds = {(p.path, p.kind) for p in verify_dataset(reader, workers=1).problems}
        check((shard.path, "truncated") in kinds, f"verify missed the cut {shard.path}: {kinds}")
    root = copy_dataset(dataset, work / "missing")
    (root / manifest.shards[0].path).unlink()
    try:
        try_load(str(root))
    except Exception as exc:  # noqa: BLE001
        check(isinstance(exc, ObjectMissingError), f"missing shard: {type(exc).__name__}")
        outcome.refuse(exc, must_name=manifest.shards[0].path)
        outcome.detected += 1
    data = (dataset / "manifest").read_bytes()
    for keep in sorted(rng.sample(range(len(data)), min(tries, len(data)))):
        (root / "manifest").write_bytes(data[:keep])
        try:
            try_load(str(root))
        except Exception as exc:  # noqa: BLE001
            outcome.refuse(exc, must_name="manifest")
        else:
            raise AssertionError(f"manifest cut to {keep} bytes was accepted")
    root = copy_dataset(dataset, work / "cut_index")
    index_path = manifest.shards[0].index_path
    (root / index_path).write_bytes((root / index_path).read_bytes()[:7])
    with DatasetReader.open(str(root)) as reader:
        problems = [p for p in verify_dataset(reader, workers=1).problems if p.path == index_path]
    check(bool(problems), f"verify missed the cut sidecar {index_path}")
    outcome.tries += 1
    outcome.detected += 1
    return outcome


def _write(inputs: list[Path], out: Path, **kwargs: Any) -> Any:
    from zephon_stream import write_dataset

    return write_dataset(
        [str(p) for p in inputs],
        str(out),
        tokenizer="bytes",
        block_tokens=4097,
        blocks_per_shard=4,
        progress=False,
        **kwargs,
    )


def case_tiny_datasets(dataset: Path, work: Path, tries: int, rng: random.Random) -> Outcome:
    """An empty dataset (refused by the writer unless asked), one shorter than
    a sample, and one with fewer samples than a global batch: the loader
    refuses each with a clear error."""
    from zephon_stream import StreamingLoader
    from zephon_stream.errors import EmptyDatasetError

    outcome = Outcome()
    texts = {
        "empty": [b"", b""],
        "shorter_than_a_sample": [b"x = 1\n"],
        "smaller_than_a_batch": [b"y" * (SEQ_LEN * 3 + 10)],
    }
    for name, contents in texts.items():
        folder = work / f"in_{name}"
        folder.mkdir(parents=True, exist_ok=True)
        inputs = []
        for i, content in enumerate(contents):
            inputs.append(folder / f"{i}.txt")
            inputs[-1].write_bytes(content)
        out = work / f"ds_{name}"
        if name == "empty":
            # The writer refuses to commit no tokens unless asked; the
            # loader must still refuse the dataset committed all the same.
            try:
                _write(inputs, out)
            except EmptyDatasetError as exc:
                outcome.refuse(exc, must_name=str(out))
            else:
                raise AssertionError(f"{name}: a dataset with no tokens was committed without allow_empty")
            _write(inputs, out, allow_empty=True)
        else:
            _write(inputs, out)
        for batch in (BATCH, 64):
            try:
                with StreamingLoader(str(out), seq_len=SEQ_LEN, local_batch_size=batch) as loader:
                    next(loader)
            except StopIteration:
                raise AssertionError(f"{name} (batch {batch}): iteration ended silently, no error") from None
            except Exception as exc:  # noqa: BLE001
                outcome.refuse(exc, must_name=str(out) if name == "empty" else None)
                check(name != "empty" or "holds no tokens" in str(exc), f"{name}: the loader said {exc}")
            else:
                # Three samples can still fill batch 8 by wrapping epochs
                # only if the order allows it; a batch returned must be real data.
                outcome.accept()
    return outcome


def case_writer_text(dataset: Path, work: Path, tries: int, rng: random.Random) -> Outcome:
    """Documents longer than a block (round trip exact), invalid UTF-8 (rejected
    with its offset) and NUL bytes (kept as text), in txt and jsonl inputs."""
    import numpy as np

    from zephon_stream.reader import DatasetReader

    outcome = Outcome()
    folder = work / "text"
    folder.mkdir(parents=True, exist_ok=True)
    long_doc = "".join(chr(rng.choice((0x41, 0x3B1, 0x4E2D, 0x1F600, 0x0A, 0x20))) for _ in range(60_000))
    nul_doc = "before\x00after\x00\x00end"
    (folder / "0_long.txt").write_text(long_doc, encoding="utf-8")
    (folder / "1_nul.txt").write_bytes(nul_doc.encode())
    (folder / "2_bad.txt").write_bytes(b"valid start \xff\xfe then \xc3 broken")
    (folder / "3_mixed.jsonl").write_bytes(
        json.dumps({"text": nul_doc}).encode()
        + b"\n"
        + b'{"text": "\\udc80 lone surrogate"}\n'
        + b'{"text": "ok \xe9\xff"}\n'
        + json.dumps({"text": long_doc}).encode()
        + b"\n"
    )
    out = work / "text_ds"
    summary = _write(sorted(folder.iterdir()), out)
    rejects = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    reasons = {(Path(r["source"]).name, r["record"]): r["reason"] for r in rejects}
    check(reasons.get(("2_bad.txt", 0)) == "undecodable", f"invalid UTF-8 in a txt file: rejects {reasons}")
    check(reasons.get(("3_mixed.jsonl", 2)) == "undecodable", f"invalid UTF-8 in a jsonl line: rejects {reasons}")
    check(summary.records_in == summary.records_written + sum(summary.rejected.values()), "records do not reconcile")
    expected_docs = [long_doc, nul_doc, nul_doc]
    with DatasetReader.open(str(out)) as reader:
        check(reader.manifest.block_tokens < len(long_doc.encode()), "the long document fits in a block")
        spans = reader.documents(0, reader.manifest.num_tokens)
        texts = [bytes(reader.document_tokens(s)[:-1].astype(np.uint8)).decode("utf-8") for s in spans]
    # The lone-surrogate JSON line is either rejected or kept; both are
    # accounted for, so compare the documents that match the inputs.
    kept = [t for t in texts if t in (long_doc, nul_doc)]
    check(
        kept[:2] == expected_docs[:2] and kept.count(long_doc) == 2 and kept.count(nul_doc) == 2,
        "long / NUL documents did not round trip",
    )
    outcome.tries += 4
    outcome.accepted += 2  # long documents and NUL bytes: written exactly
    outcome.refused += 2  # invalid UTF-8 in txt and jsonl: rejected with reason
    outcome.examples = [f"{k[0]} record {k[1]}: {v}" for k, v in sorted(reasons.items())][:3]
    return outcome
