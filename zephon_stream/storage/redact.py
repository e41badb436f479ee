"""Keeping secrets out of reprs, URLs, error messages and logs.

A storage option is secret when its key matches ``secret|token|password|key``
(``key``, ``secret``, ``token``, ``aws_secret_access_key``, ...). Its value is
shown as ``***`` wherever options are displayed, and every text that leaves the
storage layer (exception messages, log lines) is scrubbed of the raw values.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

REDACTED = "***"
SECRET_KEY_PATTERN = re.compile(r"secret|token|password|key", re.IGNORECASE)

# NOTE: credentials read from the environment are scrubbed too, because
# botocore may echo them (e.g. an access key id in an error message).
SECRET_ENV_VARS = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
)

# NOTE: very short values (e.g. "1", "us") would scrub unrelated text and are
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
                if len(text) >= _MIN_SCRUB_LEN:
                    found.add(text)

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
    return _USERINFO.sub(lambda m: m.group("scheme") + REDACTED + "@", text)


def redact_url(url: str) -> str:
    """``url`` without user-info (``s3://key:secret@bucket`` -> ``s3://***@bucket``)."""
    return redact_text(url)
