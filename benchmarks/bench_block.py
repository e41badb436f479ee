"""Block decode speed: ``decode_block`` against bare zstd decompression.

``decode_block`` is the loader's hot path. It adds frame-header walking, size
and checksum checks and a zero-copy numpy view on top of zstd; this measures
that overhead against ``zstandard.ZstdDecompressor().decompress`` on the same
frames (the baseline, measured in the same run), and the speed-up of decoding
in threads (zstd releases the GIL).

Data: Python stdlib sources as ``bytes``-tokenizer tokens (uint16), default
blocks of 2**20 + 1 tokens. The last printed line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sysconfig
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import zstandard

from zephon_stream.format.block import decode_block, encode_block
from zephon_stream.format.spec import DEFAULT_BLOCK_TOKENS


def stdlib_tokens(count: int) -> np.ndarray:
    chunks, total = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        data = np.frombuffer(path.read_bytes(), dtype=np.uint8).astype(np.uint16)
        chunks.append(np.append(data, 256).astype(np.uint16))
        total += len(data) + 1
        if total >= count:
            break
    return np.concatenate(chunks)[:count]


def best_of(repeats: int, fn) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--block-tokens", type=int, default=DEFAULT_BLOCK_TOKENS)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()

    n = args.block_tokens
    tokens = stdlib_tokens(n * args.blocks)
    blocks = [tokens[i * n : (i + 1) * n] for i in range(args.blocks)]
    start = time.perf_counter()
    frames = [encode_block(b) for b in blocks]
    encode_s = time.perf_counter() - start
    raw_bytes = sum(b.nbytes for b in blocks)
    compressed = sum(len(f) for f in frames)

    dctx = zstandard.ZstdDecompressor()
    # Baseline and ours alternate so that load from other processes hits both alike.
    baseline_s = ours_s = float("inf")
    for _ in range(args.repeats):
        baseline_s = min(baseline_s, best_of(1, lambda: [dctx.decompress(f) for f in frames]))
        ours_s = min(
            ours_s, best_of(1, lambda: [decode_block(f, num_tokens=n, dtype="<u2", where="bench") for f in frames])
        )
    with ThreadPoolExecutor(args.threads) as pool:
        threaded_s = best_of(
            args.repeats,
            lambda: list(pool.map(lambda f: decode_block(f, num_tokens=n, dtype="<u2", where="bench"), frames)),
        )
    for block, frame in zip(blocks, frames):
        assert np.array_equal(decode_block(frame, num_tokens=n, dtype="<u2", where="bench"), block)

    result = {
        "block_tokens": n,
        "blocks": args.blocks,
        "compression_ratio": raw_bytes / compressed,
        "bytes_per_token": compressed / (n * args.blocks),
        "encode_mb_s": raw_bytes / encode_s / 1e6,
        "baseline_decode_mb_s": raw_bytes / baseline_s / 1e6,
        "decode_block_mb_s": raw_bytes / ours_s / 1e6,
        "decode_vs_baseline": baseline_s / ours_s,
        "threads": args.threads,
        "threaded_decode_mb_s": raw_bytes / threaded_s / 1e6,
        "thread_speedup": ours_s / threaded_s,
    }
    print(f"baseline zstd decompress: {result['baseline_decode_mb_s']:.0f} MB/s of tokens")
    print(
        f"decode_block:             {result['decode_block_mb_s']:.0f} MB/s "
        f"({result['decode_vs_baseline']:.3f}x baseline)"
    )
    print(
        f"decode_block, {args.threads} threads:  {result['threaded_decode_mb_s']:.0f} MB/s "
        f"({result['thread_speedup']:.2f}x one thread)"
    )
    print(
        f"compression {result['compression_ratio']:.2f}x, {result['bytes_per_token']:.3f} bytes/token; "
        f"encode {result['encode_mb_s']:.0f} MB/s"
    )
    print(json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()
