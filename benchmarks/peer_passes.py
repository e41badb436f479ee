"""One library's read pass in a process of its own: first batch, steady tokens/s, peak memory.

bench_peers.py runs this module once per library, place (local disk or S3)
and batch shape, each in a fresh interpreter so that its peak memory is its
own::

    python -m benchmarks.peer_passes --lib zephon --url DATASET --batch 16 --seq-len 2048 --min-seconds 10

Readers (every one shuffles, and reads ``seq_len + 1``-token samples):

- ``zephon``: ``StreamingLoader(url, seq_len, local_batch_size=batch)``, its
  default pipeline (one helper process); int64 ``input``, ``labels`` and
  ``positions`` per batch.
- ``litdata``: ``StreamingDataLoader(StreamingDataset(url,
  TokensLoader(block_size=seq_len + 1), shuffle=True), batch_size=batch,
  num_workers=--workers)``.
- ``litdata_iter``: ``for item in StreamingDataset(...)``, LitData's dataset
  iterated in this process, one sample a step (batch 1 only).
- ``mosaic``: MosaicML ``StreamingDataLoader(StreamingDataset(remote, local,
  shuffle=True, batch_size=batch), batch_size=batch, num_workers=--workers)``.

Time to the first batch runs from before the reader is built (its library
already imported) to the first batch in hand. Steady tokens/s counts ``batch * seq_len`` tokens per batch
after the first, over at least ``--min-seconds``, starting new epochs as
needed (a peer reading from S3 downloads whole shards into its cache during
the first epoch and reads later epochs from there). CPU per step is what a
training step pays for the reader in the trainer's own thread:
``time.thread_time()`` around each steady ``next()``, its median and its mean
over the steady steps (a reader with no worker reads in that thread, so its
whole reading is there; a worker's or a helper's CPU is not). Peak memory is sampled
every 50 ms over this process and all its descendants: the sum of their RSS
and the sum of their PSS (shared pages, such as a shared-memory ring, split
among the processes that map them). The last printed line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
FIGURES = (
    "first_batch_s",
    "steady_tokens_per_s",
    "step_cpu_us",
    "step_cpu_mean_us",
    "peak_rss_mib",
    "peak_pss_mib",
    "load_average",
)


def process_tree(pid: int) -> list[int]:
    """``pid`` and its live descendants, from ``/proc``."""
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        for task in Path(f"/proc/{current}/task").glob("*/children"):
            try:
                todo.extend(int(child) for child in task.read_text().split())
            except OSError:
                continue
    return tree


def memory_bytes(pid: int) -> tuple[int, int]:
    """``(RSS, PSS)`` of one process in bytes; ``(0, 0)`` once it is gone."""
    try:
        rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0, 0
    fields = dict(line.split(":", 1) for line in rollup.splitlines()[1:] if ":" in line)
    kib = lambda name: int(fields.get(name, "0 kB").split()[0]) * 1024  # noqa: E731
    return kib("Rss"), kib("Pss")


class PeakMemory:
    """Samples the memory of this process's tree every ``interval_s`` in a thread; keeps the peaks."""

    def __init__(self, *, interval_s: float = 0.05) -> None:
        self.interval_s = interval_s
        self.peak_rss = self.peak_pss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        totals = [memory_bytes(pid) for pid in process_tree(os.getpid())]
        self.peak_rss = max(self.peak_rss, sum(rss for rss, _ in totals))
        self.peak_pss = max(self.peak_pss, sum(pss for _, pss in totals))

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __enter__(self) -> PeakMemory:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


def import_mosaic() -> Any:
    """``streaming.base``, without ``streaming/__init__``, which imports torchvision
    (whose PyPI wheels need a CUDA torch) for its vision datasets."""
    import importlib.util
    import sys
    import types

    spec = importlib.util.find_spec("streaming")
    if spec is None:
        raise ImportError("mosaicml-streaming is not installed")
    package = types.ModuleType("streaming")
    package.__path__ = list(spec.submodule_search_locations)
    package.__spec__ = spec
    sys.modules.setdefault("streaming", package)
    import streaming.base as base

    return base


def zephon_batches(args: argparse.Namespace, options: dict[str, Any] | None) -> Iterator[Any]:
    from zephon_stream import StreamingLoader

    with StreamingLoader(
        args.url,
        seq_len=args.seq_len,
        local_batch_size=args.batch,
        rank=0,
        world_size=1,
        seed=0,
        storage_options=options,
    ) as loader:
        yield from loader


