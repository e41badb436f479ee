"""Client settings for Google Cloud Storage (gcsfs) and Azure Blob (adlfs).

Each client library retries on its own schedule: gcsfs up to 6 attempts with
sleeps up to 32 s, the Azure SDK up to 10 with exponential backoff (one 503
became a 20 s stall). Both are cut to a single attempt here, as botocore and
s3fs are for S3, so that ``RetryPolicy`` is the one layer that retries, bounds
the time and counts every retry in ``stats()["retries"]``.

Also here, for every store: the storage options a library is given (the
user's, less this package's own ``zephon_presigned_reads`` and
``zephon_throttle_limiter``), and the warm-up
a helper process runs for them.
"""

from __future__ import annotations

import os
import types
from collections.abc import Mapping
from typing import Any

from zephon_stream.storage.aio_session import shared_aio_session
from zephon_stream.storage.retry import RetryPolicy
from zephon_stream.storage.schemes import AZURE_PROTOCOLS, GCS_PROTOCOLS, OWN_OPTIONS, S3_PROTOCOLS


def client_options(storage_options: Mapping[str, Any] | None) -> dict[str, Any]:
    """A copy of the user's storage options without this package's own."""
    opts = dict(storage_options or {})
    for name in OWN_OPTIONS:
        opts.pop(name, None)
    return opts


def filesystem_options(protocol: str, storage_options: Mapping[str, Any] | None, policy: RetryPolicy) -> dict[str, Any]:
    """fsspec keyword arguments for a non-S3 ``protocol``: the user's options plus timeouts.

    The per-attempt connect and read timeouts of ``policy`` bound each request
    (gcsfs ``requests_timeout``, adlfs ``connection_timeout`` and
    ``read_timeout``). Options the user passes explicitly win.
    """
    opts = client_options(storage_options)
    if protocol in GCS_PROTOCOLS:
        # Pointed at an emulator, gcsfs would otherwise look for Google
        # credentials, the metadata server included; Google's own client
        # connects anonymously there too.
        if "token" not in opts and os.environ.get("STORAGE_EMULATOR_HOST"):
            opts["token"] = "anon"
        if "requests_timeout" not in opts:
            import aiohttp

            opts["requests_timeout"] = aiohttp.ClientTimeout(
                connect=policy.connect_timeout_s, sock_read=policy.read_timeout_s
            )
    elif protocol in AZURE_PROTOCOLS:
        opts.setdefault("connection_timeout", max(1, round(policy.connect_timeout_s)))
        opts.setdefault("read_timeout", max(1, round(policy.read_timeout_s)))
    opts["skip_instance_cache"] = True
    return opts


def make_single_attempt(protocol: str, fs: Any) -> None:
    """Turn off the client library's own retries on ``fs`` (gcsfs, adlfs; others untouched)."""
    if protocol in GCS_PROTOCOLS:
        _gcsfs_single_attempt(fs)
    elif protocol in AZURE_PROTOCOLS:
        _adlfs_single_attempt(fs)


def _gcsfs_single_attempt(fs: Any) -> None:
    # gcsfs wraps its request methods in a retry decorator whose attempt
    # count is fixed when the class is defined; ``GCSFileSystem.retries`` is
    # not read afterwards. The undecorated methods, bound to this instance,
    # make one attempt each.
    for name in ("_request", "_get_file_request"):
        method = getattr(type(fs), name, None)
        raw = getattr(method, "__wrapped__", None)
        if raw is not None:
            setattr(fs, name, types.MethodType(raw, fs))
    make_session = getattr(fs, "_set_session", None)
    if make_session is None:
        return

    async def set_session() -> Any:
        # aiohttp sends an idempotent request again, once and silently,
        # when its connection closes before an answer (RFC 9112 9.3.1): a retry
        # RetryPolicy would never see nor count. gcsfs makes its one session
        # here; aiohttp has no public switch for it.
        session = await make_session()
        session._retry_connection = False
        return session

    fs._set_session = set_session


def _adlfs_single_attempt(fs: Any) -> None:
    # adlfs builds its BlobServiceClient without retry settings; every
    # blob client it derives shares the service client's retry policy object,
    # so setting its counts to zero makes every request a single attempt.
    client = getattr(fs, "service_client", None)
    policy = getattr(getattr(client, "_config", None), "retry_policy", None)
    if policy is None:
        return
    for name in ("total_retries", "connect_retries", "read_retries", "status_retries"):
        if hasattr(policy, name):
            setattr(policy, name, 0)


def warm_client_library(scheme: str) -> None:
    """Load what the first client of ``scheme`` in this process needs, before it is needed.

    The first S3 read of a fresh process took 0.5-0.6 s, all but 45 ms of it
    importing s3fs and aiobotocore and parsing botocore's S3 models; a helper
    process that knows its streams' schemes pays that before it says it is
    ready instead of at its first step. Unknown schemes: nothing to do.
    """
    if scheme in S3_PROTOCOLS:
        import s3fs  # noqa: F401 - the import is the work

        loader = shared_aio_session().get_component("data_loader")
        loader.load_service_model("s3", "service-2")
        loader.load_service_model("s3", "endpoint-rule-set-1")
        for name in ("partitions", "endpoints", "sdk-default-configuration"):
            loader.load_data(name)
    elif scheme in GCS_PROTOCOLS:
        import gcsfs  # noqa: F401
    elif scheme in AZURE_PROTOCOLS:
        import adlfs  # noqa: F401
