"""``zephon-stream demo --torchft``: three torchft replica groups on loopback
under a real lighthouse; one SIGKILLed and restarted (it heals), one leaving
for good, one failing a commit. A table per committed step, then the samples
lost and repeated by ``TorchFTLoader`` against torchft's own
``DistributedSampler`` semantics on the same failures.

The groups run torchft's synchronous quorum with two loaders side by side:
``per_replica`` (each group trains its own batch) and ``fixed_global`` (each
committed step trains the failure-free run's global batch, whose hash the
table compares). The model counts what committed steps trained
(demo/torchft_group.py), so the verdict does not rest on the loader's word.
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
import tempfile
from pathlib import Path
from typing import TextIO

from zephon_stream.demo.torchft_run import (
    Run,
    lost_and_repeated,
    reference_digests,
    run_groups,
)

GROUP_BATCH = 4
GLOBAL_BATCH = 10
LANES = 12
SEQ_LEN = 16
KILL, HOLD, LEAVE, FAIL = 4, 7, 11, 15
EVENTS = {
    0: {"hold_at": [HOLD, "g1r0.life2.ready"], "fail_at": FAIL},
    1: {"kill_at": KILL},
    2: {"hold_at": [HOLD, "g1r0.life2.ready"], "leave_at": LEAVE},
}


def build_dataset(out: Path) -> str:
    """The standard library's top-level sources, bytes tokenizer, small blocks."""
    from zephon_stream import write_dataset

    files = sorted(str(p) for p in Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:40]
    write_dataset(files, str(out), tokenizer="bytes", block_tokens=4097, blocks_per_shard=4, progress=False)
    return str(out)


def step_hash(pairs: list[tuple[int, str]]) -> str:
    return hashlib.sha256(repr(sorted(pairs)).encode()).hexdigest()[:12]


def run_demo_groups(tmp: Path, dataset: str, *, steps: int = 20) -> Run:
    """The demo's run: 3 groups, synchronous quorum, both policies, the failures of ``EVENTS``."""
    loaders = [
        {"policy": "per_replica", "group_batch": GROUP_BATCH},
        {"policy": "fixed_global", "global_batch": GLOBAL_BATCH},
    ]
    return run_groups(
        tmp,
        dataset=dataset,
        groups=3,
        group_world_size=1,
        async_quorum=False,
        loaders=loaders,
        steps=steps,
        seq_len=SEQ_LEN,
        lanes=LANES,
        events=EVENTS,
        restart={1: "g0r0.step"},
    )


def run_torchft_demo(*, steps: int = 20, workdir: str | None = None, out: TextIO) -> int:
    """Run the demo, print its table and verdict to ``out``; 0 if no sample was lost or repeated."""
    # The lighthouse (Rust, in this process) logs every quorum at INFO.
    os.environ.setdefault("RUST_LOG", "warn")
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        dataset = build_dataset(Path(tmp) / "dataset")
        print(
            f"dataset {dataset}; lighthouse and 3 replica groups on loopback (synchronous quorum), "
            f"{steps} steps: group 1 SIGKILLed at step {KILL} and restarted, group 2 leaving at step {LEAVE}, "
            f"group 0 failing its commit at step {FAIL}",
            file=out,
        )
        run = run_demo_groups(Path(tmp), dataset, steps=steps)
        return report(run, dataset, steps=steps, out=out)


def report(run: Run, dataset: str, *, steps: int, out: TextIO) -> int:
    counts = run.counts("ours")
    per_replica, fixed = counts[0], counts[1]
    digests = {}
    for records in run.records.values():
        for rec in records:
            digests.update(zip(rec["positions"][1], rec["digests"][1]))
    reference = reference_digests(dataset, seq_len=SEQ_LEN, lanes=LANES, positions=steps * GLOBAL_BATCH)
    print(
        f"{'step':>4} {'groups':>6} {'committed by':>12} {'cursor':>6} {'fixed-global hash':>17} {'failure-free':>12}",
        file=out,
    )
    cursor, mismatches = 0, []
    for t in range(steps):
        recs = [(name, r) for name, rs in run.records.items() for r in rs if r["step"] == t]
        committed = sorted(name[:2] for name, r in recs if r["committed"])
        participants = max((r["participants"] for _, r in recs if r["committed"]), default=0)
        cursor += int(per_replica[t].sum())
        trained = fixed[t].nonzero().flatten().tolist()
        got = step_hash([(p, digests.get(p, "?")) for p in trained])
        want = step_hash([(p, reference[p]) for p in range(t * GLOBAL_BATCH, (t + 1) * GLOBAL_BATCH)])
        if got != want:
            mismatches.append(t)
        print(
            f"{t:>4} {participants:>6} {','.join(committed):>12} {cursor:>6} {got:>17} "
            f"{want:>12}{'' if got == want else '  DIFFERS'}",
            file=out,
        )
    ours = lost_and_repeated(per_replica.sum(dim=0))
    theirs = lost_and_repeated(run.counts("sampler"))
    fixed_total = lost_and_repeated(fixed.sum(dim=0))
    print(f"per_replica TorchFTLoader:        lost {ours[0]}, repeated {ours[1]} of {ours[2]} trained", file=out)
    print(
        f"torchft DistributedSampler:       lost {theirs[0]}, repeated {theirs[1]} of {theirs[2]} trained "
        f"(same failures)",
        file=out,
    )
    print(
        f"fixed_global TorchFTLoader:       lost {fixed_total[0]}, repeated {fixed_total[1]} of "
        f"{fixed_total[2]}; steps unlike the failure-free run's: {mismatches or 'none'}",
        file=out,
    )
    ok = ours[:2] == (0, 0) and fixed_total[:2] == (0, 0) and not mismatches
    print("OK: no sample lost or repeated" if ok else "FAILED: samples lost or repeated", file=out)
    return 0 if ok else 1
