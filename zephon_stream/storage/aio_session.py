"""The process's aiobotocore session, shared by every S3 client this package makes.

Below the store and the client settings: ``fsspec_store`` gives it to s3fs,
``cloud_clients`` warms it in a helper process before its first read.
"""

from __future__ import annotations

import datetime
import email.utils
import os
import threading
from typing import Any

_session_lock = threading.Lock()
_sessions: dict[tuple[Any, ...], Any] = {}
_CREDENTIAL_ENV = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CONFIG_FILE",
)


def shared_aio_session() -> Any:
    """One aiobotocore session per process and credential environment.

    Each session parses botocore's S3 service model on its first client
    (about half a second); sharing it makes opening a store cheap. A session
    caches the credentials it found, so a changed AWS environment gets its own.
    """
    key = (os.getpid(), *(os.environ.get(name) for name in _CREDENTIAL_ENV))
    with _session_lock:
        session = _sessions.get(key)
        if session is None:
            import aiobotocore.session

            if any(k[0] != os.getpid() for k in _sessions):
                _sessions.clear()
            session = _sessions[key] = aiobotocore.session.AioSession()
            # botocore parses each response's Last-Modified header with
            # dateutil: about a fifth of the client's CPU per ranged GET.
            session.get_component("response_parser_factory").set_parser_defaults(timestamp_parser=parse_timestamp)
        return session


def parse_timestamp(value: Any) -> datetime.datetime:
    """botocore's timestamp parser, with the two forms S3 sends read by the standard library.

    HTTP dates (``Last-Modified: Tue, 01 Dec 2026 10:00:00 GMT``) and ISO 8601
    (listings) come out as the same aware datetimes; anything else goes to botocore.
    """
    if isinstance(value, str):
        try:
            if value.endswith(" GMT"):
                return email.utils.parsedate_to_datetime(value)
            parsed = datetime.datetime.fromisoformat(value)
            if parsed.tzinfo is not None:
                return parsed
        except (TypeError, ValueError, IndexError):
            pass
    from botocore.utils import parse_timestamp as botocore_parse_timestamp

    return botocore_parse_timestamp(value)
