"""Bulk answers between dafka-py peers (rfc/dafka.md section 12).

A requester (consumer, Spark task, store writer) that can read them
subscribes to ``R<own address>`` (DIRECT-RECORDS) and ``P<own address>``
(DIRECT-PARTITIONS) on every peer, as it does to ``D<own address>``.  The
answering peers (store readers, producers) see those subscriptions on their
XPUB and answer that requester's FETCHes with DIRECT-RECORDS, each carrying
up to :data:`MAX_BYTES` of records, and its GET-HEADS and CONSUMER-HELLO with
one DIRECT-PARTITIONS.  A reference peer never subscribes to either, so it
never receives one, and keeps getting RFC 46 DIRECT-RECORDs and DIRECT-HEADs.

This module holds what both sides share: the byte bound, the subscriptions
that announce the capability, the answering side's record of who announced
it, and the sizing of each message.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Hashable

from .. import protocol as proto

MAX_BYTES = 256 * 1024  # record contents per DIRECT-RECORDS (a bigger record travels alone)
FIRST_COUNT = 256  # records in an answer's first message, before their size is known
# A peer's subscriptions reach an XPUB all at once when it connects, but in the order of their bytes: D (answer
# me) before N, Q, R, T and V (what it reads).  What arrives at once on the other connection (a FETCH) could
# meet D alone, and be answered in a form without keys: an answering peer waits until the requester's first
# subscription is this old (Settling), and a producer takes a prefix for a reference peer's after as long
# alone (dafka.protocol.batching.Audience).
SETTLE = 0.1
# the ids a requester subscribes with its own address: what it is answered, and how
REQUESTER_IDS = frozenset((proto.DIRECT_RECORD, proto.DIRECT_RECORDS, proto.DIRECT_KEYED_RECORDS, proto.DIRECT_GAP,
                           proto.DIRECT_TAIL, proto.DIRECT_PARTITIONS))
# The last of them that a requester of this version subscribes, both when it connects (sorted) and when it
# subscribes on a live connection (dafka.consumer.state.ConsumerState.own_subscriptions, ``subscriptions``
# below: V after D, N, P, R and T): once it is here, its FETCHes need not wait out SETTLE.  A requester that
# never subscribes it (a reference peer, a dafka-py 0.2 peer, one without keys) still waits SETTLE.
LAST_REQUESTER_ID = proto.DIRECT_KEYED_RECORDS
MAX_COUNT = 65_536  # records per message at most, however small they are


def subscriptions(address: str, keys: bool = False) -> list[bytes]:
    """The SUB prefixes with which a requester announces that it reads bulk answers (with ``keys``, also
    DIRECT-KEYED-RECORDS, rfc section 18, which answering peers then send in place of DIRECT-RECORDS)."""
    prefixes = [proto.subscription(proto.DIRECT_RECORDS, address, exact=True),
                proto.subscription(proto.DIRECT_PARTITIONS, address, exact=True)]
    if keys:
        prefixes.append(proto.subscription(proto.DIRECT_KEYED_RECORDS, address, exact=True))
    return prefixes


def next_count(count: int, nbytes: int) -> int:
    """Records for the next message of an answer whose last message carried
    ``count`` records in ``nbytes`` of contents."""
    if nbytes <= 0:
        return MAX_COUNT
    return max(1, min(MAX_COUNT, MAX_BYTES * count // nbytes))


class Negotiated:
    """Requesters that announced bulk answers, from the (un)subscriptions an
    answering peer's XPUB sees."""

    def __init__(self, per_pipe: bool = False) -> None:
        # With XPUB_VERBOSER (a producer's) every pipe's (un)subscription is seen: a requester that reconnected
        # before its old pipe went still reads them when the old one's unsubscription comes (dafka.core.inflight).
        self._pipes: Counter[tuple[bytes, str]] | None = Counter() if per_pipe else None
        self.records: set[str] = set()  # subscribed R<requester>: DIRECT-RECORDS
        self.partitions: set[str] = set()  # subscribed P<requester>: DIRECT-PARTITIONS
        self.keyed: set[str] = set()  # subscribed V<requester>: DIRECT-KEYED-RECORDS in place of DIRECT-RECORDS
        self.gaps: set[str] = set()  # subscribed N<requester>: reads DIRECT-GAP (rfc 19)
        self.tails: set[str] = set()  # subscribed T<requester>: reads DIRECT-TAIL (a dafka-py peer, rfc 7.5)

    def on_subscription(self, sub: proto.Subscription) -> bool:
        """Take a subscription frame into account; True if it was about bulk answers."""
        if sub.msg_id == proto.DIRECT_RECORDS:
            which = self.records
        elif sub.msg_id == proto.DIRECT_PARTITIONS:
            which = self.partitions
        elif sub.msg_id == proto.DIRECT_KEYED_RECORDS:
            which = self.keyed
        elif sub.msg_id == proto.DIRECT_GAP:
            which = self.gaps
        elif sub.msg_id == proto.DIRECT_TAIL:
            which = self.tails
        else:
            return False
        if sub.topic:
            pipes = self._pipes
            if pipes is not None:
                key = (sub.msg_id, sub.topic)
                pipes[key] += 1 if sub.subscribe else -1
                if pipes[key] > 0:
                    which.add(sub.topic)
                    return True
                del pipes[key]
                which.discard(sub.topic)
            elif sub.subscribe:
                which.add(sub.topic)
            else:
                which.discard(sub.topic)
        return True


