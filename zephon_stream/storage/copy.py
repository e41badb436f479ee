"""Copy a dataset's objects from one store to another (a local folder to S3, say)."""

from __future__ import annotations

import os
from typing import Any

from zephon_stream.format.spec import MANIFEST_NAME
from zephon_stream.storage.urls import open_store


def copy_dataset(
    src_url: str | os.PathLike[str],
    dst_url: str,
    *,
    src_options: dict[str, Any] | None = None,
    dst_options: dict[str, Any] | None = None,
) -> int:
    """Copy every object under ``src_url`` to the same relative path under ``dst_url``.

    The manifest, when there is one, is written last, so a reader of the
    destination never sees a committed dataset with objects still missing.

    Returns:
        The number of objects copied.
    """
    with open_store(src_url, src_options) as src, open_store(dst_url, dst_options) as dst:
        paths = src.list()
        ordered = [p for p in paths if p != MANIFEST_NAME] + [p for p in paths if p == MANIFEST_NAME]
        for path in ordered:
            dst.write_atomic(path, src.read(path))
    return len(ordered)
