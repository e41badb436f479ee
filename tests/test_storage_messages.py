"""What a user reads when a store cannot be used: missing credentials name the
variables and options to set; an endpoint that cannot be reached is said once,
at the first retry, with where it is (no secret), and the failure comes once,
in one message. Against real servers and a loopback port nothing listens on."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from tools.server_process import free_ports
from zephon_stream import StreamingLoader
from zephon_stream.errors import StorageError
from zephon_stream.storage import RetryPolicy, copy_dataset, open_store

QUICK = RetryPolicy(max_attempts=4, initial_backoff_s=0.01, max_backoff_s=0.05, connect_timeout_s=5)


@pytest.fixture
def no_aws_credentials(monkeypatch, tmp_path):
    """No AWS credential anywhere botocore looks: variables, files, instance metadata."""
    for name in list(os.environ):
        if name.startswith("AWS_") and name != "AWS_CA_BUNDLE":
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def assert_names_what_to_set(message: str) -> None:
    for name in (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_PROFILE",
        "AWS_ENDPOINT_URL",
        "storage_options=",
        "'key'",
        "'secret'",
        "'endpoint_url'",
        "--storage-option",
    ):
        assert name in message, (name, message)


def test_s3_without_credentials_names_the_variables_and_options_to_set(s3_bucket, no_aws_credentials):
    with open_store(s3_bucket.url("data"), {"endpoint_url": s3_bucket.endpoint_url}, retry=QUICK) as store:
        with pytest.raises(StorageError) as info:
            store.read("manifest")
        assert store.stats()["retries"] == 0
    assert f"read {s3_bucket.url('data')}/manifest" in str(info.value)
    assert_names_what_to_set(str(info.value))


def test_a_loader_on_s3_without_credentials_says_what_to_set(s3_bucket, no_aws_credentials, small_dataset):
    url = s3_bucket.url("ds")
    copy_dataset(small_dataset.url, url, dst_options=s3_bucket.storage_options)
    with pytest.raises(StorageError) as info:
        StreamingLoader(url, storage_options={"endpoint_url": s3_bucket.endpoint_url}, seq_len=64, local_batch_size=2)
    assert_names_what_to_set(str(info.value))


def test_seaweedfs_without_credentials_says_what_to_set(seaweedfs_server, no_aws_credentials):
    options = {"endpoint_url": seaweedfs_server.storage_options()["endpoint_url"]}
    with open_store("s3://zs-none/x", options, retry=QUICK) as store, pytest.raises(StorageError) as info:
        store.read("manifest")
    assert_names_what_to_set(str(info.value))


def test_azure_without_credentials_names_the_variables_and_options_to_set(monkeypatch):
    for name in list(os.environ):
        if name.startswith("AZURE_STORAGE_"):
            monkeypatch.delenv(name)
    with open_store("az://container/ds", {}, retry=QUICK) as store, pytest.raises(StorageError) as info:
        store.read("manifest")
    message = str(info.value)
    for name in (
        "AZURE_STORAGE_CONNECTION_STRING",
        "AZURE_STORAGE_ACCOUNT_NAME",
        "AZURE_STORAGE_ACCOUNT_KEY",
        "'connection_string'",
        "--storage-option connection_string=",
    ):
        assert name in message, (name, message)


@pytest.mark.parametrize("path", ["read", "read_range"])
def test_an_unreachable_endpoint_is_said_once_at_the_first_retry_and_fails_once(caplog, path):
    endpoint = f"http://127.0.0.1:{free_ports(1)[0]}"  # A port just released: nothing listens
    options = {"endpoint_url": endpoint, "key": "AKIDEXAMPLE", "secret": "wJalrXUtnFEMI-not-shown"}
    caplog.set_level(logging.INFO, logger="zephon_stream.storage")
    with open_store("s3://bucket/ds", options, retry=QUICK) as store:
        for _ in range(2):  # The second operation is the same outage: no second warning
            with pytest.raises(StorageError) as info:
                store.read("manifest") if path == "read" else store.read_range("manifest", 0, 10)
            assert "4 attempts" in str(info.value) and "s3://bucket/ds/manifest" in str(info.value)
    records = [r for r in caplog.records if r.name == "zephon_stream.storage"]
    warnings = [r for r in records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    said = warnings[0].getMessage()
    assert f"cannot reach {endpoint}" in said and "s3://bucket/ds" in said and "retrying" in said
    assert "wJalrXUtnFEMI" not in said and "AKIDEXAMPLE" not in said
    # Said at the first failed attempt, not after the retries ran out.
    attempts = [r for r in records if "attempt" in r.getMessage() and r.levelno < logging.WARNING]
    assert records.index(warnings[0]) == records.index(attempts[0]) + 1


def test_a_store_that_comes_back_is_said_again_at_its_next_outage(s3_bucket, fault_proxy, caplog):
    proxy = fault_proxy()
    caplog.set_level(logging.WARNING, logger="zephon_stream.storage")
    with open_store(s3_bucket.url("data"), s3_bucket.options_via(proxy.endpoint_url), retry=QUICK) as store:
        store.write_atomic("x", b"abc")
        for _ in range(2):
            proxy.stop()
            with pytest.raises(StorageError):
                store.read("x")
            proxy.start()
            assert store.read("x") == b"abc"
    said = [r.getMessage() for r in caplog.records if "cannot reach" in r.getMessage()]
    assert len(said) == 2, said


def test_the_command_line_says_once_it_is_retrying_and_fails_with_one_message():
    endpoint = f"http://127.0.0.1:{free_ports(1)[0]}"  # A port just released: nothing listens
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI-not-shown"}
    code = "import sys; from zephon_stream.cli import main; sys.exit(main())"
    result = subprocess.run(
        [sys.executable, "-c", code, "inspect", "s3://bucket/ds", "--storage-option", f"endpoint_url={endpoint}"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode != 0
    assert sum(f"cannot reach {endpoint}" in line for line in lines) == 1, lines
    assert sum("attempts" in line and "failed" in line for line in lines) == 1, lines
    assert "EndpointConnectionError" in result.stderr and "wJalrXUtnFEMI" not in result.stderr + result.stdout
    assert lines[0].endswith("retrying, for up to 10 attempts or 120 s per operation"), lines
