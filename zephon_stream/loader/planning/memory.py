"""The loader's memory bound, computed from its config before anything runs.

Each lane walks its blocks in order; the window shuffle spreads a block's
samples over the windows that overlap it (windows are aligned to the epoch
sequence, docs/ORDER.md), so a block is used within a range of
``samples_per_block + spread`` lane steps, with gaps shorter than ``spread``,
where ``spread`` is ``2 * window``, or 0 when the window divides the block's
samples (the default window is one block: a window is exactly one block). A
block is fetched when a step within the fetch horizon needs it and released
when no step of the retention horizon does. So each lane the rank reads holds
at most the blocks overlapping ``samples_per_block + spread +
fetch_lane_steps`` samples, plus one for a lane or epoch boundary and one for
a short block. The total is that, times the lanes the rank
reads, times the decoded bytes of a block, plus the compressed bytes in
flight, the batch ring shared by the trainer and the helper process, and
the helper process itself (its interpreter and libraries).

Under ``packing="best_fit"`` the cache holds each block as its packed rows
(``R x (L + 1)`` tokens, a little more than the block), and each decode
thread, while it packs a block, also holds the block's decoded tokens and the
packing's working arrays: at most ``PACKING_WORK_BYTES_PER_TOKEN`` a token,
reached when every token is a document of its own (web-length documents need
about 0.2, 40-token lines about 11; measured with tracemalloc).
"""

from __future__ import annotations

import dataclasses
import math

from zephon_stream.errors import ConfigError

MIB = 1 << 20
PACKING_WORK_BYTES_PER_TOKEN = 96


def packing_work_bytes(*, block_tokens: int, itemsize: int) -> int:
    """One block being packed: its decoded tokens and the packing's working arrays."""
    return block_tokens * (itemsize + PACKING_WORK_BYTES_PER_TOKEN)


def period_steps(*, lanes: int, global_batch: int) -> int:
    """Steps after which the (lane, step) pattern of every rank repeats."""
    return lanes // math.gcd(lanes, global_batch)


def window_spread(*, window: int, samples_per_block: int) -> int:
    """Lane steps by which the window shuffle can spread a block's uses.

    With windows aligned to the epoch sequence and ``window`` dividing
    the full block's samples, each full block is a union of whole windows, so
    its uses are contiguous. A short block may still share a window with its
    neighbour; its rare early release costs at most a re-fetch, never data.
    """
    window = max(1, window)
    return 0 if samples_per_block % window == 0 else 2 * window


def retention_steps(*, spread: int, lanes: int, global_batch: int, fetch_steps: int) -> int:
    """Steps planned ahead so that a block unused that long is done for its epoch.

    A lane advances ``global_batch / lanes`` samples a step; a block's uses
    within one lane are never more than ``spread`` lane steps apart (see
    :func:`window_spread`), and a rank revisits a lane at least once per
    :func:`period_steps`.
    """
    lane_steps = spread + 2
    return (
        math.ceil(lane_steps * lanes / global_batch)
        + period_steps(lanes=lanes, global_batch=global_batch)
        + fetch_steps
        + 1
    )


