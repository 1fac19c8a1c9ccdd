"""The mirror's protocol logic, free of I/O (rfc/mirror.md).

Feed it the source's records (in order per partition, as a consumer delivers
them), the outcome of each target partition's resume (its head in the target
stores, or a live writer there), the provenance records it reads, heads and
acks, and time; read back what to do: which partitions to resume, which
provenance records to write, where to seek the source, and what to copy.

A source partition ``(topic, address)`` is copied into the target under the
same address, record *k* as sequence *k*, only when the target holds nothing
of it yet or this mirror wrote it there (its provenance says so).  Anything
else in the target under that address has another writer: a mirror loop
(the source's provenance says the partition is itself a copy) or a conflict.
"""

from __future__ import annotations

import enum
import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Sequence

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (topic, partition address)

PROVENANCE_TOPIC = "__dafka_mirror"  # site-local: never copied
MAX_MARKS = 1024  # per partition, for the lag in seconds


class Phase(enum.Enum):
    RESUMING = "resuming"  # the target producer learns the partition's head; records wait in the source
    COPYING = "copying"
    LOOPED = "looped"  # a copy of a partition of the target's own site: never copied back
    SKIPPED = "skipped"  # another writer holds it in the target: waiting to tell a loop from a conflict
    CONFLICT = "conflict"  # another writer, and the source's partition is no copy; or two live writers
    GAP = "gap"  # the source no longer holds the records the target needs next


STOPPED = (Phase.LOOPED, Phase.CONFLICT, Phase.GAP)


@dataclass
class Partition:
    """One source partition as the mirror sees it."""

    topic: str
    address: str
    phase: Phase = Phase.RESUMING
    next: int = 0  # the next source offset to copy: the target producer's next sequence
    acked: int = -1  # copied: acked by producer/min_acks target stores
    source_head: int = -1  # the highest offset known to exist in the source
    # (offset, when the mirror first knew of it): the oldest not yet acked gives the lag in seconds
    seen: deque[tuple[int, float]] = field(default_factory=deque)
    skipped_until: float = 0.0  # SKIPPED: when it becomes a conflict unless the source says it is a copy
    reason: str = ""

    @property
    def key(self) -> Key:
        return (self.topic, self.address)

    def lag(self) -> int:
        return max(0, self.source_head - self.acked)


@dataclass
class Selection:
    """Which topics to mirror: by name, by prefix, or all of them.  The site's
    own provenance topic is never mirrored; the groups' commit topics
    (``__dafka_offsets.<group>``) are, when the selection takes them."""

    topics: tuple[str, ...] = ()
    prefixes: tuple[str, ...] = ()
    every: bool = False

    def __post_init__(self) -> None:
        if not (self.topics or self.prefixes or self.every):
            raise ValueError("choose what to mirror: topics by name, prefixes, or every topic")

    def wants(self, topic: str) -> bool:
        """Whether ``topic`` is mirrored (never the provenance topic)."""
        if topic == PROVENANCE_TOPIC:
            return False
        return self.every or topic in self.topics or topic.startswith(self.prefixes)


@dataclass
class Copy:
    """Records to publish in the target: ``values`` as ``first``, ``first + 1``, ..."""

    partition: Partition
    first: int
    values: Sequence[bytes]


@dataclass
class Conflict:
    partition: Partition
    reason: str


@dataclass
class Resumed:
    """What to do once a target partition's head is known."""

    seek: int | None = None  # copy from this source offset (None: nothing to copy)
    claim: bool = False  # write a provenance record first: the partition becomes this mirror's


