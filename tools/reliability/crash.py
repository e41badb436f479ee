"""Crashes: SIGKILL the writer at random points and rerun it; SIGKILL a
multi-rank loader job at random steps and resume it at a random new world size.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tools.reliability.common import check, child_env, committed_objects, process_table, step_hashes

WORKER = Path(__file__).resolve().parent / "loader_worker.py"


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for child, (_, parent) in process_table().items():
        children.setdefault(parent, []).append(child)
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL a launcher and every process under it at once, as a node failure
    would (torchrun starts its ranks in sessions of their own)."""
    for pid in [proc.pid, *_descendants(proc.pid)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=60)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def writer_kills(
    *, inputs: str, out_root: Path, runs: int, seed: int, workers: int = 2, tokenizer: str = "bytes"
) -> dict[str, Any]:
    """Kill ``zephon-stream write`` (the main process, SIGKILL) at random times,
    one or two times per run, then rerun it to the end; each run's output must
    equal an uninterrupted run's, byte for byte.

    Returns:
        ``{"runs", "kills", "objects", "clean_s", "partial_shards": [...],
        "orphans": N}`` (worker processes still alive 10 s after their parent
        was killed).
    """

    # --pool-min-input-bytes 0 starts the worker processes even for this
    # small input: that they follow their killed parent is part of the check.
    def command(out: Path) -> list[str]:
        return [
            sys.executable,
            "-m",
            "zephon_stream",
            "write",
            inputs,
            "--output",
            str(out),
            "--tokenizer",
            tokenizer,
            "--block-tokens",
            "4097",
            "--blocks-per-shard",
            "4",
            "--workers",
            str(workers),
            "--pool-min-input-bytes",
            "0",
            "--no-progress",
        ]

    env = child_env()
    clean = out_root / "clean"
    started = time.perf_counter()
    done = subprocess.run(command(clean), env=env, capture_output=True, text=True, timeout=600)
    clean_s = time.perf_counter() - started
    check(done.returncode == 0, f"clean write failed: {done.stderr[-2000:]}")
    expected = committed_objects(str(clean))
    num_shards = sum(p.endswith(".zst") for p in expected)
    rng = random.Random(seed)
    kills, partial_shards, orphans, finished = 0, [], 0, 0
    for run in range(runs):
        out = out_root / f"run{run}"
        completed = False
        for _ in range(rng.choice((1, 2))):
            # The kill point is drawn over the shard sequence (kill once
            # `target` shards are committed; 0: at a random time during
            # start-up), since wall-clock times shift with machine load.
            target = rng.randint(0, num_shards)
            delay_s = rng.uniform(0.0, clean_s) if target == 0 else 0.0
            proc = subprocess.Popen(
                command(out), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
            )
            deadline = time.monotonic() + 600
            kill_at = time.monotonic() + delay_s
            while proc.poll() is None and time.monotonic() < deadline:
                if target == 0 and time.monotonic() >= kill_at:
                    break
                if target and len([p for p in (out / "shards").glob("*.zst")]) >= target:
                    break
                time.sleep(0.002)
            if proc.poll() is not None:
                finished += 1  # ended before the kill point; its output must still match
                check(proc.returncode == 0, f"writer run {run} failed before its kill point")
                completed = True
                break
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=60)
            wait_until = time.monotonic() + 10
            while _group_alive(proc.pid) and time.monotonic() < wait_until:
                time.sleep(0.05)
            if _group_alive(proc.pid):
                orphans += 1
                os.killpg(proc.pid, signal.SIGKILL)
            kills += 1
            present = committed_objects(str(out)) if out.exists() else {}
            check("manifest" not in present, f"writer run {run}: a killed run left a manifest")
            partial_shards.append(sum(p.endswith(".zst") for p in present))
        if not completed:
            rerun = subprocess.run(command(out), env=env, capture_output=True, text=True, timeout=600)
            check(rerun.returncode == 0, f"writer run {run}: rerun failed: {rerun.stderr[-2000:]}")
        got = committed_objects(str(out))
        differing = sorted(p for p in expected.keys() | got.keys() if expected.get(p) != got.get(p))
        check(not differing, f"writer run {run}: rerun after a kill differs: {differing[:5]}")
        shutil.rmtree(out)
    return {
        "runs": runs,
        "kills": kills,
        "finished_before_kill": finished,
        "objects": len(expected),
        "shards": num_shards,
        "clean_s": round(clean_s, 2),
        "partial_shards": partial_shards,
        "orphans": orphans,
    }


