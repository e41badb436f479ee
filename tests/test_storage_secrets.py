"""Secrets given as storage options, in a URL or in the environment never show
up in reprs, URLs, exception messages, logs or printed output."""

from __future__ import annotations

import logging
import pickle
from functools import partial

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
    assert "attempt 1 failed" in caplog.text  # the logs were captured, and still hold no secret
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


def _service_account_info(token_uri: str) -> dict[str, str]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return {
        "type": "service_account",
        "project_id": "zephon-test",
        "private_key_id": "zephonPrivateKeyIdLeak55",
        "private_key": pem.decode(),
        "client_email": "leak-check@zephon-test.iam.gserviceaccount.com",
        "client_id": "1234",
        "token_uri": token_uri,
    }


def _cloud_credentials(object_store, endpoint_url: str) -> tuple[list[dict], tuple[str, ...]]:
    """Option sets carrying each kind of credential the backend takes, and the raw secrets in them."""
    if object_store.backend == "gcs":
        # The token endpoint is a closed loopback port: refreshing the
        # service account's token fails, and that failure is searched too.
        from google.oauth2.credentials import Credentials

        from tools.server_process import free_ports

        info = _service_account_info(f"http://127.0.0.1:{free_ports(1)[0]}/token")
        # An access token as a bare string makes gcsfs check it at
        # oauth2.googleapis.com; as a credentials object it is used as is.
        access_token = "ya29.zephonAccessTokenLeakCheck31"
        base = {"endpoint_url": endpoint_url, "project": "zephon-test"}
        body = info["private_key"].split("\n")[1]
        option_sets = [{**base, "token": Credentials(access_token)}, {**base, "token": info}]
        return option_sets, (access_token, body, info["private_key_id"])
    from datetime import datetime, timedelta, timezone

    from azure.storage.blob import AccountSasPermissions, ResourceTypes, generate_account_sas

    from tools.azurite import ACCOUNT_KEY, ACCOUNT_NAME

    sas = generate_account_sas(
        ACCOUNT_NAME,
        ACCOUNT_KEY,
        ResourceTypes(service=True, container=True, object=True),
        AccountSasPermissions(read=True, write=True, list=True),
        expiry=datetime.now(timezone.utc) + timedelta(hours=1),
    )
    signature = dict(part.split("=", 1) for part in sas.split("&"))["sig"]
    with_sas = f"BlobEndpoint={endpoint_url}/{ACCOUNT_NAME};SharedAccessSignature={sas}"
    with_key = object_store.server.connection_string(endpoint_url)
    return [{"connection_string": with_key}, {"connection_string": with_sas}], (ACCOUNT_KEY, signature)


@pytest.mark.parametrize("object_store", ["gcs", "azure"], indirect=True)
def test_cloud_credentials_never_appear_in_any_output(
    object_store, small_dataset, tmp_path, caplog, capsys, monkeypatch
):
    """GCS access tokens and service-account keys, Azure account keys, SAS
    signatures and connection strings: not in reprs, errors, logs, progress,
    the audit log, the loader's state or stats."""
    from tools.fault_proxy import FaultProxy
    from zephon_stream import StreamingLoader, write_dataset
    from zephon_stream.cli import main

    caplog.set_level(logging.DEBUG)
    seen: list[str] = []
    url = object_store.url("secret-ds")
    with FaultProxy(upstream=object_store.server.endpoint_url, rates={"error_503": 1.0}) as failing:
        option_sets, secrets = _cloud_credentials(object_store, failing.endpoint_url)
        for options in option_sets:
            store = open_store(url, options, retry=QUICK)
            seen += [repr(store), repr(store.storage_options)]
            for call in (partial(store.read, "a.bin"), partial(store.write_atomic, "a.bin", b"x"), store.list):
                with pytest.raises(ZephonError) as info:
                    call()
                seen += [str(info.value), repr(info.value)]
            store.close()
    if object_store.backend == "azure":
        # A working connection string, from the environment as adlfs reads it.
        monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", object_store.server.connection_string())
        working = {}
        option_args = []
    else:
        from google.oauth2.credentials import Credentials

        working = {"endpoint_url": object_store.server.endpoint_url, "token": Credentials(secrets[0])}
        option_args = object_store.cli_options()
    inputs = [str(p) for p in small_dataset.sources[:4]]
    assert main(["write", *inputs, "--output", url, "--tokenizer", "bytes", "--block-tokens", "4097",
                 "--blocks-per-shard", "2", *option_args]) == 0  # fmt: skip
    summary = write_dataset(
        inputs,
        f"{url}-2",
        tokenizer="bytes",
        block_tokens=4097,
        blocks_per_shard=2,
        storage_options=working,
        progress=True,
    )
    seen += [repr(summary), summary.table()]
    audit = tmp_path / "audit.jsonl"
    with StreamingLoader(url, seq_len=64, local_batch_size=4, storage_options=working, audit_log=str(audit)) as loader:
        next(iter(loader))
        seen += [repr(loader), repr(loader.state_dict()), repr(loader.stats())]
    seen += [audit.read_text()]
    captured = capsys.readouterr()
    seen += [captured.out, captured.err, caplog.text]
    text = "\n".join(seen)
    assert "attempt 1 failed" in caplog.text and len(captured.err) > 0
    assert [secret for secret in secrets if secret in text] == []
    assert "***" in text
