"""Read throughput of StreamingLoader (one rank), local disk and object stores.

``--backend local`` (the default) gives the figures below; ``--backend
moto|seaweedfs|gcs|azure`` measures the loader on that server against local
disk in the same run (benchmarks/bench_read_remote.py says what it prints).

Dataset: the Python standard library sources on this machine (site-packages
excluded), written with the ``bytes`` tokenizer: about 30 million tokens.

Figures, each with its baseline measured in the same run:

1. Loader tokens/s against (a) a tight loop that only zstd-decompresses the
   same blocks (one thread, frames already in memory), and (b) plain s3fs
   ``cat_file`` range reads of the same block bytes (one thread). The loader
   reads ``--epochs`` passes: the first pass is the figure the targets name
   (timed from the first batch, so the pipeline's warm-up is in it); the
   passes after it are printed beside it as the steady rate of a long run. Targets:
   local (int64 CPU delivery) >= 0.6 x (a) at 2048 x 16; local batch 1 >=
   0.3 x (a); S3 >= 0.8 x min(a, b). The local figure is given for the
   helper process (the default) and the in-process threads. Printed beside them, not a
   baseline: one thread that decodes and writes the 24 bytes per token of
   int64 output, the least work behind any batch. One epoch of steps
   also decodes the next epoch's first blocks ahead (``blocks_fetched`` vs
   ``blocks``), work the decode-only loop does not do.
2. Time to the first batch: a cold start against a start after
   ``load_state_dict`` at a cursor 90% into the epoch. Target ratio <= 1.2.
3. 50 ms of latency injected on every storage request (fault proxy), a
   consumer that computes for ``--step-ms`` per step, prefetch 4: stall time
   per step once warm. Target: no stalls.
4. ``--limiter`` (alone, on ``--backend``, SeaweedFS unless given): the loader
   with the node's request-rate limiter against it off, paired, on a store
   that never throttles (benchmarks/read_limiter.py). Target: 1.0.
5. ``--packing`` (alone): what the document outputs cost the helper process
   (docs/PACKING.md), with the settings off (baseline), with
   ``cross_document_targets="ignore"`` alone, and with ``"ignore"`` and
   ``packing_outputs=True``. (a) The producer's assembly alone in this
   thread, CPU time per step, interleaved passes over the same steps: the
   extra work of each setting, as a fraction of (b)'s helper CPU per step
   with the settings off. Target: <= 10% at 2048 x 16. (b) Paired trials, in
   alternating order, of the loader reading the same steps: the helper's CPU
   time per step (all its threads: fetch, decode, assembly, from the
   scheduler's counts) and the producer's assembly wall time, each as the
   median of the paired ratios to the baseline. On a shared machine (b)'s
   ratios carry the other load's noise; (a) is the figure to judge.

moto reads the whole object for every ranged GET, so the dataset is
written with small shards (``--blocks-per-shard``) to measure the loader and
not moto's copying.

The last printed line is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import zstandard

from benchmarks.bench_read_remote import BACKENDS, remote_figures
from benchmarks.read_limiter import limiter_figures
from benchmarks.read_measurements import first_batch_s, loader_tokens_per_s, process_cpu_s  # noqa: F401 (re-exported)
from tools.fault_proxy import FaultProxy
from zephon_stream import Manifest, StreamingLoader, write_dataset
from zephon_stream.format.spec import DEFAULT_BLOCK_TOKENS
from zephon_stream.storage import copy_dataset, open_store
from zephon_stream.storage.embedded_s3 import EmbeddedS3


def build_dataset(
    out: Path, blocks_per_shard: int | None, *, copies: int = 1, block_tokens: int = DEFAULT_BLOCK_TOKENS
) -> Manifest:
    """The stdlib sources, ``copies`` times over (each copy read through its own
    link to the folder, so the copies are distinct inputs)."""
    if not (out / "manifest").exists():
        root = Path(sysconfig.get_paths()["stdlib"])
        rels = sorted(str(p.relative_to(root)) for p in root.rglob("*.py") if "site-packages" not in p.parts)
        if copies == 1:
            files = [str(root / rel) for rel in rels]
        else:
            files = []
            for copy in range(copies):
                link = out.parent / f"{out.name}-inputs" / f"copy{copy}"
                link.parent.mkdir(parents=True, exist_ok=True)
                if not link.exists():
                    link.symlink_to(root)
                files += [str(link / rel) for rel in rels]
        write_dataset(
            files,
            str(out),
            tokenizer="bytes",
            blocks_per_shard=blocks_per_shard,
            block_tokens=block_tokens,
            progress=False,
        )
    return Manifest.load(str(out))


def decode_only_tokens_per_s(manifest: Manifest, root: Path, repeats: int) -> float:
    with open_store(str(root)) as store:
        frames = [store.read_range(*manifest.block_byte_range(b)) for b in range(manifest.num_blocks)]
    decompressor = zstandard.ZstdDecompressor()
    best, best_cpu = float("inf"), float("inf")
    for _ in range(repeats):
        started, cpu = time.perf_counter(), time.process_time()
        for frame in frames:
            decompressor.decompress(frame)
        best = min(best, time.perf_counter() - started)
        best_cpu = min(best_cpu, time.process_time() - cpu)
    return manifest.num_tokens / best, manifest.num_tokens / best_cpu


def decode_and_write_tokens_per_s(manifest: Manifest, root: Path, args: argparse.Namespace, repeats: int) -> float:
    """Informational floor, not a target: one thread that decodes every block
    and writes the int64 ``input``, ``labels`` and ``positions`` (24 bytes a
    token) of consecutive samples into a few recycled batch buffers, with no
    order, EOS search or hand-off. What any loader of this output must do."""
    import numpy as np

    with open_store(str(root)) as store:
        frames = [store.read_range(*manifest.block_byte_range(b)) for b in range(manifest.num_blocks)]
    decompressor = zstandard.ZstdDecompressor()
    rows, seq_len = args.local_batch, args.seq_len
    buffers = [np.empty((3, rows, seq_len), np.int64) for _ in range(7)]
    ramp = np.arange(seq_len, dtype=np.int64)
    best = float("inf")
    for _ in range(repeats):
        started, step = time.perf_counter(), 0
        for frame in frames:
            tokens = np.frombuffer(decompressor.decompress(frame), dtype=manifest.np_dtype)
            for first in range(0, len(tokens) - rows * seq_len, rows * seq_len):
                out = buffers[step % len(buffers)]
                window = tokens[first : first + rows * seq_len + 1]
                np.copyto(out[0].reshape(-1), window[:-1])
                np.copyto(out[1].reshape(-1), window[1:])
                out[2] = ramp
                step += 1
        best = min(best, time.perf_counter() - started)
    return manifest.num_tokens / best


def s3fs_range_tokens_per_s(manifest: Manifest, url: str, options: dict) -> float:
    import s3fs

    fs = s3fs.S3FileSystem(
        key=options["key"],
        secret=options["secret"],
        endpoint_url=options["endpoint_url"],
        client_kwargs=options.get("client_kwargs", {}),
        skip_instance_cache=True,
    )
    base = url.removeprefix("s3://")
    fs.cat_file(f"{base}/manifest")  # connect before timing
    started = time.perf_counter()
    for block in range(manifest.num_blocks):
        path, start, end = manifest.block_byte_range(block)
        fs.cat_file(f"{base}/{path}", start=start, end=end)
    return manifest.num_tokens / (time.perf_counter() - started)


def first_step_s(url: str, args: argparse.Namespace, pipeline: str, pause_s: float) -> float:
    """Seconds in the first ``next()`` when the trainer spends ``pause_s``
    between making the loader and its first step (building its model): the
    helper process starts when the loader is made."""
    with StreamingLoader(url, seq_len=args.seq_len, local_batch_size=args.local_batch, pipeline=pipeline) as loader:
        time.sleep(pause_s)
        started = time.perf_counter()
        next(loader)
        return time.perf_counter() - started


def latency_stalls(url: str, options: dict, args: argparse.Namespace) -> dict:
    with StreamingLoader(
        url,
        seq_len=args.latency_seq_len,
        local_batch_size=args.latency_batch,
        storage_options=options,
        prefetch_steps=4,
        helper_nice=args.helper_nice,
    ) as loader:
        batches = iter(loader)
        for _ in range(args.warm_steps):
            next(batches)
            time.sleep(args.step_ms / 1000)
        warm = loader.stats()
        stalls = []
        for _ in range(args.latency_steps):
            next(batches)
            stalls.append(loader.stats()["last_step_stall_s"])
            time.sleep(args.step_ms / 1000)
        end = loader.stats()
    return {
        "stall_s_per_step": (end["stall_s"] - warm["stall_s"]) / args.latency_steps,
        "stalled_steps": end["stalled_steps"] - warm["stalled_steps"],
        "max_stall_s": max(stalls),
        "steps": args.latency_steps,
        "blocks_fetched": end["blocks_fetched"] - warm["blocks_fetched"],
        "warmup_stall_s": warm["stall_s"],
    }


def dataset_parser(doc: str) -> argparse.ArgumentParser:
    """The arguments of every benchmark over this dataset (``--data-dir``,
    ``--seq-len``, ``--local-batch``), described by ``doc``'s first paragraph."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--data-dir", help="reuse/keep the written dataset here (default: a temp folder)")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--local-batch", type=int, default=16)
    return parser


