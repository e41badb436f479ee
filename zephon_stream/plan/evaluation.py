"""The evaluation order: every sample of held-out datasets once per pass, in a fixed order.

No shuffle and no lanes: sequence index ``i`` walks stream 0's blocks in id
order, each block's samples in order, then stream 1's, and so on. Step ``t``
of a pass covers indices ``[t * B, (t + 1) * B)``; rank ``r`` of ``W`` takes the
contiguous ``B / W`` of them starting at ``t * B + r * B / W``. The last step is
padded to ``B`` rows with indices past the end, marked invalid, so every rank
takes ``ceil(N / B)`` steps. docs/ORDER.md ("Evaluation") specifies it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from zephon_stream.errors import ConfigError
from zephon_stream.plan.shape import StreamShape
from zephon_stream.plan.slicing import check_slice_args


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class EvalSlice:
    """One rank's rows of one evaluation step.

    Attributes:
        step: the step within the pass.
        indices: sequence index of each row (``>= num_samples`` on padding rows).
        valid: False on padding rows, which must not count in the metrics.
        stream, block, sample: the address of each row; a padding row holds
            the address of index ``indices mod num_samples``, so it can be
            read like any other.
    """

    step: int
    indices: np.ndarray
    valid: np.ndarray
    stream: np.ndarray
    block: np.ndarray
    sample: np.ndarray


class EvalOrder:
    """The sequential evaluation order over datasets at one seq_len.

    Args:
        shapes: one ``StreamShape`` per held-out dataset.
        seq_len: tokens per sample input.

    Raises:
        ConfigError: no dataset, a bad seq_len, or no sample at all.
    """

    def __init__(self, shapes: list[StreamShape], seq_len: int) -> None:
        if not shapes:
            raise ConfigError("the evaluation order needs at least one dataset")
        if seq_len < 1:
            raise ConfigError(f"seq_len must be >= 1, got {seq_len}")
        self.shapes = list(shapes)
        self.seq_len = seq_len
        # Runs of blocks with equal sample counts (full runs and single
        # short blocks), so an index finds its block by one search however
        # large the dataset.
        starts, first_block, per_block, stream_of = [], [], [], []
        total = 0
        for s, shape in enumerate(self.shapes):
            spb = shape.samples_per_full_block(seq_len)
            short_samples = shape.short_block_samples(seq_len)
            block = 0
            for short_id, count in zip(shape.short_ids.tolist(), short_samples.tolist()):
                for run_first, run_blocks, each in ((block, short_id - block, spb), (short_id, 1, count)):
                    if run_blocks * each:
                        starts.append(total)
                        first_block.append(run_first)
                        per_block.append(each)
                        stream_of.append(s)
                        total += run_blocks * each
                block = short_id + 1
            if (shape.num_blocks - block) * spb:
                starts.append(total)
                first_block.append(block)
                per_block.append(spb)
                stream_of.append(s)
                total += (shape.num_blocks - block) * spb
        if total == 0:
            reasons = "; ".join(
                f"dataset {s} ({shape.label}): {shape.no_samples_reason(seq_len)}"
                for s, shape in enumerate(self.shapes)
            )
            raise ConfigError(f"no sample of seq_len {seq_len} in the evaluation datasets: {reasons}")
        self.num_samples = total
        self._starts = np.array(starts, dtype=np.int64)
        self._first_block = np.array(first_block, dtype=np.int64)
        self._per_block = np.array(per_block, dtype=np.int64)
        self._stream = np.array(stream_of, dtype=np.int64)

    def num_steps(self, global_batch: int) -> int:
        """Steps of one pass at ``global_batch`` rows a step (the last one padded)."""
        if global_batch < 1:
            raise ConfigError(f"global batch must be >= 1, got {global_batch}")
        return -(-self.num_samples // global_batch)

    def sample_at(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(stream, block, sample)`` of sequence indices in ``[0, num_samples)``."""
        indices = np.asarray(indices, dtype=np.int64)
        if indices.size and (int(indices.min()) < 0 or int(indices.max()) >= self.num_samples):
            raise ConfigError(
                f"evaluation indices must lie in [0, {self.num_samples}), got "
                f"{int(indices.min())}..{int(indices.max())}"
            )
        run = np.searchsorted(self._starts, indices, side="right") - 1
        block, sample = np.divmod(indices - self._starts[run], self._per_block[run])
        return self._stream[run], self._first_block[run] + block, sample

    def rank_slice(self, step: int, global_batch: int, world_size: int, rank: int) -> EvalSlice:
        """Rank ``rank``'s rows of evaluation step ``step`` (padding rows marked).

        Raises:
            ConfigError: a step outside the pass, ``world_size`` not dividing
                ``global_batch``, or a bad rank.
        """
        check_slice_args(0, global_batch, world_size, rank)
        steps = self.num_steps(global_batch)
        if not 0 <= step < steps:
            raise ConfigError(f"evaluation step {step} outside [0, {steps}) at global batch {global_batch}")
        rows = global_batch // world_size
        first = step * global_batch + rank * rows
        indices = np.arange(first, first + rows, dtype=np.int64)
        stream, block, sample = self.sample_at(indices % self.num_samples)
        return EvalSlice(
            step=step,
            indices=indices,
            valid=indices < self.num_samples,
            stream=stream,
            block=block,
            sample=sample,
        )
