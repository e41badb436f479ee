"""Storage faults on every real backend (SeaweedFS, fake-gcs-server, Azurite),
through tools/fault_proxy.py or by killing the server: transient answers are
retried by ``RetryPolicy`` alone and counted, and the data are bit-identical
to a clean run; permanent errors fail at once and name the object."""

from __future__ import annotations

import base64
import threading
import time

import pytest

from tools.azurite import METADATA_SAVE_INTERVAL_S, connection_string
from tools.fault_proxy import FaultProxy
from tools.reliability.common import step_hashes
from zephon_stream import StreamingLoader
from zephon_stream.errors import ObjectMissingError, StorageError
from zephon_stream.storage import RetryPolicy, copy_dataset, open_store

FAST_RETRY = RetryPolicy(
    max_attempts=8,
    initial_backoff_s=0.01,
    max_backoff_s=0.1,
    timeout_s=20,
    throttle_initial_backoff_s=0.01,
    throttle_max_backoff_s=0.1,
)
OBJECT = bytes(range(256)) * 2048
RANGE_BYTES = 20_000
NUM_READS = 16
# The Azure SDK retries a body cut short inside ``download_blob`` (3 tries,
# 1 s apart, not configurable), so truncation is not in Azure's matrix.
TRANSIENT = {
    "seaweedfs": ("error_503", "error_500", "error_429", "reset", "truncate"),
    "gcs": ("error_503", "error_500", "error_429", "reset", "truncate"),
    "azure": ("error_503", "error_500", "error_429", "reset"),
}


def read_ranges(store) -> list[bytes]:
    step = (len(OBJECT) - RANGE_BYTES) // NUM_READS
    return [store.read_range("obj", i * step, i * step + RANGE_BYTES) for i in range(NUM_READS)]


def expected_ranges() -> list[bytes]:
    step = (len(OBJECT) - RANGE_BYTES) // NUM_READS
    return [OBJECT[i * step : i * step + RANGE_BYTES] for i in range(NUM_READS)]


def test_transient_answers_are_retried_by_the_policy_and_counted(object_store):
    url = object_store.url("faults")
    with open_store(url, object_store.storage_options) as store:
        store.write_atomic("obj", OBJECT)
    for kind in TRANSIENT[object_store.backend]:
        with (
            FaultProxy(upstream=object_store.server.endpoint_url, rates={kind: 0.3}, seed=5) as proxy,
            open_store(url, object_store.options_via(proxy.endpoint_url), retry=FAST_RETRY) as store,
        ):
            got = read_ranges(store)
            injected = proxy.counts()[kind]
            requests = proxy.counts()["requests"]
            stats = store.stats()
        assert got == expected_ranges(), kind
        assert injected > 0, kind
        # A 429 is the store throttling: counted apart from the other retries.
        counted = "throttled" if kind == "error_429" else "retries"
        assert stats[counted] == injected and stats["retries"] + stats["throttled"] == injected, (kind, stats)
        # One attempt per client call: every request the proxy saw beyond
        # the reads is one it failed, so no client library retried on its own.
        assert requests == NUM_READS + injected, (kind, requests, injected)


def test_loader_through_mixed_faults_reads_the_clean_batches(object_store, small_dataset):
    url = object_store.url("ds")
    copy_dataset(small_dataset.url, url, dst_options=object_store.storage_options)
    settings = {"seq_len": 256, "local_batch_size": 12, "seed": 2}
    with StreamingLoader(small_dataset.url, **settings) as local:
        expected = step_hashes(local, 30)
    rates = {"error_503": 0.08, "error_500": 0.08, "reset": 0.08}
    with (
        FaultProxy(upstream=object_store.server.endpoint_url, rates=rates, seed=9) as proxy,
        StreamingLoader(url, storage_options=object_store.options_via(proxy.endpoint_url), **settings) as loader,
    ):
        got = step_hashes(loader, 30)
        retries = loader.stats()["retries"]
        injected = sum(proxy.counts()[kind] for kind in rates)
    assert got == expected
    assert injected > 0 and retries > 0, (injected, retries)