def main() -> None:
    parser = dataset_parser(__doc__)
    parser.add_argument(
        "--backend",
        default="local",
        choices=("local", *BACKENDS),
        help="local: the local figures (and moto's S3 section unless --local-only); any other: "
        "that server on loopback against local disk (benchmarks/bench_read_remote.py)",
    )
    parser.add_argument(
        "--blocks-per-shard",
        type=int,
        default=None,
        help="default 2 for local and moto (moto copies the whole object per ranged GET), else the writer's default",
    )
    parser.add_argument("--block-tokens", type=int, default=DEFAULT_BLOCK_TOKENS)
    parser.add_argument("--copies", type=int, default=1, help="copies of the stdlib sources in the dataset")
    parser.add_argument("--trials", type=int, default=2, help="paired local/server trials (--backend)")
    parser.add_argument(
        "--fetch-concurrency",
        type=int,
        default=8,
        help="raw range reads at once (the loader's num_fetch_threads default)",
    )
    parser.add_argument("--raw-passes", type=int, default=2, help="passes over the blocks of the raw range reads")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--epochs",
        type=int,
        default=3,
        help="passes over the data for the throughput figures (the first, and the steady rest)",
    )
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--latency-seq-len", type=int, default=8192)
    parser.add_argument("--step-ms", type=float, default=25.0)
    parser.add_argument("--warm-steps", type=int, default=10)
    parser.add_argument("--latency-steps", type=int, default=300)
    parser.add_argument("--latency-batch", type=int, default=4)
    parser.add_argument("--helper-nice", type=int, default=10, help="the loader's helper_nice")
    parser.add_argument("--latency-only", action="store_true", help="only the stall figure under storage latency")
    parser.add_argument(
        "--local-only", action="store_true", help="skip every S3 figure (for a machine without moto's server)"
    )
    parser.add_argument(
        "--packing",
        action="store_true",
        help="only the cost of cross_document_targets and packing_outputs in the helper",
    )
    parser.add_argument("--packing-trials", type=int, default=7)
    parser.add_argument("--packing-steps", type=int, default=300)
    parser.add_argument(
        "--limiter",
        action="store_true",
        help="only the loader with the request-rate limiter against it off, on --backend "
        "(seaweedfs unless given), paired (benchmarks/read_limiter.py)",
    )
    args = parser.parse_args()
    if args.limiter and args.backend == "local":
        args.backend = "seaweedfs"

    if args.blocks_per_shard is None and args.backend in ("local", "moto"):
        args.blocks_per_shard = 2
    with tempfile.TemporaryDirectory() as tmp:
        name = "stdlib-bytes"
        if (args.copies, args.block_tokens, args.blocks_per_shard) != (1, DEFAULT_BLOCK_TOKENS, 2):
            name += f"-x{args.copies}-b{args.block_tokens}-s{args.blocks_per_shard or 'default'}"
        root = Path(args.data_dir or tmp) / name
        manifest = build_dataset(root, args.blocks_per_shard, copies=args.copies, block_tokens=args.block_tokens)
        if args.backend != "local":
            print(
                f"dataset: {manifest.num_tokens} tokens, {manifest.num_blocks} blocks of {manifest.block_tokens} "
                f"tokens, {manifest.num_shards} shards, {manifest.compressed_bytes / 2**20:.1f} MiB compressed; "
                f"{args.local_batch} x {args.seq_len}"
            )
            epoch_steps = manifest.num_tokens // args.seq_len // args.local_batch - 2
            measure = limiter_figures if args.limiter else remote_figures
            figures = {
                "tokens": manifest.num_tokens,
                "blocks": manifest.num_blocks,
                "block_tokens": manifest.block_tokens,
                "seq_len": args.seq_len,
                "local_batch": args.local_batch,
                **measure(manifest, root, args, epoch_steps),
            }
            figures["load_average_1min"] = os.getloadavg()[0]
            print(json.dumps(figures))
            return
        if args.latency_only:
            print(json.dumps(latency_figure(root, args)))
            return
        if args.packing:
            print(json.dumps(packing_figure(str(root), args)))
            return
        print(
            f"dataset: {manifest.num_tokens} tokens, {manifest.num_blocks} blocks, {manifest.num_shards} shards, "
            f"{manifest.compressed_bytes / 2**20:.1f} MiB compressed"
        )
        epoch_steps = manifest.num_tokens // args.seq_len // args.local_batch - 2
        decode, decode_cpu = decode_only_tokens_per_s(manifest, root, args.repeats)
        decode_write = decode_and_write_tokens_per_s(manifest, root, args, args.repeats)
        local = loader_tokens_per_s(str(root), None, args, epoch_steps, passes=args.epochs)
        local_threads = loader_tokens_per_s(str(root), None, args, epoch_steps, pipeline="threads", passes=args.epochs)
        batch1 = loader_tokens_per_s(
            str(root), None, args, min(epoch_steps * args.local_batch, 4000), local_batch=1, passes=2
        )
        first_step = {
            f"{pipeline}_pause_{pause:g}s": statistics.median(
                first_step_s(str(root), args, pipeline, pause) for _ in range(args.repeats)
            )
            for pipeline in ("process", "threads")
            for pause in (0.0, 1.0)
        }
        print(f"(a) zstd decode only: {decode / 1e6:.1f} M tokens/s")
        print(
            f"(floor, one thread) decode + write the int64 batch: {decode_write / 1e6:.1f} M tokens/s = "
            f"{decode_write / decode:.2f} x (a)"
        )
        print(
            f"loader local: {local['tokens_per_s'] / 1e6:.1f} M tokens/s = {local['tokens_per_s'] / decode:.2f} x (a) "
            f"(target >= 0.6); per CPU second (trainer + helper): {local['tokens_per_cpu_s'] / 1e6:.1f} M vs "
            f"{decode_cpu / 1e6:.1f} M = {local['tokens_per_cpu_s'] / decode_cpu:.2f}"
        )
        print(
            f"loader local, in-process threads: {local_threads['tokens_per_s'] / 1e6:.1f} M tokens/s = "
            f"{local_threads['tokens_per_s'] / decode:.2f} x (a)"
        )
        if args.epochs > 1:
            print(
                f"loader local, epochs 2-{args.epochs} (steady): helper process "
                f"{local['steady_tokens_per_s'] / 1e6:.1f} M tokens/s = "
                f"{local['steady_tokens_per_s'] / decode:.2f} x (a), "
                f"threads {local_threads['steady_tokens_per_s'] / 1e6:.1f} M = "
                f"{local_threads['steady_tokens_per_s'] / decode:.2f} x (a)"
            )
        print(
            "first next(), local, after 0 s / 1 s of trainer set-up: "
            + ", ".join(f"{name} {seconds * 1e3:.0f} ms" for name, seconds in first_step.items())
        )
        print(
            f"loader local, batch 1: {batch1['tokens_per_s'] / 1e6:.1f} M tokens/s = "
            f"{batch1['tokens_per_s'] / decode:.2f} x (a) (target >= 0.3); second pass "
            f"{batch1['steady_tokens_per_s'] / 1e6:.1f} M = {batch1['steady_tokens_per_s'] / decode:.2f} x (a)"
        )
        figures = {
            "tokens": manifest.num_tokens,
            "seq_len": args.seq_len,
            "local_batch": args.local_batch,
            "decode_only_tokens_per_s": decode,
            "decode_only_tokens_per_cpu_s": decode_cpu,
            "decode_and_write_tokens_per_s": decode_write,
            "blocks": manifest.num_blocks,
            "cpu_count": os.cpu_count(),
            "loader_local": local,
            "local_ratio_vs_decode": local["tokens_per_s"] / decode,
            "local_steady_ratio_vs_decode": local.get("steady_tokens_per_s", 0) / decode,
            "loader_local_threads": local_threads,
            "local_threads_ratio_vs_decode": local_threads["tokens_per_s"] / decode,
            "loader_local_batch1": batch1,
            "local_batch1_ratio_vs_decode": batch1["tokens_per_s"] / decode,
            "first_next_s": first_step,
        }
        if not args.local_only:
            figures.update(s3_figures(manifest, root, args, decode, epoch_steps))
    figures["load_average_1min"] = os.getloadavg()[0]
    print(json.dumps(figures))


