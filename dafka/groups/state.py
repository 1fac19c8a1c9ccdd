"""A consumer group member's view of its group, free of I/O (rfc/dafka.md section 14).

No coordinator and no consensus round.  Every member publishes a heartbeat
(GROUP-MEMBER) that only the members of its group subscribe to: the topics it
reads, the partitions it reads with their committed offsets, and those it has
just handed over.  A member's view of the group is itself and every member
whose heartbeat it heard within ``timeout``.  Each member computes the
assignment alone from its own view, and the views agree once the heartbeats
have gone round, so the group settles on one owner per partition: a topic's
partitions, in the order of their names, go each to the member with the
highest rendezvous weight ``blake2b(group, topic, partition, member)`` among
those reading the topic that have fewer than their share (the partitions
divided by the members, rounded up).  So no member reads more than its share,
and a member joining or leaving moves few partitions besides its own.  The
partitions a member knows are those it met (records, HEADs, the stores'
heads) and those the others' heartbeats list.

Handover: a member that the view makes the owner of a partition another live
member still reads waits until that member lists it as released (with its
final commit, so the new owner resumes exactly there), or until ``timeout``
passes.  A partition whose reader died is taken over once its heartbeats have
been missing for ``timeout``, from the highest offset committed for it.

Feed it heartbeats (:meth:`on_member`), the partitions the consumer meets
(:meth:`meet`), commits, the offsets topic's records and time; read back
``assigned`` and ``revoked`` (for the consumer to start and stop) and ``out``
(frames to publish).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from hashlib import blake2b

from ..records import PartitionKey
from .. import protocol as proto
from ..protocol.commits import decode_commits

log = logging.getLogger(__name__)

def weight(group: str, topic: str, partition: str, member: str) -> int:
    """The rendezvous weight of ``member`` for a partition: the highest wins it."""
    raw = "\0".join((group, topic, partition, member)).encode("utf-8", "surrogateescape")
    return int.from_bytes(blake2b(raw, digest_size=8).digest(), "big")


@dataclass
class Member:
    """Another member, as its last heartbeat described it."""

    subjects: frozenset[str]
    seen_at: float
    holds: set[PartitionKey] = field(default_factory=set)  # partitions it reads


class GroupState:
    def __init__(self, group: str, address: str, *, interval: float, timeout: float, join_wait: float,
                 now: float) -> None:
        self.group = group
        self.address = address
        self.interval = interval  # between heartbeats
        self.timeout = timeout  # a member unheard this long has left the view
        self.join_wait = join_wait  # how long a new member listens before it reads its share
        self.topics: set[str] = set()
        self.members: dict[str, Member] = {}
        self.committed: dict[PartitionKey, int] = {}  # the highest offset committed for each partition, as known
        self.owned: set[PartitionKey] = set()  # partitions we read
        self.revoking: set[PartitionKey] = set()  # ...of which the consumer is told to stop these
        self.released: dict[PartitionKey, float] = {}  # partitions we handed over -> when (listed for ``timeout``)
        self.known: dict[PartitionKey, int] = {}  # every partition of our topics met -> highest sequence seen
        self.waiting: dict[PartitionKey, float] = {}  # ours by our view, still read by a live member -> since when
        self.assigned: list[PartitionKey] = []  # for the consumer: start reading these...
        self.revoked: list[PartitionKey] = []  # ...and stop these, then call :meth:`released_by_us`
        self.out: list[list[bytes]] = []
        self.ready = False  # our view is formed: we read our share
        self.view_from: float | None = None  # when the tower had told us of every live peer
        self.members_subscribed = 0  # members that subscribed to our heartbeats while we joined
        self.heartbeat_due = now
        self.last_tick = now
        self.malformed = 0  # records of the offsets topic that were not commits
        self.rebalances = 0
        self._weights: dict[tuple[PartitionKey, str], int] = {}
        self._plan: dict[PartitionKey, str] | None = None  # the assignment of our view (None: to compute)

    # -- what comes in --------------------------------------------------------

    def subscribe(self, topic: str, now: float) -> None:
        self.topics.add(topic)
        self.heartbeat_due = now
        self._rebalance(now)

    def meet(self, topic: str, partition: str, seq: int, now: float) -> None:
        """The consumer met a partition of one of our topics that it does not read."""
        key = (topic, partition)
        known = self.known.get(key)
        if known is None:
            self.known[key] = seq
            self.heartbeat_due = now  # the others learn of it from us, should they have missed it
            self._rebalance(now)
        elif seq > known:
            self.known[key] = seq

    def on_member(self, msg: proto.GroupMemberMsg, now: float) -> None:
        """A heartbeat of our group's member (ours, or another group's, are ignored)."""
        if msg.topic != self.group or msg.address == self.address:
            return
        committed = self.committed
        holds = set()
        learnt = False
        for entry in msg.entries:
            key = (entry.subject, entry.address)
            if entry.offset != proto.NO_OFFSET and entry.offset > committed.get(key, -1):
                committed[key] = entry.offset
            if entry.state == proto.READING:
                holds.add(key)
            if key not in self.known and key[0] in self.topics:
                self.known[key] = -1  # its head is not known yet
                learnt = True
        if msg.leaving:
            if self.members.pop(msg.address, None) is not None:
                log.info("group %s: member %s left", self.group, msg.address)
                self._rebalance(now)
            return
        member = self.members.get(msg.address)
        subjects = frozenset(msg.subjects)
        self.members[msg.address] = Member(subjects, now, holds)
        if member is None or member.subjects != subjects or learnt:
            if member is None:
                log.info("group %s: member %s joined (%s)", self.group, msg.address, ", ".join(sorted(subjects)))
                self.heartbeat_due = now  # so that it learns of us at once
            self._rebalance(now)
        elif self.waiting and not holds >= member.holds:
            self._rebalance(now)  # it released something: perhaps what we wait for

    def on_subscription(self, now: float, *, member: bool = True) -> None:
        """A member (or an observer, ``member=False``) subscribed to our group's
        heartbeats: it should hear ours now.  While we join, a member's
        subscription also tells us that there is one more member to hear before
        we read our share, should its heartbeat be slower than ``join_wait``."""
        self.heartbeat_due = now
        if member and not self.ready:
            self.members_subscribed += 1

    def on_offsets(self, values: list[bytes]) -> None:
        """Records of the offsets topic: commits, kept if higher than known."""
        committed = self.committed
        for value in values:
            try:
                _, offsets = decode_commits(value)
            except ValueError as exc:
                self.malformed += 1
                log.debug("group %s: %s", self.group, exc)
                continue
            for key, offset in offsets.items():
                if offset > committed.get(key, -1):
                    committed[key] = offset

    def commit(self, offsets: dict[PartitionKey, int], now: float) -> dict[PartitionKey, int]:
        """Record our commits of partitions we read; returns those that moved
        (for the offsets topic), and heartbeats them at once."""
        moved = {}
        committed = self.committed
        for key, offset in offsets.items():
            if key in self.owned and offset > committed.get(key, -1):
                committed[key] = moved[key] = offset
        if moved:
            self.heartbeat_due = now
        return moved

    def released_by_us(self, keys: list[PartitionKey], now: float) -> None:
        """The consumer stopped reading ``keys`` (after committing): list them as released."""
        for key in keys:
            self.owned.discard(key)
            self.revoking.discard(key)
            self.released[key] = now
        self.heartbeat_due = now
        self._rebalance(now)  # the view may have given some back meanwhile

    # -- time -----------------------------------------------------------------

    def tick(self, now: float, *, peers_replayed: bool, offsets_loaded: bool) -> None:
        """Advance time: join once the view is formed, expire silent members,
        hand over what waited too long, and heartbeat when due."""
        gap = now - self.last_tick
        if gap > self.timeout and self.ready:
            # We were stopped or starved (no poll) for longer than others wait for us: they have
            # taken our partitions over.  Give everything up and join again, as a newcomer does.
            log.warning("group %s: member %s was unresponsive for %.1f s; rejoining",
                        self.group, self.address, gap)
            self.ready = False
            self.view_from = now
            self.members_subscribed = 0
            self._revoke_all()
        elif gap > self.timeout / 2:
            # Our own loop stood still (we tick at least every interval): the others' heartbeats may wait
            # unread in our socket, and the stall counts for nobody's silence.  (A member that took the other
            # for dead after a stall of its own made the group deliver thousands of records twice:
            # tests/faults/test_sharded.py.)
            for m in self.members.values():
                m.seen_at += gap
        self.last_tick = now
        if not self.ready:
            if self.view_from is None and peers_replayed:
                self.view_from = now
            if self.view_from is not None and now >= self.view_from + self.join_wait and (
                    offsets_loaded and len(self.members) >= self.members_subscribed
                    or now >= self.view_from + self.timeout):
                self.ready = True
                log.info("group %s: member %s reads its share (%d other members)",
                         self.group, self.address, len(self.members))
                self._rebalance(now)
        gone = [a for a, m in self.members.items() if now - m.seen_at >= self.timeout]
        for address in gone:
            del self.members[address]
            log.warning("group %s: member %s unheard for %.1f s, its partitions move",
                        self.group, address, self.timeout)
        if gone or any(now - since >= self.timeout for since in self.waiting.values()):
            self._rebalance(now)
        for key in [k for k, at in self.released.items() if now - at >= self.timeout]:
            del self.released[key]
        if now >= self.heartbeat_due:
            self.out.append(self.heartbeat())
            self.heartbeat_due = now + self.interval

    def next_due(self) -> float:
        """When :meth:`tick` must run next at the latest."""
        due = self.heartbeat_due
        if not self.ready:
            return min(due, self.last_tick + 0.02)
        for member in self.members.values():
            due = min(due, member.seen_at + self.timeout)
        for since in self.waiting.values():
            due = min(due, since + self.timeout)
        return due

    # -- what goes out --------------------------------------------------------

    def heartbeat(self, leaving: bool = False) -> list[bytes]:
        committed = self.committed
        entries = [proto.GroupEntry(t, p, committed.get((t, p), proto.NO_OFFSET),
                                    proto.RELEASED if leaving else proto.READING)
                   for t, p in sorted(self.owned)]
        entries += [proto.GroupEntry(t, p, committed.get((t, p), proto.NO_OFFSET), proto.RELEASED)
                    for t, p in sorted(self.released) if (t, p) not in self.owned]
        entries += [proto.GroupEntry(t, p, committed.get((t, p), proto.NO_OFFSET), proto.KNOWN)
                    for t, p in sorted(self.known) if (t, p) not in self.owned and (t, p) not in self.released]
        return proto.encode(proto.GroupMemberMsg(self.group, self.address, tuple(sorted(self.topics)),
                                                 tuple(entries), leaving))

    def leave(self) -> list[bytes]:
        """Our last heartbeat: everything we read is released, at its last commit."""
        return self.heartbeat(leaving=True)

    # -- assignment -----------------------------------------------------------

    def owner(self, key: PartitionKey) -> str | None:
        """The member of our view that should read ``key`` (None: nobody reads its topic)."""
        if self._plan is None:
            self._plan = self._assign()
        return self._plan.get(key)

    def _assign(self) -> dict[PartitionKey, str]:
        by_topic: dict[str, list[PartitionKey]] = {}
        for key in self.known:
            by_topic.setdefault(key[0], []).append(key)
        plan = {}
        weights = self._weights
        if len(weights) > 100_000:
            weights.clear()
        for topic, keys in by_topic.items():
            members = sorted(a for a, m in self.members.items() if topic in m.subjects)
            if topic in self.topics:
                members.append(self.address)
            if not members:
                continue
            share = -(-len(keys) // len(members))
            load = dict.fromkeys(members, 0)
            for key in sorted(keys):
                ranked = []
                for address in members:
                    w = weights.get((key, address))
                    if w is None:
                        w = weights[(key, address)] = weight(self.group, topic, key[1], address)
                    ranked.append((w, address))
                ranked.sort(reverse=True)
                for _, address in ranked:
                    if load[address] < share:
                        load[address] += 1
                        plan[key] = address
                        break
        return plan

    def _rebalance(self, now: float) -> None:
        self._plan = None
        if not self.ready:
            return
        self.rebalances += 1
        for key in list(self.owned):
            self._settle(key, now)
        for key in list(self.known):
            if key not in self.owned:
                self._settle(key, now)

    def _settle(self, key: PartitionKey, now: float) -> None:
        """Start or stop reading ``key`` as our view says."""
        ours = self.owner(key) == self.address
        if key in self.owned:
            if not ours and key not in self.revoking:
                self.revoking.add(key)
                self.revoked.append(key)
            return
        if not ours:
            self.waiting.pop(key, None)
            return
        holder = next((a for a, m in self.members.items() if key in m.holds), None)
        if holder is not None:
            since = self.waiting.setdefault(key, now)
            if now - since < self.timeout:
                return
            log.warning("group %s: %s/%s still read by %s after %.1f s; taking it over",
                        self.group, key[0], key[1], holder, self.timeout)
        self.waiting.pop(key, None)
        self.owned.add(key)
        self.released.pop(key, None)
        self.assigned.append(key)
        self.heartbeat_due = now  # tell the others at once: one that also wants it waits for our release

    def _revoke_all(self) -> None:
        for key in self.owned:
            if key not in self.revoking:
                self.revoking.add(key)
                self.revoked.append(key)
        self.waiting.clear()
