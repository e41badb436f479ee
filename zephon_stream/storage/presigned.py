"""Ranged GETs over presigned URLs: the loader's block reads from S3 and Azure Blob, at a sixth of the CPU.

A ranged GET through s3fs costs the client 1.6-2.0 ms of CPU whatever its
size (aiobotocore signs each request, runs its event hooks and parses the
answer into a response dict), and one through adlfs 2.8 ms (the Azure SDK's
pipeline of policies). In the loader's helper that CPU is taken under the
interpreter lock the block assembler needs. The client library still does
everything that needs the service's knowledge: credentials, endpoint, region,
signature. It signs one URL per object (S3: botocore's
``generate_presigned_url``; Azure: a read-only blob SAS from the account key,
or the SAS the store was given), and every range of that object is then read
with a plain aiohttp GET on the same event loop: 0.25-0.45 ms of CPU a GET of
70 KB on the project's machine.

A URL is signed for an hour and signed again after half of that. A 403 on a
URL gets one freshly signed URL (rotated or expiring credentials). A second
refusal, or any other 4xx than 404 and 416, raises :class:`PresignRefused`,
and the store makes the same read through its client library: if that
succeeds, the store does not take presigned URLs and reads through the
library from then on (a warning says so); a real access error comes from the
library, in its own words. The URL, which carries a signature and perhaps a
session token, never reaches an error message or a log.
"""

from __future__ import annotations

import asyncio
import datetime
import re
import time
import urllib.parse
import urllib.request
import weakref
from collections.abc import Mapping
from typing import Any

from zephon_stream.storage.retry import HttpStatusError, RetryPolicy
from zephon_stream.storage.schemes import AZURE_PROTOCOLS, PRESIGNED_READS_OPTION, S3_PROTOCOLS

URL_LIFETIME_S = 3600
# Signed again halfway through its life, so a read never starts on a URL
# about to expire; signing costs about a ms, once per object per half hour.
_RESIGN_AFTER_S = URL_LIFETIME_S / 2
_ERROR_CODE = re.compile(rb"<Code>([A-Za-z0-9.]{1,64})</Code>")
# These change what a GET must carry (requester-pays or SSE-C headers,
# an object version); such stores read through s3fs, which adds them.
_S3FS_ONLY_OPTIONS = ("requester_pays", "s3_additional_kwargs", "version_aware")


class PresignRefused(Exception):
    """The store refused a presigned GET that its client library may still be allowed to make."""


def presigned_reads_allowed(protocol: str, options: Mapping[str, Any]) -> bool:
    """Whether reads of a ``protocol`` store with these options may go over presigned URLs."""
    if options.get(PRESIGNED_READS_OPTION) is False:
        return False
    if protocol in S3_PROTOCOLS:
        return not any(options.get(name) for name in _S3FS_ONLY_OPTIONS)
    return protocol in AZURE_PROTOCOLS


def _ssl_setting(options: Mapping[str, Any]) -> Any:
    # botocore's ``verify`` (False, or a CA bundle path) means the same
    # for the GETs made here.
    verify = (options.get("client_kwargs") or {}).get("verify", True)
    if verify is False:
        return False
    if isinstance(verify, str):
        import ssl

        return ssl.create_default_context(cafile=verify)
    return True


async def _s3_url(fs: Any, full: str) -> str:
    # Not ``S3FileSystem._url``: its ``set_session`` builds a new client,
    # botocore's models parsed again (12 MiB, ~0.5 s), while no request has
    # opened the client's HTTP session, and these GETs never do.
    if fs._s3 is None:
        await fs.set_session()
    bucket, key, _ = fs.split_path(full)
    # get_s3 answers the bucket's own region's client where s3fs caches regions.
    client = await fs.get_s3(bucket)
    return await client.generate_presigned_url(
        ClientMethod="get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=URL_LIFETIME_S
    )


def signs_urls(fs: Any, protocol: str) -> bool:
    """Whether ``fs`` can make the URLs: on Azure, a store with a token credential (Entra ID) cannot."""
    if protocol in S3_PROTOCOLS:
        return True
    service = getattr(fs, "service_client", None)
    if service is None:
        return False
    credential = service.credential
    return bool(getattr(credential, "account_key", None)) or "?" in service.url or credential is None


async def _azure_url(fs: Any, full: str) -> str:
    container, blob, _ = fs.split_path(full)
    service = fs.service_client
    base, _, given_sas = service.url.partition("?")
    url = f"{base.rstrip('/')}/{container}/{urllib.parse.quote(blob)}"
    credential = service.credential
    key = getattr(credential, "account_key", None)
    if key:
        from azure.storage.blob import BlobSasPermissions, generate_blob_sas

        expiry = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=URL_LIFETIME_S)
        sas = generate_blob_sas(
            credential.account_name,
            container,
            blob,
            account_key=key,
            permission=BlobSasPermissions(read=True),
            expiry=expiry,
        )
        return f"{url}?{sas}"
    if given_sas or credential is None:
        # The SAS the store was given (or none: a public container).
        return f"{url}?{given_sas}" if given_sas else url
    # A token credential (Entra ID) signs no URL here.
    raise PresignRefused("the store's credential signs no URL")


