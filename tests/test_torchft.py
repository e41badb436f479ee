"""torchft replica groups as real processes (real lighthouse, gloo on loopback):
the samples that committed steps trained are exactly positions 0..N-1, none
lost or repeated, through a kill and heal, a group leaving, a failed commit."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest

pytest.importorskip("torchft")

from zephon_stream.demo.torchft_demo import (
    EVENTS,
    FAIL,
    GLOBAL_BATCH,
    GROUP_BATCH,
    HOLD,
    KILL,
    LEAVE,
    report,
    run_demo_groups,
)
from zephon_stream.demo.torchft_run import (
    lost_and_repeated,
    reference_digests,
    run_groups,
)

pytestmark = pytest.mark.slow

STEPS = 20


def check_tokens(run, dataset: str, *, lanes: int, loader: int = 0, packing: str = "concat") -> int:
    """Every row any group was handed is the row one plain rank reads at its position."""
    rows = [
        (p, d)
        for recs in run.records.values()
        for rec in recs
        for p, d in zip(rec["positions"][loader], rec["digests"][loader])
    ]
    top = max(p for p, _ in rows) + 1
    reference = reference_digests(dataset, seq_len=16, lanes=lanes, positions=top, packing=packing)
    wrong = [(p, d) for p, d in rows if p >= 0 and reference[p] != d]
    assert not wrong, f"rows whose tokens differ from a single-rank reading: {wrong[:5]}"
    return len(rows)


def check_no_sample_lost_or_repeated(counts) -> dict[int, list[int]]:
    """``counts[t, p]``: times committed step ``t`` trained position ``p``.
    Returns each committed step's positions."""
    total = counts.sum(dim=0)
    assert int(total.max()) == 1, f"positions trained twice: {(total > 1).nonzero().flatten().tolist()[:10]}"
    trained = int(total.sum())
    assert trained > 0
    assert total[:trained].eq(1).all() and total[trained:].eq(0).all(), (
        f"trained positions are not 0..{trained - 1}: missing {(total[:trained] == 0).nonzero().flatten().tolist()}"
    )
    return {t: counts[t].nonzero().flatten().tolist() for t in range(counts.shape[0])}


def check_schedule_happened(run, *, killed: str, leaver: str | None, failer: str) -> None:
    """The failures ran: a SIGKILL, a heal with every group, a leave, a failed commit."""
    recs = run.records
    assert run.exit_codes[killed][0] == -9
    groups = len({name[:2] for name in run.records})
    assert any(r["participants"] == groups for r in recs[killed] if r["step"] > HOLD)
    if leaver is not None:
        assert max(r["step"] for r in recs[leaver]) == LEAVE - 1
        assert any(r["participants"] == groups - 1 for r in recs[failer] if r["step"] > LEAVE)
    assert any(not r["committed"] for r in recs[failer] if r["step"] == FAIL)


def test_per_replica_batches_lose_and_repeat_no_sample_through_kill_heal_leave_and_failed_commit_async(
    small_dataset, tmp_path
):
    # A second loader in the same groups reads rows of whole documents (best fit).
    loaders = [
        {"policy": "per_replica", "group_batch": GROUP_BATCH},
        {"policy": "per_replica", "group_batch": GROUP_BATCH, "packing": "best_fit"},
    ]
    run = run_groups(
        tmp_path,
        dataset=small_dataset.url,
        groups=3,
        group_world_size=1,
        async_quorum=True,
        loaders=loaders,
        steps=STEPS,
        lanes=12,
        events=EVENTS,
        restart={1: "g0r0.step"},
    )
    counts = run.counts("ours")
    per_step = check_no_sample_lost_or_repeated(counts[0])
    # Each committed step trained whole group batches (a share counts or is owed whole).
    assert all(len(p) % GROUP_BATCH == 0 and p for p in per_step.values()), per_step
    assert check_no_sample_lost_or_repeated(counts[1]) == per_step
    check_tokens(run, small_dataset.url, lanes=12, loader=1, packing="best_fit")
    check_schedule_happened(run, killed="g1r0", leaver="g2r0", failer="g0r0")
    assert run.finals["g0r0"]["states"] == run.finals["g1r0"]["states"]
    # The trap was sprung: rows went to a healing group, and were served again.
    healing = [r for rs in run.records.values() for r in rs if r["rank"] is not None and not r["counted"]]
    assert healing, "no group healed with a participating rank in the asynchronous quorum"
    ours, theirs = lost_and_repeated(counts[0].sum(dim=0)), lost_and_repeated(run.counts("sampler"))
    assert ours[:2] == (0, 0)
    check_tokens(run, small_dataset.url, lanes=12)
    print(f"\nlost, repeated, trained: ours {ours}, torchft DistributedSampler {theirs}")


