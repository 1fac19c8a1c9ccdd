"""Compacted topics (rfc/dafka.md section 19): the newest record of every key stays, older ones go.

Kafka's log cleaner, on the store's layout.  A record's key is kept beside it
(a ``k`` entry, store/keys.py, whose first byte says whether the record is a
tombstone: a keyed record with an empty value).  A :class:`Pass` over one
partition:

1. maps every key of the *dirty* records (those written since the last pass
   ended: ``cleaned + 1 .. end``) to the newest sequence that has it;
2. sweeps every key entry from the partition's floor up to ``end`` and deletes
   each record (its ``M`` and ``k`` entries) whose key has a newer record, and
   each tombstone that is the newest of its key, that a store received longer
   ago than ``store/compaction/tombstone_ms``, and that the pass before made
   clean (``cleaned``: every older record of its key is gone already);
3. then ``cleaned`` is ``end``.

Records without a key are never removed, and offsets never change (readers
answer for the holes: rfc 19).  A pass looks at ``budget`` key entries a step
and keeps its place between steps, so the writer's thread never stops writing
for longer than a step; its map holds at most :data:`MAP_KEYS` keys (a larger
dirty part is cleaned in several passes).  Only a record that a newer record
in the database supersedes is deleted, and the writer writes a step's
deletions in one batch, after the step before: a store killed at any point
keeps every record that should stay, and its first pass after a restart
(``cleaned`` = -1) starts from the beginning.  A pass starts once the dirty
part holds at least as many keyed records as the part cleaned before
(Kafka's ``min.cleanable.dirty.ratio`` of 0.5): each record is swept a
bounded number of times on average.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Callable, Iterable

from . import keys, retention
from .writer_state import Partition

MAP_KEYS = 1_000_000  # keys a pass maps at most (about 100 MiB)
TOMBSTONE_RECHECK_MS = 3_600_000  # a partition that kept tombstones is passed over again this often at least
CHECK_EVERY = 64  # key entries between two looks at whether records wait (a step ends early for them)
IDLE_MS = 10_000  # a partition not written for this long is compacted to its head, however small its dirty part
TOMBSTONE = keys.TOMBSTONE
KEYS_PER_RECORD = 3  # what a step deletes for each record: its content, its key and its attributes (rfc 18.4)


class Topics:
    """Which topics are compacted: ``store/compaction/topics``, comma-separated fnmatch patterns."""

    def __init__(self, patterns: str) -> None:
        self.patterns = tuple(p.strip() for p in patterns.split(",") if p.strip())
        self._known: dict[str, bool] = {}

    def __bool__(self) -> bool:
        return bool(self.patterns)

    def __contains__(self, topic: str) -> bool:
        found = self._known.get(topic)
        if found is None:
            found = self._known[topic] = any(fnmatchcase(topic, p) for p in self.patterns)
        return found


class Pass:
    """One compaction pass over a partition, taken a step at a time (:meth:`step`)."""

    def __init__(self, p: Partition, tombstone_limit: int) -> None:
        self.partition = p
        self.end = p.written  # the dirty part ends here (lowered if the map fills)
        self.tombstone_limit = tombstone_limit  # tombstones at or below this sequence are old enough to go
        self.cleaned = p.cleaned  # tombstones above it may still have older records of their key around
        self.newest: dict[bytes, int] = {}
        self.mapped_to = p.cleaned  # the map covers the dirty records up to here
        self.swept_to = p.floor - 1  # the sweep has looked at every key entry up to here
        self.kept = 0  # keyed records the sweep kept
        self.tombstones = 0  # ...of which tombstones
        self.deleted = 0
        self.done = False
        self.check_every = CHECK_EVERY

    def step(self, db, budget: int, interrupted: Callable[[], bool] | None = None) -> list[bytes]:
        """Look at up to ``budget`` key entries; returns the keys to delete (written by the caller, in one
        batch, before the next step).  Sets :attr:`done` when the pass is over.  ``interrupted``, asked every
        :attr:`check_every` entries, ends the step early when it says so: records wait to be written, and
        a record's ack should not wait for a step."""
        check = budget - self.check_every if interrupted is not None else -1
        p = self.partition
        prefix = p.record_keys_prefix
        deletes: list[bytes] = []
        if self.mapped_to < self.end:
            newest = self.newest
            for key, value in db.iterator(start=prefix + keys.seq_bytes(self.mapped_to + 1),
                                          stop=prefix + keys.seq_bytes(self.end + 1)):
                seq = keys.seq_of(key[-keys.SEQ_BYTES:])
                newest[value[1:]] = seq
                self.mapped_to = seq
                budget -= 1
                if len(newest) >= MAP_KEYS:
                    self.end = seq
                    break
                if budget <= 0:
                    return deletes
                if budget == check:
                    if interrupted():  # type: ignore[misc]
                        return deletes
                    check -= self.check_every
            self.mapped_to = self.end
        newest = self.newest
        records = p.key_prefix
        for key, value in db.iterator(start=prefix + keys.seq_bytes(self.swept_to + 1),
                                      stop=prefix + keys.seq_bytes(self.end + 1)):
            seq = keys.seq_of(key[-keys.SEQ_BYTES:])
            self.swept_to = seq
            budget -= 1
            last = newest.get(value[1:], seq)
            if last > seq or (value[:1] == TOMBSTONE and seq <= self.cleaned and seq <= self.tombstone_limit):
                deletes.append(records + key[-keys.SEQ_BYTES:])
                deletes.append(key)
                deletes.append(p.record_attributes_prefix + key[-keys.SEQ_BYTES:])  # (rfc 18.4: if it has some)
                self.deleted += 1
            else:
                self.kept += 1
                if value[:1] == TOMBSTONE:
                    self.tombstones += 1
            if budget <= 0:
                return deletes
            if budget == check:
                if interrupted():  # type: ignore[misc]
                    return deletes
                check -= self.check_every
        self.swept_to = self.end
        self.done = True
        return deletes

    def finish(self, now_ms: int, tombstone_ms: int) -> None:
        """The pass's deletions are all written: what it swept is clean.  A partition that kept tombstones
        is due another pass once they may have grown old enough to go, writes or not."""
        p = self.partition
        p.cleaned = self.end
        p.clean_keys = self.kept
        p.tombstones_due_ms = now_ms + min(tombstone_ms, TOMBSTONE_RECHECK_MS) if self.tombstones else -1


