"""``zephon-stream verify``: every problem listed with its object and offset; exit codes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_format_dataset import byte_docs, make_dataset
from zephon_stream.cli import main
from zephon_stream.reader import DatasetReader
from zephon_stream.reader.verify import verify_dataset
from zephon_stream.storage import open_store


@pytest.fixture
def dataset(tmp_path: Path):
    rejects = [{"source": "bad.jsonl", "record": 3, "reason": "empty", "detail": "line 4"}]
    manifest = make_dataset(tmp_path, byte_docs(14), block_tokens=800, blocks_per_shard=3, rejects=rejects)
    assert manifest.num_shards >= 4
    return tmp_path, manifest


def test_clean_dataset_verifies_with_exit_0(dataset, capsys) -> None:
    root, manifest = dataset
    assert main(["verify", str(root)]) == 0
    out = capsys.readouterr().out
    assert "OK" in out and f"{manifest.num_blocks} of {manifest.num_blocks} blocks decoded" in out


def test_every_problem_is_listed_and_exit_is_1(dataset, capsys) -> None:
    root, manifest = dataset
    # flipped byte in shard 0 block 1
    s0 = manifest.shards[0]
    data = bytearray((root / s0.path).read_bytes())
    flip_at = (s0.block_offsets[1] + s0.block_offsets[2]) // 2
    data[flip_at] ^= 0x5A
    (root / s0.path).write_bytes(bytes(data))
    # truncated shard 1: its last block is cut
    s1 = manifest.shards[1]
    (root / s1.path).write_bytes((root / s1.path).read_bytes()[: s1.block_offsets[2] + 5])
    # missing shard 2 and sidecar 3
    (root / manifest.shards[2].path).unlink()
    (root / manifest.shards[3].index_path).unlink()

    assert main(["verify", str(root)]) == 1
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert any(
        f"shard {s0.path} block 1 (bytes {s0.block_offsets[1]}..{s0.block_offsets[2]})" in line
        and line.startswith("CORRUPT")
        for line in lines
    ), out
    assert any(f"shard {s0.path}: sha256 mismatch" in line for line in lines), out
    assert any(line.startswith("TRUNCATED") and f"{s1.path} block 2" in line for line in lines), out
    assert any(
        line.startswith("TRUNCATED") and f"truncated at byte {s1.block_offsets[2] + 5}" in line for line in lines
    ), out
    assert any(line.startswith("MISSING") and manifest.shards[2].path in line for line in lines), out
    assert any(line.startswith("MISSING") and manifest.shards[3].index_path in line for line in lines), out
    assert "FAILED: 6 problem(s)" in out


def test_rejects_list_must_match_num_rejected(dataset) -> None:
    root, _ = dataset
    (root / "rejects.jsonl").write_text("")
    with DatasetReader.open(str(root)) as reader:
        report = verify_dataset(reader)
    assert [p.message for p in report.problems] == ["rejects list rejects.jsonl: 0 lines, manifest says num_rejected 1"]


def test_extra_bytes_after_the_last_block_are_reported(dataset) -> None:
    root, manifest = dataset
    last = manifest.shards[-1]
    with open(root / last.path, "ab") as f:
        f.write(b"junk")
    with DatasetReader.open(str(root)) as reader:
        report = verify_dataset(reader, workers=1)
    assert [p.kind for p in report.problems] == ["corrupt"]
    assert "4 extra bytes" in report.problems[0].message


def test_verify_without_manifest_fails(tmp_path: Path, capsys) -> None:
    assert main(["verify", str(tmp_path)]) == 1
    assert "no committed dataset" in capsys.readouterr().err


def test_verify_over_s3_in_a_subprocess(tmp_path: Path, s3_bucket, s3_url) -> None:
    manifest = make_dataset(tmp_path, byte_docs(5), block_tokens=700, blocks_per_shard=2)
    url = s3_url("verify-me")
    store = open_store(url, s3_bucket.storage_options)
    for path in sorted(p for p in tmp_path.rglob("*") if p.is_file()):
        if path.name != "00000001.zst":
            store.write_atomic(path.relative_to(tmp_path).as_posix(), path.read_bytes())
    result = subprocess.run(
        [sys.executable, "-m", "zephon_stream", "verify", url],
        capture_output=True,
        text=True,
        env={**os.environ, **s3_bucket.env},
        timeout=120,
    )
    assert result.returncode == 1, result.stderr
    assert f"MISSING: shard {manifest.shards[1].path}" in result.stdout
    assert "FAILED: 1 problem(s)" in result.stdout


def test_dataset_written_by_the_writer_verifies(small_bpe_dataset, capsys) -> None:
    assert main(["verify", small_bpe_dataset.url]) == 0
    assert "OK" in capsys.readouterr().out
    with DatasetReader.open(small_bpe_dataset.url) as reader:
        report = verify_dataset(reader)
        assert report.num_blocks_checked == reader.manifest.num_blocks
        assert report.bytes_checked == reader.manifest.compressed_bytes
