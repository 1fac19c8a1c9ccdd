"""Sharded stores (rfc 16) with real sockets and real LevelDB: placement, views that disagree, and
reference peers in a sharded cluster.  Moves under load and kills are in tests/faults/test_sharded.py."""

from __future__ import annotations

import collections
import logging
import threading
import time

import pytest
from prometheus_client import CollectorRegistry

from dafka import Consumer, Producer, metrics, protocol as proto
from dafka.config import ConfigError
from dafka.core.addresses import new_address
from dafka.store import Store
from dafka.discovery.survey import StatusPeer
from helpers import loopback_config, wait_for
from rawpeer import RawPeer
from dafkabench.refconsumer import RefConsumer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

TOPIC = "shards"
SHARDED = {"beacon/interval": 200, "beacon/timeout": 1000, "store/replicas": 2, "store/dead_ms": 2500,
           "store/handoff_ms": 300}


def config(tower, **extra):
    return loopback_config(tower, **{k.replace("/", "__"): v for k, v in {**SHARDED, **extra}.items()})


@pytest.fixture
def stores(tower, tmp_path):
    started: list[Store] = []

    def start(n: int, **extra) -> list[Store]:
        new = [Store(config(tower, **extra), db=str(tmp_path / f"s{len(started) + i}")).start() for i in range(n)]
        started.extend(new)
        return new

    yield start
    for store in started:
        store.stop()


def produce(tower, partitions: int, records: int, min_acks: int = 2, ready=None) -> dict[str, list[bytes]]:
    """``records`` records in each of ``partitions`` partitions, acked by ``min_acks`` stores, sent once
    ``ready(producers)`` (if given) is true."""
    sent: dict[str, list[bytes]] = {}
    producers = [Producer(TOPIC, config(tower, **{"producer/min_acks": min_acks})) for _ in range(partitions)]
    try:
        if ready is not None:
            wait_for(lambda: ready(producers), 10, what="the producers to be heard")
        for producer in producers:
            values = sent[producer.address] = [b"%s-%d" % (producer.address[:6].encode(), i) for i in range(records)]
            for value in values:
                producer.send(value)
        for producer in producers:
            producer.flush(60)
    finally:
        for producer in producers:
            producer.close()
    return sent


def copies(stores: list[Store], sent: dict[str, list[bytes]]) -> collections.Counter:
    """How many stores hold each partition whole."""
    count: collections.Counter = collections.Counter()
    for store in stores:
        for (topic, partition), head in store.heads().items():
            if topic == TOPIC and head >= len(sent[partition]) - 1:
                count[partition] += 1
    return count


def read_all(tower, sent: dict[str, list[bytes]], timeout: float = 60) -> dict[str, list[bytes]]:
    """Everything, from the beginning, with a new consumer: every record exactly once, in order."""
    got: dict[str, list[bytes]] = collections.defaultdict(list)
    total = sum(map(len, sent.values()))
    with Consumer(TOPIC, config=config(tower, **{"consumer/offset/reset": "earliest"})) as consumer:
        deadline = time.monotonic() + timeout
        while sum(map(len, got.values())) < total and time.monotonic() < deadline:
            for record in consumer.consume(5000, 0.2):
                got[record.partition].append(record.value)
        for record in consumer.consume(5000, 0.5):  # nothing more comes: no duplicate
            got[record.partition].append(record.value)
    return dict(got)


def test_five_stores_with_two_replicas_hold_each_partition_twice_and_serve_everything(tower, stores):
    five = stores(5)
    sent = produce(tower, partitions=12, records=300)
    wait_for(lambda: copies(five, sent) == collections.Counter(dict.fromkeys(sent, 2)), 20,
             what="every partition on exactly 2 stores")
    held = [sum(1 for (topic, _) in store.heads() if topic == TOPIC) for store in five]
    assert sum(held) == 24 and max(held) < 12  # spread, not all on one store
    assert read_all(tower, sent) == sent
    # The stores' view: nothing under-replicated, as a metric...
    wait_for(lambda: all(s.stats()["under_replicated"] == 0 for s in five), 10, what="no under-replicated partition")
    registry = CollectorRegistry()
    metrics.register(*five, registry=registry)
    assert [registry.get_sample_value("dafka_store_under_replicated_partitions",
                                      {"role": "store-writer", "peer": s.writer_address}) for s in five] == [0] * 5
    # ...and as `dafka status` surveys it: each partition's two owners, none under-replicated.
    peer = StatusPeer(config(tower), TOPIC)
    try:
        peer.start()
        wait_for(lambda: peer.run(0.05) or peer.connected, 10, what="the status peer to meet the tower")
        peer.run(1.5)
    finally:
        peer.close()
    rows = {row["partition"]: row for row in peer.survey.partition_rows()}
    assert set(rows) == set(sent)
    ids = {store.store_id for store in five}
    for row in rows.values():
        assert len(row["owners"]) == 2 and set(row["owners"]) <= ids and row["under_replicated"] is False
        assert len(row["stores"]) == 2 and row["store_head"] == 299


