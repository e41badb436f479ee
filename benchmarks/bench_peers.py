"""zephon_stream against MosaicML Streaming and LitData on the same tokens.

The corpus is this machine's Python standard library sources, tokenized with
the byte tokenizer by ``write_dataset``. Every library then converts the same
pre-tokenized samples (``seq_len + 1`` tokens each, read back from that
dataset): the peers from the token rows in memory, zephon_stream from the
same rows saved as a ``.npy`` with an offsets file (one document per row,
``--input-format tokens --append-eos``, one compression worker), read from
disk. MosaicML's ``MDSWriter`` writes them twice: with a fixed-shape column
(``ndarray:uint16:<seq_len+1>``, as a careful user declares rows of one
length) and with a variable one (``ndarray:uint16``). Conversion tokens/s
counts the rows' tokens for every library; zephon_stream and both MDS
columns run ``--trials`` times in paired trials (the order rotates), and each
ratio is reported as the median and range of its per-trial ratios (target:
zephon over the fixed-shape ``MDSWriter`` >= 1.0 at 8 M and 30 M tokens:
``--max-bytes 8e6 --seq-len 2048`` and ``--max-bytes 30e6 --seq-len 2048``).
LitData converts once. The text conversion (tokenizing included) is
reported beside them. Then one process reads a fixed number of
samples, shuffled, from local disk and from a moto S3 server on loopback,
and we report tokens/s and ratios. The resume check reads global batches at
one rank, then at two ranks, saves the state, and goes on at three ranks from
it: zephon_stream with in-process ranks, each peer as ranks under torchrun
(gloo); each global batch is compared with one rank's, in order and as a set.

The peers are optional and are not installed by this project (their
dependencies pin other torch builds). To include them, use a separate
virtualenv that sees this environment's packages::

    python -m venv --system-site-packages /tmp/peers-venv
    /tmp/peers-venv/bin/pip install --no-deps mosaicml-streaming==0.13.0 litdata==0.2.76 \
        xxhash zstd brotli cramjam python-snappy catalogue lightning-utilities \
        transformers==4.57.6 huggingface_hub==0.36.2 tokenizers==0.22.2
    /tmp/peers-venv/bin/python benchmarks/bench_peers.py

``--convert-only`` stops after the conversions. A peer that cannot be
imported is reported as skipped. The last printed line
is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import pathlib
import resource
import shutil
import statistics
import sys
import sysconfig
import tempfile
import time
import types
from collections.abc import Callable
from typing import Any

import numpy as np


def corpus_files(max_bytes: int) -> list[str]:
    """Sorted stdlib ``.py`` files (no site-packages) up to ``max_bytes`` in total."""
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    files, total = [], 0
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.relative_to(root).parts or not path.is_file():
            continue
        size = path.stat().st_size
        if size == 0:
            continue
        if total + size > max_bytes:
            break
        files.append(str(path))
        total += size
    return files


def cpu_seconds() -> float:
    """CPU seconds of this process so far, every thread included."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


# -- zephon_stream -------------------------------------------------------------


def zephon_convert(files: list[str], out: str, storage_options: dict | None = None) -> float:
    from zephon_stream import write_dataset

    seconds, _ = timed(
        lambda: write_dataset(files, out, tokenizer="bytes", workers=2, blocks_per_shard=16, storage_options=storage_options, progress=False, overwrite=True)
    )
    return seconds


def zephon_samples(url: str, seq_len: int) -> np.ndarray:
    """Every sample of the dataset, ``[n, seq_len + 1]`` uint16, block by block."""
    from zephon_stream.reader import DatasetReader

    rows = []
    with DatasetReader.open(url) as reader:
        for block_id in range(reader.manifest.num_blocks):
            tokens = reader.read_block(block_id)
            count = (len(tokens) - 1) // seq_len
            index = np.arange(count)[:, None] * seq_len + np.arange(seq_len + 1)[None, :]
            rows.append(tokens[index])
    return np.concatenate(rows).astype(np.uint16)