class MirrorState:
    def __init__(self, selection: Selection, *, conflict_grace: float = 10.0) -> None:
        self.selection = selection
        self.conflict_grace = conflict_grace
        self.partitions: dict[Key, Partition] = {}
        self.owned: set[Key] = set()  # what this mirror wrote into the target (its own provenance)
        self.source_copies: dict[Key, str] = {}  # partitions the source holds as copies -> the site they came from
        self.to_resume: list[Partition] = []
        self.copied = 0  # records acked in the target since the start
        self.conflicts = 0
        self.gaps = 0
        self.dropped = 0  # records met while their partition resumed (read again after the seek)

    # -- provenance ------------------------------------------------------------

    def on_own_provenance(self, key: Key) -> None:
        self.owned.add(key)

    def on_source_provenance(self, key: Key, source_site: str, now: float) -> None:
        """The source's provenance topic says ``key`` is a copy (from ``source_site``)."""
        self.source_copies[key] = source_site
        p = self.partitions.get(key)
        if p is not None and p.phase is Phase.SKIPPED:
            self._loop(p)

    def resume_owned(self) -> list[Partition]:
        """At start: the selected partitions this mirror owns, to resume before
        their records come (the source is then read from each one's head + 1,
        not from its first record)."""
        for key in sorted(self.owned):
            if key not in self.partitions and self.selection.wants(key[0]):
                p = self.partitions[key] = Partition(*key)
                self.to_resume.append(p)
        return self.to_resume

    # -- records -----------------------------------------------------------------

    def on_records(self, topic: str, address: str, first: int, values: Sequence[bytes], now: float) -> Copy | None:
        """Records ``first ..`` of a source partition, consecutive; returns
        what to copy (None: nothing now)."""
        key = (topic, address)
        p = self.partitions.get(key)
        if p is None:
            if not self.selection.wants(topic):
                return None
            p = self.partitions[key] = Partition(topic, address)
            self.to_resume.append(p)
        last = first + len(values) - 1
        if last > p.source_head:
            self._seen(p, last, now)
        if p.phase is not Phase.COPYING:
            if p.phase is Phase.RESUMING:
                self.dropped += len(values)
            return None
        if last < p.next:
            return None  # copied already (the consumer met them again after the seek)
        if first > p.next:
            p.phase, p.reason = Phase.GAP, (f"the source delivered offset {first} where the target needs {p.next}: "
                                            "records gone from the source (retention) cannot be copied")
            self.gaps += 1
            log.error("mirror: %s/%s stops: %s", topic, address, p.reason)
            return None
        skip = p.next - first
        p.next = last + 1
        return Copy(p, first + skip, values[skip:] if skip else values)

    def rewind(self, key: Key, offset: int) -> None:
        """The target producer took records only up to ``offset - 1`` (its
        buffer stayed full): the source is read again from ``offset``."""
        p = self.partitions[key]
        p.next = min(p.next, offset)

    def on_source_head(self, key: Key, head: int, now: float) -> None:
        p = self.partitions.get(key)
        if p is not None and head > p.source_head:
            self._seen(p, head, now)

    def _seen(self, p: Partition, head: int, now: float) -> None:
        p.source_head = head
        if len(p.seen) < MAX_MARKS:  # (past that, newer marks are coarser: the oldest is what counts)
            p.seen.append((head, now))

    def on_acked(self, key: Key, acked: int) -> None:
        p = self.partitions[key]
        if acked > p.acked:
            self.copied += acked - p.acked
            self._acked(p, acked)

    def _acked(self, p: Partition, acked: int) -> None:
        p.acked = acked
        seen = p.seen
        while seen and seen[0][0] <= acked:
            seen.popleft()

    # -- target partitions -------------------------------------------------------

    def take_resumes(self) -> list[Partition]:
        due, self.to_resume = self.to_resume, []
        return due

    def on_resumed(self, key: Key, head: int, now: float) -> Resumed:
        """The target stores hold ``key`` up to ``head`` (-1: nothing), and no
        other live process writes it there."""
        p = self.partitions[key]
        if key in self.owned or head < 0:
            p.phase, p.next = Phase.COPYING, head + 1
            self._acked(p, head)
            return Resumed(seek=head + 1, claim=key not in self.owned)
        if key in self.source_copies:
            self._loop(p)
            return Resumed()
        p.phase, p.skipped_until = Phase.SKIPPED, now + self.conflict_grace
        p.reason = f"the target already holds offsets 0..{head} of it, written by another writer"
        return Resumed()

    def on_claimed(self, key: Key, reason: str) -> Conflict | None:
        """A live process other than this mirror writes ``key`` in the target
        (None: the original's own writer, in its own site: a loop)."""
        p = self.partitions[key]
        if key in self.source_copies and key not in self.owned:
            self._loop(p)
            return None
        return self.conflict(p, f"another live writer in the target: {reason}")

    def on_resume_failed(self, key: Key) -> None:
        """The target stores did not answer in time: try again later."""
        p = self.partitions[key]
        p.phase = Phase.RESUMING
        self.to_resume.append(p)

    def tick(self, now: float) -> list[Conflict]:
        """Skipped partitions that the source's provenance did not explain
        within ``conflict_grace`` become conflicts."""
        out = []
        for p in self.partitions.values():
            if p.phase is Phase.SKIPPED and now >= p.skipped_until:
                out.append(self.conflict(p, p.reason))
        return out

    def _loop(self, p: Partition) -> None:
        p.phase = Phase.LOOPED
        p.reason = f"a copy from {self.source_copies[p.key]}, whose writer is in the target's site"
        p.seen.clear()
        log.info("mirror: %s/%s is not copied: %s", p.topic, p.address, p.reason)

    def conflict(self, p: Partition, reason: str) -> Conflict:
        p.phase, p.reason = Phase.CONFLICT, reason
        p.seen.clear()
        self.conflicts += 1
        log.error("mirror: conflict on %s/%s, not copied: %s", p.topic, p.address, reason)
        return Conflict(p, reason)

    # -- reading -----------------------------------------------------------------

    def lag_seconds(self, p: Partition, now: float) -> float:
        """How long ago the mirror learnt of the oldest record it has not copied yet."""
        return now - p.seen[0][1] if p.seen and p.phase is Phase.COPYING else 0.0

    def phases(self) -> dict[str, int]:
        counts = {phase.value: 0 for phase in Phase}
        for p in list(self.partitions.values()):  # (a metrics scrape, while the loop adds partitions)
            counts[p.phase.value] += 1
        return counts
