"""Paths inside a store: relative, ``/``-separated, never leaving its root."""

from __future__ import annotations

import re

from zephon_stream.errors import PathEscapeError

_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def check_relative_path(path: str, *, root: str = "store root") -> str:
    """Return ``path`` if it is a clean relative path inside the root.

    Raises:
        PathEscapeError: ``path`` is empty, absolute, has a scheme or a drive,
            uses backslashes or NUL, or has ``..``, ``.`` or empty segments.
    """
    if not isinstance(path, str):
        raise PathEscapeError(f"path {path!r} under {root}: not a string")
    reason = None
    if not path:
        reason = "empty path"
    elif path.startswith("/"):
        reason = "absolute path"
    elif _SCHEME.match(path):
        reason = "has a scheme or drive"
    elif "\\" in path or "\x00" in path:
        reason = "backslash or NUL in path"
    else:
        for segment in path.split("/"):
            if segment in ("", ".", ".."):
                reason = f"segment {segment!r} not allowed"
                break
    if reason is not None:
        raise PathEscapeError(f"path {path!r} escapes {root}: {reason}")
    return path


__all__ = ["check_relative_path"]