def latency_figure(root: Path, args: argparse.Namespace) -> dict:
    """The stall figure alone (``--latency-only``), with its settings."""
    with EmbeddedS3(subprocess=True) as server:
        server.create_bucket("bench-read")
        options = server.storage_options()
        url = "s3://bench-read/stdlib"
        copy_dataset(root, url, dst_options=options)
        with FaultProxy(upstream=server.endpoint_url, latency_s=args.latency_ms / 1000) as proxy:
            latency = latency_stalls(url, {**options, "endpoint_url": proxy.endpoint_url}, args)
    print(
        f"{args.latency_ms:.0f} ms per request, {args.step_ms:.0f} ms compute per step, helper_nice "
        f"{args.helper_nice}: stall {latency['stall_s_per_step'] * 1e3:.2f} ms/step once warm, "
        f"{latency['stalled_steps']} of {latency['steps']} steps stalled (max {latency['max_stall_s'] * 1e3:.1f} ms)"
    )
    return {"latency_ms": args.latency_ms, "step_ms": args.step_ms, "helper_nice": args.helper_nice, **latency}


PACKING_SETTINGS = {
    "off": {},
    "ignore": {"cross_document_targets": "ignore"},
    "ignore_and_outputs": {"cross_document_targets": "ignore", "packing_outputs": True},
}


