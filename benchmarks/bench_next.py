"""CPU the trainer's own thread spends in ``next(loader)``, per step, measured directly.

Dataset: the Python standard library sources on this machine, written with the
``bytes`` tokenizer (benchmarks/bench_read.py builds it), once with the
writer's default blocks and once with ``--small-block-tokens`` (65,537) tokens
a block, so that the same steps span many more blocks.

For each shape (16 x 2048 on default blocks and on small blocks, 1 x 1024 on
default blocks) and each pipeline (the helper process, the default, and the
in-process threads), one rank on local disk: ``--warm-steps`` steps first
(then more until the helper serves them), then ``--steps`` steps, each
``next(loader)`` timed by the trainer thread's ``time.thread_time_ns()``, with
about ``--work-ms`` of pure-Python work between steps (calibrated alone), so
that the pipeline runs ahead and ``next()`` finds its step ready, as in a
training loop that is not starved. Printed per shape and pipeline: the median,
mean, p90 and max in µs, and how many steps waited (the wall time of
``next()`` over 1 ms). Beside them: the median over the steps whose batch
was ready (the thread off its core under 50 µs in ``next()``): on a busy
machine the helper falls behind at times, and a step that waits for it
pays the blocking receive and the wake-up, tens of µs; and the helper
process's CPU per step (all its threads).

Baseline, measured in the same run: the same timer around a function that
builds a dict of four tensors it was handed (what a slot handed over whole
must at least cost), printed beside each figure as a ratio. And, paired on
the same helper-process loader, one step at a time in turn: the short way to
a plain step (``SteadySteps`` in loader/runs/producer_run.py, what
``next()`` takes) against the full way through the feed, the run, the producer and the delivery (what it took
before): the machine's pace moves from run to run by a factor of 2-4 here,
and a paired figure moves with neither. Target: a median of at most 20 µs
with the helper process at every shape.

The last printed line is one JSON object with the figures.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from benchmarks.bench_read import build_dataset, dataset_parser, process_cpu_s
from benchmarks.bench_train_overhead import calibrate, python_work
from zephon_stream import StreamingLoader

PIPELINES = ("process", "threads")
TARGET_US = 20.0


def summary(samples_ns: list[int]) -> dict[str, float]:
    """Median, mean, p90 and max of ``samples_ns``, in µs."""
    us = sorted(s / 1000 for s in samples_ns)
    return {
        "median_us": statistics.median(us),
        "mean_us": statistics.fmean(us),
        "p90_us": us[int(0.9 * (len(us) - 1))],
        "max_us": us[-1],
    }


def baseline_ns(steps: int, iterations: int) -> list[int]:
    """The timer around handing over four ready tensors as a fresh dict."""
    tensors = {key: torch.zeros(4, dtype=torch.int64) for key in ("input", "labels", "positions", "sample_positions")}

    def hand_over() -> dict[str, torch.Tensor]:
        return dict(tensors)

    out = []
    for _ in range(steps):
        python_work(iterations)
        started = time.thread_time_ns()
        hand_over()
        out.append(time.thread_time_ns() - started)
    return out


def measure(
    url: str, *, seq_len: int, local_batch: int, pipeline: str, warm_steps: int, steps: int, iterations: int
) -> dict:
    """One loader's ``next()`` CPU per step, and its stalls."""
    with StreamingLoader(url, seq_len=seq_len, local_batch_size=local_batch, pipeline=pipeline) as loader:
        batch = None
        for _ in range(warm_steps):
            batch = next(loader)
            python_work(iterations)
        # A run's first steps come from threads while the helper starts;
        # the figure is the steady state, from the helper.
        deadline = time.monotonic() + 120
        while pipeline == "process" and loader.helper_pid is None and time.monotonic() < deadline:
            batch = next(loader)
            python_work(iterations)
        if pipeline == "process" and loader.helper_pid is None:
            raise RuntimeError("the helper process never took the run over")
        pid = loader.helper_pid
        helper_start = process_cpu_s(pid) if pid else 0.0
        cpu_ns, ready_ns, waited = [], [], 0
        for _ in range(steps):
            python_work(iterations)
            wall, started = time.perf_counter_ns(), time.thread_time_ns()
            batch = next(loader)
            cpu = time.thread_time_ns() - started
            wall = time.perf_counter_ns() - wall
            cpu_ns.append(cpu)
            waited += wall > 1_000_000
            if wall - cpu < 50_000:
                ready_ns.append(cpu)  # Off its core under 50 us: the batch was ready, no wait
        helper_us = (process_cpu_s(pid) - helper_start) / steps * 1e6 if pid else 0.0
        assert batch["input"].shape == (local_batch, seq_len)
        stall_ms = loader.stats()["stall_s"] * 1e3
        del batch  # A batch kept on would be a third held: every step a copy
        paired = paired_ways(loader, steps, iterations) if pipeline == "process" else {}
    ready = summary(ready_ns) if ready_ns else {"median_us": float("nan")}
    return {
        **summary(cpu_ns),
        "steps_waited": waited,
        "stall_ms_total": stall_ms,
        "ready_steps": len(ready_ns),
        "ready_median_us": ready["median_us"],
        "helper_cpu_us_per_step": helper_us,
        **paired,
    }


