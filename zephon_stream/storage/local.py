"""A store over a local folder."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from zephon_stream.storage.base import Store
from zephon_stream.storage.retry import RetryPolicy


def _read_umask() -> int:
    # os.umask can only be read by setting it; do it once, at import,
    # before any writer thread exists.
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _read_umask()

TEMP_PREFIX = ".tmp-"


class LocalStore(Store):
    """Plain files under ``root``.

    ``write_atomic`` writes a temporary file in the target's folder, fsyncs it
    and renames it over the target, so a reader (or a crash) never sees half an
    object. Temporary files start with ``.tmp-`` and are never listed.
    """

    def __init__(self, root: str | os.PathLike[str], *, retry: RetryPolicy | None = None) -> None:
        self._root = Path(root).expanduser().absolute()
        super().__init__(url=str(self._root), retry=retry)

    @property
    def root(self) -> Path:
        return self._root

    def local_path(self, path: str) -> Path:
        """The file behind relative ``path`` (checked not to escape the root)."""
        return self._root / self._check(path)

    def _open(self, path: str) -> Any:
        try:
            return open(self._root / path, "rb")
        except NotADirectoryError:
            # A folder on the way is a file (a file named as the root): no object is there.
            raise FileNotFoundError(f"no file at {self._root / path}: a folder on its path is a file") from None

    def _read(self, path: str) -> bytes:
        with self._open(path) as f:
            return f.read()

    def _read_range(self, path: str, start: int, end: int) -> bytes:
        with self._open(path) as f:
            # read() allocates the size asked for up front; a manifest
            # claiming a 1 TiB block must end in a truncation error, not a
            # MemoryError, so never ask for more than the file holds.
            size = os.fstat(f.fileno()).st_size
            f.seek(start)
            return f.read(max(0, min(end, size) - start))

    def _write(self, path: str, data: bytes) -> None:
        target = self._root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=TEMP_PREFIX + target.name + ".")
        try:
            # mkstemp creates 0600; a dataset must be readable like any
            # file the user writes, so apply the usual 0666 minus the umask.
            os.fchmod(fd, 0o666 & ~_UMASK)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        # fsync the folder so the rename itself survives a power loss.
        dir_fd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def _exists(self, path: str) -> bool:
        return (self._root / path).is_file()

    def _size(self, path: str) -> int:
        target = self._root / path
        if not target.is_file():
            raise FileNotFoundError(f"no file at {target}")
        return target.stat().st_size

    def _list(self, prefix: str) -> list[str]:
        base = self._root
        # Walk only the folder the prefix names, not the whole tree.
        if "/" in prefix:
            base = self._root / prefix.rsplit("/", 1)[0]
        if not base.is_dir():
            return []
        found = []
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames.sort()
            for name in filenames:
                if name.startswith(TEMP_PREFIX):
                    continue
                rel = Path(dirpath, name).relative_to(self._root).as_posix()
                if rel.startswith(prefix):
                    found.append(rel)
        return found

    def root_kind(self) -> str:
        """``"folder"``, ``"file"`` (the root is a file) or ``"missing"``."""
        if self._root.is_dir():
            return "folder"
        return "file" if self._root.exists() else "missing"

    def _delete(self, path: str) -> None:
        try:
            os.unlink(self._root / path)
        except FileNotFoundError:
            pass

    def __reduce__(self) -> tuple[Any, ...]:
        return (LocalStore, (str(self._root),), {"_retry": self._retry})
