"""Delivery to a CUDA device: StreamingLoader(device="cuda") against the same
loader on CPU and against bare pinned host-to-device copies. Needs a GPU.

Figures, each with its baseline measured in the same run (one rank, a local
dataset, a consumer that takes batches as fast as they come):

1. Loader tokens/s with ``device="cuda"`` (the pinned ring, token ids copied
   at their stored width on a side stream and widened on the device) against
   the same loader delivering CPU tensors, and against zstd decode only.
   Targets: >= 1.0 x CPU delivery and >= 0.8 x decode-only.
2. The copies alone: a tight loop of non-blocking copies of one pinned int64
   batch (input, labels, positions) to the device, as tokens/s; the loader's
   CUDA rate over this is the share of that rate it reaches.
3. Overlap: with the consumer's stream busy (``torch.cuda._sleep``), the
   batches published meanwhile are already on the device when it frees up.

Dataset: as in bench_read.py (the stdlib sources, ``bytes`` tokenizer),
written to ``--data-dir`` unless already there.

The last printed line is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_read import build_dataset, dataset_parser, decode_only_tokens_per_s, loader_tokens_per_s
from zephon_stream import StreamingLoader


def pinned_copy_tokens_per_s(args: argparse.Namespace, steps: int) -> float:
    shape = (args.local_batch, args.seq_len)
    host = [torch.randint(0, 1000, shape, dtype=torch.int64).pin_memory() for _ in range(3)]
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for tensor in host:
            tensor.to("cuda", non_blocking=True)
        stream.synchronize()
        started = time.perf_counter()
        for _ in range(steps):
            for tensor in host:
                tensor.to("cuda", non_blocking=True)
        stream.synchronize()
    return args.local_batch * args.seq_len * steps / (time.perf_counter() - started)


def overlap(url: str, args: argparse.Namespace) -> dict:
    with StreamingLoader(
        url, seq_len=args.seq_len, local_batch_size=args.local_batch, device="cuda", prefetch_steps=4
    ) as loader:
        batches = iter(loader)
        next(batches)
        torch.cuda.synchronize()
        torch.cuda._sleep(2_000_000_000)  # about a second on the consumer's stream
        started = time.perf_counter()
        got = [next(batches) for _ in range(4)]
        host_s = time.perf_counter() - started
        time.sleep(0.2)
        loader.delivery.copy_stream.synchronize()
        consumer_still_busy = not torch.cuda.current_stream().query()
        torch.cuda.synchronize()
        assert all(b["input"].is_cuda for b in got)
    return {"host_s_for_4_batches": host_s, "copies_done_while_consumer_busy": consumer_still_busy}


def main() -> None:
    parser = dataset_parser(__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_device.py needs a CUDA device")

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.data_dir or tmp) / "stdlib-bytes"
        manifest = build_dataset(root, blocks_per_shard=2)
        steps = manifest.num_tokens // args.seq_len // args.local_batch - 2
        decode, _ = decode_only_tokens_per_s(manifest, root, args.repeats)
        runs = {
            device: [loader_tokens_per_s(str(root), None, args, steps, device) for _ in range(args.repeats)]
            for device in ("cpu", "cuda")
        }
        best = {device: max(r["tokens_per_s"] for r in rs) for device, rs in runs.items()}
        copies = pinned_copy_tokens_per_s(args, steps)
        overlapped = overlap(str(root), args)

    print(f"GPU: {torch.cuda.get_device_name()}, {os.cpu_count()} CPUs, torch {torch.__version__}")
    print(f"zstd decode only (one thread): {decode / 1e6:.0f} M tokens/s")
    print(f"loader, CPU delivery:  {best['cpu'] / 1e6:.0f} M tokens/s = {best['cpu'] / decode:.2f} x decode")
    print(
        f"loader, CUDA delivery: {best['cuda'] / 1e6:.0f} M tokens/s = {best['cuda'] / best['cpu']:.2f} x CPU "
        f"delivery (target >= 1.0), {best['cuda'] / decode:.2f} x decode (target >= 0.8)"
    )
    print(f"pinned copies alone:   {copies / 1e6:.0f} M tokens/s; the loader uses {best['cuda'] / copies:.3f} of it")
    print(
        f"consumer stream busy: 4 batches taken in {overlapped['host_s_for_4_batches'] * 1e3:.1f} ms, copies done "
        f"while it was busy: {overlapped['copies_done_while_consumer_busy']}"
    )
    print(
        json.dumps(
            {
                "gpu": torch.cuda.get_device_name(),
                "cpu_count": os.cpu_count(),
                "seq_len": args.seq_len,
                "local_batch": args.local_batch,
                "decode_only_tokens_per_s": decode,
                "loader_cpu_tokens_per_s": best["cpu"],
                "loader_cuda_tokens_per_s": best["cuda"],
                "cuda_vs_cpu_delivery": best["cuda"] / best["cpu"],
                "cuda_vs_decode": best["cuda"] / decode,
                "pinned_copy_tokens_per_s": copies,
                "runs": runs,
                **overlapped,
            }
        )
    )


if __name__ == "__main__":
    main()
