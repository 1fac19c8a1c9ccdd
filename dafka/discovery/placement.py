"""Which stores hold which partitions, with sharded stores (rfc section 16): free of I/O.

With ``store/replicas`` R > 0, a partition lives on the R stores that rank
highest for it by rendezvous hashing over the stores a store knows to be
there (its *view*), as consumer groups assign partitions (rfc 14.3), with no
coordinator and no quorum: every store computes the same owners from the
same view.  R = 0 is RFC 46's rule: every store holds every partition.

The view is this store and every store whose STORE-MEMBER heartbeat was
heard within ``store/dead_ms`` (longer than ``beacon/timeout``, so that a
restart, which keeps the store's identity, moves nothing).  While views
differ, two stores may both think they own a partition: harmless, both keep
it.  No partition is ever left without its full copies by a move: a store
that stops owning a partition keeps holding it until every owner holds it to
the head it has (:meth:`Placement.handed_off`), and deletes it
``store/handoff_ms`` after that.
"""

from __future__ import annotations

from ..records import PartitionKey

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from hashlib import blake2b



def weight(topic: str, partition: str, store: str) -> int:
    """A store's rendezvous weight for a partition: the first 8 bytes of
    BLAKE2b(topic NUL partition NUL store id), big-endian.  Highest ranks first."""
    raw = "\0".join((topic, partition, store)).encode("utf-8", "surrogateescape")
    return int.from_bytes(blake2b(raw, digest_size=8, person=b"dafka-placement").digest(), "big")


def place(topic: str, partition: str, racks: Mapping[str, str], replicas: int) -> list[str]:
    """The owners of a partition among ``racks`` (store id -> rack, "" for none), best first.

    The stores are ranked by :func:`weight`.  Without racks, the owners are the
    first ``replicas``.  With racks, the first store of each rack in rank order
    comes first (a store without a rack is a rack of its own), then, where there
    are fewer racks than replicas, the best of the rest: Kafka's rack awareness,
    replicas spread over as many racks as there are."""
    ranked = sorted(racks, key=lambda store: (weight(topic, partition, store), store), reverse=True)
    if replicas <= 0 or replicas >= len(ranked):
        return ranked
    chosen: list[str] = []
    seen: set[str] = set()
    for store in ranked:
        rack = racks[store] or "\0" + store
        if rack not in seen:
            seen.add(rack)
            chosen.append(store)
            if len(chosen) == replicas:
                return chosen
    rest = [store for store in ranked if store not in chosen]
    return chosen + rest[:replicas - len(chosen)]


@dataclass
class StoreMember:
    """What a peer store's STORE-MEMBER said, and when it was last heard."""

    store: str  # its persistent identity
    rack: str
    replicas: int
    writer: str  # its writer's and reader's addresses
    reader: str
    heard: float
    filling: frozenset[PartitionKey] = frozenset()  # partitions it owns and has not yet filled up to their heads
    leaving: bool = False


@dataclass
class _Handoff:
    head: int  # this store's head of the partition when it stopped owning it: every owner must hold this much
    done: float | None = None  # when every owner first held it to that head


