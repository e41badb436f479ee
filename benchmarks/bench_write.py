"""Writer throughput against the tokenizer alone, on the same corpus and workers.

Corpus: every stdlib ``.py`` source on this machine that is valid UTF-8 (tens
of MB). Tokenizer: a byte-level BPE (vocab 8000) trained here on a slice of
it. Both runs use ``--workers`` spawned processes with
``TOKENIZERS_PARALLELISM=false`` and the same chunk size (with ``--workers 1``
both tokenize in this process instead):

- baseline: the texts already in memory, ``encode_batch`` on the workers, results
  taken back in order (nothing else);
- writer: ``write_dataset`` from the files on disk to a local folder (reading,
  rejects, token framing, block cutting, zstd, shard and index writes, manifest).

The target is ratio = writer tokens/s / baseline tokens/s >= 0.85. Each is
measured ``--repeat`` times, alternating, and the best of each is kept (the
machine may be shared). The last line printed is one JSON object.

``--tokens``: token inputs instead (``bench_write_tokens.py``): the corpus's
BPE ids as .npy / Megatron / Parquet, the writer against a bare zstd loop over
the same blocks on the same number of threads (target >= 0.8), and the
writer's peak RSS. ``--memory``: peak RSS of text writes against corpus size
and largest document size (each write in a fresh process).

Usage: python benchmarks/bench_write.py [--workers 2] [--repeat 2] [--max-mb 40]
       python benchmarks/bench_write.py --tokens [--tokens-m 100] [--workers 2]
       python benchmarks/bench_write.py --memory [--big-doc-mb 4.7]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import pickle
import resource
import shutil
import statistics
import sysconfig
import tempfile
import time
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

TARGET_RATIO = 0.85
CHUNK_CHARS = 256 * 1024
BPE_VOCAB = 8000
TRAIN_FILES = 300

_tokenizer = None


def _init(state: bytes) -> None:
    global _tokenizer
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _tokenizer = pickle.loads(state)


def _encode(texts: list[str]) -> int:
    return sum(len(ids) for ids in _tokenizer.encode_batch(texts))


def corpus_files(max_bytes: int) -> list[tuple[Path, str]]:
    root = Path(sysconfig.get_paths()["stdlib"])
    out, total = [], 0
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.relative_to(root).parts or not path.is_file():
            continue
        data = path.read_bytes()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        if not text:
            continue
        out.append((path, text))
        total += len(data)
        if total >= max_bytes:
            break
    return out


def train_bpe(texts: list[str], path: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.save(str(path))


def cpu_seconds() -> float:
    """CPU time of this process and its reaped children so far."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def chunks(texts: list[str]) -> list[list[str]]:
    out, cur, size = [], [], 0
    for text in texts:
        cur.append(text)
        size += len(text)
        if size >= CHUNK_CHARS:
            out.append(cur)
            cur, size = [], 0
    if cur:
        out.append(cur)
    return out


