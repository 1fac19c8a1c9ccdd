"""kafka/acl.py and the mapping's use of it, without sockets: what each principal may do, and what it is told."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, strategies as st

from test_kafka_protocol import _decode, request_frame

from dafka.kafka import batches, errors
from dafka.kafka.acl import Access, AclError, parse_acl
from dafka.kafka.mapping import Appends, Mapping, Reads, TopicView
from dafka.kafka.messages import (
    CREATE_TOPICS, DELETE_GROUPS, FETCH, FIND_COORDINATOR, HEARTBEAT, INIT_PRODUCER_ID, JOIN_GROUP, LIST_GROUPS,
    METADATA, OFFSET_COMMIT, OFFSET_FETCH, PRODUCE, read_request,
)

ACL = parse_acl("""
# principal  operations         resource  name
alice        read,write,create  topic     orders
alice        read               group     billing
bob          read               topic     logs.*     # a prefix
*            describe           topic     public
carol        all                group     *
""")


def test_rules_allow_by_principal_operation_and_name_and_read_write_imply_describe():
    assert ACL.allows("alice", "write", "topic", "orders") and ACL.allows("alice", "describe", "topic", "orders")
    assert not ACL.allows("alice", "delete", "topic", "orders") and not ACL.allows("alice", "read", "topic", "orders2")
    assert ACL.allows("bob", "read", "topic", "logs.app") and ACL.allows("bob", "describe", "topic", "logs.")
    assert not ACL.allows("bob", "read", "topic", "logs") and not ACL.allows("bob", "write", "topic", "logs.app")
    assert ACL.allows("anyone", "describe", "topic", "public") and not ACL.allows("anyone", "read", "topic", "public")
    assert ACL.allows("carol", "delete", "group", "x") and not ACL.allows("carol", "read", "topic", "orders")
    assert not ACL.allows("alice", "read", "topic", "billing")  # a group's rule is not a topic's
    assert ACL.allows_any("alice", "write", "topic") and not ACL.allows_any("bob", "write", "topic")


def test_a_bad_acl_file_names_the_line_and_what_is_wrong(tmp_path):
    for text, said in (("alice read topic", "line 1: 'alice read topic' is not PRINCIPAL"),
                       ("\n# c\nalice fly topic t", "line 3: unknown operation 'fly'"),
                       ("alice read table t", "unknown resource 'table'"),
                       ("alice read topic a*b", "'*' only ends a name")):
        with pytest.raises(AclError, match=re.escape(said)):
            parse_acl(text, "acl.txt")
    from dafka.kafka.acl import load_acl

    with pytest.raises(AclError, match="cannot read it"):
        load_acl(str(tmp_path / "missing"))


@given(st.text(max_size=200))
def test_fuzz_the_acl_parser_raises_acl_error_or_parses(text):
    try:
        parse_acl(text)
    except AclError:
        pass


def _request(api, version, body):
    return read_request(request_frame(api, version, body))


def test_produce_and_fetch_refuse_a_topic_the_principal_may_not_use_and_count_it():
    mapping = Mapping("h", 1)
    views = {"orders": TopicView("orders", [4]), "logs.app": TopicView("logs.app", [4])}
    batch = batches.write_batch(0, [(0, 5, None, b"v")])
    produce = _request(PRODUCE, 7, {"transactional_id": None, "acks": -1, "timeout_ms": 1000, "topic_data": [
        {"name": t, "partition_data": [{"index": 0, "records": batch}]} for t in ("orders", "logs.app")]})
    bob = Access("bob", ACL)
    outcome = mapping.handle(produce, views, access=bob)
    assert isinstance(outcome, Appends) and outcome.appends == []
    assert outcome.refused == {("orders", 0): errors.TOPIC_AUTHORIZATION_FAILED,
                               ("logs.app", 0): errors.TOPIC_AUTHORIZATION_FAILED}
    assert bob.denied == 2
    alice = Access("alice", ACL)
    assert [a.topic for a in mapping.handle(produce, views, access=alice).appends] == ["orders"]
    fetch = _request(FETCH, 11, {"replica_id": -1, "max_wait_ms": 0, "min_bytes": 1, "max_bytes": 1000,
                                 "isolation_level": 0, "session_id": 0, "session_epoch": -1, "rack_id": "",
                                 "topics": [{"topic": t, "partitions": [{"partition": 0, "fetch_offset": 0,
                                                                         "partition_max_bytes": 100}]}
                                            for t in ("orders", "logs.app")]})
    reads = mapping.handle(fetch, views, access=bob)
    assert isinstance(reads, Reads) and [r.topic for r in reads.reads] == ["logs.app"]
    assert reads.refused == {("orders", 0): errors.TOPIC_AUTHORIZATION_FAILED}


def test_metadata_lists_only_what_may_be_described_and_refuses_a_named_topic():
    mapping = Mapping("h", 1)
    views = {n: TopicView(n, [1]) for n in ("orders", "logs.app", "public", "secret")}
    everything = _request(METADATA, 9, {"topics": None, "allow_auto_topic_creation": True})
    listed = _decode(METADATA, 9, mapping.handle(everything, views, access=Access("bob", ACL)).body)["topics"]
    assert [t["name"] for t in listed] == ["logs.app", "public"]
    named = _request(METADATA, 9, {"topics": [{"name": "secret"}, {"name": "new"}], "allow_auto_topic_creation": True})
    topics = _decode(METADATA, 9, mapping.handle(named, views, access=Access("bob", ACL)).body)["topics"]
    assert [t["error_code"] for t in topics] == [errors.TOPIC_AUTHORIZATION_FAILED] * 2
    assert mapping.to_create(named, views, Access("bob", ACL)) == []  # bob may not create: no auto-creation
    assert mapping.to_create(_request(METADATA, 9, {"topics": [{"name": "orders"}], "allow_auto_topic_creation": True}),
                             {}, Access("alice", ACL)) == ["orders"]


def test_groups_a_principal_may_not_use_get_group_authorization_failed():
    mapping = Mapping("h", 1)
    bob = Access("bob", ACL)
    join = _request(JOIN_GROUP, 5, {"group_id": "billing", "session_timeout_ms": 10000, "rebalance_timeout_ms": 10000,
                                    "member_id": "", "group_instance_id": None, "protocol_type": "consumer",
                                    "protocols": [{"name": "range", "metadata": b"m"}]})
    (token, body), = mapping.handle(join, {}, token="t", access=bob).replies
    assert token == "t" and _decode(JOIN_GROUP, 5, body)["error_code"] == errors.GROUP_AUTHORIZATION_FAILED
    beat = _request(HEARTBEAT, 3, {"group_id": "billing", "generation_id": 1, "member_id": "m",
                                   "group_instance_id": None})
    assert _decode(HEARTBEAT, 3, mapping.handle(beat, {}, token="b", access=bob).replies[0][1])["error_code"] == 30
    find = _request(FIND_COORDINATOR, 2, {"key": "billing", "key_type": 0})
    assert _decode(FIND_COORDINATOR, 2, mapping.handle(find, {}, access=bob).body)["error_code"] == 30
    assert _decode(FIND_COORDINATOR, 2, mapping.handle(find, {}, access=Access("alice", ACL)).body)["error_code"] == 0
    commit = _request(OFFSET_COMMIT, 7, {"group_id": "billing", "generation_id": -1, "member_id": "",
                                         "group_instance_id": None, "topics": [{"name": "orders", "partitions": [
                                             {"partition_index": 0, "committed_offset": 3, "committed_leader_epoch": -1,
                                              "committed_metadata": None}]}]})
    assert mapping.handle(commit, {"orders": TopicView("orders", [4])}, access=bob).codes == {("orders", 0): 30}
    fetched = _request(OFFSET_FETCH, 7, {"group_id": "billing", "topics": [{"name": "orders", "partition_indexes": [0]}],
                                         "require_stable": False})
    answer = _decode(OFFSET_FETCH, 7, mapping.handle(fetched, {}, access=bob).body)
    assert answer["error_code"] == 30 and answer["topics"][0]["partitions"][0]["error_code"] == 30
    mapping.offsets["billing"] = {("orders", 0): (3, "")}
    listed = _decode(LIST_GROUPS, 3, mapping.handle(_request(LIST_GROUPS, 3, {}), {}, access=bob).body)["groups"]
    assert listed == [] and [g["group_id"] for g in _decode(LIST_GROUPS, 3, mapping.handle(
        _request(LIST_GROUPS, 3, {}), {}, access=Access("carol", ACL)).body)["groups"]] == ["billing"]
    delete = mapping.handle(_request(DELETE_GROUPS, 1, {"groups_names": ["billing"]}), {}, access=Access("alice", ACL))
    assert delete.group_codes == {"billing": errors.GROUP_AUTHORIZATION_FAILED} and delete.forget == []


def test_creating_topics_and_idempotent_producer_ids_need_their_rights():
    mapping = Mapping("h", 1)
    create = _request(CREATE_TOPICS, 4, {"topics": [{"name": n, "num_partitions": 1, "replication_factor": -1,
                                                     "assignments": [], "configs": []} for n in ("orders", "other")],
                                         "timeout_ms": 1000, "validate_only": False})
    outcome = mapping.handle(create, {}, access=Access("alice", ACL))
    assert outcome.topics == {"orders": 1} and outcome.codes["other"][0] == errors.TOPIC_AUTHORIZATION_FAILED
    init = _request(INIT_PRODUCER_ID, 4, {"transactional_id": None, "transaction_timeout_ms": 60000,
                                          "producer_id": -1, "producer_epoch": -1})
    assert _decode(INIT_PRODUCER_ID, 4, mapping.handle(init, {}, access=Access("bob", ACL)).body)["error_code"] == 31
    assert _decode(INIT_PRODUCER_ID, 4, mapping.handle(init, {}, access=Access("alice", ACL)).body)["error_code"] == 0