class PresignedRanges:
    """Ranged GETs over presigned URLs for one s3fs or adlfs filesystem, on its event loop.

    Built and used in one process; :meth:`close` runs on the same loop.
    """

    def __init__(self, fs: Any, protocol: str, options: Mapping[str, Any], policy: RetryPolicy) -> None:
        self._fs = fs
        self._sign = _s3_url if protocol in S3_PROTOCOLS else _azure_url
        self._ssl = _ssl_setting(options)
        self._policy = policy
        self._pool_size = int((options.get("config_kwargs") or {}).get("max_pool_connections", 64))
        self._urls: dict[str, tuple[str, float]] = {}
        self._proxies: dict[tuple[str, str], str | None] = {}
        self._session: Any = None

    def _http(self) -> Any:
        if self._session is None:
            import aiohttp

            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._pool_size, ssl=self._ssl),
                timeout=aiohttp.ClientTimeout(
                    sock_connect=self._policy.connect_timeout_s, sock_read=self._policy.read_timeout_s
                ),
                auto_decompress=False,
            )
            # aiohttp sends an idempotent request again, once and
            # silently, when its connection closes before an answer (RFC 9112
            # 9.3.1); the retry layer then never sees that failure. Off here,
            # so a reset costs one attempt of RetryPolicy, counted like any
            # other; aiohttp offers no public switch for it.
            self._session._retry_connection = False
            # A store never closed would leave aiohttp's "Unclosed client
            # session" on stderr at exit; s3fs closes its own the same way.
            weakref.finalize(self, _close_soon, self._session, asyncio.get_running_loop())
        return self._session

    def _proxy(self, url: str) -> str | None:
        # botocore follows HTTP(S)_PROXY and NO_PROXY; so do these GETs.
        # Decided once per endpoint: aiohttp's trust_env reads the environment
        # and ~/.netrc on an executor thread for every request.
        parts = urllib.parse.urlsplit(url)
        key = (parts.scheme, parts.netloc)
        if key not in self._proxies:
            proxy = urllib.request.getproxies().get(parts.scheme)
            self._proxies[key] = None if not proxy or urllib.request.proxy_bypass(parts.hostname or "") else proxy
        return self._proxies[key]

    async def _url(self, full: str, *, fresh: bool = False) -> str:
        cached = self._urls.get(full)
        now = time.monotonic()
        if cached is not None and not fresh and now - cached[1] < _RESIGN_AFTER_S:
            return cached[0]
        url = await self._sign(self._fs, full)
        self._urls[full] = (url, now)
        return url

    async def read(self, full: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of ``full`` (``bucket/key``, ``container/blob``); fewer if the object is shorter.

        Raises:
            FileNotFoundError: no such object (404).
            HttpStatusError: any other answer than the bytes; 5xx, 408 and 429 are transient.
            PresignRefused: the store refused the presigned URL (4xx), signed afresh too.
        """
        headers = {"Range": f"bytes={start}-{end - 1}"}
        for fresh in (False, True):
            url = await self._url(full, fresh=fresh)
            async with self._http().get(url, headers=headers, proxy=self._proxy(url)) as response:
                status = response.status
                body = await response.read()
            if status == 206:
                return body
            if status == 200:
                # A server that ignores Range sends the whole object.
                return body[start:end]
            if status == 416:
                return b""
            if status == 404:
                raise FileNotFoundError(f"no object {full}")
            found = _ERROR_CODE.search(body[:4096])
            code = found.group(1).decode() if found else None
            if status >= 500 or status in (408, 429):
                raise HttpStatusError(status, code, f"GET {full} bytes [{start}, {end}) answered {status}")
            if status != 403 or fresh:
                raise PresignRefused(f"GET {full} on a presigned URL answered {status} {code or ''}".rstrip())
        raise AssertionError("unreachable")

    async def close(self) -> None:
        """Close the HTTP connections."""
        session, self._session = self._session, None
        self._urls.clear()
        if session is not None:
            await session.close()


def _close_soon(session: Any, loop: asyncio.AbstractEventLoop) -> None:
    if session.closed or loop.is_closed() or not loop.is_running():
        return
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        loop.create_task(session.close())
        return
    try:
        asyncio.run_coroutine_threadsafe(session.close(), loop).result(timeout=0.5)
    except Exception:  # noqa: BLE001 - best effort at exit; nothing to report to
        pass
