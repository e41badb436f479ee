"""What rows of whole documents (``packing="best_fit"``) buy and what they cost, against windows.

Part 1, the cuts, on the same blocks of 2**20 + 1 tokens for both packings
(``plan/packing.py`` and ``plan/packing_cuts.py``), at seq_len 1024, 2048,
4096 and 8192:

- **real text**: this machine's Python standard library sources cut into
  documents before each top-level ``def``/``class``/decorator (one line to
  tens of thousands of bytes), written with the ``bytes`` tokenizer;
- **web-like**: synthetic documents whose lengths are log-normal with median
  500 tokens and sigma 1.1 (mean about 915, 0.3% past 10,000), the shape
  reported for web text; token values are random (packing reads only EOS),
  so zstd stores these blocks nearly raw and their decode time is no
  baseline: the real text's is.

Per packing: the share of documents cut (not one piece of one row), of
tokens read without their document's beginning, and the floor (documents
longer than a row, which any packing must cut); also without the documents
that cross a block edge. And conservation: per block, the inputs of the best
fit rows are the windows' inputs rearranged (counted mismatches: 0).

Beside the cuts, the time to pack one block (``best_fit_rows`` and
``packed_rows``) against the time to zstd-decode the same block, measured
in turn, and a third corpus, packing's hard case: every non-blank source
line a document (about 40 tokens).

Part 2, the loader, paired trials on the real-text dataset on local disk,
one rank at ``--rows`` x ``--seq-len`` (default 16 x 2048), concat and
best_fit in turn: the first batch (construction to the first ``next()``),
the helper process's CPU per step over ``--steps`` steps (its threads all:
fetch, decode, packing, assembly) and ``next()``'s CPU in the trainer's
thread (``time.thread_time``), with ``--work-ms`` of Python work between
steps as a training loop has. Each figure's best_fit/concat ratio is the
median over the pairs.

    python benchmarks/bench_packing.py --data-dir /tmp/bench-packing

The last printed line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_train_overhead import calibrate, python_work
from benchmarks.read_measurements import process_cpu_s
from zephon_stream import StreamingLoader, write_dataset
from zephon_stream.format.block import decode_block, encode_block
from zephon_stream.format.manifest import Manifest
from zephon_stream.plan.packing import best_fit_rows, packed_rows, window_rows
from zephon_stream.plan.packing_cuts import CutCounts, cut_counts
from zephon_stream.reader import DatasetReader

BLOCK_TOKENS = 2**20 + 1
SEQ_LENS = (1024, 2048, 4096, 8192)
WEB_MEDIAN, WEB_SIGMA = 500, 1.1
TARGETS = {
    "cut_ratio_2048": 0.35,
    "cut_ratio_4096": 0.2,
    "floor_factor": 1.2,
    "floor_points": 1.0,
    "helper_cpu_ratio": 1.5,
}


def split_at_definitions(text: str) -> list[str]:
    """A source file cut before each top-level definition (as tests/fixtures_corpus.py does)."""
    documents, current = [], []
    for line in text.splitlines(keepends=True):
        if current and line.startswith(("def ", "class ", "@", "async def ")) and not current[-1].startswith("@"):
            documents.append("".join(current))
            current = []
        current.append(line)
    if current:
        documents.append("".join(current))
    return [d for d in documents if d.strip()]


def build_real_dataset(data_dir: Path) -> Manifest:
    """The stdlib sources cut at top-level definitions, one JSONL record each, ``bytes`` tokens."""
    out = data_dir / "definitions"
    if not (out / "manifest").exists():
        root = Path(sysconfig.get_paths()["stdlib"])
        jsonl = data_dir / "definitions.jsonl"
        with jsonl.open("w", encoding="utf-8") as records:
            for path in sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts):
                try:
                    text = path.read_text(encoding="utf-8")
                except (UnicodeDecodeError, OSError):
                    continue
                for document in split_at_definitions(text):
                    records.write(json.dumps({"text": document}) + "\n")
        write_dataset(str(jsonl), str(out), tokenizer="bytes", block_tokens=BLOCK_TOKENS, progress=False)
    return Manifest.load(str(out))


def web_like_blocks(count: int, seed: int = 0) -> list[np.ndarray]:
    """Blocks of synthetic documents with web-like lengths (EOS = 0, other ids random in 1..49999)."""
    rng = np.random.default_rng(seed)
    lengths = np.maximum(1, rng.lognormal(np.log(WEB_MEDIAN), WEB_SIGMA, size=count * BLOCK_TOKENS // 300)).astype(
        np.int64
    )
    ends = np.cumsum(lengths) - 1
    total = count * BLOCK_TOKENS
    tokens = rng.integers(1, 50000, size=total, dtype=np.uint32).astype(np.uint16)
    tokens[ends[ends < total]] = 0
    return [tokens[k * BLOCK_TOKENS : (k + 1) * BLOCK_TOKENS] for k in range(count)]


def line_blocks(count: int, eos: int) -> list[np.ndarray]:
    """Every non-blank stdlib source line a document (about 40 ``bytes`` tokens): packing's hard case."""
    lines, size, total = [], 0, count * BLOCK_TOKENS
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        for line in path.read_bytes().splitlines():
            if line.strip() and b"\0" not in line:
                lines.append(line + b"\0")
                size += len(line) + 1
        if size >= total:
            break
    tokens = np.frombuffer(b"".join(lines)[:total], dtype=np.uint8).astype(np.uint16)
    tokens[tokens == 0] = eos
    return [tokens[k * BLOCK_TOKENS : (k + 1) * BLOCK_TOKENS] for k in range(count)]


