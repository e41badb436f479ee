"""Loader counters: what the pipeline did, per step and in total."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

COUNTER_KEYS = (
    "steps",
    "samples",
    "bytes_fetched",
    "blocks_fetched",
    "blocks_decoded",
    "cache_hits",
    "cache_misses",
    "fetch_s",
    "decode_s",
    "pack_s",
    "assemble_s",
    "stall_s",
    "stalled_steps",
)


class LoaderStats:
    """Thread-safe counters shared by the pipeline threads and the consumer.

    ``stall_s`` is the time the consumer spent waiting for a batch that was
    not ready; ``stalled_steps`` counts the steps where it waited at all.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, float] = dict.fromkeys(COUNTER_KEYS, 0)
        self.last_step_stall_s = 0.0

    def add(self, **deltas: float) -> None:
        """Add to counters (unknown names are a bug, hence KeyError)."""
        with self._lock:
            for key, delta in deltas.items():
                self._counts[key] += delta

    def record_step(self, samples: int, stall_s: float = 0.0, stall_threshold_s: float = 1e-4) -> None:
        """Count one step handed to the consumer and how long it waited for it.

        Called by the consumer's thread alone, the only writer of these
        counters, so without the lock (a step's counts change between two
        reads of a snapshot at worst; each count is whole)."""
        counts = self._counts
        counts["steps"] += 1
        counts["samples"] += samples
        if stall_s:
            counts["stall_s"] += stall_s
            if stall_s > stall_threshold_s:
                counts["stalled_steps"] += 1
        self.last_step_stall_s = stall_s

    def values(self, keys: tuple[str, ...]) -> list[float]:
        """The counters ``keys``, in that order, read together."""
        with self._lock:
            return [self._counts[key] for key in keys]

    def snapshot(self, **extra: Any) -> dict[str, Any]:
        """Totals, per-step averages and ``extra`` values, as plain numbers."""
        with self._lock:
            out: dict[str, Any] = {
                key: (int(value) if not key.endswith("_s") else float(value)) for key, value in self._counts.items()
            }
            out["last_step_stall_s"] = self.last_step_stall_s
        steps = max(1, out["steps"])
        out["stall_s_per_step"] = out["stall_s"] / steps
        out["bytes_fetched_per_step"] = out["bytes_fetched"] / steps
        out.update(extra)
        return out


# What the producer (helper process or thread) publishes in the ring's
# header after each step, in this order: its own LoaderStats counters
# (PIPELINE_KEYS; the consumer counts steps, samples and stalls itself), then
# the store's and the cache's.
CONSUMER_KEYS = ("steps", "samples", "stall_s", "stalled_steps")
PIPELINE_KEYS = tuple(key for key in COUNTER_KEYS if key not in CONSUMER_KEYS)
PRODUCER_KEYS = PIPELINE_KEYS + (
    "retries",
    "throttled",
    "throttle_waits",
    "throttle_wait_s",
    "storage_errors",
    "cache_resident_bytes",
    "cache_peak_bytes",
    "cache_capacity_bytes",
    "cache_forced_reservations",
    "producer_steps",
)


def read_counters(area: Any) -> dict[str, Any]:
    """The producer's counters from a float64 array, as plain numbers."""
    raw = area[: len(PRODUCER_KEYS)].tolist()
    return {key: (float(v) if key.endswith("_s") else int(v)) for key, v in zip(PRODUCER_KEYS, raw)}


# What a producer run publishes about its cache right now; every other
# producer counter is a total of its run.
CACHE_GAUGE_KEYS = ("cache_resident_bytes", "cache_peak_bytes", "cache_capacity_bytes")


class RunTotals:
    """The producer counters of a whole loader run: the runs that ended
    (phases, seeks, a helper taking over, a restarted helper) added to the
    ones in progress.

    A producer run publishes its own counters from zero (loader/producer/pipeline.py);
    ``fold`` keeps them when the run ends, so totals never drop.
    """

    def __init__(self) -> None:
        self._ended: dict[str, Any] = {key: 0 for key in PRODUCER_KEYS}

    def fold(self, ended: dict[str, Any]) -> None:
        """Keep the final counters of a run that has ended."""
        for key, value in ended.items():
            if key == "cache_peak_bytes":
                self._ended[key] = max(self._ended[key], value)
            elif key not in CACHE_GAUGE_KEYS:
                self._ended[key] += value

    def totals(self, running: list[dict[str, Any]], *, stores: Sequence[Any] = ()) -> dict[str, Any]:
        """The totals so far, with the counters of the runs in progress.

        The cache's resident bytes are those of the runs in progress, its
        capacity that of the newest of them, its peak the most any run held.
        ``stores`` are the consumer's own stores: their retries, throttling
        answers, waits for a turn and errors count whole, from the dataset's opening (its manifests) through
        every run on threads; runs publish only their own stores' (a helper
        process's).
        """
        out = dict(self._ended)
        for store in stores:
            counts = store.stats()
            out["retries"] += counts["retries"]
            out["throttled"] += counts["throttled"]
            out["throttle_waits"] += counts["throttle_waits"]
            out["throttle_wait_s"] += counts["throttle_wait_ms"] / 1000.0
            out["storage_errors"] += counts["errors"]
        out["cache_resident_bytes"] = out["cache_capacity_bytes"] = 0
        for counters in running:
            for key, value in counters.items():
                if key == "cache_peak_bytes":
                    out[key] = max(out[key], value)
                elif key == "cache_capacity_bytes":
                    out[key] = value
                else:
                    out[key] += value
        return out
