"""A whole pass at batch 1: zephon_stream against LitData's iterator, side by side.

The corpus is this machine's Python standard library sources (``--max-bytes``
of them), written by ``write_dataset`` with the byte tokenizer; LitData
converts the same ``seq_len + 1``-token samples (bench_peers.py's
conversion). Each reader then reads every sample once, one per step, from
local disk: zephon_stream as ``StreamingLoader(local_batch_size=1,
max_epochs=1)`` (default pipeline, and threads beside it), LitData as
``for item in StreamingDataset(..., TokensLoader(block_size=seq_len + 1),
shuffle=True)``. Figure: tokens/s of each, paired trials in the same run,
and the ratio zephon / LitData (target >= 0.5 at 30M tokens).

LitData is optional (see bench_peers.py's header for the virtualenv that
has it). The last printed line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import tempfile
import time

import numpy as np

from benchmarks.bench_peers import corpus_files, litdata_convert, zephon_convert, zephon_samples


def zephon_pass(url: str, seq_len: int, pipeline: str) -> tuple[float, int]:
    from zephon_stream import StreamingLoader

    started = time.perf_counter()
    tokens = 0
    with StreamingLoader(url, seq_len=seq_len, local_batch_size=1, max_epochs=1, pipeline=pipeline) as loader:
        for batch in loader:
            tokens += batch["input"].numel()
    return time.perf_counter() - started, tokens


def litdata_pass(input_dir: str, seq_len: int, cache_dir: str) -> tuple[float, int]:
    from litdata import StreamingDataset, TokensLoader

    started = time.perf_counter()
    tokens = 0
    dataset = StreamingDataset(
        input_dir, item_loader=TokensLoader(block_size=seq_len + 1), shuffle=True, cache_dir=cache_dir
    )
    for item in dataset:
        tokens += len(item) - 1
    return time.perf_counter() - started, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-bytes", type=float, default=30e6, help="stdlib source bytes (tokens, with bytes)")
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--no-litdata", action="store_true")
    args = parser.parse_args()
    figures: dict[str, object] = {"cpus": os.cpu_count(), "seq_len": args.seq_len}
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        zephon = str(work / "zephon")
        zephon_convert(corpus_files(int(args.max_bytes)), zephon)
        samples = zephon_samples(zephon, args.seq_len)
        figures["tokens"] = int(samples.shape[0] * args.seq_len)
        readers = {
            "process": lambda: zephon_pass(zephon, args.seq_len, "process"),
            "threads": lambda: zephon_pass(zephon, args.seq_len, "threads"),
        }
        if not args.no_litdata:
            samples_path = str(work / "samples.npy")
            np.save(samples_path, samples)
            litdata_convert(samples_path, len(samples), str(work / "litdata"))
            readers["litdata"] = lambda: litdata_pass(str(work / "litdata"), args.seq_len, str(work / "lit-cache"))
        del samples
        rates: dict[str, list[float]] = {name: [] for name in readers}
        for trial in range(args.trials):
            for name in list(readers) if trial % 2 == 0 else list(readers)[::-1]:
                seconds, tokens = readers[name]()
                rates[name].append(tokens / seconds)
                print(
                    f"trial {trial} {name}: {tokens:,} tokens in {seconds:.2f} s = {tokens / seconds / 1e6:.1f} M tok/s"
                )
        for name, values in rates.items():
            figures[f"{name}_tokens_per_s"] = statistics.median(values)
        if "litdata" in rates:
            figures["ratio_process_over_litdata"] = figures["process_tokens_per_s"] / figures["litdata_tokens_per_s"]
            figures["ratio_threads_over_litdata"] = figures["threads_tokens_per_s"] / figures["litdata_tokens_per_s"]
            print(
                "ratio zephon (process) / LitData iterator: "
                f"{figures['ratio_process_over_litdata']:.2f} (target >= 0.5)"
            )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
