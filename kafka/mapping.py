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
* offsets are dafka offsets, keys dafka keys (rfc 18);
* one node (``NODE_ID``) leads every partition, with leader epoch 0, and the
  last stable offset is the high watermark (no transactions).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dafka.peer import partition_address

from . import batches, errors
from .batches import Batch
from .messages import API_VERSIONS, FETCH, LIST_OFFSETS, METADATA, PRODUCE, Request, api_versions_body, encode_body
from .wire import DecodeError

NODE_ID = 1
EARLIEST, LATEST, MAX_TIMESTAMP = -2, -1, -3


def partition_name(topic: str, index: int) -> str:
    """The name of Kafka partition ``index`` of ``topic``, from which its dafka address derives."""
    return f"kafka:{topic}:{index}"


def address_of(topic: str, index: int) -> str:
    return partition_address(partition_name(topic, index))


@dataclass
class TopicView:
    """What the server knows of a topic: its partitions' heads (-1: empty) and oldest kept offsets."""

    name: str
    heads: list[int]  # by Kafka partition number
    tails: list[int] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.heads)

    def tail(self, index: int) -> int:
        return self.tails[index] if index < len(self.tails) else 0


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


class Mapping:
    def __init__(self, host: str, port: int, *, cluster_id: str = "dafka", auto_create: bool = True,
                 num_partitions: int = 1, max_request_records_bytes: int = 1024 * 1024) -> None:
        self.host, self.port, self.cluster_id = host, port, cluster_id
        self.auto_create, self.num_partitions = auto_create, num_partitions
        self.max_record_bytes = max_request_records_bytes

    # -- requests ---------------------------------------------------------------------------

    def handle(self, request: Request, topics: dict[str, TopicView]) -> Answer | Appends | Reads:
        """``topics``: the server's view of every topic the request names (missing: unknown so far)."""
        api = request.api
        if request.body is None or api is None:
            return Answer(request, None if api is None else self.unsupported(request))
        if api is API_VERSIONS:
            return Answer(request, encode_body(api, request.version, api_versions_body()))
        if api is METADATA:
            return Answer(request, self.metadata(request, topics))
        if api is LIST_OFFSETS:
            return Answer(request, self.list_offsets(request, topics))
        if api is PRODUCE:
            return self.produce(request, topics)
        assert api is FETCH
        return self.fetch(request, topics)

    def unsupported(self, request: Request) -> bytes:
        """An UNSUPPORTED_VERSION answer for a served API asked at a version we lack (the server sends
        ApiVersions' own in v0's form)."""
        api = request.api
        assert api is not None
        version = min(max(request.version, api.lo), api.hi)
        return encode_body(api, version, {"error_code": errors.UNSUPPORTED_VERSION})

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
        if api is LIST_OFFSETS:
            return [t["name"] for t in body["topics"]]
        return []

    def to_create(self, request: Request, topics: dict[str, TopicView]) -> list[str]:
        """Topics the request would auto-create: a Produce's or an allowing Metadata's, unknown so far."""
        if not self.auto_create or request.body is None:
            return []
        if request.api is METADATA:
            if not request.body.get("allow_auto_topic_creation", True) and request.version >= 4:
                return []
        elif request.api is not PRODUCE:
            return []
        return [t for t in (self.wanted_topics(request) or []) if t not in topics and valid_topic(t)]

    def metadata(self, request: Request, topics: dict[str, TopicView]) -> bytes:
        names = self.wanted_topics(request)
        listed = []
        for name in (sorted(topics) if names is None else names):
            view = topics.get(name)
            if view is None or view.count == 0:
                code = errors.INVALID_TOPIC_EXCEPTION if not valid_topic(name) else (
                    errors.LEADER_NOT_AVAILABLE if view is not None or name in self._creating(request)
                    else errors.UNKNOWN_TOPIC_OR_PARTITION)
                listed.append({"error_code": code, "name": name, "partitions": []})
                continue
            listed.append({"error_code": 0, "name": name, "is_internal": False, "topic_authorized_operations": -2147483648,
                           "partitions": [{"error_code": 0, "partition_index": i, "leader_id": NODE_ID,
                                           "leader_epoch": 0, "replica_nodes": [NODE_ID], "isr_nodes": [NODE_ID],
                                           "offline_replicas": []} for i in range(view.count)]})
        body = {"throttle_time_ms": 0, "brokers": [{"node_id": NODE_ID, "host": self.host, "port": self.port,
                                                      "rack": None}],
                "cluster_id": self.cluster_id, "controller_id": NODE_ID, "topics": listed,
                "cluster_authorized_operations": -2147483648}
        return encode_body(METADATA, request.version, body)

    def _creating(self, request: Request) -> set[str]:
        return set(self.to_create(request, {}))

    def list_offsets(self, request: Request, topics: dict[str, TopicView]) -> bytes:
        assert request.body is not None
        out = []
        for topic in request.body["topics"]:
            view = topics.get(topic["name"])
            parts = []
            for p in topic["partitions"]:
                index, ts = p["partition_index"], p["timestamp"]
                if view is None or not 0 <= index < view.count:
                    parts.append({"partition_index": index, "error_code": errors.UNKNOWN_TOPIC_OR_PARTITION,
                                  "timestamp": -1, "offset": -1, "leader_epoch": -1})
                    continue
                head = view.heads[index]
                if ts == EARLIEST:
                    offset = view.tail(index)
                elif ts in (LATEST, MAX_TIMESTAMP):
                    offset = head + 1 if ts == LATEST else head
                else:  # by timestamp: records carry none yet, so the first one kept (docs/kafka.md)
                    offset = view.tail(index) if head >= 0 else -1
                parts.append({"partition_index": index, "error_code": 0, "timestamp": -1, "offset": offset,
                              "leader_epoch": 0})
            out.append({"name": topic["name"], "partitions": parts})
        return encode_body(LIST_OFFSETS, request.version, {"throttle_time_ms": 0, "topics": out})

    def produce(self, request: Request, topics: dict[str, TopicView]) -> Answer | Appends:
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
            for part in topic["partition_data"]:
                key = (topic["name"], part["index"])
                result.order.append(key)
                if view is None or not 0 <= part["index"] < view.count:
                    result.refused[key] = errors.UNKNOWN_TOPIC_OR_PARTITION
                    continue
                records = part["records"]
                if records is None:
                    result.refused[key] = errors.CORRUPT_MESSAGE
                    continue
                if len(records) > self.max_record_bytes:
                    result.refused[key] = errors.MESSAGE_TOO_LARGE
                    continue
                try:
                    decoded = batches.read_batches(records)
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

    def produce_response(self, request: Request, results: dict[tuple[str, int], tuple[int, int]]) -> bytes:
        """``results``: (topic, index) -> (error code, base offset of the partition's first batch)."""
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for (topic, index), (code, base) in results.items():
            by_topic.setdefault(topic, []).append({"index": index, "error_code": code, "base_offset": base,
                                                   "log_append_time_ms": -1, "log_start_offset": -1,
                                                   "record_errors": [], "error_message": None})
        body = {"throttle_time_ms": 0,
                "responses": [{"name": t, "partition_responses": ps} for t, ps in by_topic.items()]}
        return encode_body(PRODUCE, request.version, body)

    def fetch(self, request: Request, topics: dict[str, TopicView]) -> Reads:
        body = request.body
        assert body is not None
        reads = Reads(request, body["max_wait_ms"], body["min_bytes"], body.get("max_bytes") or 0x7FFFFFFF, [])
        for topic in body["topics"]:
            view = topics.get(topic["topic"])
            for p in topic["partitions"]:
                key = (topic["topic"], p["partition"])
                reads.order.append(key)
                if view is None or not 0 <= p["partition"] < view.count:
                    reads.refused[key] = errors.UNKNOWN_TOPIC_OR_PARTITION
                    continue
                head, offset = view.heads[p["partition"]], p["fetch_offset"]
                if offset < view.tail(p["partition"]) or offset > head + 1:
                    reads.refused[key] = errors.OFFSET_OUT_OF_RANGE
                    continue
                reads.reads.append(Read(key[0], key[1], offset, p["partition_max_bytes"]))
        return reads

    def fetch_response(self, reads: Reads, topics: dict[str, TopicView],
                       found: dict[tuple[str, int], list[tuple[int, int, bytes | None, bytes | None]]]) -> bytes:
        """``found``: (topic, index) -> the records read, as (offset, unix ms, key, value)."""
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for key in reads.order:
            topic, index = key
            view = topics.get(topic)
            code = reads.refused.get(key, 0)
            records = found.get(key) or []
            head = view.heads[index] if view is not None and 0 <= index < view.count else -1
            if records:
                head = max(head, records[-1][0])
            part = {"partition_index": index, "error_code": code, "high_watermark": head + 1 if code == 0 else -1,
                    "last_stable_offset": head + 1 if code == 0 else -1,
                    "log_start_offset": view.tail(index) if view is not None and code == 0 else -1,
                    "aborted_transactions": None, "preferred_read_replica": -1,
                    "records": batches.write_batch(records[0][0], records) if records else b""}
            by_topic.setdefault(topic, []).append(part)
        body = {"throttle_time_ms": 0, "error_code": 0, "session_id": 0,
                "responses": [{"topic": t, "partitions": ps} for t, ps in by_topic.items()]}
        return encode_body(FETCH, reads.request.version, body)


def valid_topic(name: str) -> bool:
    """Kafka's rule: 1-249 characters of ASCII letters, digits, '.', '_' and '-', neither '.' nor '..'."""
    return 0 < len(name) <= 249 and name not in (".", "..") and all(c.isascii() and (c.isalnum() or c in "._-")
                                                                      for c in name)
