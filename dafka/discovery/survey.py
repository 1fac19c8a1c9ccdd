"""Surveying a cluster: its live peers, their roles, and the heads of every
topic and partition, got the Dafka way (``dafka status``, and the mirror's
topic discovery).

How it works (the surveying peer joins the mesh as a consumer peer):
1. Its beacon subscribes to the tower, which replays the latest beacon of
   every live peer (``"B", sender, endpoint``): the list of peers.
2. It binds an XPUB (the configured bind address; 127.0.0.1 on loopback) and
   announces it, so every peer connects a SUB to it.  The subscriptions those
   SUBs make tell each peer's role (a producer subscribes ``K<addr>``, a store
   reader ``W<addr>`` and ``G``, a store writer ``D<addr>`` ``M`` ``H``, a
   consumer ``D`` ``E`` ``L`` ``<addr>``).
3. It connects a SUB to every peer, subscribed ``E<own address>`` (the stores'
   DIRECT-HEADs), ``L<own address>`` (STORE-HELLO) and ``H[topic]`` (the live
   producers' HEADs), and sends GET-HEADS with topic ``""`` (all topics: a
   reference store prefix-matches it, a dafka-py store treats it as all) or
   the ``--topic``, again for each topic it hears a HEAD of.  It sends it when
   a store reader subscribes ``G`` and when a STORE-HELLO shows the way back
   is up.
4. After ``--wait-ms`` it prints the peers and a table: topic, partition,
   store head (highest over the stores), the last HEAD of the live producer.

With ``--groups`` it also subscribes ``J`` (every consumer group's
GROUP-MEMBER heartbeat, rfc section 14), which members answer at once, and
prints each group's members and the partitions each reads instead.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import zmq

from ..records import PartitionKey
from .. import protocol as proto
from ..config import Config
from ..core.addresses import new_address
from ..core.sockets import connect, read_subscriptions
from .beacon import CONNECT, Beacon
from .links import DataSocket
from .placement import place


@dataclass
class Survey:
    """What the tool learned; filled by :class:`StatusPeer`."""

    address: str
    topic: str | None
    peers: dict[str, str] = field(default_factory=dict)  # endpoint -> sender
    roles: dict[str, set[str]] = field(default_factory=dict)  # address -> roles
    store_heads: dict[PartitionKey, dict[str, int]] = field(default_factory=dict)  # (topic, partition) -> reader -> seq
    producer_heads: dict[PartitionKey, int] = field(default_factory=dict)
    groups: dict[str, dict[str, proto.GroupMemberMsg]] = field(default_factory=dict)  # group -> member -> heartbeat
    store_members: dict[str, proto.StoreMemberMsg] = field(default_factory=dict)  # reader -> sharded store's heartbeat
    kafka_gateways: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)  # (host, pid) -> its details
    # HEADS-AT answers (rfc 20.1), when asked: partition -> the last record held at the moment asked (-1: none)
    held_exact: dict[str, int] = field(default_factory=dict)  # a producer's own, exact
    held_at_least: dict[str, int] = field(default_factory=dict)  # the stores', lower bounds

    def held_at(self) -> dict[str, int]:
        """Per partition, the last record produced at or before the moment asked: a producer's exact answer,
        else the highest of the stores'; partitions nobody could tell of are left out."""
        return {**self.held_at_least, **self.held_exact}

    def note_role(self, address: str, role: str) -> None:
        self.roles.setdefault(address, set()).add(role)

    def role(self, address: str) -> str:
        roles = self.roles.get(address, set())
        if "store-reader" in roles:
            return "store-reader"
        if "producer" in roles:
            return "producer"
        if "consumer" in roles:
            return "consumer"
        if "direct" in roles:
            return "store-writer"
        return "?"

    def wants(self, subject: str) -> bool:
        return self.topic is None or subject == self.topic

    # -- output -------------------------------------------------------------

    def peer_rows(self) -> list[dict[str, str]]:
        rows = [{"address": s, "endpoint": e, "role": self.role(s)} for e, s in self.peers.items()]
        order = {"producer": 0, "consumer": 1, "store-writer": 2, "store-reader": 3, "?": 4}
        return sorted(rows, key=lambda r: (order[r["role"]], r["address"]))

    def group_rows(self) -> list[dict[str, Any]]:
        rows = []
        for group, members in sorted(self.groups.items()):
            for address, msg in sorted(members.items()):
                rows.append({
                    "group": group,
                    "member": address,
                    "topics": list(msg.subjects),
                    "partitions": [
                        {"topic": e.subject, "partition": e.address,
                         "committed": None if e.offset == proto.NO_OFFSET else e.offset}
                        for e in msg.entries if e.state == proto.READING],
                })
        return rows

    def kafka_group_rows(self) -> list[dict[str, Any]]:
        """The Kafka groups the gateways (``dafka kafka``) describe in their PEER-INFO: one row a group and
        gateway, with its state, members, lag and partitions (a gateway's hostile or newer body: what is not
        of the type expected is left out)."""
        rows = []
        for (host, _), details in sorted(self.kafka_gateways.items()):
            listener = details.get("listener") if isinstance(details.get("listener"), str) else host
            for group in details.get("kafka_groups") or ():
                if not isinstance(group, dict) or not isinstance(group.get("group"), str):
                    continue
                parts = [{k: p.get(k) for k in ("topic", "partition", "address", "committed", "lag")}
                         for p in group.get("partitions") or () if isinstance(p, dict)]
                rows.append({"gateway": listener, "group": group["group"], "state": str(group.get("state", "")),
                             "protocol": str(group.get("protocol", "")), "members": _int(group.get("members")),
                             "lag": _int(group.get("lag")), "partitions": parts})
        return sorted(rows, key=lambda r: (r["group"], r["gateway"]))

    def partition_rows(self) -> list[dict[str, Any]]:
        """One row a partition.  With sharded stores (rfc 16), also its ``owners`` (store identities, placed
        over the stores heard) and ``under_replicated``: fewer than ``store/replicas`` owners hold it to the
        highest head a store has and are not still filling it."""
        members = {m.store: m for m in self.store_members.values()}
        replicas = max((m.replicas for m in members.values()), default=0)
        racks = {store: m.rack for store, m in members.items()}
        rows = []
        for key in sorted(set(self.store_heads) | set(self.producer_heads)):
            stores = self.store_heads.get(key, {})
            head = max(stores.values()) if stores else None
            row: dict[str, Any] = {
                "topic": key[0],
                "partition": key[1],
                "store_head": head,
                "producer_head": self.producer_heads.get(key),
                "stores": dict(sorted(stores.items())),
            }
            if replicas:
                owners = place(key[0], key[1], racks, replicas)
                complete = sum(1 for store in owners if key not in members[store].filling
                               and head is not None and stores.get(members[store].reader, -1) >= head)
                row["owners"] = owners
                row["under_replicated"] = complete < min(replicas, len(racks))
            rows.append(row)
        return rows


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


