"""benchmarks/bench_startup_storm.py's simulated rank, on local disk: what the storm's figures are built from.

The storm itself (SeaweedFS, the throttling proxy, node processes) runs as a
benchmark; here one node's ranks run on threads as the benchmark runs them,
so that its per-rank counts and the node cache's sharing they rest on stay true.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from benchmarks.bench_startup_storm import parse_policy, run_rank
from benchmarks.storm_figures import model


def ranks_of_one_node(url: str, ranks: list[int], cache: Path) -> dict[int, dict]:
    job = {"url": url, "options": None, "seq_len": 512, "local_batch": 2, "world_size": 4, "node_cache": str(cache)}
    go, out = threading.Event(), {}
    threads = [threading.Thread(target=run_rank, args=(r, job, go, out)) for r in ranks]
    for thread in threads:
        thread.start()
    go.set()
    for thread in threads:
        thread.join()
    return out


def test_ranks_of_a_node_read_its_metadata_once_and_get_the_batches_of_ranks_alone(small_dataset, tmp_path):
    together = ranks_of_one_node(small_dataset.url, [0, 1], tmp_path / "node")
    alone = {r: ranks_of_one_node(small_dataset.url, [r], tmp_path / f"alone{r}")[r] for r in (0, 1)}
    assert all(v["ok"] for v in [*together.values(), *alone.values()]), (together, alone)
    assert together[0]["sha256"] == alone[0]["sha256"] != together[1]["sha256"] == alone[1]["sha256"]
    metadata_alone = sum(v["gets"] - v["blocks"] for v in alone.values())
    metadata_together = sum(v["gets"] - v["blocks"] for v in together.values())
    # The manifest at least is read once for the node, not once a rank.
    assert 0 < metadata_together < metadata_alone
    assert all(v["throttled"] == v["retries"] == 0 for v in together.values())
    assert not (tmp_path / "node").exists()  # The node's last loader removed its cache


def test_storm_model_scales_the_measured_requests_per_rank_and_node():
    run = {"blocks_per_rank": [4, 4, 4, 4], "gets_per_rank": [9, 4, 7, 4], "gets": 24}
    args = type("Args", (), {"ranks_per_node": 2, "job_ranks": 2048})()
    out = model(run, overhead=1.25, rank_s=0.5, args=args)
    assert out["measured"]["data_gets_per_rank"] == 4
    assert out["measured"]["metadata_gets_per_node"] == (24 - 16) / 2
    row = out["computed"]["2048 ranks, metadata as measured"]
    assert row["requests"] == 2048 * 4 + 1024 * 4
    assert row["time_s"] == max(row["requests"] / 5500 * 1.25, 0.5)


def test_storm_policy_takes_retry_policy_fields():
    assert parse_policy(["throttle_max_backoff_s=5", "max_attempts=3"]) == {
        "throttle_max_backoff_s": 5.0,
        "max_attempts": 3,
    }
    # The baseline storm's default: today's backoff, before the node's limiter.
    assert parse_policy(["throttle_limiter=0"]) == {"throttle_limiter": False}


@pytest.mark.parametrize("item", ["throttle_cap=5", "throttle_max_backoff_s", "throttle_max_backoff_s=-1"])
def test_storm_policy_refuses_what_retry_policy_does_not_take(item):
    with pytest.raises(ValueError, match="throttle"):
        parse_policy([item])
