"""What the console knows of a cluster, free of I/O: feed it what its peer
hears (tower events, decoded messages, subscriptions seen on its XPUB) and
the time; ask it for what a page shows.

It learns:

* the live peers, from the tower (``peer_up`` / ``peer_down``);
* what each dafka-py peer says of itself (PEER-INFO, rfc 17): role, version,
  host, uptime, memory, CPU, and a store's disk and partitions, a mirror's
  sources, a CDC connector's position;
* the role of a peer that says nothing (a reference peer), from what it
  subscribes to on the console's XPUB, as ``dafka status`` does;
* every partition's producer head (HEAD) and each store's head and tail
  (DIRECT-PARTITIONS, DIRECT-HEAD);
* the consumer groups (GROUP-MEMBER) and the sharded stores (STORE-MEMBER).

:meth:`ClusterModel.tick` samples the heads once a second: the cluster's and
each partition's rate, and each group's lag over time.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from dafka.records import PartitionKey
from dafka.protocol import batching
from dafka import protocol as proto
from dafka.protocol.commits import OFFSETS_TOPIC
from dafka.discovery.placement import place

HISTORY = 300  # samples (one a second) kept for the charts
RATE_WINDOW = 5.0  # seconds over which a rate is measured
STILL = 4.0  # seconds without a new head after which a partition's rate is 0 (heads come every 1-2 s)


@dataclass
class PeerView:
    """One live peer, as the console sees it."""

    address: str
    endpoint: str
    since: float  # console time it was first heard
    roles: set[str] = field(default_factory=set)  # inferred from its subscriptions
    info: dict[str, Any] = field(default_factory=dict)  # its last PEER-INFO's body
    info_role: str = ""  # the role its PEER-INFO gave
    info_at: float = 0.0  # console time of that PEER-INFO
    cpu_rate: float | None = None  # share of a core over the last two PEER-INFOs

    @property
    def role(self) -> str:
        if self.info_role:
            return self.info_role
        for role in ("store-reader", "store-writer", "producer", "consumer"):
            if role in self.roles:
                return role
        return "unknown"

    @property
    def application(self) -> str:
        return str(self.info.get("application") or "")


@dataclass
class PartitionView:
    topic: str
    address: str
    producer_head: int | None = None
    store_heads: dict[str, int] = field(default_factory=dict)  # store reader -> head
    store_tails: dict[str, int] = field(default_factory=dict)  # store reader -> oldest kept
    # the highest DIRECT-HEAD: a reference store's answer (which names no store), or a dafka-py store's before
    # it saw the console's bulk subscription
    unnamed_head: int | None = None
    samples: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=8))

    @property
    def head(self) -> int | None:
        heads = [h for h in (self.producer_head, self.unnamed_head, *self.store_heads.values()) if h is not None]
        return max(heads) if heads else None

    @property
    def stored_head(self) -> int | None:
        heads = [h for h in (self.unnamed_head, *self.store_heads.values()) if h is not None]
        return max(heads) if heads else None

    def unnamed_store(self) -> bool:
        """Whether a store that did not name itself holds more than the named ones (a reference store)."""
        return self.unnamed_head is not None and self.unnamed_head > max(self.store_heads.values(), default=-1)

    @property
    def tail(self) -> int | None:
        """The oldest offset some store still holds (0 when no store said)."""
        return min(self.store_tails.values()) if self.store_tails else (0 if self.store_heads else None)

    @property
    def records(self) -> int:
        head, tail = self.stored_head, self.tail
        return 0 if head is None or tail is None else max(0, head - tail + 1)

    def observe(self, now: float, head: int) -> None:
        """A head heard at ``now`` (a HEAD, a store's answer): a sample of the rate when it moved on.  Samples
        are taken when heads arrive, not when the console ticks: heads come every second or two, and a
        sample's time must be when its head was true."""
        if not self.samples or head > self.samples[-1][1]:
            self.samples.append((now, head))
        while len(self.samples) > 2 and now - self.samples[0][0] > RATE_WINDOW:
            self.samples.popleft()

    def rate(self, now: float) -> float:
        """Records a second over the last :data:`RATE_WINDOW` seconds; 0 once the head stood still for
        :data:`STILL` seconds."""
        if len(self.samples) < 2 or now - self.samples[-1][0] > STILL:
            return 0.0
        (t0, h0), (t1, h1) = self.samples[0], self.samples[-1]
        return (h1 - h0) / (t1 - t0) if t1 > t0 else 0.0


@dataclass
class GroupView:
    name: str
    members: dict[str, proto.GroupMemberMsg] = field(default_factory=dict)
    committed: dict[PartitionKey, int] = field(default_factory=dict)  # last known commits, kept after members go
    lag: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=HISTORY))


