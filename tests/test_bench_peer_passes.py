"""benchmarks/peer_passes.py, the harness behind bench_peers' comparison: it
counts a reader's children in its peak memory, counts only the trainer's own
thread in the CPU per step, and reports a pass's figures from a fresh process
(zephon_stream's reader; the peers are not installed here)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import pytest

from benchmarks import peer_passes
from benchmarks.peer_passes import PeakMemory, measure, process_tree, run_pass


def test_peak_memory_counts_a_child_process_that_holds_memory():
    hold_mib = 96
    code = f"import time; block = bytearray({hold_mib} << 20); print('held', flush=True); time.sleep(30)"
    with PeakMemory(interval_s=0.02) as memory:
        before_rss = memory.peak_rss
        child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        try:
            assert child.stdout.readline().strip() == "held"
            assert child.pid in process_tree(os.getpid())
            time.sleep(0.2)
        finally:
            child.kill()
            child.wait()
    assert memory.peak_rss - before_rss >= (hold_mib - 8) << 20
    assert 0 < memory.peak_pss <= memory.peak_rss


@pytest.mark.slow
def test_a_zephon_pass_reports_its_first_batch_steady_rate_and_memory(small_dataset):
    figures = run_pass("zephon", small_dataset.url, batch=4, seq_len=256, min_seconds=0.5, timeout_s=300)
    assert figures["lib"] == "zephon" and figures["batch"] == 4 and figures["seq_len"] == 256
    assert 0 < figures["first_batch_s"] < 120
    assert figures["steady_s"] >= 0.5 and figures["steady_batches"] > 0
    rate = figures["steady_batches"] * 4 * 256 / figures["steady_s"]
    assert figures["steady_tokens_per_s"] == pytest.approx(rate)
    # The helper process reads; the trainer's thread pays at most the wall time of a step.
    assert (
        figures["step_cpu_us"] > 0
        and 0 < figures["step_cpu_mean_us"] * 1e-6 <= figures["steady_s"] / figures["steady_batches"]
    )
    # The interpreter holds torch: far above 50 MiB; the helper's pages are counted in the PSS too.
    assert 50 < figures["peak_pss_mib"] <= figures["peak_rss_mib"]


def test_a_pass_that_fails_names_the_reader_and_its_error(tmp_path):
    with pytest.raises(RuntimeError, match=r"zephon pass at batch 2 exited 1: .*"):
        run_pass("zephon", str(tmp_path / "no-such-dataset"), batch=2, seq_len=128, min_seconds=0.1, timeout_s=300)


def test_cpu_per_step_counts_work_in_the_trainers_thread_not_waiting_nor_other_threads(monkeypatch):
    def spinning(args, options):  # reads in the trainer's thread, as a loader with no worker does
        while True:
            end = time.thread_time() + 0.002
            while time.thread_time() < end:
                pass
            yield None

    def waiting(args, options):  # a batch that a worker made: the trainer's thread only waits for it
        while True:
            time.sleep(0.002)
            yield None

    monkeypatch.setattr(peer_passes, "import_reader", lambda lib: None)
    monkeypatch.setattr(peer_passes, "READERS", {"spinning": spinning, "waiting": waiting})
    figures = {}
    for lib in ("spinning", "waiting"):
        args = argparse.Namespace(lib=lib, batch=1, seq_len=8, min_seconds=0.3, workers=0)
        figures[lib] = measure(args, None)
    assert figures["spinning"]["step_cpu_us"] >= 2000 and figures["spinning"]["step_cpu_mean_us"] >= 2000
    assert figures["waiting"]["step_cpu_us"] < 500
    assert figures["waiting"]["steady_batches"] > 10