def litdata_batches(args: argparse.Namespace, options: dict[str, Any] | None) -> Iterator[Any]:
    from litdata import StreamingDataLoader, StreamingDataset, TokensLoader

    dataset = StreamingDataset(
        args.url,
        item_loader=TokensLoader(block_size=args.seq_len + 1),
        shuffle=True,
        cache_dir=args.cache_dir,
        storage_options=options or {},
    )
    if args.lib == "litdata_iter":
        if args.batch != 1:
            raise ValueError(f"litdata_iter reads one sample a step, not batch {args.batch}")
        while True:
            yield from dataset
    loader = StreamingDataLoader(dataset, batch_size=args.batch, num_workers=args.workers)
    while True:
        yield from loader


def mosaic_batches(args: argparse.Namespace, options: dict[str, Any] | None) -> Iterator[Any]:
    base = import_mosaic()
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    remote, local = (args.url, args.cache_dir) if "://" in args.url else (None, args.url)
    dataset = base.StreamingDataset(remote=remote, local=local, shuffle=True, batch_size=args.batch)
    loader = base.StreamingDataLoader(dataset, batch_size=args.batch, num_workers=args.workers)
    while True:
        yield from loader


READERS = {
    "zephon": zephon_batches,
    "litdata": litdata_batches,
    "litdata_iter": litdata_batches,
    "mosaic": mosaic_batches,
}


def import_reader(lib: str) -> None:
    """Import torch and ``lib``'s reader classes (zephon_stream imports its loader lazily)."""
    import torch  # noqa: F401

    if lib == "zephon":
        from zephon_stream import StreamingLoader  # noqa: F401
    elif lib == "mosaic":
        import_mosaic()
    else:
        from litdata import StreamingDataLoader, StreamingDataset, TokensLoader  # noqa: F401


def measure(args: argparse.Namespace, options: dict[str, Any] | None) -> dict[str, Any]:
    """Time to the first batch, then steady tokens/s and the trainer's thread CPU per step
    over at least ``min_seconds``, and peak memory."""
    tokens_per_batch = args.batch * args.seq_len
    load_average = os.getloadavg()[0]
    # Imported before the clock starts: the first batch times the reader, not the imports.
    import_reader(args.lib)
    step_cpu_s = []
    with PeakMemory() as memory:
        started = time.perf_counter()
        batches = READERS[args.lib](args, options)
        next(batches)
        first = time.perf_counter()
        now = first
        while now - first < args.min_seconds:
            cpu = time.thread_time()
            next(batches)
            step_cpu_s.append(time.thread_time() - cpu)
            now = time.perf_counter()
        batches.close()
    count = len(step_cpu_s)
    return {
        "lib": args.lib,
        "batch": args.batch,
        "seq_len": args.seq_len,
        "workers": args.workers,
        "load_average": load_average,
        "first_batch_s": first - started,
        "steady_s": now - first,
        "steady_batches": count,
        "steady_tokens_per_s": count * tokens_per_batch / (now - first),
        "step_cpu_us": statistics.median(step_cpu_s) * 1e6,
        "step_cpu_mean_us": statistics.fmean(step_cpu_s) * 1e6,
        "peak_rss_mib": memory.peak_rss / 2**20,
        "peak_pss_mib": memory.peak_pss / 2**20,
    }


