"""A store over any fsspec filesystem; S3 through s3fs, GCS through gcsfs, Azure through adlfs.

One filesystem instance serves every thread of a store: s3fs runs its requests
on fsspec's event-loop thread, so concurrent ``read_range`` calls from many
threads overlap on the network.

Fork: an s3fs instance (its event loop, its connections) must not be used in a
child process. The store remembers which process built its filesystem (a
counter bumped in every forked child) and builds a fresh one, with fresh locks,
on first use in a child; pickling a store carries only its URL, options and
retry policy, and the copy reconnects on first use.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import threading
import urllib.parse
from collections.abc import Mapping
from typing import Any

import fsspec
from fsspec.utils import get_protocol

from zephon_stream.storage.aio_session import shared_aio_session
from zephon_stream.storage.base import Store
from zephon_stream.storage.cloud_clients import client_options, filesystem_options, make_single_attempt
from zephon_stream.storage.presigned import PresignedRanges, PresignRefused, presigned_reads_allowed, signs_urls
from zephon_stream.storage.redact import redact_options, redact_url, secret_values
from zephon_stream.storage.retry import RetryPolicy
from zephon_stream.storage.schemes import AZURE_PROTOCOLS, GCS_PROTOCOLS, S3_PROTOCOLS, THROTTLE_LIMITER_OPTION

logger = logging.getLogger("zephon_stream.storage")

_FSSPEC_KWARGS = frozenset({"use_listings_cache", "listings_expiry_time", "max_paths", "skip_instance_cache"})
_process = [0]


def _count_fork() -> None:
    _process[0] += 1


# A counter bumped in each forked child tells a store it runs in a new
# process; os.getpid() on every call cost more than the rest of a read_range.
os.register_at_fork(after_in_child=_count_fork)


def _s3fs_accepts(options: Mapping[str, Any]) -> bool:
    import inspect

    from s3fs import S3FileSystem

    known = set(inspect.signature(S3FileSystem.__init__).parameters) | _FSSPEC_KWARGS
    return set(options) <= known


def s3_filesystem_options(storage_options: Mapping[str, Any] | None, policy: RetryPolicy) -> dict[str, Any]:
    """s3fs keyword arguments: the user's options plus timeouts, one attempt, the env endpoint.

    botocore and s3fs each retry on their own (up to minutes against a
    dead endpoint). Both are set to a single attempt with bounded connect and
    read timeouts so that ``RetryPolicy`` is the only retry layer and counts
    every retry. Options the user passes explicitly win.
    """
    opts = client_options(storage_options)
    client_kwargs = dict(opts.get("client_kwargs") or {})
    if not opts.get("endpoint_url") and not client_kwargs.get("endpoint_url"):
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        if endpoint:
            opts["endpoint_url"] = endpoint
    if not client_kwargs.get("region_name"):
        region = os.environ.get("AWS_DEFAULT_REGION") or os.environ.get("AWS_REGION")
        if region:
            client_kwargs["region_name"] = region
    if client_kwargs:
        opts["client_kwargs"] = client_kwargs
    config = dict(opts.get("config_kwargs") or {})
    config.setdefault("connect_timeout", policy.connect_timeout_s)
    config.setdefault("read_timeout", policy.read_timeout_s)
    config.setdefault("retries", {"total_max_attempts": 1, "mode": "standard"})
    config.setdefault("max_pool_connections", 64)
    # With no fixed user agent botocore assembles one for every request
    # (about a tenth of the client's CPU per ranged GET).
    config.setdefault("user_agent", "zephon-stream")
    opts["config_kwargs"] = config
    opts.setdefault("use_listings_cache", False)
    opts["skip_instance_cache"] = True
    # Options s3fs does not know go to the session (e.g. ``profile``),
    # so only an options set without them may share the process's session.
    if opts.get("session") is None and _s3fs_accepts(opts):
        opts["session"] = shared_aio_session()
    return opts


def close_filesystem(fs: Any) -> None:
    """Close an s3fs filesystem's connections now (other filesystems: nothing to do).

    s3fs only closes its aiohttp session at interpreter exit; closing
    here means no socket outlives the store or listing that opened it.
    """
    client = getattr(fs, "_s3", None)
    if client is not None and hasattr(type(fs), "close_session"):
        type(fs).close_session(fs.loop, client)
        fs._s3 = None


class FsspecStore(Store):
    """Objects under an fsspec URL (``s3://bucket/prefix``, ``memory://x``, ...).

    On S3 a single PUT is atomic on completion, so ``write_atomic`` is one
    ``pipe_file``. Other fsspec backends are only as atomic as their own writes.
    """

    def __init__(
        self,
        url: str,
        storage_options: Mapping[str, Any] | None = None,
        *,
        retry: RetryPolicy | None = None,
    ) -> None:
        policy = retry or RetryPolicy()
        if (storage_options or {}).get(THROTTLE_LIMITER_OPTION) is False:
            policy = dataclasses.replace(policy, throttle_limiter=False)
        self._raw_url = url
        self._options = dict(storage_options or {})
        self._protocol = get_protocol(url)
        userinfo = urllib.parse.urlsplit(url).netloc.rpartition("@")[0]
        secrets = [*secret_values(self._options), *(part for part in userinfo.split(":") if part)]
        super().__init__(url=redact_url(url), retry=policy, secrets=secrets)
        self._fs_lock = threading.Lock()
        self._locks_process = _process[0]
        self._fs: Any = None
        self._fs_process = -1
        self._root = ""
        self._first_call_lock = threading.Lock()
        self._warm_process = -1
        self._first_call_async_lock: tuple[int, asyncio.Lock] | None = None
        self._presigned: PresignedRanges | None = None
        self._presigned_ok = presigned_reads_allowed(self._protocol, self._options)

    @property
    def storage_options(self) -> dict[str, Any]:
        """The options, secrets shown as ``***``."""
        return redact_options(self._options)

    def filesystem(self) -> tuple[Any, str]:
        """The fsspec filesystem of this process and the root path inside it."""
        fs = self._fs
        if fs is not None and self._fs_process == _process[0]:
            return fs, self._root
        if self._locks_process != _process[0]:
            # A lock held by another thread at fork time stays held in
            # the child forever; a child starts with locks of its own.
            self._fs_lock, self._first_call_lock = threading.Lock(), threading.Lock()
            self._locks_process = _process[0]
        with self._fs_lock:
            if self._fs is None or self._fs_process != _process[0]:
                if self._protocol in S3_PROTOCOLS:
                    kwargs = s3_filesystem_options(self._options, self._retry)
                else:
                    kwargs = filesystem_options(self._protocol, self._options, self._retry)
                fs, root = fsspec.core.url_to_fs(self._raw_url, **kwargs)
                if self._protocol in S3_PROTOCOLS:
                    # s3fs's own retry loop (class default 5) is on top of
                    # botocore's; one attempt here, retries happen in RetryPolicy.
                    fs.retries = 1
                else:
                    make_single_attempt(self._protocol, fs)
                self._root, self._fs_process, self._fs = root.rstrip("/"), _process[0], fs
                self._presigned = (
                    PresignedRanges(fs, self._protocol, kwargs, self._retry)
                    if self._presigned_ok and signs_urls(fs, self._protocol)
                    else None
                )
            return self._fs, self._root

    def _full(self, path: str) -> tuple[Any, str]:
        fs, root = self.filesystem()
        return fs, f"{root}/{path}" if root else path

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        fs, _ = self.filesystem()
        if self._warm_process == _process[0]:
            return getattr(fs, method)(*args, **kwargs)
        # Until its first request has opened an HTTP session, s3fs
        # rebuilds its client on every call; concurrent first calls from the
        # fetch threads then rebuild it over and over (10+ s for 8 threads).
        # The first call of each process runs alone.
        with self._first_call_lock:
            try:
                return getattr(fs, method)(*args, **kwargs)
            finally:
                self._warm_process = _process[0]

    def endpoint(self) -> str | None:
        """The service's URL as the client library resolves it (options, then environment), free of secrets."""
        opts = self._options
        url = opts.get("endpoint_url") or (opts.get("client_kwargs") or {}).get("endpoint_url")
        if self._protocol in S3_PROTOCOLS:
            url = url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
            return redact_url(url) if url else "AWS S3 (no endpoint_url set)"
        if self._protocol in GCS_PROTOCOLS:
            url = url or os.environ.get("STORAGE_EMULATOR_HOST") or "https://storage.googleapis.com"
        elif self._protocol in AZURE_PROTOCOLS:
            # The account's URL without its query string, where a SAS would be.
            service = getattr(self._fs, "service_client", None)
            url = service.url.partition("?")[0] if service is not None else url
        return redact_url(url) if url else None

    def limiter_key(self) -> str | None:
        """The service, its endpoint and the bucket (container): what one request-rate limit covers here.

        S3 limits each key prefix, GCS each bucket, Azure each account
        (its endpoint); a bucket on an endpoint covers all three from above.
        """
        if self._protocol in AZURE_PROTOCOLS:
            self.filesystem()  # The account's endpoint is known once its client is
        family = (
            "s3"
            if self._protocol in S3_PROTOCOLS
            else "gcs"
            if self._protocol in GCS_PROTOCOLS
            else "azure"
            if self._protocol in AZURE_PROTOCOLS
            else self._protocol
        )
        bucket = urllib.parse.urlsplit(self._raw_url).netloc.rpartition("@")[2]
        return f"{family} {self.endpoint() or ''} {bucket}"

    def event_loop(self) -> asyncio.AbstractEventLoop | None:
        """fsspec's loop for an asynchronous filesystem (s3fs, gcsfs, adlfs), else None."""
        fs, _ = self.filesystem()
        return fs.loop if getattr(fs, "async_impl", False) else None

    async def _call_async(self, method: str, *args: Any, **kwargs: Any) -> Any:
        fs, _ = self.filesystem()
        if self._warm_process == _process[0]:
            return await getattr(fs, method)(*args, **kwargs)
        # The first request of a process runs alone, as in _call; the
        # lock is the loop's, made in this process.
        held = self._first_call_async_lock
        if held is None or held[0] != _process[0]:
            held = self._first_call_async_lock = (_process[0], asyncio.Lock())
        async with held[1]:
            try:
                return await getattr(fs, method)(*args, **kwargs)
            finally:
                self._warm_process = _process[0]

    async def _read_range_async(self, path: str, start: int, end: int) -> bytes:
        _, full = self._full(path)
        presigned = self._presigned
        if presigned is not None and self._presigned_ok:
            if self._warm_process != _process[0] and self._protocol in S3_PROTOCOLS:
                await self._call_async("set_session")
            try:
                return await presigned.read(full, start, end)
            except PresignRefused as exc:
                # The client library makes the same read, signed its own
                # way. A real access error then comes from it, in its words; if
                # it may read where the URL may not, this store reads through it.
                data = await self._call_async("_cat_file", full, start=start, end=end)
                self._presigned_ok = False
                library = "s3fs" if self._protocol in S3_PROTOCOLS else "adlfs"
                logger.warning("%s: %s; reading through %s from now on", self.url, self.scrub(str(exc)), library)
                return data
        return await self._call_async("_cat_file", full, start=start, end=end)

    async def _size_async(self, path: str) -> int:
        _, full = self._full(path)
        info = await self._call_async("_info", full)
        if info.get("type") != "file":
            raise FileNotFoundError(f"not an object: {path}")
        return int(info["size"])

    def _read(self, path: str) -> bytes:
        _, full = self._full(path)
        return self._call("cat_file", full)

    def _read_range(self, path: str, start: int, end: int) -> bytes:
        fs, full = self._full(path)
        if self._presigned is not None and self._presigned_ok:
            from fsspec.asyn import sync

            return sync(fs.loop, self._read_range_async, path, start, end)
        return self._call("cat_file", full, start=start, end=end)

    def _write(self, path: str, data: bytes) -> None:
        fs, full = self._full(path)
        if self._protocol in S3_PROTOCOLS:
            # s3fs uploads an object of two parts or more as a multipart
            # upload, in parts of ``chunksize`` (default 50 MiB). The part size
            # follows s3fs's own ``default_block_size`` option (also 50 MiB by
            # default), so ``storage_options`` can set it; S3 wants >= 5 MiB.
            self._call("pipe_file", full, data, chunksize=fs.default_block_size)
            return
        parent = full.rsplit("/", 1)[0]
        if parent and parent != full:
            fs.makedirs(parent, exist_ok=True)
        self._call("pipe_file", full, data)

    def _info(self, path: str) -> dict[str, Any]:
        _, full = self._full(path)
        info = self._call("info", full)
        if info.get("type") != "file":
            raise FileNotFoundError(f"not an object: {path}")
        return info

    def _exists(self, path: str) -> bool:
        # Not fs.exists(): s3fs answers False for any error on a bucket,
        # and a transient failure must be retried, not read as "absent".
        try:
            self._info(path)
        except FileNotFoundError:
            return False
        return True

    def _size(self, path: str) -> int:
        return int(self._info(path)["size"])

    def _list(self, prefix: str) -> list[str]:
        fs, root = self.filesystem()
        base = root
        if "/" in prefix:
            base = f"{root}/{prefix.rsplit('/', 1)[0]}" if root else prefix.rsplit("/", 1)[0]
        try:
            paths = self._call("find", base, withdirs=False)
        except FileNotFoundError:
            return []
        skip = len(root) + 1 if root else 0
        found = []
        for full in paths:
            if root and not full.startswith(root + "/"):
                continue
            rel = full[skip:]
            if rel.startswith(prefix):
                found.append(rel)
        return found

    def root_kind(self) -> str:
        """``"file"`` where the URL names an object, else what its prefix holds (``Store.root_kind``)."""
        _, root = self.filesystem()
        if root and self._run("root_kind", "", "", lambda: self._call("isfile", root)):
            return "file"
        return super().root_kind()

    def _delete(self, path: str) -> None:
        _, full = self._full(path)
        try:
            self._call("rm_file", full)
        except FileNotFoundError:
            pass

    def close(self) -> None:
        """Close this process's connections (S3); the store reconnects if used again."""
        super().close()
        with self._fs_lock:
            fs, self._fs = self._fs, None
            self._warm_process = -1
            presigned, self._presigned = self._presigned, None
            ours = self._fs_process == _process[0]
        if fs is None or not ours:
            return
        # Closed with the lock released: a read starting on the loop
        # meanwhile waits for this lock (filesystem()) to build a new client,
        # and the loop must be free to run the closing.
        if presigned is not None:
            from fsspec.asyn import sync

            sync(fs.loop, presigned.close)
        close_filesystem(fs)

    def __reduce__(self) -> tuple[Any, ...]:
        return (FsspecStore, (self._raw_url, self._options), {"_retry": self._retry})

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._retry = state["_retry"]
        if not self._retry.throttle_limiter:
            self._limiter = None
