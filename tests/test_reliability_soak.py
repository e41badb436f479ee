"""Long runs and churn (tools/reliability/soak.py): RSS stays flat over many
epochs, and loaders opened and closed again and again (local and S3) leave no
thread, socket or file descriptor behind."""

from __future__ import annotations

import pytest

from tools.reliability import soak
from zephon_stream.storage import copy_dataset


@pytest.mark.slow
def test_rss_stays_flat_over_many_epochs(small_dataset):
    result = soak.long_run(url=small_dataset.url, epochs=30, growth_bound_bytes=16 << 20)
    assert result["steps"] > 1000
    assert result["growth_after_warmup_mib"] <= 16


@pytest.mark.slow
def test_local_loaders_opened_and_closed_leave_nothing_behind(small_dataset):
    result = soak.churn(url=small_dataset.url, cycles=8, pipeline="threads")
    assert result["max_threads_open"] > result["threads_before"], "the loader ran no thread; nothing was checked"
    assert result["threads_after"] == result["threads_before"]
    assert all(result["fds_after"][k] <= result["fds_before"][k] for k in result["fds_before"])


@pytest.mark.slow
def test_helper_processes_opened_and_closed_leave_nothing_behind(small_dataset):
    result = soak.churn(url=small_dataset.url, cycles=8, pipeline="process")
    assert result["max_children_open"] == 1, "no helper process ran; nothing was checked"
    assert result["children_after"] == 0
    assert result["threads_after"] == result["threads_before"]
    assert all(result["fds_after"][k] <= result["fds_before"][k] for k in result["fds_before"])


@pytest.mark.slow
def test_s3_loaders_opened_and_closed_leave_no_socket_behind(small_dataset, s3_bucket):
    url = s3_bucket.url("data")
    copy_dataset(small_dataset.url, url, dst_options=s3_bucket.storage_options)
    # Threads, so that the stores' sockets are this process's to count.
    result = soak.churn(url=url, cycles=4, storage_options=s3_bucket.storage_options, pipeline="threads")
    assert result["max_sockets_open"] > result["fds_before"]["socket"], "no socket was opened; nothing was checked"
    assert all(result["fds_after"][k] <= result["fds_before"][k] for k in result["fds_before"])
    assert result["threads_after"] == result["threads_before"]
