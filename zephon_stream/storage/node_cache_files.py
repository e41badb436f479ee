"""The files of the node cache (``node_cache.py``): stored objects, locks and the sweeps.

Layout and locking rules are in ``node_cache.py``'s docstring; these are the
file-level steps it takes, each safe against a rank that dies at any point
(every lock is an ``fcntl.flock``, released by the kernel with its process).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import struct

GATE = "node-cache.lock"
USERS, LOCKS, OBJECTS, TMP = "node-cache-users", "node-cache-locks", "node-cache-objects", "node-cache-tmp"
LIMITS = "node-cache-limits"
SUBDIRS = (USERS, LOCKS, OBJECTS, TMP, LIMITS)
O_FLAGS = os.O_CLOEXEC | os.O_NOFOLLOW
_HEADER = struct.Struct("<4sQ16s")  # magic, payload length, blake2b-128 of the payload
_MAGIC = b"ZNC1"


def encode_object(data: bytes) -> bytes:
    return _HEADER.pack(_MAGIC, len(data), hashlib.blake2b(data, digest_size=16).digest()) + data


def decode_object(blob: bytes) -> bytes | None:
    """The payload of a stored file, or None when it is truncated or corrupt."""
    if len(blob) < _HEADER.size:
        return None
    magic, length, digest = _HEADER.unpack_from(blob)
    payload = blob[_HEADER.size :]
    if magic != _MAGIC or length != len(payload) or hashlib.blake2b(payload, digest_size=16).digest() != digest:
        return None
    return payload


def try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def make_root(root: str) -> None:
    # Not os.makedirs(exist_ok=True): it raises when a last user removes
    # the folder between its mkdir and its check.
    try:
        os.mkdir(root, 0o700)
    except FileExistsError:
        pass
    except FileNotFoundError:
        os.makedirs(os.path.dirname(root), exist_ok=True)
        make_root(root)


def lock_gate(root: str) -> int:
    """An fd of the gate file, flock-held, still the file at its path."""
    gate = os.path.join(root, GATE)
    while True:
        make_root(root)
        try:
            fd = os.open(gate, os.O_RDWR | os.O_CREAT | O_FLAGS, 0o600)
        except FileNotFoundError:
            continue  # The last user removed the root between makedirs and open.
        fcntl.flock(fd, fcntl.LOCK_EX)
        # A last user unlinks the gate while holding it; whoever waited on
        # that old inode sees it is no longer at the path and starts over on a
        # fresh one, so nobody registers in a root that is being removed.
        try:
            held, there = os.fstat(fd), os.stat(gate, follow_symlinks=False)
            if (held.st_dev, held.st_ino) == (there.st_dev, there.st_ino):
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


def live_users(root: str) -> int:
    """How many registrations are held; the dead ones (lock free) are removed."""
    folder = os.path.join(root, USERS)
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return 0
    live = 0
    for name in names:
        path = os.path.join(folder, name)
        try:
            fd = os.open(path, os.O_RDONLY | O_FLAGS)
        except FileNotFoundError:
            continue
        try:
            if try_lock(fd):
                unlink(path)  # Its owner died without closing (SIGKILL, os._exit).
            else:
                live += 1
        finally:
            os.close(fd)
    return live


def sweep_orphans(root: str) -> None:
    """Remove temporary files whose key lock is free: their writer died mid-write."""
    tmp_dir = os.path.join(root, TMP)
    try:
        names = os.listdir(tmp_dir)
    except FileNotFoundError:
        return
    for name in {n.split("@", 1)[0] for n in names}:
        fd = os.open(os.path.join(root, LOCKS, name), os.O_RDWR | os.O_CREAT | O_FLAGS, 0o600)
        try:
            if try_lock(fd):
                remove_temps(root, name)
        finally:
            os.close(fd)


def remove_temps(root: str, name: str) -> None:
    tmp_dir = os.path.join(root, TMP)
    for entry in os.listdir(tmp_dir):
        if entry.split("@", 1)[0] == name:
            unlink(os.path.join(tmp_dir, entry))


def wipe(root: str) -> None:
    for sub in SUBDIRS:
        shutil.rmtree(os.path.join(root, sub), ignore_errors=True)