UNHEARD_WAIT = 5.0  # seconds a FETCH waits for its requester to subscribe to the answers before it is dropped
UNHEARD_MAX = 10_000  # FETCHes waiting so at most (the oldest are dropped first)


class Settling:
    """An answering peer's FETCHes that wait for their requester, by any key the caller chooses:

    * for it to subscribe to its answers at all (:meth:`wait_unheard`): its FETCH may overtake its subscription,
      on another connection, or it left or never was, and nobody could read the answer.  Such a FETCH waits
      :data:`UNHEARD_WAIT`, then is dropped (rfc 6.7) and counted in :attr:`unheard_dropped`;
    * for its subscriptions to settle (:meth:`hold`): :data:`SETTLE` after its first one, or until its
      :data:`LAST_REQUESTER_ID` one, after which a requester of this version subscribes to nothing more."""

    def __init__(self) -> None:
        self.heard: dict[str, float] = {}  # requester -> when its first subscription came
        self.settled: set[str] = set()  # requesters whose subscriptions are all here (LAST_REQUESTER_ID came)
        self.waiting: dict[Hashable, tuple[float, str, Any]] = {}  # key -> (when due, requester, the FETCH)
        self.unheard: dict[Hashable, tuple[float, str, Any]] = {}  # key -> (when dropped, requester, the FETCH)
        self.unheard_dropped = 0

    def on_subscription(self, sub: proto.Subscription, now: float) -> None:
        if not sub.topic or sub.msg_id not in REQUESTER_IDS:
            return
        if sub.subscribe:
            self.heard.setdefault(sub.topic, now)
            if sub.msg_id == LAST_REQUESTER_ID:
                self.settled.add(sub.topic)
                for key, (at, requester, fetch) in self.waiting.items():
                    if requester == sub.topic and at > now:
                        self.waiting[key] = (now, requester, fetch)  # due at once: nothing more will come
        elif sub.msg_id == proto.DIRECT_RECORD:  # its pipe went away
            self.heard.pop(sub.topic, None)
            self.settled.discard(sub.topic)

    def hold(self, key: Hashable, requester: str, fetch: Any, now: float) -> bool:
        """Keep ``fetch`` for later (True) if ``requester`` was first heard less than SETTLE ago and has not
        sent its last subscription yet."""
        heard = self.heard.get(requester)
        if heard is None or now >= heard + SETTLE or requester in self.settled:
            return False
        self.waiting.pop(key, None)
        self.waiting[key] = (heard + SETTLE, requester, fetch)
        return True

    def due(self, now: float) -> list[Any]:
        """The FETCHes whose time came, taken out."""
        ready = [key for key, (at, _, _) in self.waiting.items() if at <= now]
        return [self.waiting.pop(key)[2] for key in ready]

    def next_due(self) -> float | None:
        return min((at for at, _, _ in self.waiting.values()), default=None)

    def wait_unheard(self, key: Hashable, requester: str, fetch: Any, now: float) -> None:
        """Keep ``fetch`` until ``requester`` subscribes to its answers (:meth:`heard_from`), in place of
        the one it sent before under ``key``."""
        unheard = self.unheard
        unheard.pop(key, None)
        unheard[key] = (now + UNHEARD_WAIT, requester, fetch)
        if len(unheard) > UNHEARD_MAX:
            del unheard[next(iter(unheard))]
            self.unheard_dropped += 1

    def heard_from(self, requester: str) -> list[Any]:
        """``requester`` subscribed to its answers: the FETCHes it sent before, taken out."""
        if not self.unheard:
            return []
        keys = [key for key, (_, who, _) in self.unheard.items() if who == requester]
        return [self.unheard.pop(key)[2] for key in keys]

    def drop_unheard(self, now: float) -> None:
        """Drop the FETCHes whose requester has not subscribed within UNHEARD_WAIT (oldest first)."""
        unheard = self.unheard
        while unheard:
            key = next(iter(unheard))
            if unheard[key][0] > now:
                return
            del unheard[key]
            self.unheard_dropped += 1