def zephon_read(url: str, seq_len: int, batch: int, num_samples: int, storage_options: dict | None = None) -> float:
    from zephon_stream import StreamingLoader

    def run() -> int:
        with StreamingLoader(url, seq_len=seq_len, local_batch_size=batch, rank=0, world_size=1, storage_options=storage_options) as loader:
            seen = 0
            for step, item in zip(range(num_samples // batch), loader):
                seen += item["input"].numel()
            return seen

    seconds, tokens = timed(run)
    return tokens / seconds


def zephon_resume(url: str, seq_len: int, steps: int) -> dict[str, Any]:
    """Global batches of W=1 for ``2 * steps`` against W=2 for ``steps``, then W=3 from its state."""
    from zephon_stream import StreamingLoader

    global_batch = 6

    def loaders(world_size: int) -> list[Any]:
        return [
            StreamingLoader(url, seq_len=seq_len, local_batch_size=global_batch // world_size, rank=r, world_size=world_size)
            for r in range(world_size)
        ]

    def global_hashes(group: list[Any], count: int) -> list[str]:
        iterators = [iter(loader) for loader in group]
        out = []
        for _ in range(count):
            parts = [next(it)["input"].numpy() for it in iterators]
            out.append(hashlib.sha256(np.concatenate(parts).tobytes()).hexdigest())
        return out

    reference = loaders(1)
    want = global_hashes(reference, 2 * steps)
    first = loaders(2)
    got = global_hashes(first, steps)
    state = first[0].state_dict()
    second = loaders(3)
    for loader in second:
        loader.load_state_dict(state)
    got += global_hashes(second, steps)
    for loader in reference + first + second:
        loader.close()
    return {"resumed_2_to_3_bit_identical": got == want, "steps_compared": len(want)}


# -- MosaicML Streaming --------------------------------------------------------


def import_mosaic() -> Any:
    """``streaming.base``, without ``streaming/__init__``, which imports torchvision
    (whose PyPI wheels need a CUDA torch) for its vision datasets."""
    spec = importlib.util.find_spec("streaming")
    if spec is None:
        raise ImportError("mosaicml-streaming is not installed")
    package = types.ModuleType("streaming")
    package.__path__ = list(spec.submodule_search_locations)
    package.__spec__ = spec
    sys.modules.setdefault("streaming", package)
    import streaming.base as base

    return base


def zephon_token_input(samples_path: str) -> str:
    """The sample rows as zephon_stream's token input: a flat ``.npy`` and its offsets (one document a row)."""
    rows, width = np.load(samples_path, mmap_mode="r").shape
    flat_path = samples_path.replace(".npy", "-flat.npy")
    np.save(flat_path, np.load(samples_path).reshape(-1))
    np.save(flat_path.replace(".npy", ".offsets.npy"), np.arange(rows + 1, dtype=np.int64) * width)
    return flat_path


def zephon_convert_tokens(flat_path: str, rows: int, out: str) -> float:
    """Seconds to write the sample rows (one document each) from a ``.npy`` + offsets file."""
    from zephon_stream import write_dataset

    seconds, summary = timed(
        lambda: write_dataset(flat_path, out, tokenizer="bytes", input_format="tokens", append_eos=True, workers=1,
                              blocks_per_shard=16, progress=False, overwrite=True)
    )  # fmt: skip
    assert summary.num_documents == rows and summary.num_rejected == 0, summary
    return seconds


def mosaic_convert(samples: np.ndarray, out: str, column: str = "ndarray:uint16") -> float:
    """Seconds for ``MDSWriter`` to write the rows into an empty ``out`` with the ``column`` encoding."""
    base = import_mosaic()
    shutil.rmtree(out, ignore_errors=True)

    def run() -> None:
        with base.MDSWriter(columns={"tokens": column}, out=out, compression="zstd", size_limit=64 * 2**20) as writer:
            for row in samples:
                writer.write({"tokens": row})

    seconds, _ = timed(run)
    return seconds


def paired_conversions(runs: dict[str, Callable[[], float]], trials: int, results: dict[str, Any]) -> None:
    """Run each conversion ``trials`` times, rotating the order; record every trial's seconds
    and this process's CPU seconds (all its threads) beside them.

    A conversion that fails is recorded once and left out of later trials.
    """
    names = list(runs)
    for trial in range(trials):
        order = names[trial % len(names) :] + names[: trial % len(names)]
        for name in order:
            if results.get("errors", {}).get(name):
                continue
            cpu = cpu_seconds()
            seconds = attempt(results, name, runs[name], quiet=True)
            if seconds is not None:
                results.setdefault(f"{name}_trials", []).append(seconds)
                results.setdefault(f"{name}_cpu_trials", []).append(cpu_seconds() - cpu)
        done = [f"{n} {results[n]:.3f}s" for n in names if results.get(n) is not None]
        print(f"trial {trial}: " + ", ".join(done))
    for name in names:
        if results.get(f"{name}_trials"):
            results[name] = statistics.median(results[f"{name}_trials"])


def report_ratio(results: dict[str, Any], mine: str, theirs: str, label: str, target: float | None) -> None:
    """Median and range of the per-trial ratios ``theirs seconds / mine seconds`` (tokens/s ratio)."""
    a, b = results.get(f"{mine}_trials"), results.get(f"{theirs}_trials")
    if not a or not b:
        return
    ratios = [t / m for m, t in zip(a, b)]
    key = f"ratio_zephon_over_{label}_convert"
    results[key] = statistics.median(ratios)
    results[f"{key}_range"] = [min(ratios), max(ratios)]
    results[f"{key}_trials"] = ratios
    verdict = "" if target is None else f" (target >= {target})"
    print(f"ratio zephon/{label} conversion tokens/s, same token rows: median {results[key]:.2f}, "
          f"range {min(ratios):.2f}-{max(ratios):.2f} over {len(ratios)} paired trials{verdict}")
    # NOTE: on a shared machine wall time swings with others' load; CPU seconds per run much less.
    cpu = [t / m for m, t in zip(results[f"{mine}_cpu_trials"], results[f"{theirs}_cpu_trials"])]
    results[f"{key}_cpu"] = statistics.median(cpu)
    print(f"  CPU seconds, {label} over zephon: median {statistics.median(cpu):.2f}, range {min(cpu):.2f}-{max(cpu):.2f}; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


def mosaic_read(remote: str | None, local: str, batch: int, num_samples: int) -> float:
    base = import_mosaic()
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()

    def run() -> int:
        dataset = base.StreamingDataset(remote=remote, local=local, shuffle=True, batch_size=batch)
        seen = 0
        for i, item in zip(range(num_samples), dataset):
            seen += len(item["tokens"]) - 1
        # NOTE: stop its prefetch threads before the S3 server goes away
        # (the dataset has no close(); this is what its own error path does).
        dataset._event.set()
        dataset._executor.shutdown(wait=True)
        return seen

    seconds, tokens = timed(run)
    return tokens / seconds


# -- LitData -----------------------------------------------------------------


def _litdata_rows(bounds: tuple[int, int]) -> Any:
    import torch

    start, end = bounds
    rows = np.load(os.environ["BENCH_PEERS_SAMPLES"], mmap_mode="r")
    # NOTE: int16 holds byte-tokenizer ids and stores 2 bytes a token, as the others do.
    yield torch.from_numpy(np.ascontiguousarray(rows[start:end]).reshape(-1).astype(np.int16))


def litdata_convert(samples_path: str, num_samples: int, out: str) -> float:
    from litdata import TokensLoader, optimize

    os.environ["BENCH_PEERS_SAMPLES"] = samples_path
    pieces = 16
    bounds = [(i * num_samples // pieces, (i + 1) * num_samples // pieces) for i in range(pieces)]
    seconds, _ = timed(
        lambda: optimize(fn=_litdata_rows, inputs=bounds, output_dir=out, chunk_bytes="64MB", item_loader=TokensLoader(), num_workers=1, verbose=False)
    )
    return seconds


def litdata_read(input_dir: str, seq_len: int, num_samples: int, cache_dir: str, storage_options: dict | None = None) -> float:
    from litdata import StreamingDataset, TokensLoader

    def run() -> int:
        dataset = StreamingDataset(
            input_dir, item_loader=TokensLoader(block_size=seq_len + 1), shuffle=True, cache_dir=cache_dir,
            storage_options=storage_options or {},
        )  # fmt: skip
        seen = 0
        for i, item in zip(range(num_samples), dataset):
            seen += len(item) - 1
        return seen

    seconds, tokens = timed(run)
    return tokens / seconds


# -- resume at another world size (peers, under torchrun) ---------------------


def resume_worker(args: argparse.Namespace) -> None:
    """One rank: read ``--steps`` global batches with a peer, from a saved state if given.

    Rank 0 writes the per-step global batch (each sample's sha256, rank order)
    and, after the ``first`` phase, the peer's state, pickled.
    """
    import pickle

    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    local_batch = args.global_batch // world_size
    state = None
    if args.state_in:
        with open(args.state_in, "rb") as f:
            state = pickle.load(f)
    if args.lib == "mosaic":
        base = import_mosaic()
        dataset = base.StreamingDataset(local=args.data, shuffle=True, batch_size=local_batch, num_canonical_nodes=1)
        if state is not None:
            dataset.load_state_dict(state)
        items = iter(dataset)

        def next_batch() -> list[np.ndarray]:
            return [next(items)["tokens"] for _ in range(local_batch)]

    else:
        from litdata import StreamingDataLoader, StreamingDataset, TokensLoader

        dataset = StreamingDataset(args.data, item_loader=TokensLoader(block_size=args.seq_len + 1), shuffle=True)
        loader = StreamingDataLoader(dataset, batch_size=local_batch, num_workers=0)
        if state is not None:
            loader.load_state_dict(state)
        batches = iter(loader)

        def next_batch() -> list[np.ndarray]:
            return [row.numpy().astype(np.uint16) for row in next(batches)]

    steps = []
    for _ in range(args.steps):
        local = [hashlib.sha256(np.ascontiguousarray(row).tobytes()).hexdigest()[:16] for row in next_batch()]
        gathered: list[Any] = [None] * world_size
        dist.all_gather_object(gathered, local)
        steps.append([h for part in gathered for h in part])
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(steps, f)
        if args.state_out:
            if args.lib == "mosaic":
                saved = dataset.state_dict(num_samples=args.steps * args.global_batch, from_beginning=False)
            else:
                saved = loader.state_dict()
            with open(args.state_out, "wb") as f:
                pickle.dump(saved, f)
    dist.barrier()
    dist.destroy_process_group()


def peer_resume(lib: str, data: str, seq_len: int, work: pathlib.Path, steps: int = 10) -> str:
    """W=1 for ``2 * steps`` against W=2 for ``steps`` then W=3 from its state: what happens."""
    import subprocess

    def launch(world_size: int, count: int, name: str, state_in: str = "", state_out: str = "") -> list[list[str]]:
        out = work / f"{lib}-{name}.json"
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world_size}",
                   __file__, "--resume-worker", lib, "--data", data, "--steps", str(count), "--seq-len", str(seq_len),
                   "--out", str(out), "--state-in", state_in, "--state-out", state_out]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
        if done.returncode != 0:
            errors = [line for line in done.stdout.splitlines() + done.stderr.splitlines() if "Error" in line]
            raise RuntimeError(f"W={world_size} {name}: " + (errors[-1] if errors else f"exit {done.returncode}")[:300])
        return json.loads(out.read_text())

    state = str(work / f"{lib}-state.pkl")
    want = launch(1, 2 * steps, "reference")
    got = launch(2, steps, "first", state_out=state)
    try:
        got += launch(3, steps, "second", state_in=state)
    except RuntimeError as exc:
        return f"resume at W=3 from a W=2 state failed: {exc}"
    identical = sum(a == b for a, b in zip(got, want))
    same_set = sum(sorted(a) == sorted(b) for a, b in zip(got, want))
    flat = [h for batch in got for h in batch]
    repeats = len(flat) - len(set(flat))
    reference = [h for batch in want for h in batch]
    missing = len(set(reference) - set(flat))
    return (
        f"{identical}/{len(want)} global batches identical to W=1 in order, {same_set}/{len(want)} with the same "
        f"samples; {repeats} repeated samples (W=1: {len(reference) - len(set(reference))}), "
        f"{missing} of W=1's samples never read"
    )


# -- driver ------------------------------------------------------------------


def attempt(results: dict[str, Any], key: str, fn: Callable[[], Any], quiet: bool = False) -> Any:
    """Run one measurement; a peer failure is recorded, not fatal."""
    try:
        value = fn()
    except Exception as exc:  # noqa: BLE001 - a peer's failure is a result to report
        results[key] = None
        results.setdefault("errors", {})[key] = f"{type(exc).__name__}: {str(exc)[:300]}"
        print(f"{key}: failed ({type(exc).__name__}: {str(exc)[:200]})")
        return None
    results[key] = value
    if not quiet:
        print(f"{key}: {value:,.2f}" if isinstance(value, float) else f"{key}: {value}")
    return value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-bytes", type=float, default=16e6, help="stdlib source bytes to convert (default 16e6)")
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--read-samples", type=int, default=4096, help="samples each reader reads (default 4096)")
    parser.add_argument("--convert-only", action="store_true", help="only the conversions (no reads, no resume)")
    parser.add_argument("--trials", type=int, default=5, help="paired trials of the token-row conversions (default 5)")
    parser.add_argument("--resume-worker", choices=("mosaic", "litdata"), help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=10, help=argparse.SUPPRESS)
    parser.add_argument("--global-batch", type=int, default=6, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--state-in", default="", help=argparse.SUPPRESS)
    parser.add_argument("--state-out", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.resume_worker:
        args.lib = args.resume_worker
        resume_worker(args)
        return 0

    from zephon_stream.storage.embedded_s3 import EmbeddedS3

    work = pathlib.Path(tempfile.mkdtemp(prefix="bench-peers-"))
    results: dict[str, Any] = {"seq_len": args.seq_len, "read_samples": args.read_samples}
    try:
        files = corpus_files(int(args.max_bytes))
        zephon_local = str(work / "zephon")
        attempt(results, "zephon_convert_s", lambda: zephon_convert(files, zephon_local))
        samples = zephon_samples(zephon_local, args.seq_len)
        samples_path = str(work / "samples.npy")
        np.save(samples_path, samples)
        results["tokens"] = int(samples.shape[0] * args.seq_len)
        results["num_samples"] = int(samples.shape[0])
        print(f"corpus: {len(files)} files, {samples.shape[0]:,} samples of {args.seq_len}+1 tokens")
        mosaic_local = str(work / "mds")
        mosaic_fixed = str(work / "mds-fixed")
        lit_local = str(work / "litdata")
        flat_path = zephon_token_input(samples_path)
        runs = {"zephon_tokens_convert_s": lambda: zephon_convert_tokens(flat_path, len(samples), str(work / "zephon-tokens"))}
        try:
            import_mosaic()
        except ImportError as exc:
            print(f"MosaicML Streaming: skipped ({exc})")
            results.setdefault("skipped", {})["mosaic"] = str(exc)
        else:
            fixed_column = f"ndarray:uint16:{args.seq_len + 1}"
            results["mosaic_fixed_column"] = fixed_column
            runs["mosaic_fixed_convert_s"] = lambda: mosaic_convert(samples, mosaic_fixed, fixed_column)
            runs["mosaic_convert_s"] = lambda: mosaic_convert(samples, mosaic_local)
        paired_conversions(runs, args.trials, results)
        attempt(results, "litdata_convert_s", lambda: litdata_convert(samples_path, len(samples), lit_local))

        for name, folder in (("zephon", zephon_local), ("mosaic", mosaic_local), ("mosaic_fixed", mosaic_fixed), ("litdata", lit_local)):
            if os.path.isdir(folder):
                size = sum(f.stat().st_size for f in pathlib.Path(folder).rglob("*") if f.is_file())
                attempt(results, f"{name}_bytes_per_token", lambda: size / results["tokens"])
        sample_tokens = int(samples.size)
        for name in ("zephon_tokens", "mosaic_fixed", "mosaic", "litdata"):
            if results.get(f"{name}_convert_s"):
                results[f"{name}_convert_tokens_per_s"] = sample_tokens / results[f"{name}_convert_s"]
                spread = results.get(f"{name}_convert_s_trials")
                span = f" (trials {sample_tokens / max(spread) / 1e6:.1f}-{sample_tokens / min(spread) / 1e6:.1f})" if spread else ""
                print(f"{name} conversion: {results[f'{name}_convert_tokens_per_s'] / 1e6:.1f} M tokens/s{span}")
        report_ratio(results, "zephon_tokens_convert_s", "mosaic_fixed_convert_s", "mosaic_fixed", 1.0)
        report_ratio(results, "zephon_tokens_convert_s", "mosaic_convert_s", "mosaic", None)
        theirs, mine = results.get("litdata_convert_tokens_per_s"), results.get("zephon_tokens_convert_tokens_per_s")
        if theirs and mine:
            results["ratio_zephon_over_litdata_convert"] = mine / theirs
            print(f"ratio zephon/litdata conversion tokens/s, same token rows: {mine / theirs:.2f} (LitData: one run)")
        if args.convert_only:
            print(json.dumps(results, default=str))
            return 0
        n = min(args.read_samples, len(samples))
        attempt(results, "zephon_local_tokens_per_s", lambda: zephon_read(zephon_local, args.seq_len, args.batch, n))
        attempt(results, "mosaic_local_tokens_per_s", lambda: mosaic_read(None, mosaic_local, args.batch, n))
        attempt(results, "litdata_local_tokens_per_s", lambda: litdata_read(lit_local, args.seq_len, n, str(work / "lit-cache-local")))

        with EmbeddedS3(subprocess=True) as server:
            os.environ.update(server.env())
            os.environ["S3_ENDPOINT_URL"] = server.endpoint_url  # NOTE: MosaicML Streaming's name for it.
            bucket = server.create_bucket("bench-peers")
            import fsspec

            fs = fsspec.filesystem("s3", **server.storage_options())
            for name in ("mds", "litdata"):
                if (work / name).exists():
                    fs.put(str(work / name), f"bench-peers/{name}", recursive=True)
            zephon_s3 = f"{bucket}/zephon"
            zephon_convert(files, zephon_s3)
            attempt(results, "zephon_s3_tokens_per_s", lambda: zephon_read(zephon_s3, args.seq_len, args.batch, n))
            attempt(results, "mosaic_s3_tokens_per_s", lambda: mosaic_read(f"{bucket}/mds", str(work / "mds-cache"), args.batch, n))
            attempt(
                results,
                "litdata_s3_tokens_per_s",
                lambda: litdata_read(f"{bucket}/litdata", args.seq_len, n, str(work / "lit-cache-s3"), {"endpoint_url": server.endpoint_url}),
            )
        attempt(results, "zephon_resume", lambda: zephon_resume(zephon_local, args.seq_len, steps=20))
        for peer, folder in (("mosaic", mosaic_local), ("litdata", lit_local)):
            if os.path.isdir(folder):
                attempt(results, f"{peer}_resume", lambda: peer_resume(peer, folder, args.seq_len, work))

        for where in ("local", "s3"):
            mine = results.get(f"zephon_{where}_tokens_per_s")
            for peer in ("mosaic", "litdata"):
                theirs = results.get(f"{peer}_{where}_tokens_per_s")
                if mine and theirs:
                    results[f"ratio_zephon_over_{peer}_{where}"] = mine / theirs
                    print(f"ratio zephon/{peer} tokens/s, {where}: {mine / theirs:.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(results, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