def run_pass(
    lib: str,
    url: str,
    *,
    batch: int,
    seq_len: int,
    min_seconds: float,
    workers: int = 1,
    endpoint_url: str | None = None,
    env: dict[str, str] | None = None,
    timeout_s: float = 600,
) -> dict[str, Any]:
    """One pass in a fresh interpreter (a fresh cache folder for a remote peer, removed after); its figures."""
    cache = tempfile.mkdtemp(prefix=f"peer-cache-{lib}-")
    command = [sys.executable, "-m", "benchmarks.peer_passes", "--lib", lib, "--url", url, "--batch", str(batch),
               "--seq-len", str(seq_len), "--min-seconds", str(min_seconds), "--workers", str(workers),
               "--cache-dir", cache]  # fmt: skip
    if endpoint_url:
        command += ["--endpoint-url", endpoint_url]
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    try:
        done = subprocess.run(
            command,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env={**os.environ, **(env or {}), "PYTHONPATH": path},
        )
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    if done.returncode != 0:
        lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
        raise RuntimeError(f"{lib} pass at batch {batch} exited {done.returncode}: {' | '.join(lines[-3:])[:400]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def paired_passes(readers: dict[str, dict[str, Any]], trials: int, label: str, results: dict[str, Any]) -> None:
    """``trials`` passes of each reader (``name: run_pass keyword arguments``), the order rotating per trial.

    Records ``results[f"{label}_{name}"]``: every trial's figures and their
    medians; a reader that fails is recorded once and left out of later trials.
    """
    names = list(readers)
    for trial in range(trials):
        for name in names[trial % len(names) :] + names[: trial % len(names)]:
            entry = results.setdefault(f"{label}_{name}", {"trials": []})
            if "error" in entry:
                continue
            try:
                figures = run_pass(**readers[name])
            except Exception as exc:  # noqa: BLE001 - a peer's failure is a result to report
                entry["error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
                print(f"{label} {name}: failed ({entry['error'][:200]})", flush=True)
                continue
            entry["trials"].append(figures)
            print(
                f"{label} trial {trial} {name}: first batch {figures['first_batch_s'] * 1e3:.1f} ms, "
                f"{figures['steady_tokens_per_s'] / 1e6:.2f} M tokens/s over {figures['steady_s']:.1f} s, "
                f"trainer's thread CPU per step {figures['step_cpu_us']:.1f} µs "
                f"(mean {figures['step_cpu_mean_us']:.1f}), "
                f"peak RSS {figures['peak_rss_mib']:.0f} MiB (PSS {figures['peak_pss_mib']:.0f}), "
                f"load {figures['load_average']:.1f}",
                flush=True,
            )
    for name in names:
        entry = results[f"{label}_{name}"]
        for key in FIGURES:
            values = [t[key] for t in entry["trials"]]
            if values:
                entry[key] = statistics.median(values)
                entry[f"{key}_range"] = [min(values), max(values)]
    mine = results.get(f"{label}_zephon", {}).get("trials", [])
    for name in names:
        theirs = results[f"{label}_{name}"]["trials"]
        if name == "zephon" or not mine or len(theirs) != len(mine):
            continue
        ratios = [m["steady_tokens_per_s"] / t["steady_tokens_per_s"] for m, t in zip(mine, theirs)]
        results[f"{label}_ratio_zephon_over_{name}"] = {
            "median": statistics.median(ratios),
            "range": [min(ratios), max(ratios)],
        }
        print(
            f"{label}: zephon/{name} steady tokens/s, median {statistics.median(ratios):.2f}, "
            f"range {min(ratios):.2f}-{max(ratios):.2f} over {len(ratios)} paired trials",
            flush=True,
        )
    print_pass_table(label, [(name, results[f"{label}_{name}"]) for name in names])


def print_pass_table(label: str, entries: list[tuple[str, dict[str, Any]]]) -> None:
    """One line per reader: medians (ranges) of its trials' figures, and the load they ran at."""

    def cell(entry: dict[str, Any], key: str, scale: float, digits: int) -> str:
        if key not in entry:
            return "-"
        low, high = entry[f"{key}_range"]
        return f"{entry[key] * scale:.{digits}f} ({low * scale:.{digits}f}-{high * scale:.{digits}f})"

    print(f"{label}, medians (ranges) of the trials:", flush=True)
    print(
        f"  {'reader':<14} {'M tokens/s':>20} {'CPU/step in next(), µs':>24} {'mean, µs':>22} "
        f"{'first batch, ms':>20} {'PSS, MiB':>16} {'load':>12}"
    )
    for name, entry in entries:
        if "error" in entry:
            print(f"  {name:<14} failed: {entry['error'][:100]}")
            continue
        print(
            f"  {name:<14} {cell(entry, 'steady_tokens_per_s', 1e-6, 2):>20} {cell(entry, 'step_cpu_us', 1, 1):>24} "
            f"{cell(entry, 'step_cpu_mean_us', 1, 1):>22} {cell(entry, 'first_batch_s', 1e3, 1):>20} "
            f"{cell(entry, 'peak_pss_mib', 1, 0):>16} {cell(entry, 'load_average', 1, 1):>12}",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lib", choices=sorted(READERS), required=True)
    parser.add_argument("--url", required=True, help="the dataset (a folder, or s3://bucket/prefix)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--min-seconds", type=float, default=10.0, help="steady part of the pass (default 10)")
    parser.add_argument("--workers", type=int, default=1, help="a peer's DataLoader workers (default 1)")
    parser.add_argument("--cache-dir", help="a peer's local cache for a remote dataset")
    parser.add_argument("--endpoint-url", help="the S3 endpoint (credentials from the AWS variables)")
    args = parser.parse_args()
    options = None
    if args.endpoint_url:
        options = {"endpoint_url": args.endpoint_url}
        if args.lib == "zephon":
            options.update(
                key=os.environ["AWS_ACCESS_KEY_ID"],
                secret=os.environ["AWS_SECRET_ACCESS_KEY"],
                client_kwargs={"region_name": os.environ.get("AWS_DEFAULT_REGION", "us-east-1")},
            )
    figures = measure(args, options)
    print(json.dumps(figures), flush=True)
    # The peers' loaders hold worker processes and download threads that
    # an abandoned generator does not stop; the figures are out, so leave now.
    os._exit(0)


if __name__ == "__main__":
    main()
