"""What a connection's reader keeps of one partition between two Fetches: what its dafka consumer delivered,
in chunks as they came, taken by offset and by bytes with C-level slices and bisections rather than a Python
step a record (sans-I/O; the server's ``_Reader`` fills it, its Fetches take from it).

A chunk is either a store's or a producer's message as it came (:class:`~dafka.kafka.records.RecordFrames`,
the catch-up's path: a Fetch encodes the Kafka batch from its frames, with no record object on the way), or
rows, the records a consumer delivered one by one."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import deque
from itertools import accumulate
from operator import itemgetter
from typing import Any, Union

from dafka.protocol.messages import NO_KEY
from dafka.protocol.packing import lengths_of

from .records import RecordFrames

Row = tuple[int, int, Any, Any, tuple[tuple[str, Any], ...]]  # offset, unix ms, key, value, headers
ROW_BYTES = 20  # what a record counts beside its key and value towards a Fetch's byte limits
_offset = itemgetter(0)


class FrameSlice:
    """Records ``lo`` to ``hi`` (exclusive) of a message's frames, and the time of those without one."""

    __slots__ = ("frames", "lo", "hi", "default_ts")

    def __init__(self, frames: RecordFrames, lo: int, hi: int, default_ts: int) -> None:
        self.frames, self.lo, self.hi, self.default_ts = frames, lo, hi, default_ts

    def __len__(self) -> int:
        return self.hi - self.lo

    @property
    def last(self) -> int:
        """The last record's offset."""
        return self.frames.sequence + self.hi - 1


Segment = Union[list[Row], FrameSlice]  # what a Fetch takes of one chunk


class _Rows:
    __slots__ = ("rows", "ends", "first", "last")

    def __init__(self, rows: list[Row]) -> None:
        self.rows = rows
        self.ends = list(accumulate(len(r[3] or b"") + len(r[2] or b"") + ROW_BYTES for r in rows))
        self.first, self.last = rows[0][0], rows[-1][0]

    def __len__(self) -> int:
        return len(self.rows)

    def index(self, offset: int) -> int:
        return bisect_left(self.rows, offset, key=_offset) if self.first < offset else 0

    def ends_from(self, start: int) -> tuple[list[int], int]:
        return self.ends, self.ends[start - 1] if start else 0

    def segment(self, start: int, stop: int) -> list[Row]:
        return self.rows[start:stop]


class _Frames:
    __slots__ = ("frames", "skip", "default_ts", "first", "last", "size", "_ends")

    def __init__(self, frames: RecordFrames, skip: int, default_ts: int) -> None:
        self.frames, self.skip, self.default_ts = frames, skip, default_ts
        count = len(frames.lengths) // 4
        self.first, self.last = frames.sequence + skip, frames.sequence + count - 1
        self._ends: list[int] | None = None
        # the bytes of its records (those skipped counted out only if any: their sizes looked at then)
        self.size = self.ends_from(0)[0][-1] if skip else len(frames.contents) + len(frames.keys) + ROW_BYTES * count

    def __len__(self) -> int:
        return self.last - self.first + 1

    def index(self, offset: int) -> int:
        return max(0, offset - self.first)

    def ends_from(self, start: int) -> tuple[list[int], int]:
        """Each record's bytes summed up to it (counted once a Fetch cuts inside the chunk), and the sum
        before ``start``."""
        if self._ends is None:
            skip, frames = self.skip, self.frames
            sizes = lengths_of(frames.lengths)[skip:]
            if frames.key_lengths:
                keys = lengths_of(frames.key_lengths)[skip:]
                self._ends = list(accumulate(v + (0 if k == NO_KEY else k) + ROW_BYTES for v, k in zip(sizes, keys)))
            else:
                self._ends = list(accumulate(v + ROW_BYTES for v in sizes))
        return self._ends, self._ends[start - 1] if start else 0

    def segment(self, start: int, stop: int) -> FrameSlice:
        return FrameSlice(self.frames, self.skip + start, self.skip + stop, self.default_ts)


class PartitionBuffer:
    """Records in rising offsets (a compacted partition's may skip some, rfc 19), from :attr:`next` back."""

    def __init__(self) -> None:
        self.next = -1  # the offset the consumer delivers next (-1: not seeked yet)
        self.records = 0  # records held, for the reader's bound (a chunk partly taken counts whole)
        self._chunks: deque[_Rows | _Frames] = deque()

    def add(self, rows: list[Row]) -> None:
        """Rows the consumer delivered: those below :attr:`next` (delivered again) are left out."""
        if rows and rows[0][0] < self.next:
            rows = rows[bisect_left(rows, self.next, key=_offset):]
        if rows:
            self._append(_Rows(rows))

    def add_frames(self, frames: RecordFrames, skip: int, default_ts: int) -> None:
        """A message's records from its ``skip``-th on (those below :attr:`next` left out too); a record
        without a timestamp, its own or its store's, gets ``default_ts``."""
        skip = max(skip, self.next - frames.sequence)
        if skip < len(frames.lengths) // 4:
            self._append(_Frames(frames, skip, default_ts))

    def _append(self, chunk: _Rows | _Frames) -> None:
        self._chunks.append(chunk)
        self.records += len(chunk)
        self.next = chunk.last + 1

    def holds(self, offset: int) -> bool:
        """Whether a Fetch from ``offset`` is served from here: from a held record's offset up to
        :attr:`next`.  The chunks before it go (a client fetches onwards)."""
        chunks = self._chunks
        if not chunks or not chunks[0].first <= offset <= self.next:
            return False
        while chunks and chunks[0].last < offset:
            self.records -= len(chunks.popleft())
        return True

    def restart(self, offset: int) -> None:
        """Everything held dropped: the consumer reads from ``offset`` on."""
        self._chunks.clear()
        self.records = 0
        self.next = offset

    def take(self, offset: int, max_bytes: int) -> tuple[list[Segment], int]:
        """The records from ``offset`` on within ``max_bytes``, chunk by chunk, and their bytes; the first
        one whatever its size, as a Kafka broker returns the first batch even over the limit."""
        out: list[Segment] = []
        size = 0
        for chunk in self._chunks:
            if chunk.last < offset:
                continue
            start = chunk.index(offset)
            if type(chunk) is _Frames and start == 0 and chunk.size <= max_bytes - size:
                out.append(chunk.segment(0, len(chunk)))  # (a whole message: no record's size looked at)
                size += chunk.size
                continue
            ends, before = chunk.ends_from(start)
            stop = bisect_right(ends, before + max_bytes - size, lo=start)
            if stop == start and not out:
                stop = start + 1
            if stop > start:
                out.append(chunk.segment(start, stop))
                size += ends[stop - 1] - before
            if stop < len(chunk):
                break
        return out, size
