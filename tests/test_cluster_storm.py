"""A small start-up storm across four nodes of a box through a store that throttles (benchmarks/bench_storm_nodes.py).

Four nodes of three ranks, recognised as nodes by srun's variables alone, open one dataset at once through a
token bucket of 20 requests/s answering 503 SlowDown beyond it, each node with today's limiter: no rank
fails, every 503 is counted by the ranks that got it, every rank's first batch is the unthrottled storm's,
the ranks of each node share one limiter, and no node keeps its cache. The figures themselves are the
benchmark's (docs/STORAGE.md); here they are only printed.
"""

from __future__ import annotations

import json

import pytest

from benchmarks.bench_storm_nodes import main
from cluster_helpers import needs_box


@pytest.mark.slow
@needs_box
def test_four_nodes_meet_a_throttling_store_and_get_their_unthrottled_first_batches(capsys) -> None:
    code = main(
        [
            "--nodes",
            "4",
            "--ranks",
            "12",
            "--rate",
            "20",
            "--tokens-m",
            "0.5",
            "--seq-len",
            "512",
            "--local-batch",
            "2",
            "--warmup",
            "0",
            "--kinds",
            "node,no limit",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    summary = json.loads(out.strip().splitlines()[-1])
    four = summary["configurations"]["4"]["node"]
    with capsys.disabled():
        print({k: four[k] for k in ("time_over_floor_median", "throttled_per_served", "served", "gets")})
    assert four["ranks_failed"] == 0, out
    assert four["first_batches_identical"] and four["every_throttle_counted"], out
    assert four["limiters_shared"] == [12]
    assert summary["configurations"]["4"]["node_cache_leftovers"] == 0
