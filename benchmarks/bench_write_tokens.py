"""Parts of ``bench_write.py``: writing token inputs against a bare zstd loop,
and the writer's peak memory against corpus size and largest document.

Token corpus: the stdlib sources tokenized once by the BPE, each document
followed by EOS, repeated until it holds ``--tokens-m`` million tokens, then
saved as a ``.npy`` (numpy), a Megatron ``.bin``/``.idx`` pair and a Parquet
file of id lists (pyarrow). The baseline compresses the very blocks the writer
cuts (same block size, zstd level, content size and checksum) on the same
number of threads, from memory, keeping the same number of blocks in flight;
nothing else. The writer reads the file, checks every id, frames documents,
compresses, hashes and writes shards, document indexes and the manifest.

``--blocks-per-shard`` (default 16, shards of 16 Mi tokens) keeps
several shards in a 100 M-token run: the last shard's write and fsync cannot
overlap any compression, and with the default 64-block shards a benchmark of
this size would be mostly that tail, which a real corpus amortises.
"""

from __future__ import annotations

import json
import os
import resource
import struct
import subprocess
import sys
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

TARGET_TOKENS_RATIO = 0.8
_local = threading.local()


def token_docs(tokenizer, texts: list[str], target_tokens: int) -> list[np.ndarray]:
    """Each text's ids plus EOS (uint16), the list repeated to ``target_tokens`` tokens."""
    docs = [np.asarray([*ids, tokenizer.eos_id], dtype=np.uint16) for ids in tokenizer.encode_batch(texts)]
    out, total = [], 0
    while total < target_tokens:
        for doc in docs:
            out.append(doc)
            total += len(doc)
            if total >= target_tokens:
                break
    return out


def write_token_inputs(docs: list[np.ndarray], root: Path) -> dict[str, Path]:
    """The corpus as .npy, Megatron .bin/.idx and Parquet; returns the input of each kind."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root.mkdir(parents=True, exist_ok=True)
    flat = np.concatenate(docs)
    np.save(root / "corpus.npy", flat)
    lengths = np.array([len(d) for d in docs], dtype="<i4")
    pointers = np.concatenate([[0], np.cumsum(lengths[:-1], dtype=np.int64) * 2]).astype("<i8")
    flat.astype("<u2").tofile(root / "mega.bin")
    header = b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, len(docs), len(docs) + 1)
    (root / "mega.idx").write_bytes(
        header + lengths.tobytes() + pointers.tobytes() + np.arange(len(docs) + 1, dtype="<i8").tobytes()
    )
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int32))
    column = pa.ListArray.from_arrays(offsets, pa.array(flat))
    pq.write_table(pa.table({"input_ids": column}), root / "corpus.parquet", row_group_size=4096)
    return {"npy": root / "corpus.npy", "megatron": root / "mega.bin", "parquet": root / "corpus.parquet"}


def _compress(block: np.ndarray, level: int) -> int:
    import zstandard

    compressor = getattr(_local, "compressor", None)
    if compressor is None:
        compressor = _local.compressor = zstandard.ZstdCompressor(
            level=level, write_checksum=True, write_content_size=True
        )
    return len(compressor.compress(block))


def bare_compress(tokens: np.ndarray, *, block_tokens: int, workers: int, level: int) -> tuple[int, float]:
    """Compressed bytes and seconds for the blocks of ``tokens`` on ``workers`` threads."""
    start = time.perf_counter()
    total = 0
    pending: deque = deque()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for at in range(0, len(tokens), block_tokens):
            while len(pending) > 2 * workers + 2:
                total += pending.popleft().result()
            pending.append(pool.submit(_compress, tokens[at : at + block_tokens], level))
        while pending:
            total += pending.popleft().result()
    return total, time.perf_counter() - start


def run_tokens(args, tokenizer, spec: str, texts: list[str], work: Path) -> dict:
    """The ``--tokens`` benchmark; returns its figures."""
    from zephon_stream import write_dataset
    from zephon_stream.format.spec import DEFAULT_BLOCK_TOKENS, DEFAULT_ZSTD_LEVEL

    docs = token_docs(tokenizer, texts, int(args.tokens_m * 1e6))
    inputs = write_token_inputs(docs, work / "tokens")
    stream = np.load(inputs["npy"])
    largest = max(len(d) for d in docs)
    print(
        f"token corpus: {len(stream):,} tokens in {len(docs):,} documents (largest {largest:,}); "
        f"workers {args.workers}; "
        f"{args.blocks_per_shard} blocks a shard"
    )
    del docs
    base_runs, write_runs, base_cpu, write_cpu = [], [], [], []
    for rep in range(args.repeat):
        cpu = cpu_seconds()
        size, seconds = bare_compress(
            stream, block_tokens=DEFAULT_BLOCK_TOKENS, workers=args.workers, level=DEFAULT_ZSTD_LEVEL
        )
        base_runs.append(seconds)
        base_cpu.append(cpu_seconds() - cpu)
        cpu = cpu_seconds()
        print(f"[{rep}] bare zstd loop: {len(stream) / seconds:,.0f} tokens/s ({size:,} bytes)")
        start = time.perf_counter()
        summary = write_dataset(
            str(inputs["npy"]),
            str(work / "out"),
            tokenizer=spec,
            input_format="tokens",
            workers=args.workers,
            blocks_per_shard=args.blocks_per_shard,
            progress=False,
            overwrite=True,
        )
        write_runs.append(time.perf_counter() - start)
        write_cpu.append(cpu_seconds() - cpu)
        assert summary.num_tokens == len(stream) and summary.num_rejected == 0
        assert abs(summary.compressed_bytes - size) <= 64 * summary.num_blocks, (summary.compressed_bytes, size)
        print(f"[{rep}] writer (.npy):  {len(stream) / write_runs[-1]:,.0f} tokens/s")
    kinds = {}
    for kind in ("megatron", "parquet"):
        start = time.perf_counter()
        summary = write_dataset(
            str(inputs[kind]),
            str(work / "out"),
            tokenizer=spec,
            input_format="tokens",
            workers=args.workers,
            blocks_per_shard=args.blocks_per_shard,
            progress=False,
            overwrite=True,
        )
        kinds[kind] = len(stream) / (time.perf_counter() - start)
        assert summary.num_tokens == len(stream)
        print(f"writer ({kind}): {kinds[kind]:,.0f} tokens/s")
    base_tps, write_tps = len(stream) / min(base_runs), len(stream) / min(write_runs)
    ratio = write_tps / base_tps
    print(f"bare zstd (best): {base_tps:,.0f} tokens/s; writer .npy (best): {write_tps:,.0f} tokens/s")
    print(
        f"ratio: {ratio:.3f} (target >= {TARGET_TOKENS_RATIO})  "
        f"{'OK' if ratio >= TARGET_TOKENS_RATIO else 'BELOW TARGET'}"
    )
    pair = [b / w for b, w in zip(base_runs, write_runs)]
    # Wall time swings with other load on a shared machine; CPU time per run does not.
    cpu_ratio = min(base_cpu) / min(write_cpu)
    print(
        f"CPU seconds: bare zstd {min(base_cpu):.2f}, writer {min(write_cpu):.2f} (CPU-time ratio {cpu_ratio:.3f}); "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    rss = peak_rss_child(["tokens", str(inputs["npy"]), spec, str(args.workers)], work)
    print(f"writer peak RSS on {len(stream):,} tokens: {rss:.0f} MiB")
    return {
        "tokens": len(stream),
        "blocks_per_shard": args.blocks_per_shard,
        "largest_document_tokens": largest,
        "baseline_tokens_per_s": round(base_tps),
        "writer_tokens_per_s": round(write_tps),
        "ratio": round(ratio, 4),
        "target_ratio": TARGET_TOKENS_RATIO,
        "meets_target": ratio >= TARGET_TOKENS_RATIO,
        "pair_ratios": [round(r, 4) for r in pair],
        "megatron_tokens_per_s": round(kinds["megatron"]),
        "parquet_tokens_per_s": round(kinds["parquet"]),
        "megatron_ratio": round(kinds["megatron"] / base_tps, 4),
        "parquet_ratio": round(kinds["parquet"] / base_tps, 4),
        "writer_peak_rss_mib": round(rss, 1),
        "cpu_ratio": round(cpu_ratio, 4),
        "baseline_cpu_s": [round(c, 3) for c in base_cpu],
        "writer_cpu_s": [round(c, 3) for c in write_cpu],
    }


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def peak_rss_child(argv: list[str], work: Path) -> float:
    """Peak RSS (MiB) of a fresh process running one write (``child_main``)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    done = subprocess.run(
        [sys.executable, __file__, str(work / "rss-out"), *argv], env=env, capture_output=True, text=True, timeout=900
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1])["peak_rss_mib"]