def _torchrun(nproc: int, args: list[str], env: dict[str, str]) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        str(WORKER),
        *args,
    ]
    return subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )


def _read_hashes(path: Path) -> list[tuple[int, str]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        step, _, digest = line.partition(" ")
        if len(digest) == 64:
            out.append((int(step), digest))
    return out


def loader_kill_resume(
    *,
    data: str,
    work: Path,
    runs: int,
    seed: int,
    total_steps: int = 40,
    resume_steps: int = 8,
    global_batch: int = 12,
    seq_len: int = 256,
    worlds: tuple[int, ...] = (1, 2, 3, 4),
    timeout_s: float = 300,
) -> dict[str, Any]:
    """SIGKILL a torchrun loader job at a random step, resume it at another
    world size from its last committed checkpoint; every step read before the
    kill and after the resume must equal an uninterrupted single-process run.

    Returns:
        ``{"runs", "resumed": [{"from_world", "to_world", "killed_after",
        "resumed_at"}], "steps_checked"}``.
    """
    from zephon_stream import StreamingLoader

    with StreamingLoader(data, seq_len=seq_len, local_batch_size=global_batch, seed=seed) as single:
        reference = step_hashes(single, total_steps + resume_steps)
    env = child_env()
    rng = random.Random(seed)
    common = ["--data", data, "--seq-len", str(seq_len), "--global-batch", str(global_batch), "--seed", str(seed)]
    resumed, steps_checked = [], 0
    for run in range(runs):
        folder = work / f"run{run}"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        # torchrun leaves torchelastic_* folders in its TMPDIR, and ranks all
        # killed leave their node cache's files for the next job on the node
        # (docs/STORAGE.md): both go with the run's folder.
        (folder / "tmp").mkdir()
        run_env = {**env, "TMPDIR": str(folder / "tmp"), "ZEPHON_NODE_CACHE": str(folder / "node-cache")}
        w0 = rng.choice(worlds)
        w1 = rng.choice([w for w in worlds if w != w0])
        kill_at = rng.randint(2, total_steps - 2)
        hashes = folder / "killed.txt"
        proc = _torchrun(
            w0,
            [*common, "--steps", str(total_steps), "--ckpt-root", str(folder / "ckpt"), "--hashes", str(hashes)],
            run_env,
        )
        deadline = time.monotonic() + timeout_s
        while len(_read_hashes(hashes)) < kill_at:
            if proc.poll() is not None:
                raise AssertionError(
                    f"crash run {run}: job at W={w0} ended before step {kill_at}:\n{proc.stdout.read()[-4000:]}"
                )
            check(time.monotonic() < deadline, f"crash run {run}: no step {kill_at} within {timeout_s} s")
            time.sleep(0.01)
        _kill_tree(proc)
        killed = _read_hashes(hashes)
        check(proc.returncode != 0, f"crash run {run}: the job finished before the kill")
        check(
            killed == [(k, reference[k]) for k in range(len(killed))],
            f"crash run {run}: the job at W={w0} read different data before the kill",
        )
        committed = sorted(int(p.name[4:]) for p in (folder / "ckpt").glob("step*") if (p / "COMMITTED").exists())
        check(bool(committed), f"crash run {run}: no committed checkpoint")
        start = committed[-1]
        out = folder / "resumed.txt"
        proc = _torchrun(
            w1,
            [
                *common,
                "--steps",
                str(resume_steps),
                "--resume",
                str(folder / "ckpt" / f"step{start}"),
                "--ckpt-root",
                str(folder / "ckpt2"),
                "--hashes",
                str(out),
            ],
            run_env,
        )
        try:
            log, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_tree(proc)
            raise AssertionError(f"crash run {run}: the resumed job at W={w1} hung") from None
        check(proc.returncode == 0, f"crash run {run}: resume at W={w1} failed:\n{log[-4000:]}")
        got = _read_hashes(out)
        want = [(k, reference[k]) for k in range(start, start + resume_steps)]
        check(got == want, f"crash run {run}: resumed at step {start} on W={w1} (from W={w0}), data differs")
        steps_checked += len(killed) + len(got)
        resumed.append({"from_world": w0, "to_world": w1, "killed_after": len(killed), "resumed_at": start})
        shutil.rmtree(folder, ignore_errors=True)
    return {"runs": runs, "resumed": resumed, "steps_checked": steps_checked}