class StatusPeer:
    def __init__(self, config: Config, topic: str | None, groups: bool = False, held_at_ms: int | None = None) -> None:
        """``held_at_ms``: also ask every producer and store of ``topic`` what it held at that moment (unix
        ms; HEADS-AT, rfc 20.1): :meth:`Survey.held_at`."""
        self.config = config
        self.groups = groups
        self.held_at_ms = held_at_ms
        self.ctx = zmq.Context()
        self.address = new_address()
        self.survey = Survey(self.address, topic)
        self.xpub = self.ctx.socket(zmq.XPUB)
        self.xpub.setsockopt(zmq.XPUB_VERBOSE, 1)
        self.xpub.linger = 0
        self.data = DataSocket(self.ctx, config, self.xpub, self.address, "status")
        self.subs: dict[str, zmq.Socket[Any]] = {}  # endpoint -> SUB
        self.poller = zmq.Poller()
        self.poller.register(self.xpub, zmq.POLLIN)
        self.poller.register(self.data.beacon.events, zmq.POLLIN)
        self.asked: set[str] = set()  # topics GET-HEADS was sent for

    @property
    def connected(self) -> bool:
        return self.data.beacon.connected

    def start(self) -> None:
        self.data.beacon.start()

    def close(self) -> None:
        self.data.close()  # the beacon, and the CURVE authenticator of this context (its thread holds a socket)
        for sock in self.subs.values():
            sock.close(0)
        self.xpub.close(0)
        self.ctx.term()

    def wait_connected(self, timeout: float) -> bool:
        """Run until the tower is reached (it then replays the beacons it knows), at most ``timeout`` s: a
        survey's window counts from there, not from a start the machine's load may have delayed."""
        deadline = time.monotonic() + timeout
        while not self.connected:
            if time.monotonic() >= deadline:
                return False
            self.run(0.02)
        return True

    def run(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        resent = False
        while True:
            now = time.monotonic()
            if now >= deadline:
                return
            if not resent and now >= deadline - seconds / 2:
                resent = True
                self.get_heads()  # insurance against a lost first request
            for sock, _ in self.poller.poll(max(1, int((deadline - now) * 1000))):
                if sock is self.xpub:
                    self.on_subscriptions()
                elif sock is self.data.beacon.events:
                    self.on_beacon()
                elif not sock.closed:  # (on_beacon, earlier in this batch, closes the socket of a peer gone)
                    self.on_peer(sock)

    # -- GET-HEADS ----------------------------------------------------------

    def get_heads(self, topics: list[str] | None = None) -> None:
        wanted = topics if topics is not None else [self.survey.topic or "", *sorted(self.asked - {""})]
        for topic in wanted:
            self.asked.add(topic)
            self.xpub.send_multipart(proto.encode(proto.GetHeadsMsg(topic, self.address)))

    # -- events -------------------------------------------------------------

    def on_beacon(self) -> None:
        for event in Beacon.read_events(self.data.beacon.events):
            if event.kind == CONNECT:
                self.survey.peers[event.endpoint] = event.sender
                if event.endpoint in self.subs:
                    continue
                sock = self.ctx.socket(zmq.SUB)
                sock.linger = 0
                for msg_id in (proto.DIRECT_HEAD, proto.STORE_HELLO):
                    sock.setsockopt(zmq.SUBSCRIBE, proto.subscription(msg_id, self.address, exact=True))
                topic = self.survey.topic
                sock.setsockopt(zmq.SUBSCRIBE, proto.subscription(proto.HEAD, topic or "", exact=topic is not None))
                if self.held_at_ms is not None and topic:  # the request is the subscription (rfc 20.1)
                    sock.setsockopt(zmq.SUBSCRIBE, proto.heads_at_prefix(self.address, self.held_at_ms, topic))
                if self.groups:  # dafka's groups heartbeats, and the Kafka gateways' groups in their PEER-INFO
                    sock.setsockopt(zmq.SUBSCRIBE, proto.GROUP_MEMBER)
                    sock.setsockopt(zmq.SUBSCRIBE, proto.subscription(proto.PEER_INFO, self.address, exact=True))
                else:  # sharded stores' heartbeats (rfc 16), sent at once to a new subscriber
                    sock.setsockopt(zmq.SUBSCRIBE, proto.subscription(proto.STORE_MEMBER, exact=True))
                if not connect(sock, event.endpoint):
                    sock.close(0)
                    continue
                self.subs[event.endpoint] = sock
                self.poller.register(sock, zmq.POLLIN)
            else:
                self.survey.peers.pop(event.endpoint, None)
                gone = self.subs.pop(event.endpoint, None)
                if gone is not None:
                    self.poller.unregister(gone)
                    gone.close(0)

    def on_subscriptions(self) -> None:
        ask = False
        for sub in read_subscriptions(self.xpub):
            if sub is None or not sub.subscribe or self.data.answer_info(sub):
                continue
            survey, topic = self.survey, sub.topic
            if sub.msg_id == proto.GET_HEADS:
                ask = True
            elif sub.msg_id == proto.CONSUMER_HELLO and topic:
                survey.note_role(topic, "store-reader")
            elif sub.msg_id in (proto.ACK, proto.FETCH) and topic:
                survey.note_role(topic, "producer")
            elif sub.msg_id == proto.STORE_HELLO and topic:
                # (DIRECT-HEAD tells nothing: a dafka-py store writer subscribes to it too, rfc 7.1)
                survey.note_role(topic, "consumer")
            elif sub.msg_id == proto.DIRECT_RECORD and topic:
                survey.note_role(topic, "direct")
        if ask:
            self.get_heads()

    def on_peer(self, sock: zmq.Socket[Any]) -> None:
        endpoint = next((e for e, s in self.subs.items() if s is sock), None)
        sender = self.survey.peers.get(endpoint, "?") if endpoint is not None else "?"
        survey = self.survey
        new_topics = []
        hello = False
        for _ in range(10_000):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            try:
                msg = proto.decode(frames)
            except proto.MalformedMessage:
                continue
            if isinstance(msg, proto.DirectHeadMsg) and msg.topic == self.address and survey.wants(msg.subject):
                heads = survey.store_heads.setdefault((msg.subject, msg.address), {})
                heads[sender] = max(heads.get(sender, -1), msg.sequence)
                survey.note_role(sender, "store-reader")
            elif isinstance(msg, proto.HeadMsg) and survey.wants(msg.subject):
                key = (msg.subject, msg.address)
                survey.producer_heads[key] = max(survey.producer_heads.get(key, -1), msg.sequence)
                survey.note_role(msg.address, "producer")
                if msg.subject not in self.asked:
                    new_topics.append(msg.subject)
            elif isinstance(msg, proto.GroupMemberMsg):
                members = survey.groups.setdefault(msg.topic, {})
                if msg.leaving:
                    members.pop(msg.address, None)
                else:
                    members[msg.address] = msg
                survey.note_role(msg.address, "consumer")
            elif isinstance(msg, proto.PeerInfoMsg) and msg.topic == self.address:
                body = msg.info if isinstance(msg.info, dict) else {}
                details = body.get("application_details")
                if body.get("application") == "kafka" and isinstance(details, dict):
                    survey.kafka_gateways[(str(body.get("host", "")), _int(body.get("pid")))] = details
            elif (isinstance(msg, proto.HeadsAtMsg) and msg.topic == self.address and msg.since == self.held_at_ms
                  and msg.subject == survey.topic):
                for entry in msg.entries:
                    if entry.sequence == proto.NOT_KNOWN:
                        continue
                    held = -1 if entry.sequence == proto.NOTHING_HELD else entry.sequence
                    if not msg.complete and entry.address == msg.address:
                        survey.held_exact[entry.address] = held
                    else:
                        survey.held_at_least[entry.address] = max(survey.held_at_least.get(entry.address, -1), held)
            elif isinstance(msg, proto.StoreMemberMsg):
                survey.store_members[msg.reader] = msg
                survey.note_role(msg.address, "direct")
            elif isinstance(msg, proto.StoreHelloMsg) and msg.topic == self.address:
                survey.note_role(msg.address, "store-reader")
                hello = True
        if hello:
            self.get_heads()
        elif new_topics:
            self.get_heads(sorted(set(new_topics)))