def due(partitions: Iterable[Partition], topics: Topics, now_ms: int) -> Partition | None:
    """The compacted partition most due a pass, if one is: the largest share of records written since its
    last pass, if they are at least as many as the keyed records it kept then (unkeyed records count too:
    a cheap bound, as only keyed ones cost the map); else one that stopped being written (:data:`IDLE_MS`)
    with records since its last pass, or whose tombstones may have grown old enough."""
    best, share = None, 0.0
    for p in partitions:
        if p.subject not in topics or p.written < 0:
            continue
        dirty = p.written - p.cleaned
        if dirty > 0 and dirty >= p.clean_keys and dirty / (dirty + p.clean_keys) > share:
            best, share = p, dirty / (dirty + p.clean_keys)
        elif best is None and ((dirty > 0 and now_ms - p.written_ms >= IDLE_MS)
                               or 0 <= p.tombstones_due_ms <= now_ms):
            best = p
    return best


def tombstone_limit(db, p: Partition, now_ms: int, tombstone_ms: int) -> int:
    """The highest sequence of ``p`` received at least ``tombstone_ms`` ago (from its stamps; -1: none)."""
    limit = -1
    cutoff = now_ms - tombstone_ms
    for stamp in retention.stamps(db, p):
        if stamp.unix_ms > cutoff:
            break
        limit = stamp.last
    return limit