def _number(value: Any) -> float | int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value if isinstance(value, int) or math.isfinite(value) else None


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _map(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


_STORE_NUMBERS = ("disk", "partitions", "records_written", "replicas", "retention_ms", "retention_bytes")
_STORE_TEXTS = ("store", "path", "rack", "writer", "reader")
_ROW_NUMBERS = ("next", "acked", "source_head", "lag", "lag_seconds")
_ROW_TEXTS = ("topic", "partition", "phase", "reason")
_APP_NUMBERS = ("partitions", "copied", "conflicts", "gaps", "changes", "transactions", "snapshot_rows", "confirmed",
                "lag_bytes", "acked")
_APP_TEXTS = ("name", "source", "connector", "position")


def clean_info(info: dict[str, Any]) -> dict[str, Any]:
    """A PEER-INFO body with every field the console shows of the type it shows it as (a peer is hostile
    input, and so may be a newer one): a wrong type reads as absent."""
    details, app = _map(info.get("details")), _map(info.get("application_details"))
    rows, groups = app.get("rows"), app.get("kafka_groups")
    return {
        **{k: _text(info.get(k)) for k in ("version", "host", "metrics", "application")},
        **{k: _number(info.get(k)) for k in ("pid", "started", "now", "rss", "cpu")},
        "details": {
            **{k: _number(details.get(k)) for k in _STORE_NUMBERS},
            **{k: _text(details.get(k)) for k in _STORE_TEXTS},
            "topic_bytes": {str(t): n for t, n in _map(details.get("topic_bytes")).items() if _number(n) is not None},
        },
        "application_details": {
            **{k: _number(app.get(k)) for k in _APP_NUMBERS},
            **{k: _text(app.get(k)) for k in _APP_TEXTS},
            "tables": [t for t in app.get("tables") or () if isinstance(t, str)] if isinstance(app.get("tables"), list) else [],
            "topics": [t for t in app.get("topics") or () if isinstance(t, str)] if isinstance(app.get("topics"), list) else [],
            "rows": [{**{k: _number(r.get(k)) for k in _ROW_NUMBERS}, **{k: _text(r.get(k)) for k in _ROW_TEXTS}}
                     for r in (rows if isinstance(rows, list) else ()) if isinstance(r, dict)],
            "listener": _text(app.get("listener")),
            "kafka_groups": [{**{k: _number(g.get(k)) for k in ("members", "generation", "lag")},
                              **{k: _text(g.get(k)) for k in ("group", "state", "protocol")}}
                             for g in (groups if isinstance(groups, list) else ()) if isinstance(g, dict)
                             and isinstance(g.get("group"), str)],
        } if app else {},
    }


class ClusterModel:
    def __init__(self, address: str) -> None:
        self.address = address  # the console's own
        self.peers: dict[str, PeerView] = {}  # address -> live peer
        self._by_endpoint: dict[str, str] = {}
        self.partitions: dict[PartitionKey, PartitionView] = {}
        self.groups: dict[str, GroupView] = {}
        self.store_members: dict[str, proto.StoreMemberMsg] = {}  # store reader -> its heartbeat
        self.gone: deque[tuple[float, str, str]] = deque(maxlen=50)  # (when, address, role) of peers that left
        self.rates: deque[tuple[float, float]] = deque(maxlen=HISTORY)  # (time, records/s of the cluster)
        self.malformed = 0

    # -- feeding ------------------------------------------------------------

    def peer_up(self, endpoint: str, address: str, now: float) -> None:
        self._by_endpoint[endpoint] = address
        if address not in self.peers:
            self.peers[address] = PeerView(address, endpoint, now)

    def peer_down(self, endpoint: str, now: float) -> None:
        address = self._by_endpoint.pop(endpoint, None)
        if address is None:
            return
        peer = self.peers.pop(address, None)
        if peer is not None:
            self.gone.appendleft((now, address, peer.role))
        self.store_members.pop(address, None)

    def on_subscription(self, sub: proto.Subscription) -> None:
        """A subscription seen on the console's XPUB: what the subscriber is (as ``dafka status`` tells)."""
        topic = sub.topic
        if not sub.subscribe or not topic or topic not in self.peers:
            return
        role = {proto.CONSUMER_HELLO: "store-reader", proto.ACK: "producer", proto.FETCH: "producer",
                proto.STORE_HELLO: "consumer", proto.DIRECT_RECORD: "store-writer"}.get(sub.msg_id)
        if role is not None:
            self.peers[topic].roles.add(role)

    def _partition(self, topic: str, address: str) -> PartitionView:
        key = (topic, address)
        p = self.partitions.get(key)
        if p is None:
            p = self.partitions[key] = PartitionView(topic, address)
        return p

    def on_message(self, msg: proto.Message, now: float) -> None:
        """A message the console heard (on one SUB from every peer: who sent it is what it says)."""
        if isinstance(msg, proto.HeadMsg):
            p = self._partition(msg.subject, msg.address)
            p.producer_head = msg.sequence if p.producer_head is None else max(p.producer_head, msg.sequence)
            p.observe(now, msg.sequence)
            if msg.address in self.peers:
                self.peers[msg.address].roles.add("producer")
        elif isinstance(msg, proto.DirectPartitionsMsg):
            for info in msg.partitions:
                p = self._partition(info.subject, info.address)
                p.store_heads[msg.address] = info.head
                p.store_tails[msg.address] = info.tail
                p.observe(now, info.head)
        elif isinstance(msg, proto.DirectHeadMsg):
            p = self._partition(msg.subject, msg.address)
            p.unnamed_head = msg.sequence if p.unnamed_head is None else max(p.unnamed_head, msg.sequence)
            p.observe(now, msg.sequence)
        elif isinstance(msg, proto.GroupMemberMsg):
            group = self.group(msg.topic)
            if msg.leaving:
                group.members.pop(msg.address, None)
            else:
                group.members[msg.address] = msg
            for entry in msg.entries:
                if entry.state == proto.READING and entry.offset != proto.NO_OFFSET:
                    group.committed[(entry.subject, entry.address)] = entry.offset
        elif isinstance(msg, proto.StoreMemberMsg):
            if msg.leaving:
                self.store_members.pop(msg.reader, None)
            else:
                self.store_members[msg.reader] = msg
        elif isinstance(msg, proto.PeerInfoMsg):
            self._on_info(msg, now)

    def _on_info(self, msg: proto.PeerInfoMsg, now: float) -> None:
        peer = self.peers.get(msg.address)
        if peer is None:
            return
        before, then = peer.info.get("cpu"), peer.info.get("now")
        cpu, wall = msg.info.get("cpu"), msg.info.get("now")
        if (isinstance(before, (int, float)) and isinstance(then, (int, float)) and isinstance(cpu, (int, float))
                and isinstance(wall, (int, float)) and wall > then):
            peer.cpu_rate = max(0.0, (cpu - before) / (wall - then))
        peer.info, peer.info_role, peer.info_at = clean_info(msg.info), msg.role, now

    def group(self, name: str) -> GroupView:
        group = self.groups.get(name)
        if group is None:
            group = self.groups[name] = GroupView(name)
        return group

    def on_commits(self, group: str, commits: dict[PartitionKey, int]) -> None:
        """The newest commits of ``group`` read from its offsets topic (a group whose members are gone)."""
        self.group(group).committed.update(commits)

    def woke(self) -> None:
        """The console listens again after a pause: rates start over (a rate across the pause would be its
        average)."""
        for p in self.partitions.values():
            p.samples.clear()

    def tick(self, now: float) -> None:
        """A point of each chart: the cluster's rate, and each group's lag."""
        # the sum of the partitions' rates: a partition just discovered adds its records, not a burst of them
        self.rates.append((now, sum(p.rate(now) for p in self.partitions.values())))
        for group in self.groups.values():
            group.lag.append((now, sum(row["lag"] or 0 for row in self.group_partitions(group.name))))

    # -- what pages show ----------------------------------------------------

    def topic_names(self) -> list[str]:
        return sorted({topic for topic, _ in self.partitions})

    def is_internal(self, topic: str) -> bool:
        return topic.startswith("__")

    def producer_alive(self, address: str) -> bool:
        return address in self.peers

    def stores(self) -> list[dict[str, Any]]:
        """One row a store (its reader's PEER-INFO, or a reader that said nothing)."""
        rows = []
        members = {m.reader: m for m in self.store_members.values()}
        for peer in self.peers.values():
            if peer.role != "store-reader":
                continue
            details = peer.info.get("details") or {}
            held = sum(1 for p in self.partitions.values() if peer.address in p.store_heads)
            member = members.get(peer.address)
            rows.append({
                "address": peer.address, "store": details.get("store", ""), "host": peer.info.get("host", ""),
                "disk": details.get("disk"), "partitions": held, "path": details.get("path", ""),
                "replicas": member.replicas if member else (details.get("replicas") or 0),
                "rack": member.rack if member else details.get("rack", ""),
                "filling": len(member.filling) if member else 0,
                "share": held / len(self.partitions) if self.partitions else 0.0,
                "topic_bytes": details.get("topic_bytes") or {},
                "retention_ms": details.get("retention_ms"), "retention_bytes": details.get("retention_bytes"),
            })
        return sorted(rows, key=lambda r: (r["store"], r["address"]))

    def under_replicated(self) -> list[PartitionKey]:
        """With sharded stores (rfc 16): partitions that fewer than store/replicas owners hold to the head."""
        members = {m.store: m for m in self.store_members.values()}
        replicas = max((m.replicas for m in members.values()), default=0)
        if not replicas:
            return []
        racks = {store: m.rack for store, m in members.items()}
        out = []
        for key, p in self.partitions.items():
            head = p.stored_head
            owners = place(key[0], key[1], racks, replicas)
            complete = sum(1 for s in owners if key not in members[s].filling and head is not None
                           and p.store_heads.get(members[s].reader, -1) >= head)
            if complete < min(replicas, len(racks)):
                out.append(key)
        return sorted(out)

    def overview(self, now: float) -> dict[str, Any]:
        peers = []
        for peer in sorted(self.peers.values(), key=lambda p: (p.application or p.role, p.address)):
            info = peer.info
            started, then = info.get("started"), info.get("now")
            uptime = then - started if started is not None and then is not None else None
            peers.append({
                "address": peer.address, "endpoint": peer.endpoint, "role": peer.role,
                "application": peer.application, "version": info.get("version", ""),
                "host": info.get("host", ""), "pid": info.get("pid"),
                "uptime": (uptime or 0) + (now - peer.info_at) if uptime is not None else None,
                "rss": info.get("rss"), "cpu": peer.cpu_rate, "metrics": info.get("metrics", ""),
                "heard": now - peer.since, "reference": not info,
            })
        counts: dict[str, int] = {}
        for row in peers:
            counts[row["application"] or row["role"]] = counts.get(row["application"] or row["role"], 0) + 1
        topics = [t for t in self.topic_names() if not self.is_internal(t)]
        return {
            "peers": peers, "counts": counts, "stores": self.stores(), "topics": len(topics),
            "partitions": sum(1 for t, _ in self.partitions if not self.is_internal(t)),
            "records": sum(p.records for p in self.partitions.values()),
            "rate": self.rates[-1][1] if self.rates else 0.0,
            "under_replicated": self.under_replicated(),
            "sharded": bool(self.store_members), "groups": len(self.groups),
            "gone": [{"ago": now - when, "address": a, "role": r} for when, a, r in self.gone],
        }

    def topics(self, now: float, pattern: str = "", internal: bool = False) -> list[dict[str, Any]]:
        rows: dict[str, dict[str, Any]] = {}
        needle = pattern.lower()
        bytes_by_topic: dict[str, int] = {}
        for store in self.stores():
            for topic, size in store["topic_bytes"].items():
                bytes_by_topic[topic] = bytes_by_topic.get(topic, 0) + int(size)
        for (topic, _), p in self.partitions.items():
            if needle and needle not in topic.lower():
                continue
            if not internal and self.is_internal(topic):
                continue
            row = rows.get(topic)
            if row is None:
                row = rows[topic] = {"topic": topic, "partitions": 0, "records": 0, "rate": 0.0, "live": 0,
                                     "bytes": bytes_by_topic.get(topic)}
            row["partitions"] += 1
            row["records"] += p.records
            row["rate"] += p.rate(now)
            row["live"] += self.producer_alive(p.address)
        return [rows[t] for t in sorted(rows)]

    def topic(self, name: str, now: float = 0.0) -> list[dict[str, Any]]:
        """One row a partition of topic ``name`` (rates at ``now``; 0 without it)."""
        readers = {peer.address: (peer.info.get("details") or {}).get("store", "") for peer in self.peers.values()}
        rows = []
        for (topic, address), p in sorted(self.partitions.items()):
            if topic != name:
                continue
            rows.append({
                "partition": address, "alive": self.producer_alive(address),
                "producer_head": p.producer_head, "head": p.head, "tail": p.tail, "records": p.records,
                "stores": [{"reader": r, "store": readers.get(r, ""), "head": h, "tail": p.store_tails.get(r)}
                           for r, h in sorted(p.store_heads.items())]
                + ([{"reader": "", "store": "a reference store", "head": p.unnamed_head, "tail": None}]
                   if p.unnamed_store() else []),
                "rate": p.rate(now),
            })
        return rows

    def partition(self, topic: str, address: str) -> PartitionView | None:
        return self.partitions.get((topic, address))

    def group_names(self) -> list[str]:
        """Every group heard of: by its members, by its offsets topic on the stores, or from the Kafka
        gateway that coordinates it."""
        names = set(self.groups) | set(self.kafka_groups())
        names.update(t[len(OFFSETS_TOPIC):] for t, _ in self.partitions if t.startswith(OFFSETS_TOPIC))
        return sorted(names)

    def kafka_groups(self) -> dict[str, dict[str, Any]]:
        """The Kafka groups that Kafka gateways (``dafka kafka``) describe in their PEER-INFO, by name, each
        with the gateway's ``listener``."""
        out: dict[str, dict[str, Any]] = {}
        for peer in self.peers.values():
            if peer.application != "kafka":
                continue
            details = peer.info.get("application_details") or {}
            for group in details.get("kafka_groups") or ():
                out[group["group"]] = {**group, "listener": details.get("listener") or ""}
        return out

    def group_partitions(self, name: str) -> list[dict[str, Any]]:
        group = self.groups.get(name)
        if group is None:
            return []
        owner: dict[PartitionKey, str] = {}
        topics: set[str] = set()
        for member in group.members.values():
            topics.update(member.subjects)
            for entry in member.entries:
                if entry.state == proto.READING:
                    owner[(entry.subject, entry.address)] = member.address
        keys = set(group.committed) | set(owner) | {k for k in self.partitions if k[0] in topics}
        rows = []
        for key in sorted(keys):
            p = self.partitions.get(key)
            head = p.head if p is not None else None
            committed = group.committed.get(key)
            lag = None if head is None else head + 1 - (committed or 0)
            rows.append({"topic": key[0], "partition": key[1], "member": owner.get(key, ""),
                         "committed": committed, "head": head, "lag": lag})
        return rows

    def groups_overview(self) -> list[dict[str, Any]]:
        rows = []
        kafka = self.kafka_groups()
        for name in self.group_names():
            group = self.groups.get(name)
            parts = self.group_partitions(name)
            topics: set[str] = set()
            for member in (group.members.values() if group else ()):
                topics.update(member.subjects)
            rows.append({"group": name, "members": len(group.members) if group else 0,
                         "topics": sorted(topics or {r["topic"] for r in parts}),
                         "partitions": len(parts), "lag": sum(r["lag"] or 0 for r in parts),
                         "state": "stable" if group and group.members else "empty", "kafka": ""})
            if name in kafka and not (group and group.members):  # a Kafka group: as its coordinator says
                rows[-1].update(members=kafka[name]["members"] or 0, kafka=kafka[name]["listener"],
                                state=(kafka[name]["state"] or "empty").lower())
        return rows

    def applications(self, kind: str) -> list[dict[str, Any]]:
        """The mirrors (``"mirror"``) or CDC connectors (``"cdc"``) alive: one row a process."""
        seen: dict[tuple[str, Any], dict[str, Any]] = {}
        for peer in self.peers.values():
            if peer.application != kind:
                continue
            key = (str(peer.info.get("host", "")), peer.info.get("pid"))
            row = seen.setdefault(key, {"host": key[0], "pid": key[1], "details": {}, "peers": []})
            row["peers"].append({"address": peer.address, "role": peer.role})
            details = peer.info.get("application_details") or {}
            if details:
                row["details"] = details
        return list(seen.values())



def tail_prefixes(topic: str) -> list[bytes]:
    """What to subscribe on every peer to follow ``topic`` live, as a dafka-py consumer does: RECORDs, and
    KEYED-RECORDS, which a dafka-py producer then sends instead (dafka/protocol/batching.py)."""
    return [proto.subscription(proto.RECORD, topic, exact=True),
            proto.subscription(batching.LIVE_BATCHES, topic, exact=True)]
