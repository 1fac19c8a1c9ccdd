"""Kafka requests in, dafka actions and Kafka responses out: the gateway's protocol logic, without I/O.

The server (:mod:`dafka.kafka.server`) parses a frame with
:func:`~.messages.read_request` and hands it to :class:`Mapping`, which
answers at once (ApiVersions, Metadata, ListOffsets, errors) or returns what
the cluster must do first: :class:`Appends` for a Produce (records to publish
on the gateway's own partitions), :class:`Reads` for a Fetch (offset ranges to
read).  The server does those and hands back the results, and the mapping
builds the response.  What the mapping knows of the cluster comes from the
server as a :class:`TopicView` per topic.

How Kafka's names map to dafka's (docs/kafka.md):

* a Kafka topic is a dafka topic;
* Kafka partition ``n`` of topic ``t`` is the dafka partition
  :func:`partition_name`'s address: the gateway produces it as a resumed
  producer (rfc 15), so its offsets go on across restarts, and any gateway
  gives the same number to the same partition;
* the partitions dafka producers write follow, read-only, at the numbers
  :mod:`~.numbering` keeps; a Kafka producer cannot write their topic
  (:func:`read_only_topic`);
* offsets are dafka offsets, keys dafka keys (rfc 18);
* the live gateways are the brokers (:mod:`~.gateways`); each gateway
  partition and each group has one of them for leader and coordinator, with
  leader epoch 0; a Produce, or a group's request, to another gets
  ``NOT_LEADER_OR_FOLLOWER`` or ``NOT_COORDINATOR``; any gateway serves any
  Fetch; the last stable offset is the high watermark (no transactions).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from functools import lru_cache
from typing import Any, Hashable

from dafka.core.addresses import partition_address

from . import batches, errors
from .acl import ALLOW_ALL, CREATE, DELETE, DESCRIBE, GROUP, READ, TOPIC, WRITE, Access
from .batches import Batch
from .fetch_buffer import Row, Segment
from .gateways import Gateways, Node, group_key, partition_key
from .groups import Coordinator
from .idempotence import Sequences
from .messages import (
    API_VERSIONS, CREATE_TOPICS, DELETE_GROUPS, DELETE_TOPICS, DESCRIBE_CONFIGS, DESCRIBE_GROUPS, FETCH,
    FIND_COORDINATOR, HEARTBEAT,
    INIT_PRODUCER_ID, JOIN_GROUP, LEAVE_GROUP, LIST_GROUPS, LIST_OFFSETS, METADATA, OFFSET_COMMIT, OFFSET_FETCH,
    PRODUCE, SYNC_GROUP, Request, api_versions_body, encode_body,
)
from .wire import DecodeError

NODE_ID = 1  # a gateway's node id unless --node-id says otherwise
EARLIEST, LATEST, MAX_TIMESTAMP = -2, -1, -3


def partition_name(topic: str, index: int) -> str:
    """The name of Kafka partition ``index`` of ``topic``, from which its dafka address derives."""
    return f"kafka:{topic}:{index}"


def address_of(topic: str, index: int) -> str:
    return partition_address(partition_name(topic, index))


def index_of(topic: str, address: str) -> int | None:
    """The Kafka partition number of a dafka partition of ``topic`` (None: not one the gateways number)."""
    return _numbering(topic).get(address)


@lru_cache(maxsize=256)
def _numbering(topic: str) -> dict[str, int]:
    """Every address the gateways may give a partition of ``topic``, to its number (computed once a topic)."""
    return {address_of(topic, index): index for index in range(MAX_CREATE_PARTITIONS)}


@dataclass
class TopicView:
    """What the server knows of a topic: its partitions' heads (-1: empty) and oldest kept offsets, by
    Kafka partition number, and which dafka partitions they are.  The first ``writable`` are the gateways'
    own; the others (:mod:`~.numbering`'s foreign partitions) are read-only."""

    name: str
    heads: list[int]
    tails: list[int] = field(default_factory=list)
    addresses: list[str | None] = field(default_factory=list)  # empty: every partition is the gateways'
    writable: int = -1  # -1: every partition
    unsure: set[int] = field(default_factory=set)  # partitions whose head this gateway only heard of (it leads none)

    @property
    def count(self) -> int:
        return len(self.heads)

    @property
    def foreign(self) -> bool:
        """Whether some partition is written by a dafka producer, so that Kafka producers cannot write it."""
        return 0 <= self.writable < self.count

    def tail(self, index: int) -> int:
        return self.tails[index] if index < len(self.tails) else 0

    def address(self, index: int) -> str | None:
        """The dafka address of Kafka partition ``index`` (None: a number no partition holds)."""
        return self.addresses[index] if self.addresses else address_of(self.name, index)


@dataclass
class Append:
    topic: str
    index: int
    batch: Batch


@dataclass
class Appends:
    """A Produce's batches to publish, in the request's order; ``acks`` as the client asked (0, 1, -1)."""

    request: Request
    acks: int
    timeout_ms: int
    appends: list[Append]
    # (topic, index) -> error code, for partitions answered without an append
    refused: dict[tuple[str, int], int] = field(default_factory=dict)
    order: list[tuple[str, int]] = field(default_factory=list)
    messages: dict[tuple[str, int], str] = field(default_factory=dict)  # why, for some of the refused


@dataclass
class Read:
    topic: str
    index: int
    offset: int
    max_bytes: int


@dataclass
class Reads:
    request: Request
    max_wait_ms: int
    min_bytes: int
    max_bytes: int
    reads: list[Read]
    refused: dict[tuple[str, int], int] = field(default_factory=dict)
    order: list[tuple[str, int]] = field(default_factory=list)


@dataclass
class Answer:
    """A response ready to send (``body`` None: acks=0, nothing goes back)."""

    request: Request
    body: bytes | None


@dataclass
class Replies:
    """Answers of group requests, each to the request its token stands for: a JoinGroup or SyncGroup
    waits for the rest of its generation, so the request that was handled may get none yet, and others
    theirs."""

    replies: list[tuple[Hashable, bytes]]


@dataclass
class Seek:
    """A ListOffsets by timestamp: what each topic's partitions held at each moment asked must be known first
    (HEADS-AT, rfc 20.1); then :meth:`Mapping.list_offsets` with them."""

    request: Request
    moments: list[tuple[str, int]]  # (topic, unix ms)


Held = dict[tuple[str, int], dict[str, int]]  # (topic, unix ms) -> partition address -> last record held then


@dataclass
class Commit:
    """Offsets to keep for a group (written to the cluster before the answer goes), or a group to forget."""

    request: Request
    group: str
    offsets: dict[tuple[str, int], tuple[int, str | None]]  # (topic, index) -> (next offset, metadata)
    codes: dict[tuple[str, int], int]  # every partition of the request: its error code
    forget: list[str] = field(default_factory=list)  # DeleteGroups: the groups whose commits go
    group_codes: dict[str, int] = field(default_factory=dict)  # DeleteGroups: each group's error code


@dataclass
class Create:
    """Topics to create (name -> partitions), then :meth:`Mapping.create_response`."""

    request: Request
    topics: dict[str, int]
    codes: dict[str, tuple[int, str | None]]  # topics refused, with why
    validate_only: bool


MAX_CREATE_PARTITIONS = 1024  # partitions a CreateTopics may ask for a topic (each is a producer of the gateway)


class Mapping:
    def __init__(self, host: str, port: int, *, cluster_id: str = "dafka", auto_create: bool = True,
                 num_partitions: int = 1, max_request_records_bytes: int = 1024 * 1024,
                 topic_configs: dict[str, str] | None = None, initial_rebalance_delay: float = 0.0,
                 gateways: Gateways | None = None) -> None:
        """``gateways``: the live gateways (None: this one alone, node :data:`NODE_ID` at ``host:port``)."""
        self.host, self.port, self.cluster_id = host, port, cluster_id
        self.gateways = gateways or Gateways(Node(NODE_ID, host, port))
        self.auto_create, self.num_partitions = auto_create, num_partitions
        self.max_record_bytes = max_request_records_bytes
        self.topic_configs = topic_configs or {}
        self.coordinator = Coordinator(initial_rebalance_delay)
        self.sequences = Sequences(self.gateways.me.node_id)
        # group -> (topic, index) -> (next offset, metadata): what OffsetFetch answers (the server loads a
        # group's from the cluster before its first request, :meth:`needs_offsets`)
        self.offsets: dict[str, dict[tuple[str, int], tuple[int, str | None]]] = {}
        self.loading: set[str] = set()  # groups this gateway leads whose commits it could not read back yet
        self._waiting: dict[Hashable, Request] = {}  # the group requests whose answers are still to come

    # -- requests ---------------------------------------------------------------------------

    def handle(self, request: Request, topics: dict[str, TopicView], now: float = 0.0,
               token: Hashable = None,
               access: Access = ALLOW_ALL) -> Answer | Appends | Reads | Replies | Commit | Create | Seek:
        """``topics``: the server's view of every topic the request names (missing: unknown so far);
        ``now``: monotonic seconds (group timeouts); ``token``: what stands for this request in
        :class:`Replies` (a group request's); ``access``: what the connection's principal may do
        (kafka/acl.py: a topic or group it may not use gets TOPIC_ or GROUP_AUTHORIZATION_FAILED)."""
        api = request.api
        if request.body is None or api is None:
            return Answer(request, None if api is None else self.unsupported(request))
        body = request.body
        if api is API_VERSIONS:
            return Answer(request, encode_body(api, request.version, api_versions_body()))
        if api is METADATA:
            return Answer(request, self.metadata(request, topics, access))
        if api is LIST_OFFSETS:
            moments = sorted({(t["name"], p["timestamp"]) for t in body["topics"] for p in t["partitions"]
                              if p["timestamp"] >= 0 and t["name"] in topics and access.allowed(DESCRIBE, TOPIC, t["name"])})
            return Seek(request, moments) if moments else Answer(request, self.list_offsets(request, topics,
                                                                                            access=access))
        if api is PRODUCE:
            return self.produce(request, topics, access)
        if api is FETCH:
            return self.fetch(request, topics, access)
        if api is FIND_COORDINATOR:
            denied = body.get("key_type", 0) == 0 and not access.may(DESCRIBE, GROUP, body["key"])
            node = self.gateways.leader(group_key(body["key"]))
            return Answer(request, encode_body(api, request.version, {
                "throttle_time_ms": 0, "error_code": errors.GROUP_AUTHORIZATION_FAILED if denied else 0,
                "error_message": None, "node_id": -1 if denied else node.node_id, "host": "" if denied else node.host,
                "port": -1 if denied else node.port}))
        if api is INIT_PRODUCER_ID:
            return Answer(request, self.init_producer_id(request, access))
        if api in (JOIN_GROUP, SYNC_GROUP, LEAVE_GROUP, HEARTBEAT):
            code = errors.GROUP_AUTHORIZATION_FAILED if not access.may(READ, GROUP, body["group_id"]) else \
                errors.NOT_COORDINATOR if not self.coordinates(body["group_id"]) else 0
            if code:
                return Replies([(token, encode_body(api, request.version, {
                    "error_code": code, "generation_id": -1, "member_id": body.get("member_id") or ""}))])
            return self.group_request(request, now, token)
        if api is OFFSET_COMMIT:
            return self.offset_commit(request, topics, now, access)
        if api is OFFSET_FETCH:
            return Answer(request, self.offset_fetch(request, access))
        if api is LIST_GROUPS:
            listed = [{"group_id": g.name, "protocol_type": g.protocol_type or "consumer"}
                      for g in self.coordinator.groups.values()]
            listed += [{"group_id": name, "protocol_type": "consumer"} for name in sorted(self.offsets)
                       if name not in self.coordinator.groups]
            listed = [g for g in listed if access.allowed(DESCRIBE, GROUP, g["group_id"])]
            return Answer(request, encode_body(api, request.version, {"throttle_time_ms": 0, "error_code": 0,
                                                                      "groups": listed}))
        if api is DESCRIBE_GROUPS:
            return Answer(request, self.describe_groups(request, access))
        if api is DELETE_GROUPS:
            codes = {name: errors.GROUP_AUTHORIZATION_FAILED if not access.may(DELETE, GROUP, name)
                     else errors.NOT_COORDINATOR if not self.coordinates(name) else self.coordinator.delete(name)
                     for name in body["groups_names"]}
            return Commit(request, "", {}, {}, forget=[name for name, code in codes.items() if code == 0],
                          group_codes=codes)
        if api is CREATE_TOPICS:
            return self.create_topics(request, topics, access)
        if api is DELETE_TOPICS:  # a dafka topic is its partitions' producers and the stores' records
            return Answer(request, encode_body(api, request.version, {"throttle_time_ms": 0, "responses": [
                {"name": name, "error_code": errors.TOPIC_DELETION_DISABLED,
                 "error_message": "dafka does not delete topics: the stores' retention (store/retention/*) "
                                  "removes their records"} for name in body["topic_names"]]}))
        assert api is DESCRIBE_CONFIGS
        return Answer(request, self.describe_configs(request, topics, access))

    def coordinates(self, group: str) -> bool:
        """Whether this gateway is ``group``'s coordinator, ready to answer for it (its commits read back:
        a group in :attr:`loading` gets NOT_COORDINATOR meanwhile, on which clients look it up and retry)."""
        return group not in self.loading and self.leads_group(group)

    def leads_group(self, group: str) -> bool:
        """Whether the gateways' view makes this gateway ``group``'s coordinator (loaded or not)."""
        return self.gateways.leads(group_key(group))

    def leads(self, topic: str, index: int) -> bool:
        """Whether this gateway writes Kafka partition ``index`` of ``topic``."""
        return self.gateways.leads(partition_key(topic, index))

    # -- producer ids ---------------------------------------------------------------------

    def init_producer_id(self, request: Request, access: Access = ALLOW_ALL) -> bytes:
        body = request.body
        assert body is not None
        fields = {"throttle_time_ms": 0, "error_code": 0, "producer_id": -1, "producer_epoch": -1}
        if body["transactional_id"] is not None:  # transactions: not served (docs/kafka.md)
            fields["error_code"] = errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        elif not access.may_any(WRITE, TOPIC):  # an idempotent producer writes somewhere (Kafka 2.8 and later)
            fields["error_code"] = errors.CLUSTER_AUTHORIZATION_FAILED
        elif body.get("producer_id", -1) >= 0 and request.version >= 3:  # a producer bumping its epoch (KIP-360)
            fields["producer_id"] = body["producer_id"]
            fields["producer_epoch"] = (body["producer_epoch"] + 1) % 32768
        else:
            fields["producer_id"], fields["producer_epoch"] = self.sequences.new_id(), 0
        return encode_body(INIT_PRODUCER_ID, request.version, fields)

    # -- groups -----------------------------------------------------------------------------

    def group_request(self, request: Request, now: float, token: Hashable) -> Replies:
        body, api = request.body, request.api
        assert body is not None and api is not None
        c = self.coordinator
        instance = body.get("group_instance_id")
        if api is HEARTBEAT:
            code = c.heartbeat(body["group_id"], body["generation_id"], body["member_id"], instance, now)
            return Replies([(token, encode_body(api, request.version, {"throttle_time_ms": 0, "error_code": code}))])
        if api is LEAVE_GROUP:
            leaving: list[tuple[str, str | None]] = [(m["member_id"], m["group_instance_id"]) for m in body["members"]] \
                if request.version >= 3 else [(body["member_id"], None)]
            codes, waited = c.leave(body["group_id"], leaving, now)
            members = [{"member_id": m, "group_instance_id": i, "error_code": code}
                       for (m, i), code in zip(leaving, codes)]
            top = codes[0] if request.version < 3 else 0
            own = encode_body(api, request.version, {"throttle_time_ms": 0, "error_code": top, "members": members})
            return Replies(self._encoded(waited) + [(token, own)])
        self._waiting[token] = request
        if api is JOIN_GROUP:
            session = body["session_timeout_ms"]
            rebalance = body["rebalance_timeout_ms"] if request.version >= 1 else session
            if not 1000 <= session <= 30 * 60 * 1000:  # Kafka's group.min/max.session.timeout.ms
                del self._waiting[token]
                return Replies([(token, encode_body(api, request.version, {
                    "error_code": errors.INVALID_SESSION_TIMEOUT, "generation_id": -1,
                    "member_id": body["member_id"]}))])
            replies = c.join(token, body["group_id"], body["member_id"], instance, request.client_id or "",
                             "", body["protocol_type"], [(p["name"], bytes(p["metadata"])) for p in body["protocols"]],
                             session / 1000.0, rebalance / 1000.0, now)
        else:
            assignments = {a["member_id"]: bytes(a["assignment"]) for a in body["assignments"]}
            replies = c.sync(token, body["group_id"], body["generation_id"], body["member_id"], instance,
                             assignments, now)
        return Replies(self._encoded(replies))

    def tick(self, now: float) -> Replies:
        """Group timeouts: the answers they release."""
        return Replies(self._encoded(self.coordinator.tick(now)))

    def _encoded(self, replies: list[tuple[Hashable, dict[str, Any]]]) -> list[tuple[Hashable, bytes]]:
        out = []
        for token, fields in replies:
            request = self._waiting.pop(token, None)
            if request is not None and request.api is not None:
                out.append((token, encode_body(request.api, request.version, fields)))
        return out

    def hand_over(self, group: str) -> Replies:
        """A group this gateway no longer coordinates: its state dropped (the new coordinator reads its
        commits back), its waiting requests answered with NOT_COORDINATOR."""
        self.offsets.pop(group, None)
        return Replies(self._encoded(self.coordinator.hand_over(group)))

    def forget_request(self, token: Hashable) -> None:
        """A waiting request whose connection closed."""
        self._waiting.pop(token, None)

    def offset_commit(self, request: Request, topics: dict[str, TopicView], now: float,
                      access: Access = ALLOW_ALL) -> Commit | Answer:
        body = request.body
        assert body is not None
        group = body["group_id"]
        code = errors.GROUP_AUTHORIZATION_FAILED if not access.may(READ, GROUP, group) else \
            errors.NOT_COORDINATOR if not self.coordinates(group) else \
            self.coordinator.check_commit(group, body["generation_id"], body["member_id"], now)
        offsets: dict[tuple[str, int], tuple[int, str | None]] = {}
        codes: dict[tuple[str, int], int] = {}
        for topic in body["topics"]:
            view = topics.get(topic["name"])
            for p in topic["partitions"]:
                key = (topic["name"], p["partition_index"])
                if code:
                    codes[key] = code
                elif not access.may(READ, TOPIC, key[0]):
                    codes[key] = errors.TOPIC_AUTHORIZATION_FAILED
                elif view is None or not 0 <= key[1] < view.count:
                    codes[key] = errors.UNKNOWN_TOPIC_OR_PARTITION
                else:
                    codes[key] = 0
                    offsets[key] = (p["committed_offset"], p["committed_metadata"])
        return Commit(request, group, offsets, codes)

    def commit_response(self, commit: Commit, failed: int = 0) -> bytes:
        """The OffsetCommit's (or DeleteGroups') answer once the commits are kept (``failed``: the error
        code of a write that did not make it)."""
        request = commit.request
        if request.api is DELETE_GROUPS:
            results = [{"group_id": name, "error_code": failed if code == 0 and failed else code}
                       for name, code in commit.group_codes.items()]
            return encode_body(DELETE_GROUPS, request.version, {"throttle_time_ms": 0, "results": results})
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for (topic, index), code in commit.codes.items():
            by_topic.setdefault(topic, []).append({"partition_index": index,
                                                   "error_code": failed if code == 0 and failed else code})
        return encode_body(OFFSET_COMMIT, request.version, {
            "throttle_time_ms": 0, "topics": [{"name": t, "partitions": ps} for t, ps in by_topic.items()]})

    def offset_fetch(self, request: Request, access: Access = ALLOW_ALL) -> bytes:
        body = request.body
        assert body is not None
        denied = not access.may(DESCRIBE, GROUP, body["group_id"])
        if denied or not self.coordinates(body["group_id"]):
            code = errors.GROUP_AUTHORIZATION_FAILED if denied else errors.NOT_COORDINATOR
            return encode_body(OFFSET_FETCH, request.version, {"throttle_time_ms": 0, "error_code": code, "topics": [
                {"name": t["name"], "partitions": [{"partition_index": i, "committed_offset": -1, "error_code": code}
                                                   for i in t["partition_indexes"]]} for t in body["topics"] or []]})
        kept = self.offsets.get(body["group_id"], {})
        wanted = body["topics"]
        if wanted is None:  # every partition the group committed
            names: dict[str, list[int]] = {}
            for topic, index in sorted(kept):
                names.setdefault(topic, []).append(index)
            wanted = [{"name": t, "partition_indexes": ps} for t, ps in names.items() if access.allowed(DESCRIBE, TOPIC, t)]
        out = []
        for topic in wanted:
            parts = []
            allowed = access.may(DESCRIBE, TOPIC, topic["name"])
            for index in topic["partition_indexes"]:
                offset, metadata = kept.get((topic["name"], index), (-1, "")) if allowed else (-1, "")
                parts.append({"partition_index": index, "committed_offset": offset, "committed_leader_epoch": -1,
                              "metadata": metadata if metadata is not None else "",
                              "error_code": 0 if allowed else errors.TOPIC_AUTHORIZATION_FAILED})
            out.append({"name": topic["name"], "partitions": parts})
        return encode_body(OFFSET_FETCH, request.version, {"throttle_time_ms": 0, "topics": out, "error_code": 0})

    def describe_groups(self, request: Request, access: Access = ALLOW_ALL) -> bytes:
        body = request.body
        assert body is not None
        out = []
        for name in body["groups"]:
            if not access.may(DESCRIBE, GROUP, name):
                out.append({"error_code": errors.GROUP_AUTHORIZATION_FAILED, "group_id": name, "group_state": "",
                            "protocol_type": "", "protocol_data": "", "members": [],
                            "authorized_operations": -2147483648})
                continue
            group = self.coordinator.groups.get(name)
            if group is None:
                state = "Empty" if name in self.offsets else "Dead"
                out.append({"error_code": 0, "group_id": name, "group_state": state, "protocol_type": "",
                            "protocol_data": "", "members": [], "authorized_operations": -2147483648})
                continue
            members = [{"member_id": m.member_id, "group_instance_id": m.instance_id, "client_id": m.client_id,
                        "client_host": m.host or "/127.0.0.1", "member_metadata": m.metadata(group.protocol),
                        "member_assignment": m.assignment} for m in group.members.values()]
            out.append({"error_code": 0, "group_id": name, "group_state": group.state,
                        "protocol_type": group.protocol_type, "protocol_data": group.protocol, "members": members,
                        "authorized_operations": -2147483648})
        return encode_body(DESCRIBE_GROUPS, request.version, {"throttle_time_ms": 0, "groups": out})

    # -- admin ------------------------------------------------------------------------------

    def create_topics(self, request: Request, topics: dict[str, TopicView], access: Access = ALLOW_ALL) -> Create:
        body = request.body
        assert body is not None
        create: dict[str, int] = {}
        codes: dict[str, tuple[int, str | None]] = {}
        names = [t["name"] for t in body["topics"]]
        for t in body["topics"]:
            name, n = t["name"], t["num_partitions"]
            if n == -1:
                n = self.num_partitions
            if names.count(name) > 1:  # as Kafka: a topic named twice is refused, and answered once
                codes[name] = (errors.INVALID_REQUEST, f"topic {name!r} is named more than once")
            elif not access.may(CREATE, TOPIC, name):
                codes[name] = (errors.TOPIC_AUTHORIZATION_FAILED, f"not authorized to create topic {name!r}")
            elif not valid_topic(name):
                codes[name] = (errors.INVALID_TOPIC_EXCEPTION, f"{name!r} is not a valid topic name")
            elif name in topics and topics[name].count:
                codes[name] = (errors.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists")
            elif t["assignments"]:
                codes[name] = (errors.INVALID_REQUEST, "dafka places partitions itself: no replica assignments")
            elif not 1 <= n <= MAX_CREATE_PARTITIONS:
                codes[name] = (errors.INVALID_PARTITIONS, f"partitions must be 1-{MAX_CREATE_PARTITIONS}, not {n}")
            elif t["replication_factor"] not in (-1, 1):
                codes[name] = (errors.INVALID_REPLICATION_FACTOR,
                               "the stores replicate (store/replicas): ask for replication factor 1 or -1")
            elif t["configs"]:
                codes[name] = (errors.INVALID_CONFIG, "topic configs are the stores' (store/retention/*, "
                                                      "store/compaction/topics): none can be set here")
            else:
                create[name] = n
        return Create(request, create, codes, bool(body.get("validate_only")))

    def create_response(self, create: Create, failed: dict[str, tuple[int, str]] | None = None) -> bytes:
        results = []
        for name in dict.fromkeys(t["name"] for t in (create.request.body or {}).get("topics", [])):
            code, message = create.codes.get(name) or (failed or {}).get(name) or (0, None)
            results.append({"name": name, "error_code": code, "error_message": message})
        return encode_body(CREATE_TOPICS, create.request.version, {"throttle_time_ms": 0, "topics": results})

    def describe_configs(self, request: Request, topics: dict[str, TopicView], access: Access = ALLOW_ALL) -> bytes:
        body = request.body
        assert body is not None
        results = []
        for r in body["resources"]:
            if r["resource_type"] == 2 and not access.may(DESCRIBE, TOPIC, r["resource_name"]):
                entries, code = {}, errors.TOPIC_AUTHORIZATION_FAILED
            elif r["resource_type"] == 2:  # a topic
                known = r["resource_name"] in topics
                entries = self.topic_config(r["resource_name"]) if known else {}
                code = 0 if known else errors.UNKNOWN_TOPIC_OR_PARTITION
            elif r["resource_type"] == 4:  # the broker: the gateway
                entries, code = {"broker.id": str(self.gateways.me.node_id), "num.partitions": str(self.num_partitions),
                                 "auto.create.topics.enable": str(self.auto_create).lower()}, 0
            else:
                entries, code = {}, errors.INVALID_REQUEST
            keys = r["configuration_keys"]
            configs: list[dict[str, Any]] = [{"name": k, "value": v, "read_only": True, "is_default": False, "config_source": 5,
                        "is_sensitive": False, "synonyms": [], "config_type": 0, "documentation": None}
                       for k, v in entries.items() if keys is None or k in keys]
            results.append({"error_code": code, "error_message": None, "resource_type": r["resource_type"],
                            "resource_name": r["resource_name"], "configs": configs})
        return encode_body(DESCRIBE_CONFIGS, request.version, {"throttle_time_ms": 0, "results": results})

    def topic_config(self, topic: str) -> dict[str, str]:
        """The Kafka configs of a topic as the stores apply them (the gateway's store/* keys stand for theirs)."""
        patterns = [p.strip() for p in self.topic_configs.get("store/compaction/topics", "").split(",") if p.strip()]
        compacted = any(fnmatchcase(topic, p) for p in patterns)
        retention_ms = self.topic_configs.get("store/retention/ms", "-1")
        policy = ("compact,delete" if retention_ms != "-1" else "compact") if compacted else "delete"
        return {"cleanup.policy": policy, "retention.ms": retention_ms,
                "retention.bytes": self.topic_configs.get("store/retention/bytes", "-1")}

    def unsupported(self, request: Request) -> bytes:
        """An UNSUPPORTED_VERSION answer for a served API asked at a version we lack (the server sends
        ApiVersions' own in v0's form)."""
        api = request.api
        assert api is not None
        version = min(max(request.version, api.lo), api.hi)
        return encode_body(api, version, {"error_code": errors.UNSUPPORTED_VERSION})

    @staticmethod
    def groups_read(request: Request) -> list[str]:
        """The groups whose commits must be known (read back from the cluster) before the request is handled."""
        body, api = request.body, request.api
        if body is None:
            return []
        if api in (OFFSET_FETCH, OFFSET_COMMIT):
            return [body["group_id"]]
        if api is DELETE_GROUPS:
            return list(body["groups_names"])
        if api is DESCRIBE_GROUPS:
            return list(body["groups"])
        return []

    @staticmethod
    def wanted_topics(request: Request) -> list[str] | None:
        """The topics a request names (None: every topic, a Metadata of all)."""
        body, api = request.body, request.api
        if body is None:
            return []
        if api is METADATA:
            listed = body["topics"]
            if listed is None or (request.version == 0 and not listed):
                return None
            return [t["name"] for t in listed if t["name"] is not None]
        if api is PRODUCE:
            return [t["name"] for t in body["topic_data"]]
        if api is FETCH:
            return [t["topic"] for t in body["topics"]]
        if api in (LIST_OFFSETS, OFFSET_COMMIT, CREATE_TOPICS):
            return [t["name"] for t in body["topics"]]
        if api is DESCRIBE_CONFIGS:
            return [r["resource_name"] for r in body["resources"] if r["resource_type"] == 2]
        return []

    def to_create(self, request: Request, topics: dict[str, TopicView], access: Access = ALLOW_ALL) -> list[str]:
        """Topics the request would auto-create: a Produce's or an allowing Metadata's, unknown so far, that
        the principal may create."""
        if not self.auto_create or request.body is None:
            return []
        if request.api is METADATA:
            if not request.body.get("allow_auto_topic_creation", True) and request.version >= 4:
                return []
        elif request.api is not PRODUCE:
            return []
        return [t for t in (self.wanted_topics(request) or []) if t not in topics and valid_topic(t)
                and access.allowed(CREATE, TOPIC, t)]

    def metadata(self, request: Request, topics: dict[str, TopicView], access: Access = ALLOW_ALL) -> bytes:
        names = self.wanted_topics(request)
        me = self.gateways.me.node_id
        listed = []
        # a listing of every topic leaves out those the principal may not describe, as Kafka's does
        for name in ([t for t in sorted(topics) if access.allowed(DESCRIBE, TOPIC, t)] if names is None else names):
            view = topics.get(name)
            if names is not None and not access.may(DESCRIBE, TOPIC, name):
                listed.append({"error_code": errors.TOPIC_AUTHORIZATION_FAILED, "name": name, "partitions": []})
                continue
            if view is None or view.count == 0:
                code = errors.INVALID_TOPIC_EXCEPTION if not valid_topic(name) else (
                    errors.LEADER_NOT_AVAILABLE if view is not None or name in self._creating(request, access)
                    else errors.UNKNOWN_TOPIC_OR_PARTITION)
                listed.append({"error_code": code, "name": name, "partitions": []})
                continue
            parts = []
            for i in range(view.count):
                # a foreign partition has no gateway that writes it: any serves it, this one says itself
                node = me if i >= view.writable >= 0 else self.gateways.leader(partition_key(name, i)).node_id
                parts.append({"error_code": 0, "partition_index": i, "leader_id": node, "leader_epoch": 0,
                              "replica_nodes": [node], "isr_nodes": [node], "offline_replicas": []})
            listed.append({"error_code": 0, "name": name, "is_internal": False,
                           "topic_authorized_operations": -2147483648, "partitions": parts})
        body = {"throttle_time_ms": 0, "brokers": [{"node_id": n.node_id, "host": n.host, "port": n.port, "rack": None}
                                                   for n in self.gateways.live()],
                "cluster_id": self.cluster_id, "controller_id": self.gateways.live()[0].node_id, "topics": listed,
                "cluster_authorized_operations": -2147483648}
        return encode_body(METADATA, request.version, body)

    def _creating(self, request: Request, access: Access) -> set[str]:
        return set(self.to_create(request, {}, access))

    def list_offsets(self, request: Request, topics: dict[str, TopicView], held: Held | None = None,
                     access: Access = ALLOW_ALL) -> bytes:
        """Earliest, latest, and by timestamp from ``held`` (:class:`Seek`): the first record produced at or
        after the moment, as the producers and the stores' receive stamps tell it (-1 when every record is
        older; the partition's first kept when nobody can tell)."""
        assert request.body is not None
        out = []
        for topic in request.body["topics"]:
            view = topics.get(topic["name"])
            parts = []
            allowed = access.may(DESCRIBE, TOPIC, topic["name"])
            for p in topic["partitions"]:
                index, ts = p["partition_index"], p["timestamp"]
                if not allowed:
                    parts.append({"partition_index": index, "error_code": errors.TOPIC_AUTHORIZATION_FAILED,
                                  "timestamp": -1, "offset": -1, "leader_epoch": -1})
                    continue
                if view is None or not 0 <= index < view.count:
                    parts.append({"partition_index": index, "error_code": errors.UNKNOWN_TOPIC_OR_PARTITION,
                                  "timestamp": -1, "offset": -1, "leader_epoch": -1})
                    continue
                head = view.heads[index]
                if ts == EARLIEST:
                    offset = view.tail(index)
                elif ts in (LATEST, MAX_TIMESTAMP):
                    offset = head + 1 if ts == LATEST else head
                else:
                    address = view.address(index)
                    last = (held or {}).get((topic["name"], ts), {}).get(address) if address is not None else -1
                    if last is None:  # nobody could tell: from the first kept
                        offset = view.tail(index) if head >= 0 else -1
                    else:
                        offset = max(last + 1, view.tail(index)) if last < head else -1
                parts.append({"partition_index": index, "error_code": 0, "timestamp": -1 if ts < 0 or offset < 0
                              else ts, "offset": offset, "leader_epoch": 0})
            out.append({"name": topic["name"], "partitions": parts})
        return encode_body(LIST_OFFSETS, request.version, {"throttle_time_ms": 0, "topics": out})

    def produce(self, request: Request, topics: dict[str, TopicView], access: Access = ALLOW_ALL) -> Answer | Appends:
        body = request.body
        assert body is not None
        if body["transactional_id"] is not None:
            return Answer(request, self._produce_error(request, errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED))
        acks = body["acks"]
        if acks not in (0, 1, -1):
            return Answer(request, self._produce_error(request, errors.INVALID_REQUIRED_ACKS))
        result = Appends(request, acks, body["timeout_ms"], [])
        for topic in body["topic_data"]:
            view = topics.get(topic["name"])
            allowed = access.may(WRITE, TOPIC, topic["name"])
            for part in topic["partition_data"]:
                key = (topic["name"], part["index"])
                result.order.append(key)
                if not allowed:
                    result.refused[key] = errors.TOPIC_AUTHORIZATION_FAILED
                    continue
                if view is None or not 0 <= part["index"] < view.count:
                    result.refused[key] = errors.UNKNOWN_TOPIC_OR_PARTITION
                    continue
                if view.foreign:  # the whole topic, not only its foreign partitions: see read_only_topic
                    result.refused[key] = errors.INVALID_TOPIC_EXCEPTION
                    result.messages[key] = read_only_topic(view.name)
                    continue
                if not self.leads(*key):  # the client refreshes its metadata and goes to the leader
                    result.refused[key] = errors.NOT_LEADER_OR_FOLLOWER
                    continue
                records = part["records"]
                if records is None:
                    result.refused[key] = errors.CORRUPT_MESSAGE
                    continue
                if len(records) > self.max_record_bytes:
                    result.refused[key] = errors.MESSAGE_TOO_LARGE
                    continue
                try:
                    decoded = batches.read_batches(records, columns=True)
                except batches.UnsupportedCompression:
                    result.refused[key] = errors.UNSUPPORTED_COMPRESSION_TYPE
                    continue
                except DecodeError:
                    result.refused[key] = errors.CORRUPT_MESSAGE
                    continue
                result.appends += [Append(key[0], key[1], b) for b in decoded]
        return result

    def _produce_error(self, request: Request, code: int) -> bytes:
        assert request.body is not None
        return self.produce_response(request, {(t["name"], p["index"]): (code, -1)
                                               for t in request.body["topic_data"] for p in t["partition_data"]})

    def produce_response(self, request: Request, results: dict[tuple[str, int], tuple[int, int]],
                         messages: dict[tuple[str, int], str] | None = None) -> bytes:
        """``results``: (topic, index) -> (error code, base offset of the partition's first batch);
        ``messages``: why, for some of the refused (Produce 8 and later carry it)."""
        by_topic: dict[str, list[dict[str, Any]]] = {}
        messages = messages or {}
        for (topic, index), (code, base) in results.items():
            by_topic.setdefault(topic, []).append({"index": index, "error_code": code, "base_offset": base,
                                                   "log_append_time_ms": -1, "log_start_offset": -1,
                                                   "record_errors": [],
                                                   "error_message": messages.get((topic, index))})
        body = {"throttle_time_ms": 0,
                "responses": [{"name": t, "partition_responses": ps} for t, ps in by_topic.items()]}
        return encode_body(PRODUCE, request.version, body)

    def fetch(self, request: Request, topics: dict[str, TopicView], access: Access = ALLOW_ALL) -> Reads:
        body = request.body
        assert body is not None
        reads = Reads(request, body["max_wait_ms"], body["min_bytes"], body.get("max_bytes") or 0x7FFFFFFF, [])
        for topic in body["topics"]:
            view = topics.get(topic["topic"])
            allowed = access.may(READ, TOPIC, topic["topic"])
            for p in topic["partitions"]:
                key = (topic["topic"], p["partition"])
                reads.order.append(key)
                if not allowed:
                    reads.refused[key] = errors.TOPIC_AUTHORIZATION_FAILED
                    continue
                if view is None or not 0 <= p["partition"] < view.count:
                    reads.refused[key] = errors.UNKNOWN_TOPIC_OR_PARTITION
                    continue
                head, offset = view.heads[p["partition"]], p["fetch_offset"]
                if offset < view.tail(p["partition"]) or offset > head + 1:
                    # beyond a head only heard of (the leader moved, and is resuming): not out of range yet
                    unsure = offset > head + 1 and p["partition"] in view.unsure
                    reads.refused[key] = errors.NOT_LEADER_OR_FOLLOWER if unsure else errors.OFFSET_OUT_OF_RANGE
                    continue
                reads.reads.append(Read(key[0], key[1], offset, p["partition_max_bytes"]))
        return reads

    def fetch_response(self, reads: Reads, topics: dict[str, TopicView],
                       found: dict[tuple[str, int], list[Segment]]) -> bytes:
        """``found``: (topic, index) -> the records read (:meth:`fetch_buffer.PartitionBuffer.take`)."""
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for key in reads.order:
            topic, index = key
            view = topics.get(topic)
            code = reads.refused.get(key, 0)
            segments = found.get(key) or []
            head = view.heads[index] if view is not None and 0 <= index < view.count else -1
            if segments:
                last = segments[-1]
                head = max(head, last[-1][0] if isinstance(last, list) else last.last)
            part = {"partition_index": index, "error_code": code, "high_watermark": head + 1 if code == 0 else -1,
                    "last_stable_offset": head + 1 if code == 0 else -1,
                    "log_start_offset": view.tail(index) if view is not None and code == 0 else -1,
                    "aborted_transactions": None, "preferred_read_replica": -1,
                    "records": _batches(segments)}
            by_topic.setdefault(topic, []).append(part)
        body = {"throttle_time_ms": 0, "error_code": 0, "session_id": 0,
                "responses": [{"topic": t, "partitions": ps} for t, ps in by_topic.items()]}
        return encode_body(FETCH, reads.request.version, body)


def _batches(segments: list[Segment]) -> list[bytes]:
    """The batches of a partition's records that a Fetch took (``RECORDS`` writes them as they are): one a
    message's frames, one for each run of rows."""
    out: list[bytes] = []
    rows: list[Row] = []
    for segment in segments:
        if isinstance(segment, list):
            rows += segment
            continue
        if rows:
            out.append(_rows_batch(rows))
            rows = []
        out.append(batches.write_frames_batch(segment.frames, segment.lo, segment.hi, segment.default_ts))
    if rows:
        out.append(_rows_batch(rows))
    return out


def _rows_batch(rows: list[Row]) -> bytes:
    """One batch of (offset, unix ms, key, value, headers) rows, with their headers if any has."""
    headers = [row[4] for row in rows]
    return batches.write_batch(rows[0][0], rows, headers=headers if any(headers) else None)


def read_only_topic(topic: str) -> str:
    """Why a Kafka producer cannot write ``topic``.  Kafka's Metadata has no read-only partitions, and a
    producer's partitioner (keyed or not) may pick any partition listed: so a topic with a partition that a
    dafka producer writes is refused whole, at once and for good (a non-retriable error), rather than some of
    its records being refused now and then (docs/kafka.md, "Topics dafka producers write")."""
    return (f"topic {topic!r} has partitions that dafka producers write: Kafka consumers read it, Kafka producers "
            "cannot write it (they write topics whose partitions are all the gateways')")


def valid_topic(name: str) -> bool:
    """Kafka's rule: 1-249 characters of ASCII letters, digits, '.', '_' and '-', neither '.' nor '..'."""
    return 0 < len(name) <= 249 and name not in (".", "..") and all(c.isascii() and (c.isalnum() or c in "._-")
                                                                      for c in name)