def cut_figures(blocks: list[np.ndarray], eos: int, repeats: int) -> dict:
    """Per seq_len: each packing's shares cut, without beginning, the floor; conservation mismatches;
    and the time to pack a block against the time to decode it (medians over blocks of the best of
    ``repeats``, the two alternating so that other load hits both alike)."""
    out = {}
    frames = [encode_block(tokens) for tokens in blocks]
    for seq_len in SEQ_LENS:
        counts = {"concat": CutCounts(), "best_fit": CutCounts()}
        mismatched, pack_ms, decode_ms = 0, [], []
        for tokens, frame in zip(blocks, frames):
            windows, best = window_rows(tokens.size, seq_len), best_fit_rows(tokens, seq_len, eos)
            counts["concat"] += cut_counts(tokens, windows, eos)
            counts["best_fit"] += cut_counts(tokens, best, eos)
            packed = packed_rows(tokens, best)[:, :seq_len]
            mismatched += not np.array_equal(np.sort(packed, axis=None), np.sort(tokens[: best.num_rows * seq_len]))
            times = {"pack": [], "decode": []}
            for _ in range(repeats):
                started = time.perf_counter()
                decode_block(frame, num_tokens=tokens.size, dtype=tokens.dtype, where="bench")
                times["decode"].append(time.perf_counter() - started)
                started = time.perf_counter()
                packed_rows(tokens, best_fit_rows(tokens, seq_len, eos))
                times["pack"].append(time.perf_counter() - started)
            pack_ms.append(min(times["pack"]) * 1e3)
            decode_ms.append(min(times["decode"]) * 1e3)
        out[seq_len] = {name: _shares(c) for name, c in counts.items()} | {
            "blocks_not_conserved": mismatched,
            "pack_ms": statistics.median(pack_ms),
            "decode_ms": statistics.median(decode_ms),
        }
    return out


def _shares(c: CutCounts) -> dict:
    inner = c.documents - c.edge_documents
    return {
        "documents": c.documents,
        "cut_pct": 100 * c.documents_cut / c.documents,
        "without_beginning_pct": 100 * c.tokens_without_beginning / c.tokens,
        "floor_pct": 100 * c.floor / c.documents,
        "cut_pct_inner": 100 * (c.documents_cut - c.edge_documents_cut) / max(1, inner),
    }


def loader_trial(url: str, packing: str, args: argparse.Namespace, iterations: int) -> dict:
    """One loader: first batch, then the helper's CPU and next()'s CPU per step over ``args.steps`` steps."""
    started = time.perf_counter()
    with StreamingLoader(url, seq_len=args.seq_len, local_batch_size=args.rows, packing=packing) as loader:
        next(loader)
        first_batch_s = time.perf_counter() - started
        deadline = time.monotonic() + 120
        while loader.helper_pid is None and time.monotonic() < deadline:
            python_work(iterations)
            next(loader)
        pid = loader.helper_pid
        helper_start, next_ns = process_cpu_s(pid), []
        for _ in range(args.steps):
            python_work(iterations)
            cpu = time.thread_time_ns()
            batch = next(loader)
            next_ns.append(time.thread_time_ns() - cpu)
        helper_us = (process_cpu_s(pid) - helper_start) / args.steps * 1e6
        stats = loader.stats()
        del batch
    return {
        "first_batch_s": first_batch_s,
        "helper_cpu_us_per_step": helper_us,
        "next_us_median": statistics.median(next_ns) / 1e3,
        "pack_ms_per_block": stats["pack_s"] / max(1, stats["blocks_decoded"]) * 1e3,
        "decode_ms_per_block": stats["decode_s"] / max(1, stats["blocks_decoded"]) * 1e3,
    }


