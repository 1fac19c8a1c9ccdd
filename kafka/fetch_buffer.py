"""What a connection's reader keeps of one partition between two Fetches: the rows its dafka consumer
delivered, in chunks as they came, taken by offset and by bytes with C-level slices and bisections rather
than a Python step a record (sans-I/O; the server's ``_Reader`` fills it, its Fetches take from it)."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import deque
from itertools import accumulate
from operator import itemgetter
from typing import Any

Row = tuple[int, int, Any, Any, tuple[tuple[str, Any], ...]]  # offset, unix ms, key, value, headers
ROW_BYTES = 20  # what a row counts beside its key and value towards a Fetch's byte limits
_offset = itemgetter(0)


class PartitionBuffer:
    """Rows in rising offsets (a compacted partition's may skip some, rfc 19), from :attr:`next` back."""

    def __init__(self) -> None:
        self.next = -1  # the offset the consumer delivers next (-1: not seeked yet)
        self.records = 0  # rows held, for the reader's bound (a chunk partly taken counts whole)
        self._chunks: deque[tuple[list[Row], list[int]]] = deque()  # rows, and their bytes summed up to each

    def add(self, rows: list[Row]) -> None:
        """Rows the consumer delivered: those below :attr:`next` (delivered again) are left out."""
        if rows and rows[0][0] < self.next:
            rows = rows[bisect_left(rows, self.next, key=_offset):]
        if not rows:
            return
        self._chunks.append((rows, list(accumulate(len(r[3] or b"") + len(r[2] or b"") + ROW_BYTES for r in rows))))
        self.records += len(rows)
        self.next = rows[-1][0] + 1

    def holds(self, offset: int) -> bool:
        """Whether a Fetch from ``offset`` is served from here: from a held row's offset up to :attr:`next`.
        The rows before it go (a client fetches onwards)."""
        chunks = self._chunks
        if not chunks or not chunks[0][0][0][0] <= offset <= self.next:
            return False
        while chunks and chunks[0][0][-1][0] < offset:
            self.records -= len(chunks.popleft()[0])
        return True

    def restart(self, offset: int) -> None:
        """Everything held dropped: the consumer reads from ``offset`` on."""
        self._chunks.clear()
        self.records = 0
        self.next = offset

    def take(self, offset: int, max_bytes: int) -> tuple[list[Row], int]:
        """The rows from ``offset`` on within ``max_bytes``, and their bytes; the first one whatever its size,
        as a Kafka broker returns the first batch even over the limit."""
        out: list[Row] = []
        size = 0
        for rows, ends in self._chunks:
            if rows[-1][0] < offset:
                continue
            start = bisect_left(rows, offset, key=_offset) if rows[0][0] < offset else 0
            before = ends[start - 1] if start else 0
            stop = bisect_right(ends, before + max_bytes - size, lo=start)
            if stop == start and not out:
                stop = start + 1
            if stop > start:
                out.extend(rows[start:stop])
                size += ends[stop - 1] - before
            if stop < len(rows):
                break
        return out, size
