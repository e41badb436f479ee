"""Keeping secrets out of reprs, URLs, error messages and logs.

A storage option is secret when its key matches
``secret|token|password|key|connection_string|credential`` (``key``,
``secret``, ``token``, ``aws_secret_access_key``, ``account_key``,
``sas_token``, ``connection_string``, a GCS service-account dict's
``private_key``, ...). Its value is shown as ``***`` wherever options are
displayed, and every text that leaves the storage layer (exception messages,
log lines) is scrubbed of the raw values. Azure account keys and SAS
signatures are also scrubbed by their shape (``AccountKey=...``,
``SharedAccessSignature=...``, ``sig=...``), wherever they came from.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

REDACTED = "***"
SECRET_KEY_PATTERN = re.compile(r"secret|token|password|key|connection_string|credential", re.IGNORECASE)

# Credentials read from the environment are scrubbed too, because
# botocore may echo them (e.g. an access key id in an error message).
SECRET_ENV_VARS = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AZURE_STORAGE_CONNECTION_STRING",
    "AZURE_STORAGE_ACCOUNT_KEY",
    "AZURE_STORAGE_SAS_TOKEN",
    "AZURE_STORAGE_CLIENT_SECRET",
)
# gcsfs takes these words as ``token`` to name a way to authenticate;
# they are not credentials, and scrubbing "anon" would garble unrelated text.
_TOKEN_METHODS = frozenset({"anon", "google_default", "cache", "cloud", "browser"})
# The secret part of Azure connection strings and SAS URLs, by shape, so
# that one echoed by the SDK is hidden even if it reached us some other way.
_AZURE_SECRETS = re.compile(r"(?P<name>AccountKey=|SharedAccessSignature=|[?&]sig=)[^;&\s\"'<>]+", re.IGNORECASE)

# Very short values (e.g. "1", "us") would scrub unrelated text and are
# not credentials anyone relies on; they are still redacted by key in reprs.
_MIN_SCRUB_LEN = 4
_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s]*@")


def is_secret_key(key: str) -> bool:
    """Whether a storage-option key holds a secret."""
    return bool(SECRET_KEY_PATTERN.search(str(key)))


def redact_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """A copy of ``options`` with every secret value (at any depth) replaced."""
    if not options:
        return {}
    out: dict[str, Any] = {}
    for key, value in options.items():
        if is_secret_key(key) and value is not None:
            out[key] = REDACTED
        elif isinstance(value, Mapping):
            out[key] = redact_options(value)
        else:
            out[key] = value
    return out


def secret_values(options: Mapping[str, Any] | None, *, include_env: bool = True) -> tuple[str, ...]:
    """The raw secret strings in ``options`` (and the AWS environment), longest first."""
    found: set[str] = set()

    def walk(mapping: Mapping[str, Any]) -> None:
        for key, value in mapping.items():
            if isinstance(value, Mapping):
                walk(value)
            elif is_secret_key(key) and isinstance(value, (str, bytes)):
                text = value.decode(errors="replace") if isinstance(value, bytes) else value
                if len(text) >= _MIN_SCRUB_LEN and text not in _TOKEN_METHODS:
                    found.add(text)
            elif (
                is_secret_key(key)
                and isinstance(getattr(value, "token", None), str)
                and len(value.token) >= _MIN_SCRUB_LEN
            ):
                # A credentials object (google-auth) holds its access token here.
                found.add(value.token)

    if options:
        walk(options)
    if include_env:
        for name in SECRET_ENV_VARS:
            value = os.environ.get(name, "")
            if len(value) >= _MIN_SCRUB_LEN:
                found.add(value)
    return tuple(sorted(found, key=len, reverse=True))


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with each secret value and any URL user-info replaced by ``***``."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, REDACTED)
    text = _AZURE_SECRETS.sub(lambda m: m.group("name") + REDACTED, text)
    return _USERINFO.sub(lambda m: m.group("scheme") + REDACTED + "@", text)


def redact_url(url: str) -> str:
    """``url`` without user-info (``s3://key:secret@bucket`` -> ``s3://***@bucket``)."""
    return redact_text(url)
