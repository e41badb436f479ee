"""Secrets across a full write + load + fault run (tools/reliability/secrets.py):
keys given as storage options, in a URL, in the environment and as CLI
--storage-option never appear in logs, warnings, printed output, reprs,
exception messages or CLI subprocess output."""

from __future__ import annotations

import pytest

from tools.reliability import secrets


@pytest.mark.slow
def test_no_secret_in_any_output_of_a_write_load_and_fault_run(small_dataset, s3_bucket, tmp_path):
    result = secrets.secrets_run(
        endpoint_url=s3_bucket.endpoint_url,
        bucket=s3_bucket.bucket,
        inputs=list(small_dataset.sources[:6]),
        work=tmp_path,
        steps=20,
    )
    assert result["leaks"] == []
    assert result["errors_seen"] >= 4
    assert result["outputs_searched"] > 20
