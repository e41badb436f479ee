"""Typed readers for decoded msgpack maps, and the dataset-relative path rule.

Shared by the manifest and document-index codecs: every read names the
object and the field, and states what was expected and what was found.
"""

from __future__ import annotations

import re
from typing import Any

import msgpack

from zephon_stream.errors import FormatError, ManifestError, PathEscapeError

MAX_PATH_CHARS = 4096
MAX_UINT64 = 2**64 - 1
HEX64 = re.compile(r"[0-9a-f]{64}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def unpack_map(data: bytes, *, where: str, error: type[FormatError] = ManifestError) -> dict[str, Any]:
    """Decode msgpack bytes that must hold one map with string keys.

    Size limits are tied to ``len(data)`` so a hostile length prefix can never
    make the decoder allocate more than the input justifies.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise error(f"{where}: expected bytes, got {type(data).__name__}")
    size = len(data)
    try:
        obj = msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            use_list=True,
            max_str_len=size,
            max_bin_len=size,
            max_array_len=size,
            max_map_len=size,
            max_ext_len=size,
        )
    except Exception as exc:  # msgpack raises many unrelated types on bad input.
        raise error(f"{where}: not valid msgpack ({type(exc).__name__}: {exc})") from None
    if not isinstance(obj, dict):
        raise error(f"{where}: expected a msgpack map at the top level, got {type(obj).__name__}")
    return obj


class FieldReader:
    """Reads typed fields out of one decoded map, naming ``where`` in errors."""

    def __init__(self, obj: Any, *, where: str, error: type[FormatError] = ManifestError) -> None:
        if not isinstance(obj, dict):
            raise error(f"{where}: expected a map, got {type(obj).__name__}")
        self.obj = obj
        self.where = where
        self.error = error

    def fail(self, key: str, message: str) -> FormatError:
        return self.error(f"{self.where}: field {key!r}: {message}")

    def get(self, key: str) -> Any:
        if key not in self.obj:
            raise self.error(f"{self.where}: missing field {key!r}")
        return self.obj[key]

    def uint(self, key: str, *, minimum: int = 0, maximum: int = MAX_UINT64) -> int:
        value = self.get(key)
        if not isinstance(value, int) or isinstance(value, bool):
            raise self.fail(key, f"expected an integer, got {type(value).__name__}")
        if not minimum <= value <= maximum:
            raise self.fail(key, f"value {value} is outside [{minimum}, {maximum}]")
        return value

    def optional_uint(self, key: str, *, maximum: int = MAX_UINT64) -> int | None:
        if self.get(key) is None:
            return None
        return self.uint(key, maximum=maximum)

    def string(self, key: str, *, allow_empty: bool = False) -> str:
        value = self.get(key)
        if not isinstance(value, str):
            raise self.fail(key, f"expected a string, got {type(value).__name__}")
        if not value and not allow_empty:
            raise self.fail(key, "empty string")
        return value

    def hex_digest(self, key: str) -> str:
        value = self.string(key)
        if not HEX64.fullmatch(value):
            raise self.fail(key, f"expected 64 lowercase hex digits (sha256), got {value[:80]!r}")
        return value

    def binary(self, key: str) -> bytes:
        value = self.get(key)
        if not isinstance(value, bytes):
            raise self.fail(key, f"expected msgpack bin, got {type(value).__name__}")
        return value

    def array(self, key: str) -> list[Any]:
        value = self.get(key)
        if not isinstance(value, list):
            raise self.fail(key, f"expected an array, got {type(value).__name__}")
        return value

    def version(self, key: str) -> tuple[int, int]:
        value = self.get(key)
        if (
            not isinstance(value, list)
            or len(value) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_UINT64 for v in value)
        ):
            raise self.fail(key, f"expected [major, minor] non-negative integers, got {value!r:.80}")
        return value[0], value[1]


def check_relative_path(path: Any, *, field: str, where: str) -> str:
    """Check a dataset-relative object path and return it.

    A valid path is a non-empty ``/``-separated string with no empty, ``.`` or
    ``..`` component, no leading ``/``, no scheme (``s3:``, ``file:``, ``C:``),
    no backslash and no control character.

    Raises:
        PathEscapeError: naming the path, the field and the manifest.
    """
    if not isinstance(path, str):
        raise ManifestError(f"{where}: field {field!r}: expected a path string, got {type(path).__name__}")
    reason = None
    if not path:
        reason = "empty path"
    elif len(path) > MAX_PATH_CHARS:
        reason = f"longer than {MAX_PATH_CHARS} characters"
    elif path.startswith("/"):
        reason = "absolute path"
    elif ":" in path:
        reason = "has a scheme or drive (':' is not allowed)"
    elif "\\" in path:
        reason = "contains a backslash"
    elif _CONTROL.search(path):
        reason = "contains a control character"
    else:
        for part in path.split("/"):
            if part == "":
                reason = "has an empty component"
            elif part == "..":
                reason = "climbs out of the dataset root with '..'"
            elif part == ".":
                reason = "has a '.' component"
            if reason:
                break
    if reason:
        raise PathEscapeError(
            f"{where}: field {field!r}: path {path[:200]!r} {reason}; paths must stay inside the dataset root"
        )
    return path