def blocks_per_lane(*, spread: int, samples_per_block: int, lanes: int, global_batch: int, fetch_steps: int) -> int:
    """Most blocks one lane keeps resident at once (see the module docstring)."""
    assert samples_per_block >= 1
    fetch_lane_steps = math.ceil((fetch_steps + 1) * global_batch / lanes) + 1
    span = samples_per_block + spread + fetch_lane_steps
    return math.ceil(span / samples_per_block) + 2


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class MemoryBound:
    """What the loader may hold at once, by part (bytes).

    Attributes:
        resident_blocks: decoded blocks resident or in flight, at most.
        block_bytes: decoded bytes of the largest block.
        cache_bytes: ``resident_blocks * block_bytes``; also the cache capacity.
        compressed_bytes: compressed frames being fetched or waiting to decode.
        ring_bytes: the batch ring: steps queued ahead of the consumer, the
            one being assembled, and those the consumer holds or copies
            (shared memory, pinned where CUDA is the device).
        helper_bytes: the helper process's own interpreter and libraries
            (0 with ``pipeline="threads"``).
        handover_bytes: a second producer run's cache, frames in flight and
            ring, while two overlap: a run on threads and the helper taking
            it over, or a phase's run and the next one started ahead of the
            boundary (0 where runs never overlap).
        packing_bytes: under ``packing="best_fit"``, the blocks being packed,
            one per decode thread (their decoded tokens and the working
            arrays); 0 otherwise.
    """

    resident_blocks: int
    block_bytes: int
    cache_bytes: int
    compressed_bytes: int
    ring_bytes: int
    helper_bytes: int
    handover_bytes: int = 0
    packing_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        """The bound: the sum of the parts."""
        return (
            self.cache_bytes
            + self.compressed_bytes
            + self.ring_bytes
            + self.helper_bytes
            + self.handover_bytes
            + self.packing_bytes
        )

    def describe(self) -> str:
        """One line: the total and each part, in MiB."""
        packing = f" + {self.packing_bytes / MIB:.1f} MiB for the blocks being packed" if self.packing_bytes else ""
        return (
            f"{self.total_bytes / MIB:.1f} MiB = {self.resident_blocks} decoded blocks x "
            f"{self.block_bytes / MIB:.2f} MiB + {self.compressed_bytes / MIB:.1f} MiB compressed in flight + "
            f"{self.ring_bytes / MIB:.1f} MiB batch ring + {self.helper_bytes / MIB:.1f} MiB helper process + "
            f"{self.handover_bytes / MIB:.1f} MiB of a second run during a hand-over{packing}"
        )


def compute_memory_bound(
    *,
    lanes_read: int,
    blocks_per_lane: int,
    block_bytes: int,
    max_compressed_block_bytes: int,
    num_fetch_threads: int,
    num_decode_threads: int,
    ring_bytes: int,
    helper_bytes: int,
    handover: bool = False,
    packing_bytes: int = 0,
) -> MemoryBound:
    """The bound for one rank's loader.

    Args:
        lanes_read: distinct lanes this rank reads within a retention horizon.
        blocks_per_lane: from :func:`blocks_per_lane`.
        block_bytes: decoded bytes of the largest block of any stream.
        max_compressed_block_bytes: the largest compressed frame of any stream.
        num_fetch_threads: each holds one compressed frame while it reads.
        num_decode_threads: each holds one, and as many wait in the queue.
        ring_bytes: bytes of the batch ring.
        helper_bytes: the helper process's own footprint, or 0.
        handover: whether two producer runs of this size may overlap.
        packing_bytes: the blocks being packed (one per decode thread, each
            :func:`packing_work_bytes`), or 0.
    """
    resident = lanes_read * blocks_per_lane
    compressed = (num_fetch_threads + 2 * num_decode_threads) * max_compressed_block_bytes
    return MemoryBound(
        resident_blocks=resident,
        block_bytes=block_bytes,
        cache_bytes=resident * block_bytes,
        compressed_bytes=compressed,
        ring_bytes=ring_bytes,
        helper_bytes=helper_bytes,
        handover_bytes=resident * block_bytes + compressed + ring_bytes + packing_bytes if handover else 0,
        packing_bytes=packing_bytes,
    )


def check_memory(bound: MemoryBound, max_memory_bytes: int | None) -> None:
    """Refuse a config whose bound exceeds ``max_memory_bytes``.

    Raises:
        ConfigError: names the bound, its parts and what to change.
    """
    if max_memory_bytes is None or bound.total_bytes <= max_memory_bytes:
        return
    raise ConfigError(
        f"loader memory bound {bound.total_bytes} bytes exceeds max_memory_bytes={max_memory_bytes} "
        f"({bound.describe()}); to fit, lower prefetch_steps, the shuffle window, local_batch_size "
        f"or num_fetch_threads/num_decode_threads, write smaller blocks, or raise max_memory_bytes"
    )