def process_cpu_ns(pid: int) -> int:
    """CPU nanoseconds the live threads of process ``pid`` have run (the
    scheduler's count: finer than the clock ticks of ``process_cpu_s``)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as stat:
                total += int(stat.read().split()[0])
        except FileNotFoundError:
            continue  # A thread that ended meanwhile
    return total


def helper_step_costs(url: str, args: argparse.Namespace, settings: dict) -> dict:
    """Helper CPU and producer assembly time per step over ``--packing-steps``
    steps after the first, the consumer taking batches as fast as they come."""
    with StreamingLoader(
        url, seq_len=args.seq_len, local_batch_size=args.local_batch, prefetch_steps=4, **settings
    ) as loader:
        for _ in range(8):  # Past start-up: the pipeline's threads all running
            next(loader)
        cpu, assemble = process_cpu_ns(loader.helper_pid), loader.stats()["assemble_s"]
        for _ in range(args.packing_steps):
            next(loader)
        # The producer runs a full ring ahead at both readings, so the
        # steps it did in between are the steps taken.
        stats = loader.stats()
        cpu = (process_cpu_ns(loader.helper_pid) - cpu) / 1e9
        assemble = stats["assemble_s"] - assemble
    return {"helper_cpu_s_per_step": cpu / args.packing_steps, "assemble_s_per_step": assemble / args.packing_steps}


def assembly_step_costs(url: str, args: argparse.Namespace, repeats: int = 9) -> dict:
    """The producer's assembly alone, per setting, in this thread (CPU time per
    step; the best and the median of ``repeats`` interleaved passes over the
    same 200 steps of random samples from the first 8 blocks, rotating over
    a ring's slots as the producer does)."""
    import numpy as np

    from zephon_stream.format.block import decode_block
    from zephon_stream.loader import WIDE_KEYS, PackingSpec, SharedRing, SlotLayout, StepAssembler

    manifest = Manifest.load(url)
    with open_store(url) as store:
        blocks = [
            decode_block(
                store.read_range(*manifest.block_byte_range(b)),
                num_tokens=manifest.block_num_tokens(b),
                dtype=manifest.np_dtype,
                where=f"block {b}",
            )
            for b in range(min(8, manifest.num_blocks))
        ]
    rows, seq_len = args.local_batch, args.seq_len
    rng = np.random.default_rng(0)
    per_block = (min(len(b) for b in blocks) - 1) // seq_len
    steps = [
        ([blocks[i] for i in rng.integers(0, len(blocks), rows)], rng.integers(0, per_block, rows)) for _ in range(200)
    ]
    eos = manifest.tokenizer.eos_id
    runs = {}
    for name, settings in PACKING_SETTINGS.items():
        spec = PackingSpec(
            cross_document_targets=settings.get("cross_document_targets", "predict"),
            outputs=settings.get("packing_outputs", False),
        )
        ring = SharedRing.create(
            num_slots=7,
            layout=SlotLayout(
                rows=rows, seq_len=seq_len, token_dtype=manifest.np_dtype.str, wide_keys=WIDE_KEYS, packing=spec
            ),
        )
        runs[name] = (ring, ring.producer_slots(), StepAssembler(seq_len=seq_len, packing=spec))
    seconds = {name: [] for name in runs}
    for repeat in range(repeats):
        for name in list(runs) if repeat % 2 == 0 else list(runs)[::-1]:
            _, slots, assembler = runs[name]
            started = time.thread_time()
            for index, (row_blocks, samples) in enumerate(steps):
                assembler.assemble(row_blocks, samples, eos, slots[index % len(slots)])
            seconds[name].append((time.thread_time() - started) / len(steps))
    for ring, slots, _ in runs.values():
        del slots[:]
        ring.close()
    return {
        name: {"best_s_per_step": min(values), "median_s_per_step": statistics.median(values)}
        for name, values in seconds.items()
    }