@dataclass
class Placement:
    """One store's view of the stores and what follows from it.

    Feed it the peers' heartbeats (:meth:`on_member`), the heads other stores'
    readers report (:meth:`on_head`) and the partitions it learns of; ask it
    whether it owns a partition, what it may delete, and which partitions have
    fewer than R live, complete copies."""

    store: str
    rack: str
    replicas: int
    dead_after: float  # store/dead_ms, in seconds
    handoff: float  # store/handoff_ms, in seconds
    alive_after: float  # beacon/timeout, in seconds: a member not heard this long is not counted as a copy
    members: dict[str, StoreMember] = field(default_factory=dict)
    # heads each store's reader reported: store id -> key -> head
    heads: dict[str, dict[PartitionKey, int]] = field(default_factory=dict)
    handoffs: dict[PartitionKey, _Handoff] = field(default_factory=dict)
    disagreements: set[str] = field(default_factory=set)  # stores whose replicas differ from ours (logged once)
    _readers: dict[str, str] = field(default_factory=dict)  # reader address -> store id
    # owners() of each partition asked, for the current view: placing a partition hashes every store of the
    # view, and the store asks every beat (under_replicated) for every partition it knows
    _owners: dict[PartitionKey, list[str]] = field(default_factory=dict)
    _looked_at: float | None = None  # when expire() last looked

    def on_member(self, member: StoreMember) -> str | None:
        """A heartbeat; returns a line to log when it disagrees with us for the first time."""
        if member.store == self.store:
            return None
        if member.leaving:
            self.forget(member.store)
            return None
        known = self.members.get(member.store)
        if known is None or known.rack != member.rack:
            self._owners.clear()  # a new view
        self.members[member.store] = member
        self._readers[member.reader] = member.store
        if member.replicas != self.replicas and member.store not in self.disagreements:
            self.disagreements.add(member.store)
            return (f"store {member.store} places with store/replicas {member.replicas}, this store with "
                    f"{self.replicas}: while both run, a partition may be kept by more stores than either "
                    f"expects, never by fewer")
        return None

    def forget(self, store: str) -> None:
        """A store that said it leaves, or that was not heard for ``dead_after``."""
        gone = self.members.pop(store, None)
        if gone is not None:
            self._readers.pop(gone.reader, None)
            self._owners.clear()
        self.heads.pop(store, None)

    def on_head(self, reader: str, key: PartitionKey, head: int) -> None:
        """A store reader's DIRECT-HEAD (or DIRECT-PARTITIONS entry) for a partition."""
        store = self._readers.get(reader)
        if store is not None:
            heads = self.heads.setdefault(store, {})
            if head > heads.get(key, -1):
                heads[key] = head

    def expire(self, now: float) -> list[str]:
        """Drop the stores not heard for ``dead_after``; returns their ids.  A gap since the last look of more
        than half ``dead_after`` is this store's own stall (its loop stood still while the others' heartbeats
        waited unread in its socket): it counts for nobody's silence.  (A store that declared three others
        dead in the same millisecond, and moved their partitions, showed it: tests/faults/test_sharded.py.)"""
        last, self._looked_at = self._looked_at, now
        if last is not None and now - last > self.dead_after / 2:
            for m in self.members.values():
                m.heard += now - last
            return []
        dead = [store for store, m in self.members.items() if now - m.heard > self.dead_after]
        for store in dead:
            self.forget(store)
        return dead

    def view(self) -> dict[str, str]:
        """Store id -> rack: this store and every member in the view."""
        racks = {store: m.rack for store, m in self.members.items()}
        racks[self.store] = self.rack
        return racks

    def owners(self, key: PartitionKey) -> list[str]:
        """The partition's owners in this store's current view, best first."""
        owners = self._owners.get(key)
        if owners is None:
            owners = self._owners[key] = place(key[0], key[1], self.view(), self.replicas)
        return owners

    def owns(self, key: PartitionKey) -> bool:
        return self.replicas <= 0 or self.store in self.owners(key)

    def holds(self, key: PartitionKey, now: float, head: int) -> bool:
        """Whether this store keeps (stores, ACKs and serves) a partition: it owns it, or it owned it and
        is handing it over (:attr:`handoffs`, begun the first time it is asked about a partition it no longer
        owns, with ``head``, this store's head then, as what every owner must hold)."""
        if self.owns(key):
            self.handoffs.pop(key, None)
            return True
        handoff = self.handoffs.get(key)
        if handoff is None:
            if head < 0:
                return False  # nothing to hand over
            handoff = self.handoffs[key] = _Handoff(head)
        return not self._handed_off(key, now, handoff)

    def _handed_off(self, key: PartitionKey, now: float, handoff: _Handoff) -> bool:
        """True ``handoff`` seconds after every owner first answered holding the partition up to the
        handoff's head (live records move both on): only then may this store, which no longer owns it,
        delete it."""
        head = handoff.head
        complete = all(self.heads.get(owner, {}).get(key, -1) >= head for owner in self.owners(key))
        if not complete:
            handoff.done = None
            return False
        if handoff.done is None:
            handoff.done = now
        return now - handoff.done >= self.handoff

    def under_replicated(self, keys: Iterable[PartitionKey], now: float,
                         filling: Iterable[PartitionKey] = ()) -> list[PartitionKey]:
        """The partitions among ``keys`` with fewer than R owners that are alive (heard within
        ``alive_after``) and not still filling them (their heartbeats say which they fill; this store's
        own are ``filling``)."""
        if self.replicas <= 0:
            return []
        mine = set(filling)
        live = {store: m.filling for store, m in self.members.items() if now - m.heard <= self.alive_after}
        live[self.store] = frozenset(mine)
        return [key for key in keys
                if sum(1 for owner in self.owners(key) if owner in live and key not in live[owner]) < self.replicas]
