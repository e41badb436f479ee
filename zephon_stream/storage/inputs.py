"""Writer inputs: expanding paths, globs and URLs, and streaming them in."""

from __future__ import annotations

import glob
import io
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any, BinaryIO

from zephon_stream.errors import InputError, ObjectMissingError, ZephonError
from zephon_stream.storage.base import Store
from zephon_stream.storage.cloud_clients import filesystem_options, make_single_attempt
from zephon_stream.storage.fsspec_store import close_filesystem, s3_filesystem_options
from zephon_stream.storage.redact import redact_text, redact_url, secret_values
from zephon_stream.storage.retry import RetryPolicy, call_with_retry
from zephon_stream.storage.schemes import S3_PROTOCOLS
from zephon_stream.storage.urls import is_local_url, local_path, open_store

INPUT_BUFFER_BYTES = 8 * 2**20
_GLOB_CHARS = frozenset("*?[")


class RangeReader(io.RawIOBase):
    """A seekable read-only file over one object, read by ranges through a store.

    Every range goes through the store's retry layer, so a reset in the middle
    of a long input costs one retried range, not the whole file.
    """

    def __init__(self, store: Store, path: str, *, owns_store: bool = True) -> None:
        super().__init__()
        self._store = store
        self._path = path
        self._size = store.size(path)
        self._pos = 0
        self._owns_store = owns_store
        self.name = f"{store.url}/{path}"

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        if base + offset < 0:
            raise ValueError(f"{self.name}: negative seek position {base + offset}")
        self._pos = base + offset
        return self._pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        end = min(self._size, self._pos + len(view))
        if end <= self._pos:
            return 0
        data = self._store.read_range(self._path, self._pos, end)
        view[: len(data)] = data
        self._pos += len(data)
        return len(data)

    def close(self) -> None:
        if not self.closed and self._owns_store:
            self._store.close()
        super().close()


def open_input(
    url: str | os.PathLike[str],
    storage_options: Mapping[str, Any] | None = None,
    *,
    retry: RetryPolicy | None = None,
) -> BinaryIO:
    """Open one input for streaming binary reads (seekable).

    Local paths open directly; remote objects are read in 8 MiB ranges with
    retries. The caller closes the file.
    """
    if is_local_url(url):
        path = local_path(url)
        try:
            return open(path, "rb")
        except FileNotFoundError:
            raise InputError(f"input {path}: no such file") from None
    text = os.fspath(url)
    parent, _, name = text.rstrip("/").rpartition("/")
    if not name or "://" not in parent:
        raise InputError(f"input {redact_url(text)}: not an object URL")
    store = open_store(parent, storage_options, retry=retry)
    try:
        raw = RangeReader(store, name)
    except FileNotFoundError:
        store.close()
        raise InputError(f"input {redact_url(text)}: no such object") from None
    return io.BufferedReader(raw, buffer_size=INPUT_BUFFER_BYTES)  # type: ignore[return-value]


def _expand_local(pattern: str) -> list[str]:
    path = local_path(pattern)
    if _GLOB_CHARS & set(path):
        matches = glob.glob(path, recursive=True)
        return sorted(m for m in matches if os.path.isfile(m))
    if os.path.isdir(path):
        found = []
        for dirpath, dirnames, filenames in os.walk(path):
            dirnames.sort()
            found.extend(os.path.join(dirpath, name) for name in filenames)
        return sorted(found)
    return [path] if os.path.isfile(path) else []


def _expand_remote(pattern: str, storage_options: Mapping[str, Any] | None, policy: RetryPolicy) -> list[str]:
    import fsspec
    from fsspec.utils import get_protocol, glob_translate

    protocol = get_protocol(pattern)
    if protocol in S3_PROTOCOLS:
        kwargs = s3_filesystem_options(storage_options, policy)
    else:
        kwargs = filesystem_options(protocol, storage_options, policy)
    fs, path = fsspec.core.url_to_fs(pattern, **kwargs)
    if protocol in S3_PROTOCOLS:
        fs.retries = 1  # Retries happen in call_with_retry below, counted once
    else:
        make_single_attempt(protocol, fs)

    def attempt() -> list[str]:
        # Not fs.glob(), fs.isfile() or fs.isdir(): along the way they
        # answer "absent" on any error, so a transient failure would read as
        # "matches no file". find() and info() raise, and are retried.
        if _GLOB_CHARS & set(path):
            literal = path[: min(path.index(c) for c in _GLOB_CHARS if c in path)]
            base = literal.rsplit("/", 1)[0] if "/" in literal else literal
            pattern = re.compile(glob_translate(path))
            try:
                candidates = fs.find(base, withdirs=False)
            except FileNotFoundError:
                return []
            return [p for p in candidates if pattern.match(p)]
        try:
            info = fs.info(path)
        except FileNotFoundError:
            return []
        if info.get("type") == "file":
            return [path]
        return list(fs.find(path, withdirs=False))

    secrets = secret_values(storage_options)
    try:
        paths = call_with_retry(
            attempt,
            policy=policy,
            what=f"expand_inputs {redact_url(pattern)}",
            scrub=lambda text: redact_text(text, secrets),
        )
    finally:
        close_filesystem(fs)
    return sorted(fs.unstrip_protocol(p) for p in paths)


def expand_inputs(
    patterns: Iterable[str | os.PathLike[str]],
    storage_options: Mapping[str, Any] | None = None,
    *,
    retry: RetryPolicy | None = None,
) -> list[str]:
    """Expand input patterns into a deterministic list of files or object URLs.

    Each pattern is a local path, a folder (all files below it), a glob
    (``**`` included), an ``s3://`` URL or an ``s3://`` glob. Each pattern's
    matches are sorted; patterns keep the order given; a file matched twice is
    listed once, where it is first matched.

    Raises:
        InputError: a pattern that matches no file (named in the message).
        StorageError: listing failed after every retry.
    """
    policy = retry or RetryPolicy()
    secrets = secret_values(storage_options)
    result: list[str] = []
    seen: set[str] = set()
    for raw in patterns:
        pattern = os.fspath(raw)
        try:
            if is_local_url(pattern):
                matches = _expand_local(pattern)
            else:
                matches = _expand_remote(pattern, storage_options, policy)
        except ObjectMissingError:
            matches = []
        except (OSError, ValueError) as exc:
            if isinstance(exc, ZephonError):
                raise
            detail = redact_text(f"{type(exc).__name__}: {exc}", secrets)
            raise InputError(f"input {redact_url(pattern)}: cannot be listed ({detail})") from None
        if not matches:
            raise InputError(f"input {redact_url(pattern)}: matches no file")
        for match in matches:
            if match not in seen:
                seen.add(match)
                result.append(match)
    return result
