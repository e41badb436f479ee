"""The one seam to the outside: a narrow store interface over local folders and
fsspec (S3) URLs, with retries, counters and secret redaction.

``storage`` never imports torch.
"""

from zephon_stream.storage.base import STAT_KEYS, Store, check_relative_path
from zephon_stream.storage.copy import copy_dataset
from zephon_stream.storage.fsspec_store import FsspecStore
from zephon_stream.storage.inputs import expand_inputs, open_input
from zephon_stream.storage.local import LocalStore
from zephon_stream.storage.redact import redact_options, redact_text
from zephon_stream.storage.retry import RetryPolicy
from zephon_stream.storage.urls import is_local_url, join_url, local_path, open_store, parse_storage_options

__all__ = [
    "STAT_KEYS",
    "FsspecStore",
    "LocalStore",
    "RetryPolicy",
    "Store",
    "check_relative_path",
    "copy_dataset",
    "expand_inputs",
    "is_local_url",
    "join_url",
    "local_path",
    "open_input",
    "open_store",
    "parse_storage_options",
    "redact_options",
    "redact_text",
]
