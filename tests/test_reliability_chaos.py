"""Storage faults end to end (tools/reliability/chaos.py): through the fault
proxy at 20% mixed faults the loader delivers the clean run's exact steps and
the writer (S3 inputs, S3 output) writes the clean run's exact bytes."""

from __future__ import annotations

import pytest

from tools.reliability import chaos
from zephon_stream.storage import copy_dataset, open_store


@pytest.mark.slow
def test_loader_through_20_percent_faults_delivers_the_clean_steps(small_dataset, s3_bucket):
    url = s3_bucket.url("data")
    copy_dataset(small_dataset.url, url, dst_options=s3_bucket.storage_options)
    result = chaos.loader_under_faults(
        url=url, endpoint_url=s3_bucket.endpoint_url, storage_options=s3_bucket.storage_options, rates=(0.2,), steps=80
    )
    run = result["runs"][0]
    assert run["steps_differing"] == 0
    assert sum(run["faults"].values()) > 0 and run["retries"] > 0
    assert run["storage_errors"] == 0


@pytest.mark.slow
def test_writer_through_20_percent_faults_writes_the_clean_bytes(small_dataset, s3_bucket):
    with open_store(s3_bucket.url("in"), s3_bucket.storage_options) as store:
        for path in small_dataset.sources[:8]:
            store.write_atomic(path.name, path.read_bytes())
    result = chaos.writer_under_faults(
        inputs_url=s3_bucket.url("in/*.py"),
        out_url=s3_bucket.url("out"),
        endpoint_url=s3_bucket.endpoint_url,
        storage_options=s3_bucket.storage_options,
        rates=(0.2,),
    )
    run = result["runs"][0]
    assert result["objects"] > 3
    assert run["objects_differing"] == 0
    assert sum(run["faults"].values()) > 0