def test_a_producer_asking_more_acks_than_replicas_fails_at_start(tower, stores):
    with pytest.raises(ConfigError, match=r"producer/min_acks: 3 is above store/replicas \(2\)"):
        Producer(TOPIC, config(tower, **{"producer/min_acks": 3}))
    # A producer whose config does not say store/replicas hears it from the sharded stores' heartbeats.
    stores(3)
    producer = Producer(TOPIC, loopback_config(tower, beacon__interval=200, producer__min_acks=3))
    try:
        with pytest.raises(ConfigError, match=r"producer/min_acks: 3 is above the store/replicas of the sharded "
                                              r"stores \(2, store [0-9A-F]{32}\)"):
            producer.send(b"never acked by 3")  # (refused at once when the stores' heartbeat came before it)
            producer.flush(10)
        with pytest.raises(ConfigError):
            producer.send(b"refused")
    finally:
        with pytest.raises(ConfigError):
            producer.close(5)


def test_stores_that_disagree_on_replicas_lose_nothing_and_say_so(tower, stores, caplog):
    caplog.set_level(logging.WARNING, logger="dafka.store.sharding")
    three = stores(2) + stores(1, **{"store/replicas": 3})
    sent = produce(tower, partitions=8, records=200)
    wait_for(lambda: all(n >= 2 for n in copies(three, sent).values()) and len(copies(three, sent)) == 8, 20,
             what="every partition on at least 2 stores")
    assert read_all(tower, sent) == sent
    lines = [r.getMessage() for r in caplog.records if "places with store/replicas" in r.getMessage()]
    assert any("store/replicas 3" in line for line in lines) and any("store/replicas 2" in line for line in lines)


def test_a_store_that_sees_only_some_of_the_others_loses_nothing(tower, stores):
    four = stores(4)
    # The fourth store never hears the first one's heartbeat: its view lacks it for the whole test.
    blind = four[3]._writer.state.placement
    hidden = four[0].store_id
    heard = blind.on_member
    blind.on_member = lambda member: None if member.store == hidden else heard(member)
    sent = produce(tower, partitions=10, records=200)
    wait_for(lambda: len(copies(four, sent)) == 10 and all(n >= 2 for n in copies(four, sent).values()), 20,
             what="every partition on at least 2 stores")
    time.sleep(1.0)  # handoffs run: still nothing below 2 copies
    assert all(n >= 2 for n in copies(four, sent).values())
    assert read_all(tower, sent) == sent


class ReferenceStoreWriter:
    """A raw-frame store writer as the reference's: subscribes ``M`` and ``H`` (every RECORD and HEAD) and
    ``D<address>``, stores each RECORD it gets in order, and ACKs it; a HEAD past what it holds makes it
    FETCH the rest.  It never sends STORE-MEMBER, so the
    sharded stores place nothing on it; every message it gets must be an exact RFC 46 one."""

    def __init__(self, tower) -> None:
        self.address = new_address()
        self.peer = RawPeer(tower, self.address, [proto.RECORD, proto.HEAD, proto.DIRECT_RECORD + self.address.encode()])
        self.records: dict[str, list[bytes]] = collections.defaultdict(list)
        self.foreign = collections.Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ref-store-writer")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peer.pump()
            if not self.peer.sub.poll(5):
                continue
            while self.peer.sub.poll(0):
                frames = self.peer.sub.recv_multipart()
                if frames[0][:1] not in (proto.RECORD, proto.HEAD, proto.DIRECT_RECORD):
                    self.foreign[frames[0][:1]] += 1
                    continue
                msg = proto.decode(frames)
                held = self.records[msg.address]
                if type(msg) in (proto.RecordMsg, proto.DirectRecordMsg) and msg.sequence == len(held):
                    held.append(msg.content)
                    self.peer.send(proto.AckMsg(msg.address, msg.subject, msg.sequence))
                elif type(msg) is proto.HeadMsg and msg.sequence >= len(held):  # behind: FETCH, as the reference
                    self.peer.send(proto.FetchMsg(msg.address, self.address, msg.subject, len(held),
                                                  msg.sequence + 1 - len(held)))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.peer.close()


