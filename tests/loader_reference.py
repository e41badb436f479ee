"""Reference reads and hashes for loader tests, independent of the pipeline.

``DirectReader`` decodes blocks straight from the manifest's byte ranges, so a
loader row can be checked against the tokens at its plan address.
``zephon_stream.loader.front.audit.union_sha256`` hashes one global step from every rank's rows, sorted by
global position, so runs at different world sizes compare bit for bit.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from zephon_stream.format.block import decode_block
from zephon_stream.format.manifest import Manifest
from zephon_stream.loader.front.audit import union_sha256
from zephon_stream.plan.packing import best_fit_rows, packed_rows
from zephon_stream.storage import open_store


class DirectReader:
    """Decoded blocks of one or more datasets, read one block at a time."""

    def __init__(self, urls: Sequence[str], storage_options: dict | None = None) -> None:
        self.stores = [open_store(url, storage_options) for url in urls]
        self.manifests = [Manifest.read(store) for store in self.stores]
        self._blocks: dict[tuple[int, int], np.ndarray] = {}
        self._packed: dict[tuple[int, int, int], np.ndarray] = {}

    def block(self, stream: int, block: int) -> np.ndarray:
        key = (stream, block)
        if key not in self._blocks:
            manifest = self.manifests[stream]
            path, start, end = manifest.block_byte_range(block)
            data = self.stores[stream].read_range(path, start, end)
            tokens = int(manifest.block_token_counts()[block])
            self._blocks[key] = decode_block(data, num_tokens=tokens, dtype=manifest.np_dtype, where=path)
        return self._blocks[key]

    def sample(self, stream: int, block: int, sample: int, seq_len: int, packing: str = "concat") -> np.ndarray:
        """The ``seq_len + 1`` tokens of one sample (its inputs, then its last label), as int64.

        Under ``"best_fit"``: row ``sample`` of the block's best-fit rows,
        computed here from the block's tokens (``plan/packing.py``).
        """
        if packing == "best_fit":
            key = (stream, block, seq_len)
            if key not in self._packed:
                tokens = self.block(stream, block)
                eos = int(self.manifests[stream].tokenizer.eos_id)
                self._packed[key] = packed_rows(tokens, best_fit_rows(tokens, seq_len, eos))
            return self._packed[key][sample].astype(np.int64)
        start = sample * seq_len
        return self.block(stream, block)[start : start + seq_len + 1].astype(np.int64)

    def close(self) -> None:
        for store in self.stores:
            store.close()


def reference_positions(inputs: np.ndarray, eos_id: int) -> np.ndarray:
    """Positions restarting after each EOS, computed token by token."""
    out = np.zeros_like(inputs)
    for r in range(inputs.shape[0]):
        pos = 0
        for t in range(inputs.shape[1]):
            out[r, t] = pos
            pos = 0 if inputs[r, t] == eos_id else pos + 1
    return out


def run_step_hashes(loaders: Sequence, steps: int) -> list[str]:
    """Per-step union hashes of several loaders driven in lockstep (one per rank)."""
    hashes = []
    iterators = [iter(loader) for loader in loaders]
    for _ in range(steps):
        batches = [next(it) for it in iterators]
        hashes.append(
            union_sha256((b["sample_positions"].numpy(), b["input"].numpy(), b["labels"].numpy()) for b in batches)
        )
    return hashes


def resume_points(order, global_batch: int, manifest, *, max_steps: int = 2000) -> dict[str, int]:
    """Steps (of ``global_batch`` samples, lanes = ``global_batch``) to resume at.

    ``mid_block``: the steps just before and just after the cut read the same
    blocks, so the cut is inside each of them.
    ``mid_shard``: also, the first row's block is not its shard's first block.
    ``epoch``: the first step of stream 0's second epoch.
    """

    def blocks(step):
        piece = order.rank_slice(step * global_batch, global_batch, 1, 0)
        return [(int(s), int(b)) for s, b in zip(piece.stream, piece.block)]

    def inside_blocks(step):
        return blocks(step - 1) == blocks(step)

    assert order.lanes == global_batch
    mid_block = next(k for k in range(2, max_steps) if inside_blocks(k))
    mid_shard = next(
        k
        for k in range(mid_block + 1, max_steps)
        if inside_blocks(k) and manifest.block_location(blocks(k)[0][1])[1] > 0
    )
    return {"mid_block": mid_block, "mid_shard": mid_shard, "epoch": order.streams[0].lane_length}


def steps_until_the_helper_serves(loader, *, pause_s: float = 0.02, timeout_s: float = 120.0) -> int:
    """Take steps, pausing between them, until the loader's helper process
    serves them (the first steps of a run may come from threads while the
    helper starts); returns how many were taken."""
    deadline = time.monotonic() + timeout_s
    taken = 0
    while loader.helper_pid is None:
        assert time.monotonic() < deadline, f"no helper took over within {timeout_s} s"
        next(loader)
        taken += 1
        time.sleep(pause_s)
    return taken
