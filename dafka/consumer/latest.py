"""Where a ``latest`` reader starts each partition (rfc section 8.1), free of I/O.

``latest`` means every record produced after the subscription, on every
partition.  A reader cannot see when a record was produced, so it asks the
peers that hold records: it subscribes ``A<own address>`` NUL 0x01 ``since``
``subject`` (:func:`dafka.protocol.encoding.heads_at_prefix`), and every dafka-py
producer and store reader its SUB connects to, now or later, answers once
with a HEADS-AT: the last sequence of each partition it held at ``since``.
A record a peer held before the subscription was produced before it, so
each answer is a lower bound of the partition's last record from before the
subscription; a producer's own is exact.  A partition starts one past the
highest bound.  A partition that nobody held at the subscription, and that
a store which answered did not list, was born after it: it starts at 0.

A partition is met (a record, a HEAD, a store's head) before or after the
answers come.  It starts at once when its producer has answered, else
:data:`WAIT` seconds after it was met, with what the stores said by then, or,
when no dafka-py peer said anything of its topic (reference peers only), at
the reference's rule: the first live record, or one past the first head.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..records import PartitionKey
from .. import protocol as proto

WAIT = 0.25  # seconds a met partition waits for the answers of the peers that hold it


@dataclass(slots=True)
class _Waiting:
    deadline: float
    fallback: int  # where the reference's rule would start it
    head: int  # the highest sequence known to exist


class LatestStarts:
    """The start of each partition of the topics a ``latest`` reader subscribed to.

    Feed it :meth:`subscribe`, :meth:`meet`, :meth:`on_answer` and :meth:`tick`;
    the last three return the partitions decided: ``(topic, partition, start,
    head)`` each, to read from ``start`` (fetching up to ``head``, the highest
    sequence known to exist)."""

    def __init__(self, wait: float = WAIT) -> None:
        self.wait = wait
        self.since: dict[str, int] = {}  # topic -> the subscription's time, unix ms
        self.held: dict[PartitionKey, int] = {}  # the highest sequence a peer held at ``since`` (-1: none)
        self.exact: set[PartitionKey] = set()  # partitions whose own producer answered
        self.stores_answered: dict[str, int] = {}  # topic -> answers that list every partition their sender holds
        self.waiting: dict[PartitionKey, _Waiting] = {}
        self.answers = 0  # HEADS-AT taken in (counters for metrics)
        self.guessed: set[PartitionKey] = set()  # started by the reference's rule: no dafka-py peer said anything
        self.stale = 0  # HEADS-AT for another subscription (an earlier ``since``)

    def subscribe(self, topic: str, since_ms: int) -> None:
        self.since.setdefault(topic, since_ms)

    def subscription(self, topic: str, requester: str) -> bytes:
        """The SUB prefix that asks every peer for its HEADS-AT of ``topic``."""
        return proto.heads_at_prefix(requester, self.since[topic], topic)

    def meet(self, topic: str, partition: str, fallback: int, head: int,
             now: float) -> tuple[str, str, int, int] | None:
        """A message of a partition not started yet: ``fallback`` is where the
        reference's rule starts it (a live record's sequence, one past a
        head), ``head`` the highest sequence it shows.  Returns the decision
        if it can be made now, else None (:meth:`tick` makes it later)."""
        key = (topic, partition)
        if key in self.exact:
            return topic, partition, self.held[key] + 1, head
        waiting = self.waiting.get(key)
        if waiting is None:
            self.waiting[key] = _Waiting(now + self.wait, fallback, head)
        elif head > waiting.head:
            waiting.head = head
        return None

    def unsubscribe(self, topic: str) -> None:
        """Forget a topic: a later :meth:`subscribe` starts afresh, from its own moment."""
        self.since.pop(topic, None)
        self.stores_answered.pop(topic, None)
        for keys in (self.held, self.waiting):
            for key in [k for k in keys if k[0] == topic]:
                del keys[key]
        self.exact = {k for k in self.exact if k[0] != topic}
        self.guessed = {k for k in self.guessed if k[0] != topic}

    def forget(self, topic: str, partition: str) -> None:
        """Stop waiting for a partition (a group moved it away)."""
        self.waiting.pop((topic, partition), None)

    def on_answer(self, msg: proto.HeadsAtMsg) -> list[tuple[str, str, int, int]]:
        """A HEADS-AT addressed to us: the partitions it decides."""
        topic = msg.subject
        if self.since.get(topic) != msg.since:
            self.stale += 1
            return []
        self.answers += 1
        held = self.held
        decided = []
        for entry in msg.entries:
            if entry.sequence == proto.NOT_KNOWN:
                continue
            key = (topic, entry.address)
            seq = -1 if entry.sequence == proto.NOTHING_HELD else entry.sequence
            if seq > held.get(key, -2):
                held[key] = seq
            if not msg.complete and entry.address == msg.address:  # the partition's own producer: exact
                held[key] = seq
                self.exact.add(key)
                waiting = self.waiting.pop(key, None)
                if waiting is not None:
                    decided.append((topic, entry.address, seq + 1, waiting.head))
        if msg.complete:
            self.stores_answered[topic] = self.stores_answered.get(topic, 0) + 1
        return decided

    def due(self) -> float | None:
        """When :meth:`tick` has something to decide (None: nothing waits)."""
        return min((w.deadline for w in self.waiting.values()), default=None)

    def tick(self, now: float) -> list[tuple[str, str, int, int]]:
        """The partitions whose wait is over."""
        decided = []
        for key, waiting in list(self.waiting.items()):
            if waiting.deadline > now:
                continue
            del self.waiting[key]
            topic, partition = key
            if key in self.held or self.stores_answered.get(topic):
                start = self.held.get(key, -1) + 1
            else:
                start = waiting.fallback
                self.guessed.add(key)
            decided.append((topic, partition, start, waiting.head))
        return decided
