"""Memory: a loader run's peak RSS growth stays within its computed bound plus
a stated constant, measured in a fresh subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from zephon_stream import write_dataset

PROBE = Path(__file__).parent / "dist_loader" / "loader_memory_probe.py"
# What the bound does not model: malloc arena slack, thread stacks
# touched, numpy/torch temporaries and Python objects of the pipeline.
RSS_SLACK_BYTES = 24 << 20
BLOCK_TOKENS = 2**17 + 1  # 256 KiB decoded per block


@pytest.fixture(scope="module")
def big_block_dataset(stdlib_corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("big_blocks")
    write_dataset(
        [str(p) for p in stdlib_corpus.files],
        str(out),
        tokenizer="bytes",
        block_tokens=BLOCK_TOKENS,
        blocks_per_shard=4,
        progress=False,
    )
    return str(out)


@pytest.mark.slow
@pytest.mark.parametrize("pipeline", ["process", "threads"])
def test_peak_rss_stays_within_the_memory_bound_plus_a_constant(big_block_dataset, pipeline):
    result = subprocess.run(
        [
            sys.executable,
            str(PROBE),
            "--data",
            big_block_dataset,
            "--seq-len",
            "1024",
            "--local-batch",
            "4",
            "--steps",
            "600",
            "--pipeline",
            pipeline,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["blocks_fetched"] >= 8, figures  # the run walked through many blocks
    assert figures["forced_reservations"] == 0, figures
    assert figures["cache_peak_bytes"] <= figures["cache_capacity_bytes"], figures
    assert figures["growth_bytes"] <= figures["bound_bytes"] + RSS_SLACK_BYTES, figures
    assert (figures["helper_peak_bytes"] > 0) == (pipeline == "process"), figures
