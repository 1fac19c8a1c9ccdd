"""Where the console's live tail starts each partition, free of I/O (rfc section 20).

A live tail shows every record produced after it opened, as a ``latest``
consumer delivers them: a one-shot producer that sent, flushed and exited
before the console's SUB had connected to it is heard of only by its HEAD or
from a store, and its records are fetched.  The console feeds this class
what it hears of a followed topic (live records, heads, HEADS-AT answers, the
clock) and reads back which records to pass on, in order per partition, and
which ranges to fetch; it passes the fetched records back in.

A tail shows the newest records at most :data:`~.peer.TAIL_RATE` a second, so
a partition found with more than :data:`FETCH_MOST` records to catch up on
fetches only its newest ones and counts the others as skipped.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dafka.records import PartitionKey
from dafka import protocol as proto
from dafka.consumer.latest import LatestStarts

Entry = tuple[int, bytes, "bytes | None"]  # (offset, value, key)
FETCH_MOST = 200  # records a partition's catching up fetches at most (the newest)
HOLD = 1_000  # live records kept per partition while it waits for its start or a fetch


@dataclass
class Fetching:
    """A range to read for a tail: the caller fetches it and hands the answer to :meth:`LiveStarts.fetched`."""

    topic: str
    partition: str
    start: int
    end: int


@dataclass
class _Partition:
    next: int | None = None  # the next offset to pass on (None: not started)
    fetching: bool = False
    held: list[Entry] = field(default_factory=list)  # live records waiting for the start or a fetch


@dataclass
class Passed:
    """What to pass on to a topic's tails: ``entries`` of one partition, in order, and ``skipped`` records
    it will never show (beyond :data:`FETCH_MOST`, or not found by a fetch)."""

    topic: str
    partition: str
    entries: list[Entry]
    skipped: int = 0


class LiveStarts:
    """The start and catching up of each partition of the followed topics."""

    def __init__(self) -> None:
        self.latest = LatestStarts()
        self.partitions: dict[PartitionKey, _Partition] = {}
        self.fetches: list[Fetching] = []  # ranges to read (the caller takes them)
        self.passed: list[Passed] = []  # what the caller passes on to the tails (and empties)
        self.dropped = 0  # live records beyond HOLD while a partition waited (fetched again instead)

    # -- the topics followed ---------------------------------------------------

    def follow(self, topic: str, since_ms: int) -> None:
        self.latest.subscribe(topic, since_ms)

    def unfollow(self, topic: str) -> None:
        self.latest.unsubscribe(topic)
        for key in [k for k in self.partitions if k[0] == topic]:
            del self.partitions[key]

    def subscriptions(self, requester: str) -> set[bytes]:
        """The HEADS-AT requests to subscribe on every peer (one per followed topic)."""
        return {self.latest.subscription(topic, requester) for topic in self.latest.since}

    def follows_on(self, topic: str, partition: str, first: int, count: int) -> bool:
        """Whether live records ``first .. first+count-1`` come next in a started partition (the caller
        passes them on as they are, without splitting them); then they are taken as passed."""
        p = self.partitions.get((topic, partition))
        if p is None or p.next != first or p.fetching:
            return False
        p.next = first + count
        return True

    # -- what is heard -----------------------------------------------------------

    def live(self, topic: str, partition: str, first: int, entries: list[Entry], now: float) -> None:
        """Live records ``first ..`` of a followed topic that do not :meth:`follows_on`."""
        p = self.partitions.setdefault((topic, partition), _Partition())
        if p.next is None or p.fetching:
            self._hold(p, entries)
            if p.next is None:
                self._decide(self.latest.meet(topic, partition, first, entries[-1][0], now))
            return
        self._take(topic, partition, p, entries)

    def head(self, topic: str, partition: str, head: int, now: float) -> None:
        """A HEAD, DIRECT-HEAD or store's head of a followed topic's partition."""
        p = self.partitions.setdefault((topic, partition), _Partition())
        if p.next is None:
            self._decide(self.latest.meet(topic, partition, head + 1, head, now))
        elif not p.fetching and head >= p.next:  # records the tail has not seen live
            self._fetch(topic, partition, p, p.next, head)

    def on_answer(self, msg: proto.HeadsAtMsg) -> None:
        if msg.subject in self.latest.since:
            for decided in self.latest.on_answer(msg):
                self._decide(decided)

    def tick(self, now: float) -> None:
        for decided in self.latest.tick(now):
            self._decide(decided)

    def due(self) -> float | None:
        return self.latest.due()

    def fetched(self, fetch: Fetching, records: dict[int, tuple[bytes, bytes | None]]) -> None:
        """A fetch's answer (offset -> (value, key)), complete or not: the records found, then those held."""
        p = self.partitions.get((fetch.topic, fetch.partition))
        if p is None:  # unfollowed meanwhile
            return
        p.fetching = False
        found = [(o, *records[o]) for o in range(fetch.start, fetch.end + 1) if o in records]
        self._emit(fetch.topic, fetch.partition, found, fetch.end + 1 - fetch.start - len(found))
        p.next = fetch.end + 1
        held, p.held = p.held, []
        self._take(fetch.topic, fetch.partition, p, held)

    # -- inside --------------------------------------------------------------------

    def _hold(self, p: _Partition, entries: list[Entry]) -> None:
        room = HOLD - len(p.held)
        p.held.extend(entries[:max(0, room)])
        self.dropped += max(0, len(entries) - max(0, room))

    def _decide(self, decided: tuple[str, str, int, int] | None) -> None:
        if decided is None:
            return
        topic, partition, start, head = decided
        p = self.partitions.setdefault((topic, partition), _Partition())
        p.next = start
        if head >= start:
            self._fetch(topic, partition, p, start, head)
            return
        held, p.held = p.held, []
        self._take(topic, partition, p, held)

    def _fetch(self, topic: str, partition: str, p: _Partition, start: int, end: int) -> None:
        newest = max(start, end - FETCH_MOST + 1)
        if newest > start:
            self._emit(topic, partition, [], newest - start)
        p.next = newest
        p.fetching = True
        self.fetches.append(Fetching(topic, partition, newest, end))

    def _take(self, topic: str, partition: str, p: _Partition, entries: list[Entry]) -> None:
        """Pass on ``entries`` from ``p.next`` on; at a gap, fetch it and hold the rest until it came."""
        assert p.next is not None
        run: list[Entry] = []
        for i, entry in enumerate(entries):
            if entry[0] < p.next:
                continue
            if entry[0] > p.next:
                self._emit(topic, partition, run)
                gap_end = entry[0] - 1
                self._hold(p, entries[i:])
                self._fetch(topic, partition, p, p.next, gap_end)
                return
            run.append(entry)
            p.next += 1
        self._emit(topic, partition, run)

    def _emit(self, topic: str, partition: str, entries: list[Entry], skipped: int = 0) -> None:
        if entries or skipped:
            self.passed.append(Passed(topic, partition, entries, skipped))
