"""The Kafka messages the gateway serves, with the versions it announces.

Written from Kafka's JSON schemas (clients/src/main/resources/common/message),
field by field for the versions below: each :class:`Api` names its request
and response :class:`~.wire.Struct`, the versions we serve, and its first
flexible version.  :func:`read_request` parses a request's header and body,
:func:`response_frame` frames a response body for the wire.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .wire import (
    BOOL, BYTES, INT8, INT16, INT32, INT64, NULLABLE_STRING, RECORDS, STRING, UUID,
    Array, DecodeError, Field, Reader, Struct, uvarint,
)

F = Field
_H16, _H32 = INT16.codec, INT32.codec
_HEADER_TAGS = Struct()  # a request header v2 ends with tagged fields, none of which we read


@dataclass(frozen=True)
class Api:
    key: int
    name: str
    lo: int  # versions served
    hi: int
    flexible: int  # the first flexible version (header v2 / response header v1 from there)
    request: Struct
    response: Struct

    def is_flexible(self, version: int) -> bool:
        return version >= self.flexible


_API_VERSION = Struct(F("api_key", INT16), F("min_version", INT16), F("max_version", INT16))

API_VERSIONS = Api(
    18, "ApiVersions", 0, 3, 3,
    Struct(F("client_software_name", STRING, 3), F("client_software_version", STRING, 3)),
    Struct(F("error_code", INT16), F("api_keys", Array(_API_VERSION)), F("throttle_time_ms", INT32, 1)),
)

_METADATA_TOPIC = Struct(F("topic_id", UUID, 10), F("name", STRING, nullable_from=10))
_METADATA_PARTITION = Struct(
    F("error_code", INT16), F("partition_index", INT32), F("leader_id", INT32), F("leader_epoch", INT32, 7),
    F("replica_nodes", Array(INT32)), F("isr_nodes", Array(INT32)), F("offline_replicas", Array(INT32), 5),
)
METADATA = Api(
    3, "Metadata", 0, 9, 9,
    Struct(F("topics", Array(_METADATA_TOPIC), nullable_from=1), F("allow_auto_topic_creation", BOOL, 4),
           F("include_cluster_authorized_operations", BOOL, 8, 10), F("include_topic_authorized_operations", BOOL, 8)),
    Struct(
        F("throttle_time_ms", INT32, 3),
        F("brokers", Array(Struct(F("node_id", INT32), F("host", STRING), F("port", INT32),
                                  F("rack", NULLABLE_STRING, 1)))),
        F("cluster_id", NULLABLE_STRING, 2), F("controller_id", INT32, 1),
        F("topics", Array(Struct(
            F("error_code", INT16), F("name", STRING, nullable_from=12), F("topic_id", UUID, 10),
            F("is_internal", BOOL, 1), F("partitions", Array(_METADATA_PARTITION)),
            F("topic_authorized_operations", INT32, 8)))),
        F("cluster_authorized_operations", INT32, 8, 10),
    ),
)

PRODUCE = Api(
    0, "Produce", 3, 9, 9,
    Struct(F("transactional_id", NULLABLE_STRING, 3), F("acks", INT16), F("timeout_ms", INT32),
           F("topic_data", Array(Struct(F("name", STRING), F("partition_data", Array(Struct(
               F("index", INT32), F("records", RECORDS)))))))),
    Struct(
        F("responses", Array(Struct(F("name", STRING), F("partition_responses", Array(Struct(
            F("index", INT32), F("error_code", INT16), F("base_offset", INT64), F("log_append_time_ms", INT64, 2),
            F("log_start_offset", INT64, 5),
            F("record_errors", Array(Struct(F("batch_index", INT32), F("batch_index_error_message", NULLABLE_STRING))), 8),
            F("error_message", NULLABLE_STRING, 8))))))),
        F("throttle_time_ms", INT32, 1),
    ),
)

FETCH = Api(
    1, "Fetch", 4, 12, 12,
    Struct(
        F("cluster_id", NULLABLE_STRING, 12, tag=0),
        F("replica_id", INT32, 0, 14), F("max_wait_ms", INT32), F("min_bytes", INT32), F("max_bytes", INT32, 3),
        F("isolation_level", INT8, 4), F("session_id", INT32, 7), F("session_epoch", INT32, 7),
        F("topics", Array(Struct(F("topic", STRING, 0, 12), F("topic_id", UUID, 13), F("partitions", Array(Struct(
            F("partition", INT32), F("current_leader_epoch", INT32, 9), F("fetch_offset", INT64),
            F("last_fetched_epoch", INT32, 12), F("log_start_offset", INT64, 5), F("partition_max_bytes", INT32))))))),
        F("forgotten_topics_data", Array(Struct(F("topic", STRING, 0, 12), F("topic_id", UUID, 13),
                                                F("partitions", Array(INT32)))), 7),
        F("rack_id", STRING, 11),
    ),
    Struct(
        F("throttle_time_ms", INT32, 1), F("error_code", INT16, 7), F("session_id", INT32, 7),
        F("responses", Array(Struct(F("topic", STRING, 0, 12), F("topic_id", UUID, 13), F("partitions", Array(Struct(
            F("partition_index", INT32), F("error_code", INT16), F("high_watermark", INT64),
            F("last_stable_offset", INT64, 4), F("log_start_offset", INT64, 5),
            F("aborted_transactions", Array(Struct(F("producer_id", INT64), F("first_offset", INT64))), 4,
              nullable_from=4),
            F("preferred_read_replica", INT32, 11), F("records", RECORDS))))))),
    ),
)

LIST_OFFSETS = Api(
    2, "ListOffsets", 1, 7, 6,
    Struct(F("replica_id", INT32), F("isolation_level", INT8, 2), F("topics", Array(Struct(
        F("name", STRING), F("partitions", Array(Struct(
            F("partition_index", INT32), F("current_leader_epoch", INT32, 4), F("timestamp", INT64)))))))),
    Struct(F("throttle_time_ms", INT32, 2), F("topics", Array(Struct(F("name", STRING), F("partitions", Array(Struct(
        F("partition_index", INT32), F("error_code", INT16), F("timestamp", INT64, 1), F("offset", INT64, 1),
        F("leader_epoch", INT32, 4)))))))),
)

FIND_COORDINATOR = Api(
    10, "FindCoordinator", 0, 3, 3,
    Struct(F("key", STRING), F("key_type", INT8, 1)),
    Struct(F("throttle_time_ms", INT32, 1), F("error_code", INT16), F("error_message", NULLABLE_STRING, 1),
           F("node_id", INT32), F("host", STRING), F("port", INT32)),
)

JOIN_GROUP = Api(
    11, "JoinGroup", 0, 5, 6,
    Struct(F("group_id", STRING), F("session_timeout_ms", INT32), F("rebalance_timeout_ms", INT32, 1),
           F("member_id", STRING), F("group_instance_id", NULLABLE_STRING, 5), F("protocol_type", STRING),
           F("protocols", Array(Struct(F("name", STRING), F("metadata", BYTES))))),
    Struct(F("throttle_time_ms", INT32, 2), F("error_code", INT16), F("generation_id", INT32),
           F("protocol_name", STRING), F("leader", STRING), F("member_id", STRING),
           F("members", Array(Struct(F("member_id", STRING), F("group_instance_id", NULLABLE_STRING, 5),
                                     F("metadata", BYTES))))),
)

SYNC_GROUP = Api(
    14, "SyncGroup", 0, 3, 4,
    Struct(F("group_id", STRING), F("generation_id", INT32), F("member_id", STRING),
           F("group_instance_id", NULLABLE_STRING, 3),
           F("assignments", Array(Struct(F("member_id", STRING), F("assignment", BYTES))))),
    Struct(F("throttle_time_ms", INT32, 1), F("error_code", INT16), F("assignment", BYTES)),
)

HEARTBEAT = Api(
    12, "Heartbeat", 0, 3, 4,
    Struct(F("group_id", STRING), F("generation_id", INT32), F("member_id", STRING),
           F("group_instance_id", NULLABLE_STRING, 3)),
    Struct(F("throttle_time_ms", INT32, 1), F("error_code", INT16)),
)

LEAVE_GROUP = Api(
    13, "LeaveGroup", 0, 3, 4,
    Struct(F("group_id", STRING), F("member_id", STRING, 0, 2),
           F("members", Array(Struct(F("member_id", STRING), F("group_instance_id", NULLABLE_STRING))), 3)),
    Struct(F("throttle_time_ms", INT32, 1), F("error_code", INT16),
           F("members", Array(Struct(F("member_id", STRING), F("group_instance_id", NULLABLE_STRING),
                                     F("error_code", INT16))), 3)),
)

OFFSET_COMMIT = Api(
    8, "OffsetCommit", 2, 7, 8,
    Struct(F("group_id", STRING), F("generation_id", INT32), F("member_id", STRING),
           F("group_instance_id", NULLABLE_STRING, 7), F("retention_time_ms", INT64, 2, 4),
           F("topics", Array(Struct(F("name", STRING), F("partitions", Array(Struct(
               F("partition_index", INT32), F("committed_offset", INT64), F("committed_leader_epoch", INT32, 6),
               F("committed_metadata", NULLABLE_STRING)))))))),
    Struct(F("throttle_time_ms", INT32, 3), F("topics", Array(Struct(F("name", STRING), F("partitions", Array(Struct(
        F("partition_index", INT32), F("error_code", INT16)))))))),
)

OFFSET_FETCH = Api(
    9, "OffsetFetch", 1, 7, 6,
    Struct(F("group_id", STRING), F("topics", Array(Struct(F("name", STRING), F("partition_indexes", Array(INT32)))),
                                    nullable_from=2),
           F("require_stable", BOOL, 7)),
    Struct(F("throttle_time_ms", INT32, 3), F("topics", Array(Struct(F("name", STRING), F("partitions", Array(Struct(
        F("partition_index", INT32), F("committed_offset", INT64), F("committed_leader_epoch", INT32, 5),
        F("metadata", NULLABLE_STRING), F("error_code", INT16))))))), F("error_code", INT16, 2)),
)

LIST_GROUPS = Api(
    16, "ListGroups", 0, 3, 3,
    Struct(),
    Struct(F("throttle_time_ms", INT32, 1), F("error_code", INT16),
           F("groups", Array(Struct(F("group_id", STRING), F("protocol_type", STRING))))),
)

DESCRIBE_GROUPS = Api(
    15, "DescribeGroups", 0, 4, 5,
    Struct(F("groups", Array(STRING)), F("include_authorized_operations", BOOL, 3)),
    Struct(F("throttle_time_ms", INT32, 1), F("groups", Array(Struct(
        F("error_code", INT16), F("group_id", STRING), F("group_state", STRING), F("protocol_type", STRING),
        F("protocol_data", STRING),
        F("members", Array(Struct(F("member_id", STRING), F("group_instance_id", NULLABLE_STRING, 4),
                                  F("client_id", STRING), F("client_host", STRING), F("member_metadata", BYTES),
                                  F("member_assignment", BYTES)))),
        F("authorized_operations", INT32, 3))))),
)

DELETE_GROUPS = Api(
    42, "DeleteGroups", 0, 1, 2,
    Struct(F("groups_names", Array(STRING))),
    Struct(F("throttle_time_ms", INT32), F("results", Array(Struct(F("group_id", STRING), F("error_code", INT16))))),
)

INIT_PRODUCER_ID = Api(
    22, "InitProducerId", 0, 4, 2,
    Struct(F("transactional_id", NULLABLE_STRING), F("transaction_timeout_ms", INT32), F("producer_id", INT64, 3),
           F("producer_epoch", INT16, 3)),
    Struct(F("throttle_time_ms", INT32), F("error_code", INT16), F("producer_id", INT64), F("producer_epoch", INT16)),
)

CREATE_TOPICS = Api(
    19, "CreateTopics", 2, 4, 5,
    Struct(F("topics", Array(Struct(
        F("name", STRING), F("num_partitions", INT32), F("replication_factor", INT16),
        F("assignments", Array(Struct(F("partition_index", INT32), F("broker_ids", Array(INT32))))),
        F("configs", Array(Struct(F("name", STRING), F("value", NULLABLE_STRING))))))),
        F("timeout_ms", INT32), F("validate_only", BOOL, 1)),
    Struct(F("throttle_time_ms", INT32, 2), F("topics", Array(Struct(
        F("name", STRING), F("error_code", INT16), F("error_message", NULLABLE_STRING, 1))))),
)

DELETE_TOPICS = Api(
    20, "DeleteTopics", 1, 5, 4,
    Struct(F("topic_names", Array(STRING)), F("timeout_ms", INT32)),
    Struct(F("throttle_time_ms", INT32), F("responses", Array(Struct(
        F("name", STRING), F("error_code", INT16), F("error_message", NULLABLE_STRING, 5))))),
)

DESCRIBE_CONFIGS = Api(
    32, "DescribeConfigs", 0, 3, 4,
    Struct(F("resources", Array(Struct(F("resource_type", INT8), F("resource_name", STRING),
                                       F("configuration_keys", Array(STRING, nullable=True))))),
           F("include_synonyms", BOOL, 1), F("include_documentation", BOOL, 3)),
    Struct(F("throttle_time_ms", INT32), F("results", Array(Struct(
        F("error_code", INT16), F("error_message", NULLABLE_STRING), F("resource_type", INT8),
        F("resource_name", STRING),
        F("configs", Array(Struct(
            F("name", STRING), F("value", NULLABLE_STRING), F("read_only", BOOL), F("is_default", BOOL, 0, 0),
            F("config_source", INT8, 1), F("is_sensitive", BOOL),
            F("synonyms", Array(Struct(F("name", STRING), F("value", NULLABLE_STRING), F("source", INT8))), 1),
            F("config_type", INT8, 3), F("documentation", NULLABLE_STRING, 3)))))))),
)

SASL_HANDSHAKE = Api(
    17, "SaslHandshake", 0, 1, 2,  # never flexible; after v0, the tokens go raw (a size, the bytes), v1 in SaslAuthenticate
    Struct(F("mechanism", STRING)),
    Struct(F("error_code", INT16), F("mechanisms", Array(STRING))),
)

SASL_AUTHENTICATE = Api(
    36, "SaslAuthenticate", 0, 2, 2,
    Struct(F("auth_bytes", BYTES)),
    Struct(F("error_code", INT16), F("error_message", NULLABLE_STRING), F("auth_bytes", BYTES),
           F("session_lifetime_ms", INT64, 1)),
)

APIS: dict[int, Api] = {api.key: api for api in (
    API_VERSIONS, METADATA, PRODUCE, FETCH, LIST_OFFSETS, FIND_COORDINATOR, JOIN_GROUP, SYNC_GROUP, HEARTBEAT,
    LEAVE_GROUP, OFFSET_COMMIT, OFFSET_FETCH, LIST_GROUPS, DESCRIBE_GROUPS, DELETE_GROUPS, INIT_PRODUCER_ID,
    CREATE_TOPICS, DELETE_TOPICS, DESCRIBE_CONFIGS, SASL_HANDSHAKE, SASL_AUTHENTICATE)}


@dataclass
class Request:
    api: Api | None  # None: a key we do not serve
    api_key: int
    version: int
    correlation_id: int
    client_id: str | None
    body: dict[str, Any] | None  # None when the version is not served (the body is left unread)

    @property
    def supported(self) -> bool:
        return self.body is not None


def read_request(frame: bytes | memoryview) -> Request:
    """A request (without its 4-byte size): header v1 or v2 (by the API's flexible version), then the body.

    A version or key we do not serve leaves the body unread (``body`` None): the caller answers
    UNSUPPORTED_VERSION.  Raises :class:`DecodeError` for a frame that does not parse."""
    r = Reader(frame)
    api_key, version, correlation_id = r.fixed(_H16), r.fixed(_H16), r.fixed(_H32)
    client_id = NULLABLE_STRING.read(r, False)
    api = APIS.get(api_key)
    if api is None or not api.lo <= version <= api.hi:
        # ApiVersions of a version above ours: the client expects a v0 answer and its error (KIP-511).
        return Request(api, api_key, version, correlation_id, client_id, None)
    flexible = api.is_flexible(version)
    if flexible:
        _HEADER_TAGS.read_version(r, True, version)  # the header's tagged fields
    body = api.request.read_version(r, flexible, version)
    return Request(api, api_key, version, correlation_id, client_id, body)



def encode_body(api: Api, version: int, body: dict[str, Any]) -> bytes:
    out: list[bytes] = []
    api.response.write_version(out, body, api.is_flexible(version), version)
    return b"".join(out)


def response_frame(api: Api | None, version: int, correlation_id: int, body: bytes) -> bytes:
    """Size, response header (v1 with tagged fields in a flexible version, except ApiVersions: always v0), body."""
    flexible = api is not None and api.key != API_VERSIONS.key and api.is_flexible(version)
    header = _H32.pack(correlation_id) + (uvarint(0) if flexible else b"")
    return _H32.pack(len(header) + len(body)) + header + body


def unsupported_api_versions(correlation_id: int) -> bytes:
    """ApiVersions v0's answer with UNSUPPORTED_VERSION and what we serve (the client retries at a version in it)."""
    return response_frame(API_VERSIONS, 0, correlation_id, encode_body(API_VERSIONS, 0, api_versions_body(35)))


def api_versions_body(error_code: int = 0) -> dict[str, Any]:
    return {"error_code": error_code, "throttle_time_ms": 0,
            "api_keys": [{"api_key": a.key, "min_version": a.lo, "max_version": a.hi}
                         for a in sorted(APIS.values(), key=lambda a: a.key)]}


__all__ = ["APIS", "Api", "DecodeError", "Request", "api_versions_body", "encode_body", "read_request",
           "response_frame", "unsupported_api_versions"]
