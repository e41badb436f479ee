"""Secrets given as storage options, in a URL or in the environment never show
up in reprs, URLs, exception messages, logs or printed output."""

from __future__ import annotations

import logging
import pickle

import pytest

from zephon_stream.errors import ConfigError, ZephonError
from zephon_stream.storage import RetryPolicy, expand_inputs, open_input, open_store, parse_storage_options
from zephon_stream.storage.retry import call_with_retry

KEY = "AKIAZEPHONLEAKCHECK01"
SECRET = "zephon/Secret+Value=LeakCheck42"
TOKEN = "zephonSessionTokenLeakCheck77"
ENV_KEY = "AKIAZEPHONENVLEAKCHK"
ENV_SECRET = "zephonEnvSecretLeakCheck99"
ALL_SECRETS = (KEY, SECRET, TOKEN, ENV_KEY, ENV_SECRET)
QUICK = RetryPolicy(max_attempts=2, initial_backoff_s=0.01, max_backoff_s=0.02)


def test_secrets_never_appear_in_any_output(s3_bucket, fault_proxy, caplog, capsys, monkeypatch):
    caplog.set_level(logging.DEBUG, logger="zephon_stream")
    caplog.set_level(logging.INFO)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ENV_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", ENV_SECRET)
    proxy = fault_proxy(rates={"error_503": 1.0})
    options = {
        **s3_bucket.options_via(proxy.endpoint_url),
        "key": KEY,
        "secret": SECRET,
        "token": TOKEN,
        "client_kwargs": {"region_name": "us-east-1", "aws_session_token": TOKEN},
    }
    seen: list[str] = []
    store = open_store(s3_bucket.url("data"), options, retry=QUICK)
    seen += [repr(store), str(store), store.url, repr(store.storage_options), repr(options and store.storage_options)]
    for call in (
        lambda: store.read("a.bin"),
        lambda: store.read_range("a.bin", 0, 10),
        lambda: store.write_atomic("a.bin", b"x"),
        lambda: store.read("../escape"),
        lambda: store.list(),
    ):
        with pytest.raises(ZephonError) as info:
            call()
        seen += [str(info.value), repr(info.value)]
    # A failure whose own text carries the secret is scrubbed before it is raised or logged.
    def leaky() -> None:
        raise ConnectionResetError(f"reset while sending {SECRET} and {ENV_SECRET}")

    with pytest.raises(ZephonError) as info:
        call_with_retry(leaky, policy=QUICK, what="read x", scrub=store.scrub)
    seen += [str(info.value)]
    store.close()

    url_store = open_store(f"s3://{KEY}:{SECRET}@{s3_bucket.bucket}/data", options, retry=QUICK)
    seen += [repr(url_store), url_store.url]
    with pytest.raises(ZephonError) as info:
        url_store.read("missing")
    seen += [str(info.value)]
    url_store.close()

    with pytest.raises(ZephonError) as info:
        open_input(s3_bucket.url("data/missing.txt"), options, retry=QUICK)
    seen += [str(info.value)]
    with pytest.raises(ZephonError) as info:
        expand_inputs([s3_bucket.url("data/nothing-*.txt")], options)
    seen += [str(info.value)]
    for typo in (f"secret:{SECRET}", f"token {TOKEN}"):
        with pytest.raises(ConfigError) as info:
            parse_storage_options([typo])
        seen += [str(info.value)]

    captured = capsys.readouterr()
    seen += [captured.out, captured.err, caplog.text]
    assert "giving up" in caplog.text  # the logs were captured, and still hold no secret
    text = "\n".join(seen)
    leaked = [secret for secret in ALL_SECRETS if secret in text]
    assert leaked == []
    assert "***" in text


def test_pickled_store_reconnects_with_its_credentials_but_shows_none(s3_bucket):
    options = {**s3_bucket.storage_options, "secret": s3_bucket.storage_options["secret"]}
    store = open_store(s3_bucket.url("p"), options)
    store.write_atomic("x", b"1")
    copy = pickle.loads(pickle.dumps(store))
    assert copy.read("x") == b"1"
    assert options["secret"] not in repr(copy) and copy.storage_options["secret"] == "***"
    store.close()
    copy.close()
