"""The fault proxy and the embedded S3 server that the storage tests stand on:
they must forward faithfully, inject exactly what they are told, and be
restartable on the same port."""

from __future__ import annotations

import http.client
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tools.fault_proxy import FaultProxy
from tools.server_process import free_ports
from zephon_stream.storage import open_store
from zephon_stream.storage.embedded_s3 import EmbeddedS3

REPO = Path(__file__).resolve().parent.parent
# moto refuses anonymous reads of a private bucket but does not verify
# signatures, so a well-formed (unverified) Authorization header suffices.
AUTH = "AWS4-HMAC-SHA256 Credential=testing-key-id/20260101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=00"


def _get(endpoint: str, path: str, headers: dict[str, str] | None = None, method: str = "GET"):
    host, port = endpoint.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request(method, path, headers={"Authorization": AUTH, **(headers or {})})
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def run_proxy_script(upstream: str, path: str, args: list[str], requests: int) -> tuple[list[int], list[str]]:
    """Run tools/fault_proxy.py as a script with ``args``, GET ``path`` through it ``requests`` times,
    stop it with SIGTERM: ``(the statuses, the lines it printed)``."""
    port = free_ports(1)[0]
    process = subprocess.Popen(
        [sys.executable, str(REPO / "tools" / "fault_proxy.py"), "--upstream", upstream, "--port", str(port), *args],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        assert "fault proxy" in process.stdout.readline()
        statuses = [_get(f"http://127.0.0.1:{port}", path)[0] for _ in range(requests)]
    finally:
        process.send_signal(signal.SIGTERM)
        out, _ = process.communicate(timeout=30)
    return statuses, out.strip().splitlines()


@pytest.fixture
def stored(s3_bucket):
    payload = os.urandom(100_000)
    with open_store(s3_bucket.url("p"), s3_bucket.storage_options) as store:
        store.write_atomic("obj.bin", payload)
    return f"/{s3_bucket.bucket}/p/obj.bin", payload


def test_proxy_forwards_range_requests_and_headers_faithfully(s3_bucket, fault_proxy, stored):
    path, payload = stored
    proxy = fault_proxy()
    direct = _get(s3_bucket.endpoint_url, path, {"Range": "bytes=1000-1999"})
    proxied = _get(proxy.endpoint_url, path, {"Range": "bytes=1000-1999"})
    assert proxied[0] == direct[0] == 206
    assert proxied[2] == direct[2] == payload[1000:2000]
    volatile = {"date", "x-amzn-requestid", "connection", "server"}
    assert {k: v for k, v in proxied[1].items() if k not in volatile} == {
        k: v for k, v in direct[1].items() if k not in volatile
    }
    assert proxied[1]["content-range"] == f"bytes 1000-1999/{len(payload)}"
    head = _get(proxy.endpoint_url, path, method="HEAD")
    assert head[0] == 200 and head[1]["content-length"] == str(len(payload)) and head[2] == b""


def test_signed_requests_through_the_proxy_reach_the_server(s3_bucket, fault_proxy, stored):
    _, payload = stored
    proxy = fault_proxy()
    with open_store(s3_bucket.url("p"), s3_bucket.options_via(proxy.endpoint_url)) as store:
        assert store.read_range("obj.bin", 5, 500) == payload[5:500]
        store.write_atomic("put-through-proxy", b"abc")
        assert store.list() == ["obj.bin", "put-through-proxy"]
    assert proxy.counts()["requests"] >= 3


def test_same_seed_injects_the_same_faults(fault_proxy, stored):
    path, _ = stored
    rates = {"error_500": 0.2, "error_503": 0.2}
    outcomes = []
    for _ in range(2):
        proxy = fault_proxy(rates=rates, seed=42)
        outcomes.append([_get(proxy.endpoint_url, path)[0] for _ in range(30)])
        counts = proxy.counts()
        assert counts["requests"] == 30
        assert counts["error_500"] == outcomes[-1].count(500) and counts["error_503"] == outcomes[-1].count(503)
        proxy.stop()
    assert outcomes[0] == outcomes[1]
    assert {500, 503, 200} <= set(outcomes[0])


def test_fail_every_answers_every_nth_eligible_request_and_lists_each(fault_proxy, stored):
    path, payload = stored
    proxy = fault_proxy(fail_every=3, fault_methods=("GET",))
    statuses = [_get(proxy.endpoint_url, path, {"Range": f"bytes={i}-{i + 9}"})[0] for i in range(7)]
    head = _get(proxy.endpoint_url, path, method="HEAD")[0]
    assert statuses == [206, 206, 503, 206, 206, 503, 206] and head == 200
    assert proxy.counts()["error_503"] == proxy.failed() == 2
    # The path without its query string, so a presigned URL's signature is never kept.
    assert proxy.injected() == [("error_503", "GET", path, "bytes=2-11"), ("error_503", "GET", path, "bytes=5-14")]
    proxy.set_fail_every(None)
    assert {_get(proxy.endpoint_url, path)[0] for _ in range(4)} == {200}
    proxy.set_fail_every(1, times=2)
    assert [_get(proxy.endpoint_url, path)[0] for _ in range(3)] == [503, 503, 200] and len(proxy.injected()) == 4
    with pytest.raises(ValueError, match="fail_every"):
        proxy.set_fail_every(0)


def test_truncated_body_sends_fewer_bytes_than_content_length(fault_proxy, stored):
    path, payload = stored
    proxy = fault_proxy(rates={"truncate": 1.0})
    with pytest.raises(http.client.IncompleteRead) as info:
        _get(proxy.endpoint_url, path)
    assert len(info.value.partial) == len(payload) // 2
    assert proxy.counts()["truncate"] == 1


def test_reset_drops_the_connection(fault_proxy, stored):
    path, _ = stored
    proxy = fault_proxy(rates={"reset": 1.0})
    with pytest.raises((ConnectionError, http.client.RemoteDisconnected)):
        _get(proxy.endpoint_url, path)
    assert proxy.counts()["reset"] == 1


def test_latency_stall_and_slow_body_delay_but_deliver(fault_proxy, stored):
    path, payload = stored
    for kwargs, minimum_s in (
        ({"latency_s": 0.05}, 0.05),
        ({"rates": {"stall": 1.0}, "stall_s": 0.3}, 0.3),
        ({"rates": {"slow_body": 1.0}, "slow_body_s": 0.3}, 0.25),
    ):
        proxy = fault_proxy(**kwargs)
        started = time.monotonic()
        status, _, body = _get(proxy.endpoint_url, path)
        assert status == 200 and body == payload
        assert time.monotonic() - started >= minimum_s
        proxy.stop()


def test_stopped_proxy_refuses_connections_and_restarts_on_the_same_port(fault_proxy, stored):
    path, payload = stored
    proxy = fault_proxy()
    port = proxy.port
    assert _get(proxy.endpoint_url, path)[2] == payload
    proxy.stop()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    proxy.start()
    assert proxy.port == port
    assert _get(proxy.endpoint_url, path)[2] == payload


def test_bad_rates_are_refused(s3_server):
    with pytest.raises(ValueError, match="unknown"):
        FaultProxy(upstream=s3_server.endpoint_url, rates={"explode": 0.1})
    with pytest.raises(ValueError, match="sum"):
        FaultProxy(upstream=s3_server.endpoint_url, rates={"reset": 0.7, "stall": 0.7})


def test_proxy_script_runs_and_reports_counts(s3_server, stored):
    path, payload = stored
    statuses, lines = run_proxy_script(s3_server.endpoint_url, path, ["--rate", "error_503=0.5", "--seed", "1"], 10)
    counts = json.loads(lines[-1])
    assert counts["requests"] == 10 and counts["error_503"] == statuses.count(503) > 0


def test_embedded_s3_moves_off_a_taken_port(caplog):
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        taken = blocker.getsockname()[1]
        with caplog.at_level(logging.WARNING, logger="zephon_stream.storage"):
            with EmbeddedS3(port=taken) as server:
                assert server.port != taken
                assert server.create_bucket("moved-port") == "s3://moved-port"
    assert f"port {taken}" in caplog.text and "in use" in caplog.text


@pytest.mark.slow
def test_embedded_s3_in_a_subprocess_serves_other_processes():
    with EmbeddedS3(subprocess=True) as server:
        server.create_bucket("sub-bucket")
        code = (
            "from zephon_stream.storage import open_store\n"
            "s = open_store('s3://sub-bucket/x')\n"
            "s.write_atomic('hello', b'from a child')\n"
            "print(s.read('hello').decode())\n"
        )
        result = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, **server.env()},
        )
        assert result.stdout.strip() == "from a child", result.stderr
        with open_store("s3://sub-bucket/x", server.storage_options()) as store:
            assert store.read("hello") == b"from a child"
    assert server.port == 0