def test_server_killed_mid_stream_and_restarted_costs_retries_not_data(object_store, small_dataset):
    url = object_store.url("ds")
    copy_dataset(small_dataset.url, url, dst_options=object_store.storage_options)
    if object_store.backend == "azure":
        time.sleep(METADATA_SAVE_INTERVAL_S + 0.5)
    settings = {"seq_len": 256, "local_batch_size": 12, "seed": 4, "pipeline": "threads"}
    # 5 steps share a ring slot here, so the producer may have read the
    # first ~40 steps before the kill; 120 steps need every block again.
    with StreamingLoader(small_dataset.url, **settings) as local:
        expected = step_hashes(local, 120)
    server = object_store.server
    with StreamingLoader(url, storage_options=object_store.storage_options, **settings) as loader:
        got = step_hashes(loader, 2)
        server.kill()
        restart = threading.Timer(1.0, server.restart)
        restart.start()
        try:
            got += step_hashes(loader, 118)
        finally:
            restart.join()
        retries = loader.stats()["retries"]
    assert got == expected
    assert retries > 0


def _fails_fast(store, read, match: str, error_type: type[Exception] = StorageError) -> Exception:
    started = time.monotonic()
    with pytest.raises(error_type) as info:
        read(store)
    # A client library's own backoff would take 20 s and more; the bound
    # leaves a busy machine room (the first call also builds the client).
    assert time.monotonic() - started < 15
    assert store.stats()["retries"] == 0
    assert match in str(info.value)
    return info.value


def test_permanent_errors_fail_at_once_and_name_the_object(object_store):
    url = object_store.url("perm")
    with open_store(url, object_store.storage_options) as store:
        store.write_atomic("obj", OBJECT)
        _fails_fast(store, lambda s: s.read("absent"), f"{url}/absent", ObjectMissingError)
    with (
        FaultProxy(upstream=object_store.server.endpoint_url, rates={"error_403": 1.0}) as proxy,
        open_store(url, object_store.options_via(proxy.endpoint_url)) as store,
    ):
        error = _fails_fast(store, lambda s: s.read_range("obj", 0, 10), f"{url}/obj")
        assert "not retryable" in str(error)


@pytest.mark.parametrize("object_store", ["seaweedfs", "azure"], indirect=True)
def test_bad_credentials_fail_at_once_and_name_the_object(object_store):
    """fake-gcs-server checks no credentials; SeaweedFS and Azurite check signatures."""
    url = object_store.url("creds")
    with open_store(url, object_store.storage_options) as store:
        store.write_atomic("obj", OBJECT)
    if object_store.backend == "azure":
        wrong_key = base64.b64encode(b"not the account key of this server").decode()
        options = {"connection_string": connection_string(object_store.server.endpoint_url, wrong_key)}
    else:
        options = {**object_store.storage_options, "secret": "not-the-secret-value"}
    with open_store(url, options) as store:
        error = _fails_fast(store, lambda s: s.read("obj"), f"{url}/obj")
    assert "not retryable" in str(error)


def test_each_clients_error_is_classified_by_its_status():
    """The errors botocore, gcsfs and azure-core raise (built here as they raise
    them) are retried on 5xx, 408, 429, S3's throttling and timeout codes and on
    broken connections, not on 401/403."""
    from azure.core.exceptions import ClientAuthenticationError, HttpResponseError, ServiceRequestError
    from botocore.exceptions import ClientError
    from gcsfs.retry import HttpError

    from zephon_stream.storage.retry import describe_error, is_transient

    def azure_error(status: int, code: str, kind: type[HttpResponseError] = HttpResponseError) -> Exception:
        error = kind(message=f"{code} answered")
        error.status_code, error.error_code = status, code
        return error

    def s3_error(status: int, code: str) -> Exception:
        return ClientError({"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "GetObject")

    # S3 answers RequestTimeout with status 400: the code decides.
    assert all(is_transient(s3_error(*answer)) for answer in ((503, "SlowDown"), (500, "InternalError"),
                                                             (400, "RequestTimeout")))  # fmt: skip
    assert not is_transient(s3_error(403, "AccessDenied")) and not is_transient(s3_error(400, "InvalidRequest"))
    assert all(is_transient(HttpError({"code": code, "message": "m"})) for code in (500, 502, 503, 408, 429))
    assert not any(is_transient(HttpError({"code": code, "message": "m"})) for code in (400, 401, 403))
    assert is_transient(azure_error(503, "ServerBusy")) and is_transient(azure_error(500, "InternalError"))
    assert not is_transient(azure_error(403, "AuthenticationFailed", ClientAuthenticationError))
    assert is_transient(ServiceRequestError("connection refused"))
    assert describe_error(azure_error(503, "ServerBusy")).endswith("[HTTP 503 ServerBusy]")
    assert describe_error(HttpError({"code": 429, "message": "slow down"})).endswith("[HTTP 429]")
