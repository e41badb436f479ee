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
reported beside them.

Then each library reads its dataset in read passes (``peer_passes.py``, a
fresh process each): zephon_stream's ``StreamingLoader``, LitData's
``StreamingDataLoader`` and its plain dataset iterator (batch 1 only), and
MosaicML's ``StreamingDataLoader`` over the fixed-shape MDS, all shuffled,
the peers' loaders once per ``--workers`` count of DataLoader workers
(default ``1,0``: one worker, as zephon_stream has one helper process, and
none, batches built in the trainer's process). For each: the time to the first batch,
steady tokens/s over at least ``--min-seconds`` (repeated epochs), the CPU a
step costs the trainer's own thread (``time.thread_time()`` around each
steady ``next()``, median and mean: with no worker the whole read is there),
and the peak memory of the reader's processes, at batch 1 and at ``--batch`` (16) x
``--seq-len`` (2048), from local disk and from S3 on a SeaweedFS server on
loopback (the same two cores), ``--pass-trials`` paired trials with the
order rotating; every zephon_stream / peer ratio of steady tokens/s is the
median and range of the per-trial ratios. The resume check reads global
batches at one rank, then at two ranks, saves the state, and goes on at
three ranks from it: zephon_stream with in-process ranks, each peer as ranks
under torchrun (gloo, ``peer_resume.py``); each global batch is compared
with one rank's, in order and as a set. After each set of passes a table
gives every reader's medians and the load they ran at. The figures in
docs/BENCHMARKS.md come from ``--max-bytes 32e6`` (the whole standard
library, 31.5 M tokens) and, for the CPU per step, from ``--no-s3
--no-resume --max-bytes 8e6``.

The peers are optional and are not installed by this project (their
dependencies pin other torch builds). To include them, use a separate
virtualenv that sees this environment's packages (from the repository root;
``.venv-peers/`` is git-ignored)::

    python -m venv --system-site-packages .venv-peers
    .venv-peers/bin/pip install --no-deps mosaicml-streaming==0.13.0 litdata==0.2.76 \
        xxhash zstd brotli cramjam python-snappy catalogue lightning-utilities \
        transformers==4.57.6 huggingface_hub==0.36.2 tokenizers==0.22.2
    .venv-peers/bin/python benchmarks/bench_peers.py --no-s3 --no-resume --max-bytes 8e6 --pass-trials 3

``--convert-only`` stops after the conversions, ``--no-local``, ``--no-s3``
and ``--no-resume`` skip those parts. A peer that cannot be imported is reported
as skipped. The last printed line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import hashlib
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
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

# Run as a script (benchmarks/ first on sys.path), the repository root makes
# ``benchmarks`` and ``tools`` importable, as ``python -m benchmarks.bench_peers`` does.
_REPO = pathlib.Path(__file__).resolve().parent.parent
if str(_REPO) not in sys.path:
    sys.path.insert(0, str(_REPO))

from benchmarks.peer_passes import import_mosaic, paired_passes  # noqa: E402
from benchmarks.peer_resume import peer_resume  # noqa: E402


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
        lambda: write_dataset(
            files,
            out,
            tokenizer="bytes",
            workers=2,
            blocks_per_shard=16,
            storage_options=storage_options,
            progress=False,
            overwrite=True,
        )
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


def zephon_resume(url: str, seq_len: int, steps: int) -> dict[str, Any]:
    """Global batches of W=1 for ``2 * steps`` against W=2 for ``steps``, then W=3 from its state."""
    from zephon_stream import StreamingLoader

    global_batch = 6

    def loaders(world_size: int) -> list[Any]:
        return [
            StreamingLoader(
                url, seq_len=seq_len, local_batch_size=global_batch // world_size, rank=r, world_size=world_size
            )
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


# -- conversions ---------------------------------------------------------------


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
        lambda: write_dataset(
            flat_path,
            out,
            tokenizer="bytes",
            input_format="tokens",
            append_eos=True,
            workers=1,
            blocks_per_shard=16,
            progress=False,
            overwrite=True,
        )
    )
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
    print(
        f"ratio zephon/{label} conversion tokens/s, same token rows: median {results[key]:.2f}, "
        f"range {min(ratios):.2f}-{max(ratios):.2f} over {len(ratios)} paired trials{verdict}"
    )
    # On a shared machine wall time swings with others' load; CPU seconds per run much less.
    cpu = [t / m for m, t in zip(results[f"{mine}_cpu_trials"], results[f"{theirs}_cpu_trials"])]
    results[f"{key}_cpu"] = statistics.median(cpu)
    print(
        f"  CPU seconds, {label} over zephon: median {statistics.median(cpu):.2f}, "
        f"range {min(cpu):.2f}-{max(cpu):.2f}; "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )


# -- LitData -----------------------------------------------------------------


def _litdata_rows(bounds: tuple[int, int]) -> Any:
    import torch

    start, end = bounds
    rows = np.load(os.environ["BENCH_PEERS_SAMPLES"], mmap_mode="r")
    # int16 holds byte-tokenizer ids and stores 2 bytes a token, as the others do.
    yield torch.from_numpy(np.ascontiguousarray(rows[start:end]).reshape(-1).astype(np.int16))


