"""Storage faults under the loader and the writer, through tools/fault_proxy.py.

The loader streams a dataset from S3 through the proxy at each fault rate and
must deliver the per-step hashes of a clean run; the writer converts S3 inputs
to an S3 output through the proxy and must write the bytes of a clean run.
"""

from __future__ import annotations

import time
from typing import Any

from tools.fault_proxy import FAULT_KINDS, FaultProxy
from tools.reliability.common import check, committed_objects, step_hashes

# How a total fault rate is split between kinds; every kind is drawn.
FAULT_MIX = {"error_500": 0.2, "error_503": 0.2, "reset": 0.2, "truncate": 0.2, "stall": 0.1, "slow_body": 0.1}
STALL_S = 0.5
SLOW_BODY_S = 0.2


def mixed_rates(total: float) -> dict[str, float]:
    """Per-kind rates summing to ``total``."""
    return {kind: total * share for kind, share in FAULT_MIX.items()}


def _faults(counts: dict[str, int]) -> dict[str, int]:
    return {kind: counts[kind] for kind in FAULT_KINDS}


def loader_under_faults(
    *,
    url: str,
    endpoint_url: str,
    storage_options: dict[str, Any],
    rates: tuple[float, ...],
    steps: int,
    seq_len: int = 256,
    local_batch_size: int = 8,
    seed: int = 0,
) -> dict[str, Any]:
    """Stream ``steps`` steps cleanly, then through the proxy at each rate.

    Returns:
        ``{"steps", "runs": [{"rate", "faults", "requests", "retries",
        "stall_s", "steps_differing", "seconds"}]}``.

    Raises:
        ScenarioFailure: a step's data differs from the clean run's, or no
            fault was injected at a non-zero rate.
    """
    from zephon_stream import StreamingLoader

    def run(options: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
        with StreamingLoader(
            url,
            seq_len=seq_len,
            local_batch_size=local_batch_size,
            seed=seed,
            storage_options=options,
            num_fetch_threads=4,
        ) as loader:
            hashes = step_hashes(loader, steps)
            return hashes, loader.stats()

    expected, _ = run(storage_options)
    runs = []
    for i, rate in enumerate(rates):
        proxy = FaultProxy(
            upstream=endpoint_url, rates=mixed_rates(rate), seed=1000 + i, stall_s=STALL_S, slow_body_s=SLOW_BODY_S
        )
        with proxy:
            started = time.perf_counter()
            got, stats = run({**storage_options, "endpoint_url": proxy.endpoint_url})
            seconds = time.perf_counter() - started
            counts = proxy.counts()
        differing = sum(a != b for a, b in zip(got, expected)) + abs(len(got) - len(expected))
        runs.append(
            {
                "rate": rate,
                "faults": _faults(counts),
                "requests": counts["requests"],
                "retries": stats["retries"],
                "storage_errors": stats["storage_errors"],
                "stall_s": round(stats["stall_s"], 3),
                "steps_differing": differing,
                "seconds": round(seconds, 2),
            }
        )
        check(differing == 0, f"loader at fault rate {rate}: {differing} of {steps} steps differ from the clean run")
        # At 1% a short run may draw no fault at all; only a run expecting
        # several must have seen one, or it proves nothing.
        check(
            rate * counts["requests"] < 5 or sum(_faults(counts).values()) > 0, f"fault rate {rate}: nothing injected"
        )
    return {"steps": steps, "runs": runs}


def writer_under_faults(
    *,
    inputs_url: str,
    out_url: str,
    endpoint_url: str,
    storage_options: dict[str, Any],
    rates: tuple[float, ...],
    tokenizer: str = "bytes",
    block_tokens: int = 4097,
    blocks_per_shard: int = 4,
) -> dict[str, Any]:
    """Convert S3 inputs (a glob) to an S3 output cleanly, then through the proxy
    at each rate (inputs, listing and output all through it).

    Returns:
        ``{"objects", "bytes", "runs": [{"rate", "faults", "requests",
        "objects_differing", "seconds"}]}``.

    Raises:
        ScenarioFailure: any output object differs from the clean run's.
    """
    from zephon_stream import write_dataset

    def write(out: str, options: dict[str, Any]) -> dict[str, bytes]:
        write_dataset(
            inputs_url,
            out,
            tokenizer=tokenizer,
            block_tokens=block_tokens,
            blocks_per_shard=blocks_per_shard,
            storage_options=options,
            progress=False,
        )
        return committed_objects(out, storage_options)

    expected = write(f"{out_url}/clean", storage_options)
    check("manifest" in expected, "the clean write committed no manifest")
    runs = []
    for i, rate in enumerate(rates):
        proxy = FaultProxy(
            upstream=endpoint_url, rates=mixed_rates(rate), seed=2000 + i, stall_s=STALL_S, slow_body_s=SLOW_BODY_S
        )
        with proxy:
            started = time.perf_counter()
            got = write(f"{out_url}/rate{i}", {**storage_options, "endpoint_url": proxy.endpoint_url})
            seconds = time.perf_counter() - started
            counts = proxy.counts()
        differing = sorted(p for p in expected.keys() | got.keys() if expected.get(p) != got.get(p))
        runs.append(
            {
                "rate": rate,
                "faults": _faults(counts),
                "requests": counts["requests"],
                "objects_differing": len(differing),
                "seconds": round(seconds, 2),
            }
        )
        check(not differing, f"writer at fault rate {rate}: objects differ from the clean run: {differing[:5]}")
        # At 1% a short run may draw no fault at all; only a run expecting
        # several must have seen one, or it proves nothing.
        check(
            rate * counts["requests"] < 5 or sum(_faults(counts).values()) > 0, f"fault rate {rate}: nothing injected"
        )
    return {"objects": len(expected), "bytes": sum(map(len, expected.values())), "runs": runs}