def test_sync_quorum_per_replica_exact_and_fixed_global_steps_equal_the_failure_free_run(small_dataset, tmp_path):
    # The run of `zephon-stream demo --torchft`, whose table and verdict are checked too.
    run = run_demo_groups(tmp_path, small_dataset.url, steps=STEPS)
    counts = run.counts("ours")
    per_step = check_no_sample_lost_or_repeated(counts[0])
    assert all(len(p) % GROUP_BATCH == 0 and p for p in per_step.values()), per_step
    check_schedule_happened(run, killed="g1r0", leaver="g2r0", failer="g0r0")
    assert run.finals["g0r0"]["states"] == run.finals["g1r0"]["states"]
    # The synchronous quorum heals before the step: no share is ever owed, the order is read in order.
    assert not [r for rs in run.records.values() for r in rs if r["rank"] is not None and not r["counted"]]
    assert [p for t in sorted(per_step) for p in sorted(per_step[t])] == list(range(int(counts[0].sum())))
    fixed = check_no_sample_lost_or_repeated(counts[1])
    wrong = {t: p for t, p in fixed.items() if p != list(range(t * GLOBAL_BATCH, (t + 1) * GLOBAL_BATCH))}
    assert not wrong, f"fixed_global steps that differ from the failure-free run's: {wrong}"
    check_tokens(run, small_dataset.url, lanes=12)
    check_tokens(run, small_dataset.url, lanes=12, loader=1)
    table = io.StringIO()
    assert report(run, small_dataset.url, steps=STEPS, out=table) == 0, table.getvalue()
    assert "DIFFERS" not in table.getvalue() and "lost 0, repeated 0 of" in table.getvalue()
    ours, theirs = lost_and_repeated(counts[0].sum(dim=0)), lost_and_repeated(run.counts("sampler"))
    print(f"\n{table.getvalue()}lost, repeated, trained: ours {ours}, torchft DistributedSampler {theirs}")


def test_demo_command_offers_the_torchft_run():
    done = subprocess.run(
        [sys.executable, "-m", "zephon_stream", "demo", "--help"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and "--torchft" in done.stdout


def test_groups_of_two_ranks_lose_and_repeat_no_sample_through_kill_heal_and_failed_commit(small_dataset, tmp_path):
    events = {0: {"hold_at": [HOLD, "g1r1.life2.ready"], "fail_at": FAIL}, 1: {"kill_at": KILL}}
    run = run_groups(
        tmp_path,
        dataset=small_dataset.url,
        groups=2,
        group_world_size=2,
        async_quorum=True,
        loaders=[{"policy": "per_replica", "group_batch": GROUP_BATCH}],
        steps=STEPS,
        lanes=12,
        events=events,
        restart={1: "g0r0.step"},
    )
    counts = run.counts("ours")
    per_step = check_no_sample_lost_or_repeated(counts[0])
    assert all(len(p) % GROUP_BATCH == 0 and p for p in per_step.values()), per_step
    check_schedule_happened(run, killed="g1r1", leaver=None, failer="g0r0")
    # The two ranks of a group read disjoint halves of its share.
    for rec0, rec1 in zip(run.records["g0r0"], run.records["g0r1"]):
        assert rec0["step"] == rec1["step"] and not set(rec0["positions"][0]) & set(rec1["positions"][0])
    check_tokens(run, small_dataset.url, lanes=12)
    ours, theirs = lost_and_repeated(counts[0].sum(dim=0)), lost_and_repeated(run.counts("sampler"))
    assert ours[:2] == (0, 0)
    print(f"\nlost, repeated, trained: ours {ours}, torchft DistributedSampler {theirs}")