def loader_figures(url: str, args: argparse.Namespace) -> dict:
    iterations = calibrate(args.work_ms / 1e3)
    trials: dict[str, list[dict]] = {"concat": [], "best_fit": []}
    for pair in range(args.pairs):
        order = ("concat", "best_fit") if pair % 2 == 0 else ("best_fit", "concat")
        for packing in order:
            trials[packing].append(loader_trial(url, packing, args, iterations))
    keys = trials["concat"][0].keys()
    medians = {p: {k: statistics.median(t[k] for t in runs) for k in keys} for p, runs in trials.items()}
    ratios = {
        k: statistics.median(b[k] / c[k] for b, c in zip(trials["best_fit"], trials["concat"]) if c[k])
        for k in ("first_batch_s", "helper_cpu_us_per_step", "next_us_median")
    }
    return {"medians": medians, "ratios": ratios, "pairs": args.pairs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--data-dir", type=Path, default=Path("/tmp/bench-packing"))
    parser.add_argument("--web-blocks", type=int, default=8, help="synthetic web-like blocks (default 8)")
    parser.add_argument("--real-blocks", type=int, default=16, help="real-text blocks, spread over the dataset")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--work-ms", type=float, default=2.0)
    parser.add_argument("--repeats", type=int, default=5, help="timings per block (best of)")
    parser.add_argument("--skip-loader", action="store_true", help="part 1 only")
    args = parser.parse_args()
    args.data_dir.mkdir(parents=True, exist_ok=True)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)

    manifest = build_real_dataset(args.data_dir)
    url = str(args.data_dir / "definitions")
    with DatasetReader.open(url) as reader:
        picks = np.linspace(0, manifest.num_blocks - 2, min(args.real_blocks, manifest.num_blocks - 1)).astype(int)
        real = [reader.read_block(int(b)) for b in sorted(set(picks.tolist()))]
    eos = manifest.tokenizer.eos_id
    corpora = {
        "real text (stdlib cut at definitions, bytes)": cut_figures(real, eos, args.repeats),
        "web-like (log-normal, median 500, sigma 1.1)": cut_figures(web_like_blocks(args.web_blocks), 0, args.repeats),
        "lines (stdlib, a non-blank line a document)": cut_figures(line_blocks(4, eos), eos, args.repeats),
    }
    for name, figures in corpora.items():
        print(
            f"\n{name}: documents cut / tokens without their beginning / floor (docs > L), % of the same blocks;"
            f" ms to pack a block against ms to decode it"
        )
        print(
            f"{'L':>6} {'concat cut':>11} {'best_fit cut':>13} {'ratio':>6} {'concat w/o beg':>15} "
            f"{'best_fit w/o beg':>17} {'floor':>6} {'conserved':>9} {'pack ms':>8} {'decode ms':>10}"
        )
        for seq_len, f in figures.items():
            c, b = f["concat"], f["best_fit"]
            print(
                f"{seq_len:>6} {c['cut_pct']:>10.1f}% {b['cut_pct']:>12.1f}% "
                f"{b['cut_pct'] / max(c['cut_pct'], 1e-9):>6.2f} "
                f"{c['without_beginning_pct']:>14.1f}% {b['without_beginning_pct']:>16.1f}% {c['floor_pct']:>5.1f}% "
                f"{'yes' if not f['blocks_not_conserved'] else 'NO':>9} {f['pack_ms']:>8.2f} {f['decode_ms']:>10.2f}"
            )
    web = corpora["web-like (log-normal, median 500, sigma 1.1)"]
    checks = {
        "cut_ratio_2048": web[2048]["best_fit"]["cut_pct"] / web[2048]["concat"]["cut_pct"]
        <= TARGETS["cut_ratio_2048"],
        "cut_ratio_4096": web[4096]["best_fit"]["cut_pct"] / web[4096]["concat"]["cut_pct"]
        <= TARGETS["cut_ratio_4096"],
        "within_floor": all(
            f["best_fit"]["cut_pct"] <= TARGETS["floor_factor"] * f["concat"]["floor_pct"] + TARGETS["floor_points"]
            for f in web.values()
        ),
        "conserved": all(f["blocks_not_conserved"] == 0 for c in corpora.values() for f in c.values()),
    }
    result: dict = {"cuts": {name: {str(k): v for k, v in f.items()} for name, f in corpora.items()}, "checks": checks}
    if not args.skip_loader:
        loader = loader_figures(url, args)
        result["loader"] = loader
        print(
            f"\nloader, {args.rows} x {args.seq_len}, local disk, {args.pairs} pairs, medians "
            f"(load average now {os.getloadavg()[0]:.1f})"
        )
        for packing, m in loader["medians"].items():
            print(
                f"  {packing:>8}: first batch {m['first_batch_s'] * 1e3:7.1f} ms, "
                f"helper {m['helper_cpu_us_per_step']:6.0f}"
                f" us/step, next() {m['next_us_median']:5.1f} us, decode {m['decode_ms_per_block']:.2f} ms/block, "
                f"pack {m['pack_ms_per_block']:.2f} ms/block"
            )
        r = loader["ratios"]
        print(
            f"  best_fit / concat, median of pairs: helper CPU per step {r['helper_cpu_us_per_step']:.2f} "
            f"(target <= {TARGETS['helper_cpu_ratio']}), "
            f"first batch {r['first_batch_s']:.2f}, next() {r['next_us_median']:.2f}"
        )
        checks["helper_cpu"] = r["helper_cpu_us_per_step"] <= TARGETS["helper_cpu_ratio"]
    print("\ntargets: " + ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in checks.items()))
    result["load_average"] = os.getloadavg()[0]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
