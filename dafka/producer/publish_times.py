"""When a producer published its records, near enough to tell a ``latest``
consumer which of them came before its subscription (HEADS-AT, rfc 8.1).

The producer notes ``(time, sequence)`` of a record at most once every
:data:`STEP` seconds (:meth:`PublishTimes.note`, from ``Outbox.publish``:
one comparison per record otherwise).  Every record between two notes was
then published less than :data:`STEP` after the first of them, so the last
record published at or before a moment is known exactly, but within
:data:`STEP` after a note, where the answer is that note's record: a lower
bound, which makes the consumer deliver those few records rather than skip
any.  The newest :data:`RING` notes are kept, and the last one dropped.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque

STEP = 0.001  # seconds between two notes at most once a record comes
RING = 1024  # notes kept: at least the last second of a busy producer, much more of a quiet one


class PublishTimes:
    """The notes of one partition's records from ``start`` on (``before``:
    the last sequence published before ``start``, by an earlier run of a
    resumed partition; -1 for a new one).  Times are the producer's clock
    (``time.perf_counter``)."""

    __slots__ = ("start", "before", "notes", "floor")

    def __init__(self, start: float, before: int = -1) -> None:
        self.start = start
        self.before = before
        self.notes: deque[tuple[float, int]] = deque(maxlen=RING)
        self.floor: tuple[float, int] | None = None  # the newest note the ring let go

    def note(self, seq: int, now: float) -> float:
        """Record ``seq`` was published at ``now``; returns when the next note is due."""
        notes = self.notes
        if len(notes) == RING:
            self.floor = notes[0]
        notes.append((now, seq))
        return now + STEP

    def held_at(self, moment: float, next_seq: int) -> int | None:
        """The last sequence published at or before ``moment`` (-1: none), or
        a lower bound of it; None when nothing can be said (a resumed
        partition, asked of a moment before this run's start)."""
        if moment < self.start:
            return -1 if self.before < 0 else None
        notes = self.notes
        i = bisect_right(notes, moment, key=lambda n: n[0]) - 1
        if i < 0:
            floor = self.floor
            if floor is None or floor[0] > moment:
                # before the first note of this run (exact: it notes its first record), or past the ring's memory
                return self.before
            at, seq = floor
            following = notes[0][1]
        else:
            at, seq = notes[i]
            following = notes[i + 1][1] if i + 1 < len(notes) else next_seq
        # the records after ``seq`` and before ``following`` were published less than STEP after ``at``
        return following - 1 if moment >= at + STEP else seq
