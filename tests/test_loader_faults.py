"""Storage trouble under the loader, on S3 (moto) through a loopback fault
proxy: an endpoint outage mid-run is survived with the same data; a loader on
S3 leaves no thread or socket behind after close()."""

from __future__ import annotations

import threading
import time

import pytest

from loader_reference import run_step_hashes
from tools.reliability.common import open_fds
from zephon_stream import StreamingLoader
from zephon_stream.storage import copy_dataset, open_store

SEQ_LEN = 256
STEPS = 60


@pytest.mark.slow
def test_an_endpoint_outage_mid_run_is_survived_with_the_same_data(small_dataset, s3_bucket, fault_proxy):
    url = s3_bucket.url("data")
    copy_dataset(small_dataset.url, url, dst_options=s3_bucket.storage_options)
    with StreamingLoader(small_dataset.url, seq_len=SEQ_LEN, local_batch_size=8) as local:
        expected = run_step_hashes([local], STEPS)
    proxy = fault_proxy()
    options = s3_bucket.options_via(proxy.endpoint_url)
    with StreamingLoader(
        url, seq_len=SEQ_LEN, local_batch_size=8, storage_options=options, prefetch_steps=2, num_fetch_threads=2
    ) as loader:
        got = run_step_hashes([loader], 5)
        outage = threading.Thread(target=proxy.outage, args=(2.0,))
        outage.start()
        started = time.monotonic()
        got += run_step_hashes([loader], STEPS - 5)
        outage.join()
        stats = loader.stats()
    assert got == expected
    assert stats["retries"] > 0, "the outage never hit a read; the test proves nothing"
    assert time.monotonic() - started >= 1.5
    assert stats["stall_s"] > 1.0


def own_threads():
    """Live threads, less the in-process S3 server's per-connection threads
    (they serve the server and end as its clients hang up)."""
    return {t for t in threading.enumerate() if "process_request_thread" not in t.name}


@pytest.mark.slow
@pytest.mark.parametrize("pipeline", ["threads", "process"])
def test_close_on_s3_leaves_no_thread_or_socket(small_dataset, s3_bucket, pipeline):
    url = s3_bucket.url("data")
    copy_dataset(small_dataset.url, url, dst_options=s3_bucket.storage_options)
    # Warm fsspec's process-wide event-loop thread first; it is shared by
    # every fsspec filesystem of the process and is not the loader's.
    with open_store(url, s3_bucket.storage_options) as store:
        store.read("manifest")
    threads, socks = own_threads(), open_fds()["socket"]
    # Sockets watched while the loader reads: a connection is open only
    # while it is used or kept alive, and on a busy machine the loader may
    # have read every block it needs before the 20th step.
    reading, peak = threading.Event(), [socks]

    def watch() -> None:
        while not reading.wait(0.002):
            peak[0] = max(peak[0], open_fds()["socket"])

    watcher = threading.Thread(target=watch)
    watcher.start()
    loader = StreamingLoader(
        url, seq_len=SEQ_LEN, local_batch_size=8, storage_options=s3_bucket.storage_options, pipeline=pipeline
    )
    for _ in zip(range(20), loader):
        pass
    reading.set()
    watcher.join()
    assert peak[0] > socks, "no connection was ever open; the check below proves nothing"
    loader.close()
    assert own_threads() - threads == set()
    # moto runs in this process; give its side of each connection a moment to close.
    deadline = time.monotonic() + 30
    while open_fds()["socket"] > socks and time.monotonic() < deadline:
        time.sleep(0.05)
    assert open_fds()["socket"] <= socks
