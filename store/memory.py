"""Giving a burst's memory back to the system.

A burst leaves the store's RSS far above what it holds (issue 26): libzmq's I/O
thread allocates every message it receives and the writer thread frees it, so
glibc spreads them over several arenas and keeps the freed space; LevelDB's
memtable stays full until the next write fills it.  Three things fix that:

* :func:`dafka.core.heap.limit_arenas`, set when a writer starts: at most 2 arenas.  A thread that finds its
  arena locked makes a new one, so a store starved of CPU had many, each keeping what was freed in it
  (+46 MiB beside 3 busy processes through tests/test_store_memory.py's burst, +13-14 MiB with 2).
* :func:`dafka.core.heap.mmap_large_blocks`, set when a writer starts: blocks of 1 MiB and more (LevelDB's
  write batches, what a burst makes as big) are mmapped, and so unmapped when
  freed.  glibc would otherwise raise that threshold to 32 MiB after the first
  such free, and keep them in its heaps.  It is process-wide
  and set once.
* :func:`release`, when the writer has been idle for ``store/memory/idle_ms``:
  the memtable is written to disk, then ``malloc_trim(0)`` returns the free
  pages of every arena.  It takes about 10-20 ms, once per burst.

On a C library without these calls (musl, macOS) they do nothing.
"""

from __future__ import annotations

import plyvel

from dafka.core import heap

# A key after every key the store writes (they start with a printable prefix byte, store/keys.py):
# compacting this empty range makes LevelDB write its memtable, and nothing else.
_PAST_EVERY_KEY = b"\xff" * 8


def release(db: plyvel.DB | None) -> None:
    """Write LevelDB's memtable to disk and return free heap pages to the system."""
    if db is not None:
        db.compact_range(start=_PAST_EVERY_KEY, stop=_PAST_EVERY_KEY + b"\xff")
    heap.trim()