def packing_figure(url: str, args: argparse.Namespace) -> dict:
    """Paired trials of the packing settings against the settings off (``--packing``)."""
    names = list(PACKING_SETTINGS)
    assembly = assembly_step_costs(url, args)
    trials = []
    for trial in range(args.packing_trials):
        order = names if trial % 2 == 0 else names[::-1]
        trials.append({name: helper_step_costs(url, args, PACKING_SETTINGS[name]) for name in order})
    figures: dict = {
        "seq_len": args.seq_len,
        "local_batch": args.local_batch,
        "steps": args.packing_steps,
        "trials": args.packing_trials,
        "cpu_count": os.cpu_count(),
        "assembly_cpu": assembly,
    }
    for name in names:
        for key in ("helper_cpu_s_per_step", "assemble_s_per_step"):
            figures[f"{name}_{key}_median"] = statistics.median(t[name][key] for t in trials)
            if name != "off":
                figures[f"{name}_{key}_ratio_median"] = statistics.median(t[name][key] / t["off"][key] for t in trials)
    for name in names[1:]:
        print(
            f"{name}: helper CPU {figures[f'{name}_helper_cpu_s_per_step_median'] * 1e6:.0f} us/step vs off "
            f"{figures['off_helper_cpu_s_per_step_median'] * 1e6:.0f} (median of paired ratios "
            f"{figures[f'{name}_helper_cpu_s_per_step_ratio_median']:.3f}); producer's assembly (wall) "
            f"{figures[f'{name}_assemble_s_per_step_median'] * 1e6:.1f} us/step vs off "
            f"{figures['off_assemble_s_per_step_median'] * 1e6:.1f} (median of paired ratios "
            f"{figures[f'{name}_assemble_s_per_step_ratio_median']:.3f})"
        )
    helper_off = figures["off_helper_cpu_s_per_step_median"]
    for name in names[1:]:
        extra = assembly[name]["best_s_per_step"] - assembly["off"]["best_s_per_step"]
        figures[f"{name}_extra_assembly_fraction_of_helper"] = extra / helper_off
        print(
            f"{name}: assembly (CPU, best of 9) {assembly[name]['best_s_per_step'] * 1e6:.1f} us/step vs off "
            f"{assembly['off']['best_s_per_step'] * 1e6:.1f}: +{extra * 1e6:.1f} us = {extra / helper_off:.1%} of "
            f"the helper's {helper_off * 1e6:.0f} us of CPU per step (target <= 10%)"
        )
    figures["load_average_1min"] = os.getloadavg()[0]
    return figures