def paired_ways(loader: StreamingLoader, steps: int, iterations: int) -> dict[str, float]:
    """The short way to a step (``SteadySteps``, loader/runs/producer_run.py) against the full way, one
    step each in turn on the same loader: a paired figure that the machine's
    changes of pace from run to run leave alone."""
    # The full way is the loader's own, private: what next() took before the short way.
    ways = {"short": loader.__next__, "full": loader._next_the_full_way}
    cpu_ns: dict[str, list[int]] = {name: [] for name in ways}
    for step in range(2 * steps):
        name = "short" if step % 2 else "full"
        python_work(iterations)
        started = time.thread_time_ns()
        batch = ways[name]()  # Kept until the next step, as a training loop keeps it
        cpu_ns[name].append(time.thread_time_ns() - started)
    del batch
    short, full = (statistics.median(cpu_ns[name]) / 1000 for name in ("short", "full"))
    return {"paired_short_median_us": short, "paired_full_median_us": full, "paired_full_to_short": full / short}


def main() -> None:
    parser = dataset_parser(__doc__)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--warm-steps", type=int, default=300)
    parser.add_argument("--work-ms", type=float, default=1.0)
    parser.add_argument("--small-block-tokens", type=int, default=65537)
    parser.add_argument("--pipelines", default=",".join(PIPELINES))
    args = parser.parse_args()
    pipelines = args.pipelines.split(",")
    iterations = calibrate(args.work_ms)
    figures: dict = {
        "steps": args.steps,
        "warm_steps": args.warm_steps,
        "work_ms": args.work_ms,
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "load_average_1min_start": os.getloadavg()[0],
    }
    base = summary(baseline_ns(args.steps, iterations))
    figures["baseline_dict_of_four_tensors"] = base
    print(
        f"baseline (a dict of four ready tensors, same timer): median {base['median_us']:.1f} us, "
        f"mean {base['mean_us']:.1f} us"
    )
    with tempfile.TemporaryDirectory() as tmp:
        top = Path(args.data_dir or tmp)
        default = str(top / "stdlib-bytes")
        build_dataset(Path(default), blocks_per_shard=2)
        small = str(top / f"stdlib-bytes-{args.small_block_tokens}")
        build_dataset(Path(small), blocks_per_shard=None, block_tokens=args.small_block_tokens)
        shapes = [("16x2048", default, 2048, 16), (f"16x2048_blocks{args.small_block_tokens}", small, 2048, 16),
                  ("1x1024", default, 1024, 1)]  # fmt: skip
        for name, url, seq_len, local_batch in shapes:
            for pipeline in pipelines:
                entry = measure(
                    url,
                    seq_len=seq_len,
                    local_batch=local_batch,
                    pipeline=pipeline,
                    warm_steps=args.warm_steps,
                    steps=args.steps,
                    iterations=iterations,
                )
                entry["ratio_to_baseline_median"] = entry["median_us"] / base["median_us"]
                figures[f"{name}_{pipeline}"] = entry
                target = f" (target <= {TARGET_US:g})" if pipeline == "process" else ""
                helper = ""
                if pipeline == "process":
                    helper = (
                        f"; the helper process {entry['helper_cpu_us_per_step']:.0f} us; in turn on one loader, "
                        f"the short way {entry['paired_short_median_us']:.1f} us against the full way "
                        f"{entry['paired_full_median_us']:.1f} us"
                    )
                print(
                    f"{name} {pipeline}: next() CPU per step median {entry['median_us']:.1f} us{target}, "
                    f"mean {entry['mean_us']:.1f}, p90 {entry['p90_us']:.1f}, max {entry['max_us']:.0f} us; "
                    f"{entry['ratio_to_baseline_median']:.1f}x the baseline; {entry['steps_waited']} of "
                    f"{args.steps} steps waited over 1 ms; median {entry['ready_median_us']:.1f} us over the "
                    f"{entry['ready_steps']} steps whose batch was ready{helper}"
                )
    figures["target_met"] = all(
        figures[k]["median_us"] <= TARGET_US for k in figures if k.endswith("_process") and isinstance(figures[k], dict)
    )
    figures["load_average_1min_end"] = os.getloadavg()[0]
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
