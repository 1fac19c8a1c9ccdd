"""kafka/gateways.py without sockets: announcements, who is live, and who leads what."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, strategies as st

from dafka.kafka import errors
from dafka.kafka.gateways import (
    Gateways, Node, decode_announcement, encode_announcement, group_key, partition_key,
)
from dafka.kafka.mapping import Mapping, TopicView
from dafka.kafka.messages import FETCH, FIND_COORDINATOR, METADATA, OFFSET_FETCH, PRODUCE, read_request

from test_kafka_protocol import _decode, request_frame


def _request(api, version, body):
    return read_request(request_frame(api, version, body))

A, B, C = Node(1, "127.0.0.1", 9092), Node(2, "127.0.0.1", 9093), Node(3, "127.0.0.1", 9094)


def test_an_announcement_round_trips_and_a_bad_one_names_what_is_wrong():
    assert decode_announcement(encode_announcement(B)) == (B, False, {})
    assert decode_announcement(encode_announcement(B, leaving=True, topics={"t": 3})) == (B, True, {"t": 3})
    for bad, why in [(b"\xff", "not JSON"), (b"[]", "not an object"),
                     (b'{"node_id": -1, "host": "h", "port": 1, "leaving": false, "topics": {}}', "node_id"),
                     (b'{"node_id": 1, "host": "", "port": 1, "leaving": false, "topics": {}}', "host"),
                     (b'{"node_id": 1, "host": "h", "port": 70000, "leaving": false, "topics": {}}', "port"),
                     (b'{"node_id": 1, "host": "h", "port": 7, "leaving": false, "topics": {"t": 0}}', "topics")]:
        with pytest.raises(ValueError, match=why):
            decode_announcement(bad)


@given(st.binary(max_size=200))
def test_decoding_any_bytes_gives_an_announcement_or_a_value_error(data):
    try:
        node, leaving, topics = decode_announcement(data)
    except ValueError:
        return
    assert isinstance(node, Node) and isinstance(leaving, bool) and isinstance(topics, dict)


def test_gateways_come_and_go_and_every_view_picks_the_same_leaders():
    a, b = Gateways(A, timeout=3.0), Gateways(B, timeout=3.0)
    assert a.live() == [A] and a.leads(partition_key("t", 0))  # alone, it leads everything
    assert a.on_announcement(B, False, now=0.0) and not a.on_announcement(B, False, now=1.0)  # heard again: no change
    assert b.on_announcement(A, False, now=0.0)
    assert a.live() == b.live() == [A, B]
    keys = [partition_key("t", i) for i in range(200)] + [group_key(f"g{i}") for i in range(50)]
    assert all(a.leader(k) == b.leader(k) for k in keys)
    shares = Counter(a.leader(k).node_id for k in keys)
    assert 80 <= shares[1] <= 170, shares  # both lead a fair share
    # B unheard for the timeout: gone, and A leads again what B led, nothing else moves
    before = {k: a.leader(k) for k in keys}
    version = a.version
    assert a.expire(now=1.0) == [] and a.expire(now=2.0) == [] and a.expire(now=2.9) == []
    assert a.expire(now=4.1) == [B]
    assert a.version > version and a.live() == [A] and all(a.leader(k) == A for k in keys)
    # a third gateway joins: only keys it now leads move (rendezvous hashing)
    a.on_announcement(B, False, now=5.0)
    a.on_announcement(C, False, now=5.0)
    moved = [k for k in keys if a.leader(k) != before[k]]
    assert moved and all(a.leader(k) == C for k in moved)
    # the partition counts they announce: the highest of the live ones
    a.on_announcement(B, False, now=5.0, topics={"t": 4})
    a.on_announcement(C, False, now=5.0, topics={"t": 6, "u": 1})
    assert (a.partitions("t"), a.partitions("u"), a.partitions("v")) == (6, 1, 0)
    # one that leaves says so: gone at once
    assert a.on_announcement(C, True, now=5.1) and a.live() == [A, B] and a.partitions("t") == 4
    assert not a.on_announcement(C, True, now=5.2)
    assert not a.on_announcement(A, False, now=5.3)  # its own announcement, heard back: nothing


def _two_gateway_mapping() -> tuple[Mapping, str, str]:
    gateways = Gateways(A)
    gateways.on_announcement(B, False, now=0.0)
    mapping = Mapping(A.host, A.port, gateways=gateways)
    mine = next(f"p{i}" for i in range(100) if gateways.leads(partition_key(f"p{i}", 0)))
    theirs = next(f"p{i}" for i in range(100) if not gateways.leads(partition_key(f"p{i}", 0)))
    return mapping, mine, theirs


def test_metadata_lists_every_live_gateway_and_each_partitions_leader():
    mapping, mine, theirs = _two_gateway_mapping()
    request = _request(METADATA, 9, {"topics": [{"name": mine}, {"name": theirs}], "allow_auto_topic_creation": False,
                                     "include_cluster_authorized_operations": False,
                                     "include_topic_authorized_operations": False})
    body = _decode(METADATA, 9, mapping.handle(request, {mine: TopicView(mine, [-1]),
                                                         theirs: TopicView(theirs, [-1])}).body)
    assert [(b["node_id"], b["port"]) for b in body["brokers"]] == [(1, 9092), (2, 9093)]
    leaders = {t["name"]: t["partitions"][0]["leader_id"] for t in body["topics"]}
    assert leaders == {mine: 1, theirs: 2}


def test_a_produce_to_a_partition_another_gateway_leads_gets_not_leader_or_follower():
    mapping, mine, theirs = _two_gateway_mapping()
    request = _request(PRODUCE, 7, {"transactional_id": None, "acks": -1, "timeout_ms": 1000, "topic_data": [
        {"name": theirs, "partition_data": [{"index": 0, "records": b""}]}]})
    outcome = mapping.handle(request, {theirs: TopicView(theirs, [-1])})
    assert outcome.refused == {(theirs, 0): errors.NOT_LEADER_OR_FOLLOWER}


def test_a_group_is_found_at_its_coordinator_and_refused_elsewhere():
    mapping, _, _ = _two_gateway_mapping()
    gateways = mapping.gateways
    theirs = next(f"g{i}" for i in range(100) if not gateways.leads(group_key(f"g{i}")))
    body = _decode(FIND_COORDINATOR, 2, mapping.handle(_request(FIND_COORDINATOR, 2, {"key": theirs, "key_type": 0}),
                                                       {}).body)
    assert (body["error_code"], body["node_id"], body["port"]) == (0, 2, 9093)
    fetched = _request(OFFSET_FETCH, 7, {"group_id": theirs, "topics": [{"name": "t", "partition_indexes": [0]}],
                                         "require_stable": False})
    answer = _decode(OFFSET_FETCH, 7, mapping.handle(fetched, {}).body)
    assert answer["error_code"] == errors.NOT_COORDINATOR


def test_a_fetch_past_a_head_only_heard_of_is_not_out_of_range():
    """The partition's leader moved and is resuming it: a consumer at its end must not reset its offset."""
    mapping = Mapping("h", 1)
    body = {"replica_id": -1, "max_wait_ms": 500, "min_bytes": 1, "max_bytes": 10_000, "isolation_level": 0,
            "session_id": 0, "session_epoch": -1, "rack_id": "",
            "topics": [{"topic": "t", "partitions": [{"partition": 0, "fetch_offset": 9, "partition_max_bytes": 100},
                                                     {"partition": 1, "fetch_offset": 9, "partition_max_bytes": 100}]}]}
    reads = mapping.handle(_request(FETCH, 11, body), {"t": TopicView("t", [4, 4], unsure={0})})
    assert reads.refused == {("t", 0): errors.NOT_LEADER_OR_FOLLOWER, ("t", 1): errors.OFFSET_OUT_OF_RANGE}


