"""A node-local cache of small immutable metadata that the ranks of one node share.

One rank fetches an object (a manifest, a page of an index object) from the
store and puts it in a folder on the node; the other ranks read it from there.
Everything is coordinated with ``fcntl.flock`` locks, which the kernel releases
when a process dies, so a SIGKILLed rank never leaves a lock held.

Layout under the root (the cache owns it: created if missing, removed at the end
when the cache has left it empty)::

    node-cache.lock           the gate: held to register, deregister and wipe
    node-cache-users/<id>     one file per open NodeCache, flock-held while open
    node-cache-locks/<name>   one lock per key, held while that key is fetched
    node-cache-objects/<name> header (magic, length, blake2b) + the bytes
    node-cache-tmp/<name>@<id> objects being written, renamed into place
    node-cache-limits/<name>  a store's request-rate limiter (storage/limiter.py)

``storage`` never imports torch.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import stat
import tempfile
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from zephon_stream.errors import ConfigError
from zephon_stream.storage.node_cache_files import (
    GATE,
    LIMITS,
    LOCKS,
    O_FLAGS,
    OBJECTS,
    SUBDIRS,
    TMP,
    USERS,
    decode_object,
    encode_object,
    live_users,
    lock_gate,
    make_root,
    remove_temps,
    sweep_orphans,
    try_lock,
    unlink,
    wipe,
)
from zephon_stream.storage.node_ranks import node_ranks

ENV_VAR = "ZEPHON_NODE_CACHE"
_SAFE_KEY = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*(/[A-Za-z0-9_-][A-Za-z0-9_.-]*)*")
_MAX_KEY_CHARS = 4096
_MAX_PLAIN_NAME = 160
_SPACE_LOCK = "@space"  # '@' never appears in a key's file name, so no key can take this lock.


def node_cache_root(env: Mapping[str, str] | None = None, explicit: str | None = None) -> str | None:
    """Where the ranks of one node share metadata, or None when there is nothing to share.

    Args:
        env: The environment to read (``os.environ`` when None).
        explicit: A node-local folder the user names; wins over everything else.

    Returns:
        ``explicit``; else ``$ZEPHON_NODE_CACHE`` if set and not empty; else, when
        the launcher that started this process says its node runs more than one
        rank (torchrun, Slurm's ``srun``, ``mpirun``: ``node_ranks.py``), a folder
        under ``/dev/shm`` (the temp folder where that is missing) whose name
        holds this user's uid; else None (one rank per node, or no launcher).

    Raises:
        ConfigError: the launcher's variable is not a positive integer.
    """
    env = os.environ if env is None else env
    if explicit:
        return os.fspath(explicit)
    if env.get(ENV_VAR):
        return env[ENV_VAR]
    ranks = node_ranks(env)
    if ranks is None or ranks.count <= 1:
        return None
    base = (
        "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK | os.X_OK) else tempfile.gettempdir()
    )
    # One folder per user, not per job: a job whose ranks were all killed
    # leaves its files here, and the next job of this user on the node wipes
    # them when it opens the folder; a per-job name would never be opened again.
    return os.path.join(base, f"zephon-node-cache-{os.getuid()}")


def key_file_name(key: str) -> str:
    """The file name that holds ``key``: the key itself for short safe keys, else a hash.

    Raises:
        ValueError: ``key`` is not a non-empty printable string of at most 4096 characters.
    """
    if not isinstance(key, str) or not key or len(key) > _MAX_KEY_CHARS or not key.isprintable():
        raise ValueError(f"node cache key {key!r}: want a non-empty printable string of at most {_MAX_KEY_CHARS} chars")
    if len(key) <= _MAX_PLAIN_NAME and _SAFE_KEY.fullmatch(key):
        return key.replace("/", "~")  # '~' is not a safe character, so no two keys meet.
    # URLs and long keys become a digest: no ':' or '%' in names, and a
    # presigned URL's token never lands in a file name.
    return "=" + hashlib.blake2b(key.encode(), digest_size=20).hexdigest()


class _Registration:
    """What deregistering needs, apart from the NodeCache (so its finalizer can run)."""

    def __init__(self, root: str, user_path: str, user_fd: int) -> None:
        self.root, self.user_path, self.user_fd = root, user_path, user_fd
        self.pid = os.getpid()

    @property
    def open(self) -> bool:
        return self.user_fd >= 0 and self.pid == os.getpid()

    def forget(self) -> None:
        """In a forked child: drop the inherited fd; the registration stays the parent's."""
        if self.user_fd >= 0:
            os.close(self.user_fd)
        self.user_fd = -1

    def close(self) -> None:
        if not self.open:
            self.forget()
            return
        _OPEN.discard(self)
        gate = lock_gate(self.root)
        try:
            unlink(self.user_path)
            os.close(self.user_fd)
            self.user_fd = -1
            if live_users(self.root):
                sweep_orphans(self.root)
                return
            # The last user, holding the gate: remove the subfolders first,
            # the gate last (a newcomer then opens a new gate and finds an empty
            # root), and the root only if empty (a newcomer's files keep it).
            wipe(self.root)
            unlink(os.path.join(self.root, GATE))
            try:
                os.rmdir(self.root)
            except OSError:
                pass
        finally:
            os.close(gate)


_OPEN: weakref.WeakSet[_Registration] = weakref.WeakSet()


def _forget_in_child() -> None:
    # A forked child must neither keep its parent's registration alive
    # after the parent dies nor deregister it when the child exits.
    for registration in list(_OPEN):
        registration.forget()
    _OPEN.clear()


os.register_at_fork(after_in_child=_forget_in_child)


class NodeCache:
    """Immutable metadata shared by the processes of one node through a folder.

    Open one per process (a forked child opens its own); use as a context
    manager or call ``close()``. An atexit hook and the finalizer close it too.

    Args:
        root: A node-local folder for the cache alone (``/dev/shm`` is best); see
            ``node_cache_root``. Created if missing; it must belong to this user.
        max_bytes: Bytes kept on the node, headers included; past it ``get``
            returns what it fetched without storing it.

    Raises:
        ConfigError: ``root`` is not a folder of this user, or ``max_bytes`` < 0.
    """

    def __init__(self, root: str | os.PathLike[str], *, max_bytes: int = 512 * 2**20) -> None:
        if max_bytes < 0:
            raise ConfigError(f"node cache max_bytes={max_bytes}: must be >= 0")
        self._root = os.path.abspath(os.fspath(root))
        self._max_bytes = max_bytes
        self._stats_lock = threading.Lock()
        self._stats = {"hits": 0, "fetches": 0, "waits": 0, "bytes": 0, "not_stored": 0, "dropped": 0}
        # Checked before the gate is made, so nothing lands in a folder of another user.
        make_root(self._root)
        self._check_root(missing_ok=True)
        # os.urandom, not the secrets module: a script run from a folder
        # with a secrets.py of its own (torchrun runs scripts so) shadows it.
        user_path = os.path.join(self._root, USERS, f"{os.getpid()}-{os.urandom(6).hex()}")
        fd = -1
        gate = lock_gate(self._root)
        try:
            self._check_root(missing_ok=False)
            if not live_users(self._root):
                wipe(self._root)  # Every earlier user died: their files are stale.
            for sub in SUBDIRS:
                os.makedirs(os.path.join(self._root, sub), mode=0o700, exist_ok=True)
            fd = os.open(user_path, os.O_RDWR | os.O_CREAT | os.O_EXCL | O_FLAGS, 0o600)
            # Locked before the gate is let go, so nobody ever sees it free.
            fcntl.flock(fd, fcntl.LOCK_EX)
            sweep_orphans(self._root)
        except BaseException:
            if fd >= 0:
                unlink(user_path)
                os.close(fd)
            raise
        finally:
            os.close(gate)
        self._registration = _Registration(self._root, user_path, fd)
        _OPEN.add(self._registration)
        self._finalizer = weakref.finalize(self, self._registration.close)

    def _check_root(self, *, missing_ok: bool) -> None:
        try:
            info = os.stat(self._root)
        except FileNotFoundError:
            if missing_ok:
                return  # A last user just removed it; the gate makes it again, as ours.
            raise
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            raise ConfigError(
                f"node cache root {self._root}: not a folder of uid {os.getuid()} (owner uid {info.st_uid}); "
                f"name another with {ENV_VAR}"
            )

    @property
    def root(self) -> str:
        """The folder the cache lives in."""
        return self._root

    @property
    def closed(self) -> bool:
        """Whether this process can no longer use the cache (closed, or inherited by fork)."""
        return not self._registration.open

    def _count(self, **deltas: int) -> None:
        with self._stats_lock:
            for name, delta in deltas.items():
                self._stats[name] += delta

    def _path(self, sub: str, name: str) -> str:
        return os.path.join(self._root, sub, name)

    def _read(self, name: str) -> tuple[bytes | None, bool]:
        """The payload stored under ``name``, and whether a file (good or bad) is there."""
        try:
            with open(self._path(OBJECTS, name), "rb") as f:
                blob = f.read()
        except FileNotFoundError:
            return None, False
        return decode_object(blob), True

    def get(self, key: str, fetch: Callable[[], bytes]) -> bytes:
        """The bytes under ``key``, from the node if a process put them there, else fetched and stored.

        At most one process of the node fetches a key at a time: the others wait
        for it and then read what it stored. A fetch that raises stores nothing;
        the error reaches its caller and the next caller fetches again.

        Args:
            key: ``/``-separated name, e.g. ``"index/<fingerprint>/blocks/3"``.
            fetch: Returns the bytes when they are not on the node yet.

        Raises:
            ValueError: the key is not valid, or the cache is closed.
            TypeError: ``fetch`` returned something other than bytes.
        """
        name = key_file_name(key)
        if not self._registration.open:
            raise ValueError(f"node cache at {self._root}: closed (or opened in a parent process)")
        data, _ = self._read(name)
        if data is not None:
            self._count(hits=1)
            return data
        lock = os.open(self._path(LOCKS, name), os.O_RDWR | os.O_CREAT | O_FLAGS, 0o600)
        try:
            if not try_lock(lock):
                self._count(waits=1)
                fcntl.flock(lock, fcntl.LOCK_EX)
            data, present = self._read(name)
            if data is not None:
                self._count(hits=1)
                return data
            if present:
                unlink(self._path(OBJECTS, name))  # Truncated or corrupt: never data.
                self._count(dropped=1)
            # We hold the key's lock, so any temporary file of this key is
            # a dead writer's.
            remove_temps(self._root, name)
            data = fetch()
            if not isinstance(data, (bytes, bytearray, memoryview)):
                raise TypeError(f"node cache key {key!r}: fetch returned {type(data).__name__}, not bytes")
            data = bytes(data)
            self._count(fetches=1)
            self._store(name, data)
            return data
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            os.close(lock)

    def _store(self, name: str, data: bytes) -> None:
        blob = encode_object(data)
        space = os.open(self._path(LOCKS, _SPACE_LOCK), os.O_RDWR | os.O_CREAT | O_FLAGS, 0o600)
        try:
            # The sum and the rename under one node-wide lock keep the
            # bound exact when several keys are stored at once.
            fcntl.flock(space, fcntl.LOCK_EX)
            if self._stored_bytes() + len(blob) > self._max_bytes:
                self._count(not_stored=1)
                return
            tmp = self._path(TMP, f"{name}@{os.getpid()}-{os.urandom(6).hex()}")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | O_FLAGS, 0o600)
            try:
                view = memoryview(blob)
                while view:
                    view = view[os.write(fd, view) :]
            except BaseException:
                os.close(fd)
                unlink(tmp)
                raise
            os.close(fd)
            # No fsync: /dev/shm is memory and a node's cache does not
            # outlive its jobs; on a disk, a torn file fails the digest check.
            os.replace(tmp, self._path(OBJECTS, name))
            self._count(bytes=len(data))
        finally:
            fcntl.flock(space, fcntl.LOCK_UN)
            os.close(space)

    def _stored_bytes(self) -> int:
        total = 0
        with os.scandir(os.path.join(self._root, OBJECTS)) as entries:
            for entry in entries:
                try:
                    total += entry.stat(follow_symlinks=False).st_size
                except FileNotFoundError:
                    pass
        return total

    def limiter_path(self, name: str) -> str:
        """The file of the node's request-rate limiter ``name`` (``limiter.py``); removed with the cache.

        Raises:
            ValueError: the cache is closed, or ``name`` is not a plain file name.
        """
        if not self._registration.open:
            raise ValueError(f"node cache at {self._root}: closed (or opened in a parent process)")
        if not re.fullmatch(r"[A-Za-z0-9_-]+", name):
            raise ValueError(f"node cache limiter name {name!r}: want letters, digits, '_' and '-'")
        return self._path(LIMITS, name)

    def stats(self) -> dict[str, int]:
        """This process's counts: ``hits`` (read from the node), ``fetches``, ``waits``
        (for another process's fetch), ``bytes`` (payload stored on the node),
        ``not_stored`` (past ``max_bytes``) and ``dropped`` (corrupt files removed)."""
        with self._stats_lock:
            return dict(self._stats)

    def close(self) -> None:
        """Deregister; the last user of the node removes every file and folder the cache made."""
        self._finalizer()

    def __enter__(self) -> NodeCache:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"NodeCache({self._root!r}, closed={self.closed})"


__all__ = ["ENV_VAR", "NodeCache", "key_file_name", "node_cache_root"]
