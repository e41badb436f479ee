"""What a storage failure tells the user to do: which credentials to set, and
whether the endpoint could be reached at all.

Recognised by the client library's error, looked up without importing the
library (one never imported raised nothing).
"""

from __future__ import annotations

import socket

_S3_CREDENTIALS = (
    "no S3 credentials were found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), and "
    "AWS_ENDPOINT_URL for a store other than AWS; or pass storage_options={'key': ..., 'secret': ..., "
    "'endpoint_url': ...} (on the command line: --storage-option key=... --storage-option secret=... "
    "--storage-option endpoint_url=...); a public bucket reads with storage_options={'anon': True}"
)
_AZURE_CREDENTIALS = (
    "no Azure credentials were found: set AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT_NAME with "
    "AZURE_STORAGE_ACCOUNT_KEY or AZURE_STORAGE_SAS_TOKEN; or pass storage_options={'connection_string': ...} "
    "or {'account_name': ..., 'account_key': ...} (on the command line: --storage-option connection_string=...)"
)
# Errors raised before any request was answered because nothing listens,
# the name does not resolve or the connection could not be made in time;
# a reset or a cut body came from a server that was there.
_UNREACHABLE_NAMES = frozenset(
    {
        "EndpointConnectionError",  # botocore
        "ConnectTimeoutError",  # botocore
        "ClientConnectorError",  # aiohttp, and its DNS and certificate kinds below
        "ClientConnectorDNSError",
        "ConnectionTimeoutError",  # aiohttp
        "ServiceRequestError",  # azure-core: the request was never sent
        "ConnectTimeout",  # requests
    }
)


def error_chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from or during, outermost first (at most 16)."""
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and not any(current is s for s in seen) and len(seen) < 16:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def credentials_hint(exc: BaseException) -> str:
    """``"; "`` and what to set, where ``exc`` says the client found no credentials; else ``""``."""
    for item in error_chain(exc):
        module = type(item).__module__
        name = type(item).__name__
        if module.startswith("botocore") and name in ("NoCredentialsError", "PartialCredentialsError"):
            return f"; {_S3_CREDENTIALS}"
        if isinstance(item, ValueError) and "connection_string or account_name" in str(item):
            return f"; {_AZURE_CREDENTIALS}"
    return ""


def is_unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` says the endpoint could not be reached (refused, unresolvable, connect timeout)."""
    for item in error_chain(exc):
        if isinstance(item, (ConnectionRefusedError, socket.gaierror)):
            return True
        if any(cls.__name__ in _UNREACHABLE_NAMES for cls in type(item).__mro__):
            return True
    return False