def s3_figures(manifest: Manifest, root: Path, args: argparse.Namespace, decode: float, epoch_steps: int) -> dict:
    """S3 throughput against min(decode, s3fs), first-batch times (local and
    S3), and stalls with latency injected in front of the S3 server."""
    with EmbeddedS3(subprocess=True) as server:
        server.create_bucket("bench-read")
        options = server.storage_options()
        url = "s3://bench-read/stdlib"
        copy_dataset(root, url, dst_options=options)

        s3fs_rate = s3fs_range_tokens_per_s(manifest, url, options)
        remote = loader_tokens_per_s(url, options, args, epoch_steps, passes=args.epochs)
        floor = min(decode, s3fs_rate)
        print(f"(b) s3fs range reads: {s3fs_rate / 1e6:.1f} M tokens/s")
        print(
            f"loader S3:    {remote['tokens_per_s'] / 1e6:.1f} M tokens/s = {remote['tokens_per_s'] / floor:.2f} x "
            f"min(a, b) (target >= 0.8)"
        )
        if args.epochs > 1:
            print(
                f"loader S3, epochs 2-{args.epochs} (steady): {remote['steady_tokens_per_s'] / 1e6:.1f} M tokens/s = "
                f"{remote['steady_tokens_per_s'] / floor:.2f} x min(a, b)"
            )

        resume_at = int(0.9 * epoch_steps) * args.local_batch
        ttfb = {}
        for name, where, opts in (("local", str(root), None), ("s3", url, options)):
            cold = statistics.median(first_batch_s(where, opts, args, 0) for _ in range(args.repeats))
            warm = statistics.median(first_batch_s(where, opts, args, resume_at) for _ in range(args.repeats))
            ttfb[name] = {"cold_s": cold, "resume_90pct_s": warm, "ratio": warm / cold}
            print(
                f"first batch {name}: cold {cold * 1e3:.0f} ms, after load_state_dict at 90% {warm * 1e3:.0f} ms, "
                f"ratio {warm / cold:.2f} (target <= 1.2)"
            )

        with FaultProxy(upstream=server.endpoint_url, latency_s=args.latency_ms / 1000) as proxy:
            slow = {**options, "endpoint_url": proxy.endpoint_url}
            latency = latency_stalls(url, slow, args)
        print(
            f"{args.latency_ms:.0f} ms per request, prefetch 4, {args.step_ms:.0f} ms compute per step: "
            f"stall {latency['stall_s_per_step'] * 1e3:.2f} ms/step once warm, {latency['stalled_steps']} of "
            f"{latency['steps']} steps stalled (max {latency['max_stall_s'] * 1e3:.1f} ms; "
            f"{latency['blocks_fetched']} blocks fetched while measuring)"
        )
    return {
        "s3fs_range_tokens_per_s": s3fs_rate,
        "loader_s3": remote,
        "s3_ratio_vs_min": remote["tokens_per_s"] / floor,
        "s3_steady_ratio_vs_min": remote.get("steady_tokens_per_s", 0) / floor,
        "first_batch": ttfb,
        "latency": {"latency_ms": args.latency_ms, "step_ms": args.step_ms, **latency},
    }


if __name__ == "__main__":
    main()