def test_a_stall_of_its_own_loop_expires_nobody():
    a = Gateways(A, timeout=3.0)
    a.on_announcement(B, False, now=0.0)
    assert a.expire(now=0.5) == []
    assert a.expire(now=10.0) == []  # stopped 9.5 s itself: B's announcements wait unread
    assert [a.expire(now=t) for t in (11.0, 12.0, 12.4)] == [[], [], []]
    assert a.expire(now=12.6) == [B]  # then unheard for 3 s of its own running


def test_the_stall_guard_counts_each_stall_of_the_loop_once():
    from dafka.kafka.gateways import STALL_SECONDS, TIMEOUT_SECONDS, StallGuard

    assert STALL_SECONDS < TIMEOUT_SECONDS  # before another gateway can take this one for gone
    guard = StallGuard(limit=2.0)
    assert not guard.observe(100.0)  # the first observation: no gap yet
    assert not any(guard.observe(100.0 + i * 0.05) for i in range(1, 40))  # ticks
    assert guard.observe(104.5) and guard.count == 1 and guard.longest == pytest.approx(2.55)
    assert not guard.observe(104.5) and not guard.observe(104.6) and guard.count == 1  # once per stall
    assert not guard.observe(103.0)  # (a clock read late by another caller: no gap, nothing goes back)
    assert guard.observe(110.0) and guard.count == 2


