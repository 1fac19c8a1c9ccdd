"""Giving freed memory back to the system (glibc).

glibc keeps what a process frees for its next allocations: only the top of
each heap shrinks on its own, so a few live blocks above a burst's freed ones
keep all of them resident.  A peer that held many bytes for a while (a store
through a burst, a producer whose unacked window filled while its stores were
behind) calls :func:`trim` once it holds few again: ``malloc_trim(0)`` returns
every free page of every arena, in about 10-20 ms.  On a C library without
it (musl, macOS) both calls do nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading

log = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
import os
MMAP_THRESHOLD = int(os.environ.get("DAFKA_EXP_MMAP", 64 * 1024))

_lock = threading.Lock()
_libc: ctypes.CDLL | None = None
_tuned = False


def _glibc() -> ctypes.CDLL | None:
    global _libc
    if _libc is None:
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            libc.malloc_trim, libc.mallopt  # noqa: B018 - both exist only in glibc
        except (OSError, AttributeError):
            return None
        _libc = libc
    return _libc


def mmap_large_blocks() -> bool:
    """mmap every allocation of :data:`MMAP_THRESHOLD` bytes and more, so that
    freeing one unmaps it (glibc would otherwise raise that threshold to 32 MiB
    after the first such free, and keep them in its heaps).  Process-wide and
    set once; True if applied."""
    global _tuned
    with _lock:
        if not _tuned:
            if MMAP_THRESHOLD == 0:
                return False
            libc = _glibc()
            _tuned = libc is not None and libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
            if not _tuned:
                log.debug("no glibc mallopt; the allocator keeps its own thresholds")
        return _tuned


def trim() -> bool:
    """Return the free pages of every arena to the system; True if glibc did."""
    libc = _glibc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True