def baseline(tokenizer, texts: list[str], workers: int) -> tuple[int, float]:
    """Tokens and seconds for the tokenizer alone on ``workers`` processes
    (``workers=1``: in this process, as the writer does)."""
    start = time.perf_counter()
    if workers == 1:
        tokens = sum(len(ids) for chunk in chunks(texts) for ids in tokenizer.encode_batch(chunk))
        return tokens, time.perf_counter() - start
    pool = ProcessPoolExecutor(
        max_workers=workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_init,
        initargs=(pickle.dumps(tokenizer),),
    )
    tokens = 0
    pending: deque = deque()
    with pool:
        for chunk in chunks(texts):
            if len(pending) >= 2 * workers + 2:
                tokens += pending.popleft().result()
            pending.append(pool.submit(_encode, chunk))
        while pending:
            tokens += pending.popleft().result()
    return tokens, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--max-mb", type=float, default=40.0, help="corpus size cap (MB)")
    parser.add_argument("--tokens", action="store_true", help="benchmark token inputs against bare zstd")
    parser.add_argument("--tokens-m", type=float, default=100.0, help="--tokens: corpus size in million tokens")
    parser.add_argument("--blocks-per-shard", type=int, default=16, help="--tokens: blocks a shard")
    parser.add_argument("--memory", action="store_true", help="peak RSS against corpus and largest document size")
    parser.add_argument("--big-doc-mb", type=float, default=4.7, help="--memory: size of the one large document")
    args = parser.parse_args()
    if args.tokens or args.memory:
        special(args)
        return

    from zephon_stream import Manifest, write_dataset
    from zephon_stream.writer.tokenizers import load_tokenizer

    files = corpus_files(int(args.max_mb * 1e6))
    texts = [t for _, t in files]
    corpus_bytes = sum(len(t.encode("utf-8")) for t in texts)
    work = Path(tempfile.mkdtemp(prefix="bench_write_"))
    try:
        corpus_dir = work / "corpus"
        corpus_dir.mkdir()
        for i, (path, _) in enumerate(files):
            shutil.copyfile(path, corpus_dir / f"{i:05d}_{path.name}")
        tok_path = work / "tokenizer.json"
        train_bpe(texts[:TRAIN_FILES], tok_path)
        spec = f"hf:{tok_path}"
        tokenizer = load_tokenizer(spec)
        print(
            f"corpus: {len(files)} files, {corpus_bytes / 1e6:.1f} MB; BPE vocab {tokenizer.vocab_size}; "
            f"workers {args.workers}"
        )

        base_runs, write_runs = [], []
        summary = None
        base_cpu, write_cpu = [], []
        for rep in range(args.repeat):
            cpu = cpu_seconds()
            tokens, seconds = baseline(tokenizer, texts, args.workers)
            base_cpu.append(cpu_seconds() - cpu)
            base_runs.append((tokens, seconds))
            print(
                f"[{rep}] tokenizer alone: {tokens:,} tokens in {seconds:.2f} s = {tokens / seconds:,.0f} tokens/s "
                f"(CPU {base_cpu[-1]:.2f} s)"
            )
            out = work / "out"
            shutil.rmtree(out, ignore_errors=True)
            cpu = cpu_seconds()
            start = time.perf_counter()
            summary = write_dataset(
                str(corpus_dir / "*.py"), str(out), tokenizer=spec, workers=args.workers, progress=False
            )
            seconds = time.perf_counter() - start
            write_cpu.append(cpu_seconds() - cpu)
            write_runs.append((summary.num_tokens, seconds))
            print(
                f"[{rep}] writer:          {summary.num_tokens:,} tokens in {seconds:.2f} s = "
                f"{summary.num_tokens / seconds:,.0f} tokens/s (CPU {write_cpu[-1]:.2f} s)"
            )
        assert summary is not None
        manifest = Manifest.load(str(work / "out"))
        # The writer's stream holds one EOS per document on top of the ids.
        assert manifest.num_tokens == base_runs[0][0] + len(texts), (manifest.num_tokens, base_runs[0][0])
        base_tps = max(t / s for t, s in base_runs)
        write_tps = max(t / s for t, s in write_runs)
        ratio = write_tps / base_tps
        # On a shared machine wall time swings with other load; CPU time
        # per token shows the writer's own overhead regardless.
        cpu_ratio = min(base_cpu) / min(write_cpu)
        pair_ratios = [(wt / ws) / (bt / bs) for (bt, bs), (wt, ws) in zip(base_runs, write_runs)]
        bytes_per_token = manifest.compressed_bytes / manifest.num_tokens
        print(f"tokenizer alone (best): {base_tps:,.0f} tokens/s")
        print(f"writer (best):          {write_tps:,.0f} tokens/s")
        print(f"ratio: {ratio:.3f} (target >= {TARGET_RATIO})  {'OK' if ratio >= TARGET_RATIO else 'BELOW TARGET'}")
        print(
            f"ratio of each alternating pair: {', '.join(f'{r:.3f}' for r in pair_ratios)} "
            f"(median {statistics.median(pair_ratios):.3f})"
        )
        print(
            f"CPU seconds: tokenizer alone {min(base_cpu):.2f}, writer {min(write_cpu):.2f} "
            f"(CPU-time ratio {cpu_ratio:.3f}); load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
        )
        print(
            f"compressed: {manifest.compressed_bytes:,} bytes in {manifest.num_shards} shards, "
            f"{manifest.num_blocks} blocks; {bytes_per_token:.3f} bytes/token "
            f"({manifest.dtype}, {corpus_bytes / manifest.num_tokens:.2f} text bytes/token)"
        )
        print(
            json.dumps(
                {
                    "benchmark": "bench_write",
                    "workers": args.workers,
                    "corpus_files": len(files),
                    "corpus_bytes": corpus_bytes,
                    "num_tokens": manifest.num_tokens,
                    "baseline_tokens_per_s": round(base_tps),
                    "writer_tokens_per_s": round(write_tps),
                    "ratio": round(ratio, 4),
                    "target_ratio": TARGET_RATIO,
                    "meets_target": ratio >= TARGET_RATIO,
                    "pair_ratios": [round(r, 4) for r in pair_ratios],
                    "median_pair_ratio": round(statistics.median(pair_ratios), 4),
                    "cpu_ratio": round(cpu_ratio, 4),
                    "baseline_cpu_s": [round(c, 3) for c in base_cpu],
                    "writer_cpu_s": [round(c, 3) for c in write_cpu],
                    "load_average": round(os.getloadavg()[0], 2),
                    "compressed_bytes": manifest.compressed_bytes,
                    "bytes_per_token": round(bytes_per_token, 4),
                    "baseline_runs_s": [round(s, 3) for _, s in base_runs],
                    "writer_runs_s": [round(s, 3) for _, s in write_runs],
                }
            )
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


def special(args: argparse.Namespace) -> None:
    """``--tokens`` and ``--memory``; the last line printed is one JSON object."""
    from bench_write_tokens import run_memory, run_tokens
    from zephon_stream.writer.tokenizers import load_tokenizer

    files = corpus_files(int(args.max_mb * 1e6))
    texts = [t for _, t in files]
    work = Path(tempfile.mkdtemp(prefix="bench_write_"))
    try:
        train_bpe(texts[:TRAIN_FILES], work / "tokenizer.json")
        spec = f"hf:{work / 'tokenizer.json'}"
        result = {
            "benchmark": "bench_write",
            "workers": args.workers,
            "corpus_bytes": sum(len(t.encode()) for t in texts),
        }
        if args.tokens:
            result["tokens"] = run_tokens(args, load_tokenizer(spec), spec, texts, work)
        if args.memory:
            result["memory"] = run_memory(args, spec, files, work)
        result["load_average"] = round(os.getloadavg()[0], 2)
        print(json.dumps(result))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