def test_a_reference_store_and_consumer_work_in_a_sharded_cluster(tower, stores):
    ref_store = ReferenceStoreWriter(tower)
    try:
        three = stores(3)
        wait_for(lambda: ref_store.peer.peers and all(s.stats()["writer_peers"] >= 4 for s in three), 10,
                 what="the reference store to meet the sharded stores")
        time.sleep(0.5)
        # A reference store does not refill from other stores: it must hear the producers before they send.
        sent = produce(tower, partitions=6, records=300, min_acks=2,
                       ready=lambda producers: {p.endpoint for p in producers} <= ref_store.peer.peers)
        wait_for(lambda: copies(three, sent) == collections.Counter(dict.fromkeys(sent, 2)), 20,
                 what="every partition on exactly 2 sharded stores")
        # The reference store holds everything (it is placed nowhere), as RFC 46 RECORDs only.
        wait_for(lambda: dict(ref_store.records) == sent, 20, what="the reference store to hold every record")
        assert not ref_store.foreign
        for store in three:
            assert ref_store.address not in {m.writer for m in store._writer.state.placement.members.values()}
        # A reference consumer reads everything from the beginning, from whichever stores hold it.
        ref = RefConsumer(tower.sub_endpoint, tower.pub_endpoint, new_address(), earliest=True, keep=True)
        try:
            ref.subscribe(TOPIC)
            assert ref.run(lambda: ref.total() >= 1800, timeout=60), ref.delivered
            assert {partition: ref.contents[(TOPIC, partition)] for partition in sent} == sent
            assert ref.foreign == 0
        finally:
            ref.close()
    finally:
        ref_store.close()


def test_a_store_that_restarts_keeps_its_identity_and_nothing_moves(tower, stores, tmp_path):
    three = stores(3, **{"store/dead_ms": 8000})
    sent = produce(tower, partitions=8, records=100)
    wait_for(lambda: copies(three, sent) == collections.Counter(dict.fromkeys(sent, 2)), 20, what="2 copies each")
    identity, before = three[1].store_id, dict(three[1].heads())
    moved = [(s.stats()["moves_in"], s.stats()["moves_out"]) for s in (three[0], three[2])]
    three[1].stop()
    time.sleep(1.2)  # past beacon/timeout, within store/dead_ms
    again = Store(config(tower, **{"store/dead_ms": 8000}), db=str(tmp_path / "s1")).start()
    try:
        assert again.store_id == identity
        time.sleep(1.5)  # past settling: it still owns what it held
        assert again.heads() == before
        assert [(s.stats()["moves_in"], s.stats()["moves_out"]) for s in (three[0], three[2])] == moved
        assert (again.stats()["moves_in"], again.stats()["moves_out"]) == (0, 0)
    finally:
        again.stop()


def test_a_reference_producer_is_stored_on_two_sharded_stores(tower, stores):
    """A raw-frame producer as the reference's (RECORDs and HEADs on its data socket, FETCH answered with
    DIRECT-RECORDs, nothing else): the sharded stores learn its partition from its HEADs, subscribe to its
    records, fetch what came before, and its two owners store and ACK every record."""
    three = stores(3)
    address = new_address(producer=True)
    # A reference producer subscribes to the ACKs and FETCHes of its own address.
    producer = RawPeer(tower, address, [proto.ACK + address.encode(), proto.FETCH + address.encode()])
    values = [b"ref-%d" % i for i in range(200)]
    acked = -1
    try:
        wait_for(lambda: producer.pump() or len(producer.peers) >= 6, 10, what="the stores to connect")
        for seq, value in enumerate(values):
            producer.send(proto.RecordMsg(TOPIC, address, TOPIC, seq, value))
            if seq % 50 == 0:
                producer.send(proto.HeadMsg(TOPIC, address, TOPIC, seq))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and (acked < 199 or copies(three, {address: values})[address] < 2):
            producer.pump()
            producer.send(proto.HeadMsg(TOPIC, address, TOPIC, 199))
            while producer.sub.poll(50):
                frames = producer.sub.recv_multipart()
                assert frames[0][:1] in (proto.ACK, proto.FETCH), frames[0][:1]  # nothing but RFC 46 replies
                msg = proto.decode(frames)
                if type(msg) is proto.FetchMsg and msg.topic == address:
                    for seq in range(msg.sequence, min(msg.sequence + msg.count, len(values))):
                        producer.send(proto.DirectRecordMsg(msg.address, address, TOPIC, seq, values[seq]))
                elif type(msg) is proto.AckMsg and msg.topic == address:
                    acked = max(acked, msg.sequence)
        assert acked == 199
        time.sleep(0.5)
        assert copies(three, {address: values}) == collections.Counter({address: 2})  # its owners, only they
    finally:
        producer.close()
    assert read_all(tower, {address: values}) == {address: values}


def test_a_resumed_partition_continues_after_the_head_its_owners_hold(tower, stores):
    """Producer(resume=True) (CDC's partitions) asks the stores for its head: only its owners know it."""
    stores(3)
    from dafka import partition_address

    address = partition_address("sharded-resume")
    settings = config(tower, **{"producer/min_acks": 2})
    with Producer(TOPIC, settings, address=address, resume=True) as first:
        for i in range(30):
            first.send(b"a%d" % i)
        first.flush(20)
    with Producer(TOPIC, settings, address=address, resume=True) as second:
        assert second.send(b"b0").get(20).offset == 30