def litdata_convert(samples_path: str, num_samples: int, out: str) -> float:
    from litdata import TokensLoader, optimize

    os.environ["BENCH_PEERS_SAMPLES"] = samples_path
    pieces = 16
    bounds = [(i * num_samples // pieces, (i + 1) * num_samples // pieces) for i in range(pieces)]
    seconds, _ = timed(
        lambda: optimize(
            fn=_litdata_rows,
            inputs=bounds,
            output_dir=out,
            chunk_bytes="64MB",
            item_loader=TokensLoader(),
            num_workers=1,
            verbose=False,
        )
    )
    return seconds


# -- driver ------------------------------------------------------------------


def versions() -> dict[str, str]:
    """The installed version of each library compared (``None``: not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in ("zephon-stream", "mosaicml-streaming", "litdata", "torch"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


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


def passes(
    args: argparse.Namespace,
    folders: dict[str, str],
    results: dict[str, Any],
    where: str,
    endpoint_url: str | None = None,
    env: dict[str, str] | None = None,
) -> None:
    """Paired read passes of every library whose dataset exists, at batch 1 and at ``--batch``;
    the peers' loaders once per ``--workers`` count (``litdata_w1``, ``mosaic_w0``, ...)."""
    for batch in (1, args.batch):
        readers = {}
        for lib, url in folders.items():
            if lib == "litdata_iter" and batch != 1:
                continue
            counts = args.workers if lib in ("litdata", "mosaic") else [0]
            for workers in counts:
                name = f"{lib}_w{workers}" if lib in ("litdata", "mosaic") else lib
                readers[name] = {
                    "lib": lib,
                    "url": url,
                    "batch": batch,
                    "seq_len": args.seq_len,
                    "min_seconds": args.min_seconds,
                    "workers": workers,
                    "endpoint_url": endpoint_url,
                    "env": env,
                }
        paired_passes(readers, args.pass_trials, f"{where}_b{batch}", results)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-bytes", type=float, default=16e6, help="stdlib source bytes to convert (default 16e6)")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=16, help="the batch of the second pass shape (default 16)")
    parser.add_argument("--min-seconds", type=float, default=10.0, help="steady part of each read pass (default 10)")
    parser.add_argument(
        "--workers",
        type=lambda s: [int(n) for n in s.split(",")],
        default=[1, 0],
        help="the peers' DataLoader workers, each count a reader of its own (default 1,0)",
    )
    parser.add_argument("--pass-trials", type=int, default=3, help="paired trials of each read pass (default 3)")
    parser.add_argument("--trials", type=int, default=5, help="paired trials of the token-row conversions (default 5)")
    parser.add_argument("--convert-only", action="store_true", help="only the conversions (no reads, no resume)")
    parser.add_argument("--no-local", action="store_true", help="skip the passes from local disk")
    parser.add_argument("--no-s3", action="store_true", help="skip the passes from S3 (SeaweedFS)")
    parser.add_argument("--no-resume", action="store_true", help="skip the resume check")
    args = parser.parse_args()

    work = pathlib.Path(tempfile.mkdtemp(prefix="bench-peers-"))
    results: dict[str, Any] = {
        "seq_len": args.seq_len,
        "batch": args.batch,
        "min_seconds": args.min_seconds,
        "workers": args.workers,
        "cpus": os.cpu_count(),
        "versions": versions(),
    }
    print(f"versions: {results['versions']}; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
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
        runs = {
            "zephon_tokens_convert_s": lambda: zephon_convert_tokens(
                flat_path, len(samples), str(work / "zephon-tokens")
            )
        }
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

        for name, folder in (
            ("zephon", zephon_local),
            ("mosaic", mosaic_local),
            ("mosaic_fixed", mosaic_fixed),
            ("litdata", lit_local),
        ):
            if os.path.isdir(folder):
                size = sum(f.stat().st_size for f in pathlib.Path(folder).rglob("*") if f.is_file())
                attempt(results, f"{name}_bytes_per_token", lambda size=size: size / results["tokens"])
        sample_tokens = int(samples.size)
        for name in ("zephon_tokens", "mosaic_fixed", "mosaic", "litdata"):
            if results.get(f"{name}_convert_s"):
                results[f"{name}_convert_tokens_per_s"] = sample_tokens / results[f"{name}_convert_s"]
                spread = results.get(f"{name}_convert_s_trials")
                span = (
                    f" (trials {sample_tokens / max(spread) / 1e6:.1f}-{sample_tokens / min(spread) / 1e6:.1f})"
                    if spread
                    else ""
                )
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

        # MosaicML reads its fixed-shape MDS, the faster of its two columns.
        local = {"zephon": zephon_local, "litdata": lit_local, "litdata_iter": lit_local, "mosaic": mosaic_fixed}
        local = {lib: url for lib, url in local.items() if os.path.isdir(url)}
        if not args.no_local:
            passes(args, local, results, "local")
        if not args.no_s3:
            from tools.seaweedfs import SeaweedFS
            from zephon_stream.storage import copy_dataset

            with SeaweedFS(buckets=["bench-peers"]) as server:
                import fsspec

                fs = fsspec.filesystem("s3", **server.storage_options())
                remote = {lib: f"s3://bench-peers/{pathlib.Path(url).name}" for lib, url in local.items()}
                for lib, url in local.items():
                    if lib == "zephon":
                        copy_dataset(url, remote[lib], dst_options=server.storage_options())
                    elif lib != "litdata_iter":
                        fs.put(url, remote[lib].removeprefix("s3://"), recursive=True)
                # MosaicML Streaming reads the endpoint from S3_ENDPOINT_URL, the others take it as an option.
                env = {**server.env(), "S3_ENDPOINT_URL": server.endpoint_url}
                passes(args, remote, results, "s3", endpoint_url=server.endpoint_url, env=env)
        if not args.no_resume:
            attempt(results, "zephon_resume", lambda: zephon_resume(zephon_local, args.seq_len, steps=20))
            for peer, folder in (("mosaic", mosaic_local), ("litdata", lit_local)):
                if os.path.isdir(folder):
                    attempt(results, f"{peer}_resume", partial(peer_resume, peer, folder, args.seq_len, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(results, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