def test_s3_server_script_prints_its_endpoint_and_creates_buckets():
    process = subprocess.Popen(
        [sys.executable, str(REPO / "tools" / "s3_server.py"), "--bucket", "made-by-script"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        first = process.stdout.readline()
        assert "S3 server on http://127.0.0.1:" in first
        env = dict(
            line.removeprefix("export ").strip().split("=", 1) for line in (process.stdout.readline() for _ in range(5))
        )
        with open_store(
            "s3://made-by-script/x", {"endpoint_url": env["AWS_ENDPOINT_URL"], "key": "k", "secret": "s"}
        ) as store:
            store.write_atomic("ok", b"1")
            assert store.list() == ["ok"]
    finally:
        process.send_signal(signal.SIGTERM)
        out, _ = process.communicate(timeout=30)
    assert "stopped" in out


def test_rate_limit_throttles_beyond_rate_and_burst_with_s3s_slow_down(fault_proxy, stored):
    path, payload = stored
    proxy = fault_proxy(rate_limit=0.5, burst=3)
    answers = [_get(proxy.endpoint_url, path) for _ in range(6)]
    assert [a[0] for a in answers] == [200, 200, 200, 503, 503, 503]
    assert answers[0][2] == payload
    status, headers, body = answers[3]
    assert b"<Code>SlowDown</Code>" in body and b"Please reduce your request rate." in body
    assert headers["content-type"] == "application/xml"
    assert _get(proxy.endpoint_url, path, method="HEAD")[0:3:2] == (503, b"")
    counts = proxy.counts()
    assert counts["throttled"] == 4 and counts["requests"] == 7 and proxy.failed(("throttled",)) == 4
    assert sum(fault_kind_counts(counts)) == 0
    assert sum(served for _, served, _ in proxy.timeline()) == 3
    assert sum(throttled for _, _, throttled in proxy.timeline()) == 4
    proxy.set_rate_limit(None)
    assert _get(proxy.endpoint_url, path)[0] == 200


def test_rate_limit_answers_as_gcs_and_keeps_one_bucket_per_prefix(fault_proxy, stored):
    path, _ = stored
    proxy = fault_proxy(rate_limit=0.01, burst=1, throttle_style="gcs")
    assert _get(proxy.endpoint_url, path)[0] == 200
    status, headers, body = _get(proxy.endpoint_url, path)
    error = json.loads(body)["error"]
    assert status == 429 and error["code"] == 429 and error["errors"][0]["reason"] == "rateLimitExceeded"
    other = path.replace("/p/", "/q/")
    assert _get(proxy.endpoint_url, other)[0] == 404, "another prefix has a bucket of its own"
    assert proxy.counts()["throttled"] == 1


def test_rate_limit_refills_at_its_rate():
    from tools.rate_limit import RateLimiter, parse_rate_limit, request_prefix

    now = [0.0]
    limiter = RateLimiter(rate_per_s=2.0, burst=2.0, clock=lambda: now[0])
    assert [limiter.admit("/b/ds/x") for _ in range(3)] == [True, True, False]
    now[0] = 0.5
    assert [limiter.admit("/b/ds/x") for _ in range(2)] == [True, False]
    now[0] = 1.2
    assert limiter.admit("/b/ds/y") and not limiter.admit("/b/ds/y")
    assert limiter.timeline() == [(0, 3, 2), (1, 1, 1)]
    assert parse_rate_limit("100:250") == (100.0, 250.0) and parse_rate_limit("5") == (5.0, None)
    assert request_prefix("/download/storage/v1/b/bkt/o/ds%2Fshards%2Fa.zst?alt=media", 1) == "bkt/ds"
    assert (
        request_prefix("/bkt/ds/shards/a.zst", 2) == "bkt/ds/shards" and request_prefix("/bkt?list-type=2", 1) == "bkt"
    )


def fault_kind_counts(counts):
    from tools.fault_proxy import FAULT_KINDS

    return [counts[kind] for kind in FAULT_KINDS]


def test_proxy_script_takes_a_rate_limit(s3_server, stored):
    path, _ = stored
    args = ["--rate-limit", "0.01:2", "--throttle-style", "s3"]
    statuses, lines = run_proxy_script(s3_server.endpoint_url, path, args, 5)
    assert statuses == [200, 200, 503, 503, 503]
    assert json.loads(lines[-1])["throttled"] == 3 and json.loads(lines[-2])["timeline"][0][1:] == [2, 3]
