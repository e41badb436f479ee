"""What the loader costs a training loop: the loop's speed with the loader beside
it, against the same loop without it, measured in the same run.

Dataset: the Python standard library sources on this machine, written with the
``bytes`` tokenizer (benchmarks/bench_read.py builds it), read at seq 2048 x 16.

``--consumer python`` (any machine): each step does a fixed amount of
pure-Python work (calibrated to ``--work-ms`` when run alone), standing in for
a dispatch-bound trainer that needs the interpreter. Baseline: the same work
with no loader. Figure: baseline time / time with the loader taking one batch
per step, for the helper process (the default) and the in-process threads.
Target on a 2-core machine: >= 0.98 at 5 ms per step with the helper process.

``--consumer model`` (CUDA): a small causal transformer in bf16 (about 2 M
parameters and about 100 M, byte vocabulary), forward, backward and AdamW per
step. Baseline: the same batch already on the GPU, reused. Figures: the
baseline time / time with ``device="cuda"`` delivery, and / time with CPU
delivery plus ``.to("cuda")``. Targets: >= 0.99 (2 M) and >= 0.998 (100 M)
with device delivery, and device delivery >= CPU delivery plus ``.to()``.

Each configuration runs ``--repeats`` times, interleaved; the best time of
each counts. The last printed line is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from benchmarks.bench_read import build_dataset
from zephon_stream import StreamingLoader

PIPELINES = ("process", "threads")


def python_work(iterations: int) -> int:
    """Pure-Python work that holds the interpreter lock throughout."""
    total = 0
    for i in range(iterations):
        total += i & 7
    return total


def calibrate(work_ms: float) -> int:
    """Iterations of :func:`python_work` that take ``work_ms`` alone (best of 5)."""
    probe = 200_000
    best = min(_timed(python_work, probe) for _ in range(5))
    return max(1, int(probe * work_ms / 1000 / best))


def _timed(fn, *args) -> float:
    started = time.perf_counter()
    fn(*args)
    return time.perf_counter() - started


def python_loop_s(url: str | None, args: argparse.Namespace, iterations: int, pipeline: str | None) -> float:
    """Seconds for ``--steps`` steps of work, with a loader (``url``) or without."""
    if url is None:
        started = time.perf_counter()
        for _ in range(args.steps):
            python_work(iterations)
        return time.perf_counter() - started
    with StreamingLoader(url, seq_len=args.seq_len, local_batch_size=args.local_batch, pipeline=pipeline) as loader:
        for _ in range(args.warm_steps):
            next(loader)
        started = time.perf_counter()
        for _ in range(args.steps):
            batch = next(loader)
            assert batch["input"].shape[0] == args.local_batch
            python_work(iterations)
        return time.perf_counter() - started


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_per_step_s(url: str, args: argparse.Namespace, pipeline: str) -> tuple[float, float]:
    """``(trainer, helper)`` CPU seconds per step, with the batches ready (the
    consumer pauses 2 ms a step). The trainer's figure is the CPU time its own
    thread spends in ``next(loader)``: what the trainer's interpreter pays,
    whatever else the machine does. The helper's is its whole process (0 with
    threads)."""
    with StreamingLoader(url, seq_len=args.seq_len, local_batch_size=args.local_batch, pipeline=pipeline) as loader:
        for _ in range(args.warm_steps):
            next(loader)
        pid = loader.helper_pid
        helper_start = process_cpu_s(pid) if pid else 0.0
        spent = 0.0
        for _ in range(args.steps):
            time.sleep(0.002)
            started = time.thread_time()
            next(loader)
            spent += time.thread_time() - started
        helper = (process_cpu_s(pid) - helper_start) if pid else 0.0
    return spent / args.steps, helper / args.steps


def python_consumer(url: str, args: argparse.Namespace) -> dict:
    figures = {}
    for pipeline in PIPELINES:
        trainer, helper = min(cpu_per_step_s(url, args, pipeline) for _ in range(args.repeats))
        figures[f"trainer_cpu_us_per_step_{pipeline}"] = trainer * 1e6
        figures[f"helper_cpu_us_per_step_{pipeline}"] = helper * 1e6
        print(f"{pipeline}: the trainer's thread spends {trainer * 1e6:.0f} us of CPU per step in next()"
              + (f"; the helper process {helper * 1e6:.0f} us" if pipeline == "process" else ""))
    for work_ms in args.work_ms:
        iterations = calibrate(work_ms)
        best = {name: float("inf") for name in ("alone", *PIPELINES)}
        for _ in range(args.repeats):
            best["alone"] = min(best["alone"], python_loop_s(None, args, iterations, None))
            for pipeline in PIPELINES:
                best[pipeline] = min(best[pipeline], python_loop_s(url, args, iterations, pipeline))
        ratios = {pipeline: best["alone"] / best[pipeline] for pipeline in PIPELINES}
        print(f"{work_ms:g} ms of Python per step, alone {best['alone'] / args.steps * 1e3:.2f} ms/step: "
              + ", ".join(f"{p} {r:.3f}x" for p, r in ratios.items())
              + (" (target >= 0.98 with the helper process)" if work_ms == 5 else ""))
        figures[f"{work_ms:g}ms"] = {"alone_s": best["alone"], **{f"{p}_s": best[p] for p in PIPELINES},
                                     **{f"ratio_{p}": r for p, r in ratios.items()}}
    return figures


def model_consumer(url: str, vocab_size: int, args: argparse.Namespace) -> dict:
    from zephon_stream.demo.model import ModelConfig, TinyTransformer

    sizes = {"2m": ModelConfig(vocab_size=vocab_size, dim=256, num_layers=2, num_heads=4, max_seq_len=args.seq_len),
             "100m": ModelConfig(vocab_size=vocab_size, dim=768, num_layers=14, num_heads=12,
                                 max_seq_len=args.seq_len)}
    figures = {}
    for name, config in sizes.items():
        torch.manual_seed(0)
        model = TinyTransformer(config).cuda()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        params = sum(p.numel() for p in model.parameters())

        def step(inputs: torch.Tensor, labels: torch.Tensor) -> None:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(inputs)
            loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), labels.flatten())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        def run(mode: str) -> float:
            if mode == "resident":
                with StreamingLoader(url, seq_len=args.seq_len, local_batch_size=args.local_batch) as loader:
                    batch = {k: v.cuda() for k, v in next(loader).items()}
                batches = None
            else:
                loader = StreamingLoader(url, seq_len=args.seq_len, local_batch_size=args.local_batch,
                                         device="cuda" if mode == "device" else None)
                batches = iter(loader)
            try:
                for index in range(args.warm_steps + args.model_steps):
                    if index == args.warm_steps:
                        torch.cuda.synchronize()
                        started = time.perf_counter()
                    if batches is not None:
                        batch = next(batches)
                        if mode == "cpu_to":
                            batch = {k: v.to("cuda") for k, v in batch.items()}
                    step(batch["input"], batch["labels"])
                torch.cuda.synchronize()
                return time.perf_counter() - started
            finally:
                if batches is not None:
                    loader.close()

        best = {mode: float("inf") for mode in ("resident", "device", "cpu_to")}
        for _ in range(args.repeats):
            for mode in best:
                best[mode] = min(best[mode], run(mode))
        tokens = args.model_steps * args.local_batch * args.seq_len
        figures[name] = {
            "parameters": params,
            "resident_tokens_per_s": tokens / best["resident"],
            "ratio_device": best["resident"] / best["device"],
            "ratio_cpu_to": best["resident"] / best["cpu_to"],
        }
        print(f"model {name} ({params / 1e6:.1f} M params, {tokens / best['resident'] / 1e6:.2f} M tok/s resident): "
              f"device delivery {figures[name]['ratio_device']:.4f}x, CPU delivery + .to() "
              f"{figures[name]['ratio_cpu_to']:.4f}x")
        torch.cuda.empty_cache()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--consumer", choices=("python", "model"), default="python")
    parser.add_argument("--data-dir", help="reuse/keep the written dataset here (default: a temp folder)")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--local-batch", type=int, default=16)
    parser.add_argument("--work-ms", type=lambda s: [float(v) for v in s.split(",")], default=[2.0, 5.0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--model-steps", type=int, default=200)
    parser.add_argument("--warm-steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.consumer == "model" and not torch.cuda.is_available():
        sys.exit("bench_train_overhead.py --consumer model needs a CUDA device")

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.data_dir or tmp) / "stdlib-bytes"
        manifest = build_dataset(root, blocks_per_shard=2)
        figures = {"consumer": args.consumer, "seq_len": args.seq_len, "local_batch": args.local_batch,
                   "cpu_count": os.cpu_count(), "torch": torch.__version__}
        if args.consumer == "python":
            figures["python"] = python_consumer(str(root), args)
        else:
            figures["gpu"] = torch.cuda.get_device_name()
            figures["model"] = model_consumer(str(root), manifest.tokenizer.vocab_size, args)
    figures["load_average_1min"] = os.getloadavg()[0]
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
