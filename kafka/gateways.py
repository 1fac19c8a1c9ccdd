"""The live Kafka gateways of a cluster and which one leads what, free of I/O.

Several gateways serve one cluster with no coordinator.  Each announces
itself (:class:`Node`: its node id and Kafka listener) every
:data:`ANNOUNCE_SECONDS` on the topic :data:`ANNOUNCE_TOPIC`, from a
producer whose address is its node id's (so two live processes cannot share
a node id: rfc 15's twin rule stops the second), and hears the others'
announcements.  A gateway unheard for ``timeout`` seconds is gone; one that
closes says so (``leaving``).

Every gateway-written Kafka partition, the partition registry, and every
group's coordinator is led by one live gateway, chosen by rendezvous
hashing over the live ones as stores place partitions (rfc 16): each
gateway computes the same leader from the same view, and the loss of a
gateway moves only what it led.  Views differ for a moment after a change;
the twin rule keeps two of them from writing one partition meanwhile.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

ANNOUNCE_TOPIC = "__dafka_kafka_gateways"
ANNOUNCE_SECONDS = 0.5
TIMEOUT_SECONDS = 3.0  # unheard for this long: gone (six announcements missed)
REGISTRY_KEY = "registry"
# A gateway whose own loop stood still this long may have been taken for gone (TIMEOUT_SECONDS unheard, its last
# announcement up to two intervals old) and its partitions taken over: it lets go of what it writes.
STALL_SECONDS = TIMEOUT_SECONDS - 2 * ANNOUNCE_SECONDS


@dataclass(frozen=True, order=True)
class Node:
    """A gateway as Kafka clients see it: a broker."""

    node_id: int
    host: str
    port: int


def encode_announcement(node: Node, *, leaving: bool = False, topics: dict[str, int] | None = None) -> bytes:
    """``topics``: the partition count of each gateway-written topic the gateway knows (an empty partition
    is in no store: the others learn how many a topic has from here)."""
    return json.dumps({"node_id": node.node_id, "host": node.host, "port": node.port, "leaving": leaving,
                       "topics": topics or {}}, separators=(",", ":")).encode()


def decode_announcement(value: bytes) -> tuple[Node, bool, dict[str, int]]:
    """(the node, whether it leaves, its topics' partition counts) of an announcement (ValueError if it is
    not one)."""
    try:
        fields = json.loads(value)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(fields, dict) or set(fields) != {"node_id", "host", "port", "leaving", "topics"}:
        raise ValueError("not an object of node_id, host, port, leaving and topics")
    node_id, host, port, leaving = fields["node_id"], fields["host"], fields["port"], fields["leaving"]
    if not isinstance(node_id, int) or isinstance(node_id, bool) or not 0 <= node_id < 2 ** 31:
        raise ValueError(f"node_id must be 0 .. 2**31-1, not {node_id!r}")
    if not isinstance(host, str) or not host or not isinstance(port, int) or isinstance(port, bool) \
            or not 0 < port < 65536 or not isinstance(leaving, bool):
        raise ValueError("host must be a name, port 1 .. 65535, leaving a boolean")
    topics = fields["topics"]
    if not isinstance(topics, dict) or not all(
            isinstance(count, int) and not isinstance(count, bool) and 0 < count < 2 ** 31 for count in topics.values()):
        raise ValueError("topics must map names to partition counts")
    return Node(node_id, host, port), leaving, topics


def partition_key(topic: str, index: int) -> str:
    return f"partition\0{topic}\0{index}"


def group_key(group: str) -> str:
    return f"group\0{group}"


def _weight(node_id: int, key: str) -> bytes:
    return hashlib.blake2b(f"{node_id}\0{key}".encode(), digest_size=8).digest()


class Gateways:
    """This gateway's view of the live gateways (itself always among them)."""

    def __init__(self, me: Node, timeout: float = TIMEOUT_SECONDS) -> None:
        self.me = me
        self.timeout = timeout
        self.version = 0  # moves at every change of who is live
        self._heard: dict[int, tuple[Node, float]] = {}
        self._topics: dict[int, dict[str, int]] = {}  # node id -> its announced partition counts
        self._leaders: dict[str, Node] = {}
        self._expired_at: float | None = None

    def live(self) -> list[Node]:
        """Every live gateway, by node id."""
        return sorted([self.me, *(node for node, _ in self._heard.values())])

    def node(self, node_id: int) -> Node | None:
        return self.me if node_id == self.me.node_id else self._heard.get(node_id, (None, 0.0))[0]

    def partitions(self, topic: str) -> int:
        """How many partitions the live gateways say ``topic`` has (0: none says)."""
        return max((counts.get(topic, 0) for counts in self._topics.values()), default=0)

    def on_announcement(self, node: Node, leaving: bool, now: float, topics: dict[str, int] | None = None) -> bool:
        """Take another gateway's announcement; True when who is live (or where) changed."""
        if node.node_id == self.me.node_id:
            return False
        known = self._heard.get(node.node_id)
        if leaving:
            self._topics.pop(node.node_id, None)
            if known is None:
                return False
            del self._heard[node.node_id]
        else:
            self._heard[node.node_id] = (node, now)
            self._topics[node.node_id] = topics or {}
            if known is not None and known[0] == node:
                return False
        self._changed()
        return True

    def expire(self, now: float) -> list[Node]:
        """Forget the gateways unheard for ``timeout``; returns them.  A stall of this gateway's own loop (it
        expires at least every announcement) counts for nobody's silence: their announcements may wait
        unread in its socket."""
        gap = now - self._expired_at if self._expired_at is not None else 0.0
        self._expired_at = now
        if gap > self.timeout / 2:
            self._heard = {node_id: (node, seen + gap) for node_id, (node, seen) in self._heard.items()}
        gone = [node for node, seen in self._heard.values() if now - seen >= self.timeout]
        for node in gone:
            del self._heard[node.node_id]
            self._topics.pop(node.node_id, None)
        if gone:
            self._changed()
        return gone

    def leader(self, key: str) -> Node:
        """The live gateway that leads ``key`` (:func:`partition_key`, :func:`group_key`, :data:`REGISTRY_KEY`):
        the one of highest weight for it."""
        node = self._leaders.get(key)
        if node is None:
            node = self._leaders[key] = max(self.live(), key=lambda n: _weight(n.node_id, key))
        return node

    def leads(self, key: str) -> bool:
        return self.leader(key).node_id == self.me.node_id

    def _changed(self) -> None:
        self.version += 1
        self._leaders.clear()


class StallGuard:
    """Whether this gateway's own loop stood still (SIGSTOP, a starved machine) for longer than ``limit``
    seconds.  Another gateway may then have taken its partitions over, and producers that wrote them on
    would give offsets the other used a second content, which the stores' re-ACKs make look acked; so the
    gateway lets go of what it writes, and answers a Produce that spanned a stall with NOT_LEADER_OR_FOLLOWER
    (the client retries at the leader; an idempotent batch that was stored is answered from its note).
    ``observe`` is called every tick and around each Produce; ``count`` tells a Produce whether one came."""

    def __init__(self, limit: float = STALL_SECONDS) -> None:
        self.limit = limit
        self.count = 0
        self.longest = 0.0
        self._seen: float | None = None

    def observe(self, now: float) -> bool:
        """True once for each stall: when the gap since the last observation exceeds the limit."""
        if self._seen is None:
            self._seen = now
        gap, self._seen = now - self._seen, max(now, self._seen)
        if gap <= self.limit:
            return False
        self.count += 1
        self.longest = max(self.longest, gap)
        return True
