"""Opening stores from URLs, joining URLs, and CLI-style storage options."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

from zephon_stream.errors import ConfigError
from zephon_stream.storage.base import Store, check_relative_path
from zephon_stream.storage.retry import RetryPolicy

_SCHEME = re.compile(r"^(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*)://")
_OPTION_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def is_local_url(url: str | os.PathLike[str]) -> bool:
    """Whether ``url`` is a plain path or a ``file://`` URL."""
    match = _SCHEME.match(os.fspath(url))
    return match is None or match.group("scheme").lower() in ("file", "local")


def url_scheme(url: str | os.PathLike[str]) -> str:
    """The lower-case scheme of ``url`` (``file`` for a plain path)."""
    match = _SCHEME.match(os.fspath(url))
    return "file" if match is None else match.group("scheme").lower()


def local_path(url: str | os.PathLike[str]) -> str:
    """The filesystem path of a local ``url`` (``file:///x`` -> ``/x``)."""
    text = os.fspath(url)
    match = _SCHEME.match(text)
    if match is not None:
        text = text[match.end() :]
    return os.path.expanduser(text)


def open_store(
    url: str | os.PathLike[str],
    storage_options: Mapping[str, Any] | None = None,
    *,
    retry: RetryPolicy | None = None,
) -> Store:
    """Open the store rooted at ``url``.

    Args:
        url: a local folder (path or ``file://``), ``s3://bucket/prefix``, or
            any URL fsspec opens.
        storage_options: fsspec/s3fs keyword arguments (``key``, ``secret``,
            ``endpoint_url``, ``client_kwargs``...). Without them S3 uses the
            standard AWS variables, ``AWS_ENDPOINT_URL`` included.
        retry: retry bounds; the default survives endpoint outages of ~15 s.
    """
    if is_local_url(url):
        from zephon_stream.storage.local import LocalStore

        return LocalStore(local_path(url), retry=retry)
    from zephon_stream.storage.fsspec_store import FsspecStore

    return FsspecStore(os.fspath(url), storage_options, retry=retry)


def join_url(base: str | os.PathLike[str], rel: str) -> str:
    """``base`` + ``/`` + ``rel``, refusing a ``rel`` that would leave ``base``."""
    check_relative_path(rel, root=os.fspath(base))
    return os.fspath(base).rstrip("/") + "/" + rel


def _parse_value(text: str) -> Any:
    lowered = text.strip().lower()
    if lowered in ("true", "yes", "on"):
        return True
    if lowered in ("false", "no", "off"):
        return False
    if lowered in ("none", "null"):
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_storage_options(items: Iterable[str]) -> dict[str, Any]:
    """Turn ``["KEY=VALUE", ...]`` (as given to ``--storage-option``) into a dict.

    Values that read as ints, floats, booleans (true/false/yes/no) or none are
    converted; a dotted key nests (``client_kwargs.region_name=us-east-1``).

    Raises:
        ConfigError: an item without ``=`` or with an empty key.
    """
    options: dict[str, Any] = {}
    for number, item in enumerate(items, start=1):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep:
            # The item is not quoted: without "=" it may be a bare secret.
            raise ConfigError(f"storage option #{number}: expected KEY=VALUE (no '=' found)")
        if not _OPTION_KEY.match(key):
            raise ConfigError(
                f"storage option #{number}: expected KEY=VALUE with KEY made of letters, digits, '_' and '.'"
            )
        target = options
        *parents, leaf = key.split(".")
        for part in parents:
            child = target.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"storage option {key!r}: {part!r} is already set to a value")
            target = child
        target[leaf] = _parse_value(value)
    return options