def test_a_partition_resumed_while_its_topic_was_surveyed_is_stopped_when_its_leader_changed_meanwhile():
    """A request that may create a topic resumes the partitions this gateway leads while the survey runs.
    One whose leader changed meanwhile is not this gateway's to write: left running, it beaconed its
    partition's address for good, and the gateway that leads it could never resume it (nemesis, stops)."""
    import asyncio

    from dafka.kafka.server import KafkaGateway
    from helpers import loopback_config

    class Resumed:
        stopped = 0

        async def stop(self, timeout=None):
            Resumed.stopped += 1

    class Leads:
        surveyed = False

        def leads(self, topic, index):
            return not self.surveyed  # every partition this gateway's before the survey, none after

    async def learn():
        gateway = KafkaGateway(loopback_config())
        gateway.mapping = leads = Leads()

        def survey(topic):
            leads.surveyed = True
            return {}
        gateway._producer = lambda topic, index: Resumed()
        gateway._survey = survey
        await gateway._learn("t", create=True, partitions=3)
        await asyncio.gather(*gateway._background)
        return gateway

    gateway = asyncio.run(asyncio.wait_for(learn(), 30))
    assert Resumed.stopped == 3 and gateway.producers == {}
    assert gateway.views["t"].count == 3


def test_a_topic_whose_partition_another_process_still_writes_is_known_and_that_partition_unsure():
    """A partition whose resume raises (its last writer still beacons it, PartitionClaimed) does not take its
    topic away: the others are served, and a Produce to it resumes it again.  Without its topic, a gateway
    answered UNKNOWN_TOPIC_OR_PART for every partition for the resume timeout (nemesis, seed 12)."""
    import asyncio

    import types

    from dafka.errors import PartitionClaimed
    from dafka.kafka.mapping import address_of
    from dafka.kafka.server import KafkaGateway
    from helpers import loopback_config

    class Leads:
        def leads(self, topic, index):
            return True

    async def learn():
        gateway = KafkaGateway(loopback_config())
        gateway.mapping = Leads()

        async def partition(key, resumed=None):
            if key[1] == 1:
                raise PartitionClaimed("still beaconed")
            gateway.producers[key] = producer = types.SimpleNamespace(next_offset=10)
            return producer
        gateway._partition = partition
        await gateway._learn("t", create=False, found={address_of("t", i): 9 for i in range(3)})
        return gateway

    gateway = asyncio.run(asyncio.wait_for(learn(), 30))
    view = gateway.views["t"]
    assert view.count == 3 and view.unsure == {1} and set(gateway.producers) == {("t", 0), ("t", 2)}


def test_the_retry_of_a_batch_partly_stored_appends_only_its_missing_records_and_answers_its_first_offset():
    """The gateway that resumes a partition found 2 of a noted batch's 4 records stored (its last gateway
    died while they went out): the client's retry of the batch appends the other 2, noted as such, and gets
    the batch's first offset; a second retry is answered as a duplicate."""
    import asyncio
    import types

    from dafka.kafka.batches import Batch
    from dafka.kafka.idempotence import BatchEntry, Sequences, decode_entry
    from dafka.kafka.server import KafkaGateway
    from helpers import loopback_config

    key, pid = ("t", 0), 7
    sent, noted = [], []

    class Producer:
        next_offset = 7  # offsets 5 and 6 hold the batch's first two records

        async def wait_for_room(self, count, nbytes):
            pass

        async def send_many(self, values, keys=None, attributes=None):
            first = self.next_offset
            sent.append((first, list(values), keys, list(attributes)))
            self.next_offset += len(values)
            return first

    class Noted:
        async def send(self, value):
            noted.append(decode_entry(value))
            done = asyncio.get_running_loop().create_future()
            done.set_result(None)
            return types.SimpleNamespace(future=lambda: done)

    async def retry():
        gateway = KafkaGateway(loopback_config())
        sequences = Sequences()
        sequences.restore("t", [BatchEntry(0, pid, 0, 5, 4, 5)], {0: 6})
        gateway.mapping = types.SimpleNamespace(sequences=sequences)
        gateway._sequence_producers[key] = Noted()
        batch = Batch(0, 0, 3, 0, 0, pid, 0, 5, [], body_bytes=4, count=4, values=[b"a", b"b", b"c", b"d"],
                      keys=None, record_attributes=["A", "B", "C", "D"])
        return [await gateway._append(key, Producer(), batch, 5.0) for _ in range(2)]

    assert asyncio.run(asyncio.wait_for(retry(), 30)) == [(0, 5, False), (0, 5, True)]
    assert sent == [(7, [b"c", b"d"], None, ["C", "D"])]
    assert noted == [BatchEntry(0, pid, 0, 7, 2, 7)]  # the rest: sequences 7 and 8 at offsets from 7
