"""Audit log records and ``zephon-stream diff-log``."""

from __future__ import annotations

import numpy as np
import pytest

from zephon_stream.cli import main as cli_main
from zephon_stream.loader.front.audit import AuditLog, addresses_sha256, first_divergence, read_audit_log


def write_log(path, fingerprints, *, world_size=1, start=0):
    log = AuditLog(str(path), header={"seq_len": 8, "global_batch": 4})
    for step, fp in enumerate(fingerprints, start):
        log.append(
            {
                "step": step,
                "cursor": 4 * step,
                "addresses_sha256": fp,
                "data_sha256": f"d{fp}",
                "world_size": world_size,
                "local_batch_size": 4 // world_size,
            }
        )
    log.close()


def test_address_fingerprint_ignores_row_order_but_not_addresses():
    pos = np.array([5, 3, 4])
    s, b, k = np.array([0, 1, 0]), np.array([7, 2, 7]), np.array([1, 0, 2])
    fp = addresses_sha256(pos, s, b, k)
    order = np.array([2, 0, 1])
    assert addresses_sha256(pos[order], s[order], b[order], k[order]) == fp
    assert addresses_sha256(pos, s, b, np.array([1, 0, 3])) != fp


def test_diff_log_names_the_first_diverging_step(tmp_path, capsys):
    write_log(tmp_path / "a.jsonl", ["x0", "x1", "x2", "x3"])
    write_log(tmp_path / "b.jsonl", ["x0", "x1", "y2", "y3"], world_size=2)
    divergence, _ = first_divergence(
        read_audit_log(str(tmp_path / "a.jsonl")), read_audit_log(str(tmp_path / "b.jsonl"))
    )
    assert divergence is not None and (divergence.step, divergence.field) == (2, "addresses_sha256")
    assert cli_main(["diff-log", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]) == 1
    assert "diverged at step 2" in capsys.readouterr().out


def test_diff_log_accepts_logs_that_agree_up_to_the_shorter_and_a_resumed_log(tmp_path, capsys):
    write_log(tmp_path / "a.jsonl", ["x0", "x1", "x2", "x3"])
    write_log(tmp_path / "b.jsonl", ["x0", "x1"], world_size=2)
    write_log(tmp_path / "b.jsonl", ["x1", "x2"], world_size=4, start=1)  # appended after a resume at step 1
    records = read_audit_log(str(tmp_path / "b.jsonl"))
    assert [r["kind"] for r in records] == ["header", "step", "step", "resume", "step", "step"]
    assert cli_main(["diff-log", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]) == 0
    assert "identical over 3 common steps" in capsys.readouterr().out


def test_diff_log_compares_rank0_data_only_at_the_same_world_size(tmp_path):
    a = [
        {
            "kind": "step",
            "step": 0,
            "cursor": 0,
            "addresses_sha256": "f",
            "data_sha256": "d1",
            "world_size": 2,
            "local_batch_size": 2,
        }
    ]
    b = [dict(a[0], data_sha256="d2")]
    c = [dict(a[0], data_sha256="d2", world_size=1, local_batch_size=4)]
    assert first_divergence(a, b)[0].field == "data_sha256"
    assert first_divergence(a, c)[0] is None


def test_remote_audit_log_is_rewritten_whole_on_s3(s3_bucket):
    url = s3_bucket.url("logs/run.jsonl")
    log = AuditLog(url, header={"seq_len": 8}, storage_options=s3_bucket.storage_options, flush_every=2)
    for step in range(5):
        log.append({"step": step, "cursor": step, "addresses_sha256": str(step)})
    log.close()
    records = read_audit_log(url, s3_bucket.storage_options)
    assert [r.get("step") for r in records] == [None, 0, 1, 2, 3, 4]


def test_loader_audit_logs_agree_across_world_sizes_and_name_a_divergence(small_dataset, tmp_path, capsys):
    from zephon_stream import StreamingLoader

    def run(path, *, world, seed=0, steps=8, resume_at=None):
        loaders = [
            StreamingLoader(
                small_dataset.url,
                seq_len=256,
                local_batch_size=8 // world,
                world_size=world,
                rank=r,
                seed=seed,
                audit_log=str(path),
            )
            for r in range(world)
        ]
        try:
            if resume_at is not None:
                for loader in loaders:
                    loader.load_state_dict({**loader.state_dict(), "position": resume_at * 8})
            for _ in range(steps):
                for loader in loaders:
                    next(loader)
        finally:
            for loader in loaders:
                loader.close()

    run(tmp_path / "w1.jsonl", world=1)
    run(tmp_path / "w2.jsonl", world=2, steps=5)
    run(tmp_path / "w2.jsonl", world=4, resume_at=5, steps=3)  # resumed at another world size, same log
    run(tmp_path / "seed.jsonl", world=1, seed=1)
    records = read_audit_log(str(tmp_path / "w2.jsonl"))
    assert [r["step"] for r in records if r["kind"] == "step"] == list(range(8))
    assert cli_main(["diff-log", str(tmp_path / "w1.jsonl"), str(tmp_path / "w2.jsonl")]) == 0
    assert "identical over 8 common steps" in capsys.readouterr().out
    assert cli_main(["diff-log", str(tmp_path / "w1.jsonl"), str(tmp_path / "seed.jsonl")]) == 1
    assert "diverged at step 0: addresses_sha256 differs" in capsys.readouterr().out


def test_union_sha256_is_independent_of_how_rows_are_split_between_ranks():
    from zephon_stream.loader.front.audit import union_sha256

    rng = np.random.default_rng(3)
    positions = np.arange(12, dtype=np.int64)
    inputs = rng.integers(0, 257, size=(12, 8))
    labels = rng.integers(0, 257, size=(12, 8))
    one_rank = union_sha256([(positions, inputs, labels)])
    swapped = [(positions[6:], inputs[6:], labels[6:]), (positions[:6], inputs[:6], labels[:6])]
    three = [(positions[k::3], inputs[k::3], labels[k::3]) for k in range(3)]
    assert union_sha256(swapped) == one_rank == union_sha256(three)
    changed = labels.copy()
    changed[5, 7] ^= 1
    assert union_sha256([(positions, inputs, changed)]) != one_rank
    with pytest.raises(ValueError, match="same global sample position"):
        union_sha256([(positions, inputs, labels), (positions[:1], inputs[:1], labels[:1])])
