"""Whether the helper process still lives, read from the batch ring without a system call.

The trainer must raise at the very next step once its helper is gone, even
when steps the helper finished before it died are still queued, so it asks
at every step. Asking the kernel (``waitid``) is a system call, a few µs of
the trainer's CPU a step on a virtual machine.

Instead the helper's main thread locks a robust, process-shared mutex in the
ring's header (:func:`hold`) before it reports its first step, and holds it
for life. While it is held, the mutex's lock word is the holder's thread id
(the helper's pid); when the holder dies, however it dies, the kernel marks
the word ``FUTEX_OWNER_DIED`` as the thread exits, before the process can be
waited for. The trainer reads the word: the helper's pid means alive;
anything else (not locked yet, a platform without robust mutexes, the owner
dead: ``OWNER_DIED``) means asking the kernel as before.
"""

from __future__ import annotations

import ctypes
import sys

# Room for a pthread_mutex_t (40 bytes on x86-64 glibc, 48 on arm64),
# on a cache line of its own.
LOCK_BYTES = 64
_MUTEX_ATTR_BYTES = 64
_PTHREAD_PROCESS_SHARED = 1
_PTHREAD_MUTEX_ROBUST = 1
# What the kernel leaves in the lock word of a robust mutex whose
# holder died (linux/futex.h FUTEX_OWNER_DIED).
OWNER_DIED = 0x40000000


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        for name in (
            "pthread_mutexattr_init",
            "pthread_mutexattr_setpshared",
            "pthread_mutexattr_setrobust",
            "pthread_mutex_init",
            "pthread_mutex_lock",
        ):
            getattr(libc, name)
    except (OSError, AttributeError):
        return None
    return libc


def hold(address: int) -> bool:
    """In the helper's main thread: make a robust, process-shared mutex at
    ``address`` (``LOCK_BYTES`` zeroed bytes of the ring) and lock it for
    the life of the process. Whether it did (else the trainer asks the kernel)."""
    libc = _libc()
    if libc is None:
        return False
    attr = ctypes.create_string_buffer(_MUTEX_ATTR_BYTES)
    mutex = ctypes.c_void_p(address)
    if (
        libc.pthread_mutexattr_init(attr) != 0
        or libc.pthread_mutexattr_setpshared(attr, _PTHREAD_PROCESS_SHARED) != 0
        or libc.pthread_mutexattr_setrobust(attr, _PTHREAD_MUTEX_ROBUST) != 0
        or libc.pthread_mutex_init(mutex, attr) != 0
    ):
        return False
    return libc.pthread_mutex_lock(mutex) == 0
