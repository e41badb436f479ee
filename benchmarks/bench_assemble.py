"""What native code would buy the step assembly: the producer's ``StepAssembler``
(numpy) against the same work fused into one C loop, on the same ring slots.

Input: the first 16 decoded blocks of the benchmark dataset (the Python standard
library sources written with the ``bytes`` tokenizer, see bench_read.py); each
step copies ``--local-batch`` rows of ``L + 1`` tokens from random samples of
those blocks into a ring slot and writes the slot's int64 ``input``, ``labels``
and ``positions``, rotating over the ring's slots as the producer does.

Figures (µs per step, the best of ``--repeats``):
- numpy: ``StepAssembler.assemble``, what the producer runs;
- fused C: one pass per row (copy, widen, positions), compiled here with the
  system's C compiler (skipped, with a message, where there is none);
- write floor: ``np.copyto`` of the step's three int64 arrays from a cached
  source, the memory traffic any assembly of the int64 CPU contract pays.

The last printed line is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from benchmarks.bench_read import build_dataset, dataset_parser
from zephon_stream.format.block import decode_block
from zephon_stream.loader import WIDE_KEYS, SharedRing, SlotLayout, StepAssembler
from zephon_stream.storage import open_store

_FUSED_C = r"""
#include <stdint.h>
#include <string.h>
void assemble(const uint16_t **blocks, const int64_t *starts, int rows, int L, int64_t eos,
              uint16_t *tokens, int64_t *input, int64_t *labels, int64_t *positions) {
    for (int r = 0; r < rows; r++) {
        uint16_t *row = tokens + (int64_t)r * (L + 1);
        memcpy(row, blocks[r] + starts[r], (size_t)(L + 1) * sizeof(uint16_t));
        int64_t *in = input + (int64_t)r * L, *lb = labels + (int64_t)r * L, *ps = positions + (int64_t)r * L;
        int64_t position = 0;
        for (int i = 0; i < L; i++) {
            in[i] = row[i];
            lb[i] = row[i + 1];
            ps[i] = position;
            position = row[i] == eos ? 0 : position + 1;
        }
    }
}
"""


def compile_fused(workdir: Path) -> ctypes.CDLL | None:
    """The fused C assembly as a shared library, or None without a C compiler."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    source, library = workdir / "assemble.c", workdir / "assemble.so"
    source.write_text(_FUSED_C)
    subprocess.run([compiler, "-O3", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    lib = ctypes.CDLL(str(library))
    pointer = ctypes.c_void_p
    lib.assemble.argtypes = [
        ctypes.POINTER(pointer),
        pointer,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int64,
        pointer,
        pointer,
        pointer,
        pointer,
    ]
    return lib


def best_us_per_step(run, steps: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best / steps * 1e6


def measure(ring: SharedRing, blocks: list[np.ndarray], *, eos: int, args: argparse.Namespace, workdir: Path) -> dict:
    """The figures, each step written into the ring's slots in turn.

    The slot views live only in this call: the ring's shared memory can close
    once it returns.
    """
    rows, seq_len = args.local_batch, args.seq_len
    slots = ring.producer_slots()
    rng = np.random.default_rng(0)
    picks = rng.integers(0, len(blocks), (args.steps, rows))
    samples = rng.integers(0, (min(len(b) for b in blocks) - 1) // seq_len, (args.steps, rows))
    step_blocks = [[blocks[i] for i in row] for row in picks.tolist()]
    assembler = StepAssembler(seq_len=seq_len)

    def numpy_steps() -> None:
        for k in range(args.steps):
            assembler.assemble(step_blocks[k], samples[k], eos, slots[k % len(slots)])

    source = np.arange(rows * seq_len, dtype=np.int64).reshape(rows, seq_len)

    def write_floor() -> None:
        for k in range(args.steps):
            wide = slots[k % len(slots)].wide
            for key in WIDE_KEYS:
                np.copyto(wide[key], source)

    figures = {
        "seq_len": seq_len,
        "local_batch": rows,
        "steps": args.steps,
        "numpy_us_per_step": best_us_per_step(numpy_steps, args.steps, args.repeats),
    }
    # What numpy wrote for the last step, to check the C loop against.
    expected = {key: slots[(args.steps - 1) % len(slots)].wide[key].copy() for key in WIDE_KEYS}
    figures["write_floor_us_per_step"] = best_us_per_step(write_floor, args.steps, args.repeats)
    lib = compile_fused(workdir)
    if lib is None:
        print("no C compiler (cc, gcc): the fused C figure is skipped")
        return figures
    pointers = [(ctypes.c_void_p * rows)(*[b.ctypes.data for b in row]) for row in step_blocks]
    starts = samples * seq_len

    def fused_steps() -> None:
        for k in range(args.steps):
            slot = slots[k % len(slots)]
            lib.assemble(
                pointers[k],
                starts[k].ctypes.data,
                rows,
                seq_len,
                eos,
                slot.tokens.ctypes.data,
                *(slot.wide[key].ctypes.data for key in WIDE_KEYS),
            )

    figures["fused_c_us_per_step"] = best_us_per_step(fused_steps, args.steps, args.repeats)
    last = slots[(args.steps - 1) % len(slots)]
    assert all(np.array_equal(last.wide[key], expected[key]) for key in WIDE_KEYS), "C and numpy differ"
    return figures


def main() -> None:
    parser = dataset_parser(__doc__)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rows, seq_len = args.local_batch, args.seq_len

    with tempfile.TemporaryDirectory() as tmp:
        manifest = build_dataset(Path(args.data_dir or tmp) / "stdlib-bytes", blocks_per_shard=2)
        root = Path(args.data_dir or tmp) / "stdlib-bytes"
        with open_store(str(root)) as store:
            blocks = [
                decode_block(
                    store.read_range(*manifest.block_byte_range(b)),
                    num_tokens=manifest.block_num_tokens(b),
                    dtype=manifest.np_dtype,
                    where=f"block {b}",
                )
                for b in range(min(16, manifest.num_blocks))
            ]
        eos = manifest.tokenizer.eos_id
        layout = SlotLayout(rows=rows, seq_len=seq_len, token_dtype=manifest.np_dtype.str, wide_keys=WIDE_KEYS)
        ring = SharedRing.create(num_slots=8, layout=layout)
        try:
            figures = measure(ring, blocks, eos=eos, args=args, workdir=Path(tmp))
        finally:
            ring.close()

    fused = figures.get("fused_c_us_per_step")
    print(
        f"{rows} x {seq_len} per step: numpy {figures['numpy_us_per_step']:.1f} µs, "
        + (f"fused C {fused:.1f} µs ({figures['numpy_us_per_step'] / fused:.2f}x), " if fused else "")
        + f"int64 write floor {figures['write_floor_us_per_step']:.1f} µs"
    )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
