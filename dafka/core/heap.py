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

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameters
M_ARENA_MAX = -8
# Blocks of 1 MiB and more are mmapped: a store's write batches (store/batch_bytes) and whatever a burst
# makes as big.  Not the 64 KiB messages of live batches, nor the 256 KiB bulk answers: at 64 KiB every one
# of them was a fresh mapping, zero-filled on first touch and unmapped when freed, and a store spent 5.9-6.0
# us a 1000-byte record against 4.5-4.9 at 1 MiB, catching up at 0.95x the ceiling against 1.3-1.5x
# (issue 39, bench/run.py's store scenario, same run).
MMAP_THRESHOLD = 1024 * 1024

_lock = threading.Lock()
_libc: ctypes.CDLL | None = None
_tuned = False
# A thread that finds its arena locked by another makes a new one (up to 8 per core), and each keeps what was
# freed in it: a store starved of CPU beside 3 busy processes peaked at +46 MiB of anonymous memory through
# tests/test_store_memory.py's burst against +13 alone, and at +13-14 with 2 arenas (MALLOC_ARENA_MAX=2, twice).
# Its Python threads allocate under the GIL anyway; libzmq's I/O threads are the others.
ARENAS = 2


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
            libc = _glibc()
            _tuned = libc is not None and libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
            if not _tuned:
                log.debug("no glibc mallopt; the allocator keeps its own thresholds")
        return _tuned


def limit_arenas(arenas: int = ARENAS) -> bool:
    """Let glibc make at most ``arenas`` arenas from now on (process-wide); True if applied."""
    libc = _glibc()
    return libc is not None and libc.mallopt(M_ARENA_MAX, arenas) == 1


def trim() -> bool:
    """Return the free pages of every arena to the system; True if glibc did."""
    libc = _glibc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True