def run_memory(args, spec: str, files: list[tuple[Path, str]], work: Path) -> list[dict]:
    """Peak RSS of text writes (``workers=1``: tokenizing in the measured process)
    for a growing corpus, without and with one large document."""
    rows = []
    total = sum(len(t.encode()) for _, t in files)
    for fraction in (0.25, 1.0):
        chosen, size = [], 0
        for _, text in files:
            if size >= fraction * total:
                break
            chosen.append(text)
            size += len(text.encode())
        for big_mb in (0.0, args.big_doc_mb):
            folder = work / f"mem-{fraction}-{big_mb}"
            folder.mkdir()
            for i, text in enumerate(chosen):
                (folder / f"{i:05d}.py").write_text(text, encoding="utf-8")
            largest = max(len(t.encode()) for t in chosen)
            if big_mb:
                big, n, i = [], 0, 0
                while n < big_mb * 1e6:
                    big.append(chosen[i % len(chosen)])
                    n += len(big[-1].encode())
                    i += 1
                (folder / "99999_big.py").write_text("".join(big), encoding="utf-8")
                largest = n
            rss = peak_rss_child(["text", str(folder / "*.py"), spec, "1"], work)
            row = {
                "corpus_bytes": size + (largest if big_mb else 0),
                "largest_document_bytes": largest,
                "peak_rss_mib": round(rss, 1),
            }
            print(
                f"text write, workers 1: corpus {row['corpus_bytes'] / 1e6:.1f} MB, largest document "
                f"{largest / 1e6:.2f} MB: peak RSS {rss:.0f} MiB"
            )
            rows.append(row)
    return rows


def child_main(argv: list[str]) -> None:
    """``OUT MODE INPUT SPEC WORKERS``: one write, then its peak RSS as JSON."""
    out, mode, source, spec, workers = argv
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from zephon_stream import write_dataset

    summary = write_dataset(
        source,
        out,
        tokenizer=spec,
        workers=int(workers),
        progress=False,
        overwrite=True,
        input_format="tokens" if mode == "tokens" else None,
    )
    print(json.dumps({"tokens": summary.num_tokens, "peak_rss_mib": peak_rss_mib()}))


def peak_rss_mib() -> float:
    """This process's peak RSS. VmHWM, not ru_maxrss: on Linux exec folds the
    parent's high-water mark into ru_maxrss (a child started by a big parent
    reports the parent's peak); VmHWM belongs to this process's own memory map."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


if __name__ == "__main__":
    child_main(sys.argv[1:])
