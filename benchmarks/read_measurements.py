"""What the read benchmarks measure of a loader, shared by bench_read.py and
bench_read_remote.py (and the benchmarks built on bench_read's dataset):
tokens per second over whole passes, time to the first batch, and the CPU of
the loader's helper process.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from zephon_stream import StreamingLoader


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def loader_tokens_per_s(
    url: str,
    options: dict | None,
    args: argparse.Namespace,
    steps: int,
    device: str = "cpu",
    pipeline: str = "process",
    local_batch: int | None = None,
    passes: int = 1,
) -> dict:
    """``passes`` passes of ``steps`` steps each, timed from the first batch;
    with ``device="cuda"`` the clock waits for the copies to the GPU.
    ``tokens_per_s`` is the first pass; with more passes, ``steady_tokens_per_s``
    is the passes after it (the pipeline warm, the next pass's blocks already
    being fetched ahead, as in a long run). ``tokens_per_cpu_s`` counts the
    CPU of this process and of the helper process over the first pass."""

    def synchronize() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    rows = local_batch or args.local_batch
    started = time.perf_counter()
    with StreamingLoader(
        url,
        seq_len=args.seq_len,
        local_batch_size=rows,
        storage_options=options,
        prefetch_steps=4,
        device=device,
        pipeline=pipeline,
    ) as loader:
        batches = iter(loader)
        next(batches)
        synchronize()

        def cpu_s() -> float:
            return time.process_time() + (process_cpu_s(loader.helper_pid) if loader.helper_pid else 0.0)

        first, cpu = time.perf_counter(), cpu_s()
        marks, first_pass_blocks = [], 0
        for index in range(passes * steps - 1):
            batch = next(batches)
            if (index + 2) % steps == 0:
                synchronize()
                marks.append((time.perf_counter(), cpu_s()))
                first_pass_blocks = first_pass_blocks or loader.stats()["blocks_fetched"]
        assert batch["input"].device.type == device
        stats = loader.stats()
    tokens = rows * args.seq_len
    (first_done, first_cpu_done), last = marks[0], marks[-1]
    figures = {
        "tokens_per_s": tokens * (steps - 1) / (first_done - first),
        "tokens_per_cpu_s": tokens * (steps - 1) / (first_cpu_done - cpu),
        "tokens_per_s_with_start": tokens * steps / (first_done - started),
        "steps": steps,
        "passes": passes,
        "stall_s_per_step": stats["stall_s_per_step"],
        "blocks_fetched": stats["blocks_fetched"],
        "first_pass_blocks": first_pass_blocks,
        "cpu_s": first_cpu_done - cpu,
        "fetch_ms_per_block": stats["fetch_s"] / max(1, stats["blocks_fetched"]) * 1e3,
        "retries": stats["retries"],
    }
    if passes > 1:
        figures["steady_tokens_per_s"] = tokens * steps * (passes - 1) / (last[0] - first_done)
    return figures


def first_batch_s(url: str, options: dict | None, args: argparse.Namespace, position: int) -> float:
    started = time.perf_counter()
    with StreamingLoader(
        url, seq_len=args.seq_len, local_batch_size=args.local_batch, storage_options=options
    ) as loader:
        if position:
            loader.load_state_dict({**loader.state_dict(), "position": position})
        next(loader)
        return time.perf_counter() - started
