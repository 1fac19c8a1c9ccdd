"""Kafka clients beside dafka's own peers: partitions that dafka-py and reference producers write, read by
Kafka consumers at numbers that never change; what Kafka producers write, read by dafka-py and reference
consumers; a sharded cluster behind the gateway."""

from __future__ import annotations

import time

import pytest

from helpers import loopback_config, wait_for
from kafkahelpers import kcat, start_gateway
from rawpeer import RawPeer
from dafkabench.refconsumer import RefConsumer

from dafka import Consumer, Producer, protocol as proto
from dafka.kafka.mapping import address_of
from dafka.core.addresses import new_address
from dafka.store import Store

pytestmark = pytest.mark.kafka


def read_all(bootstrap: str, topic: str) -> dict[int, list[tuple[int, str]]]:
    """Every record of ``topic`` through kcat, by Kafka partition: (offset, value)."""
    read = kcat("-b", bootstrap, "-C", "-t", topic, "-e", "-f", "%p %o %s\n")
    assert read.returncode == 0, read.stderr
    out: dict[int, list[tuple[int, str]]] = {}
    for line in read.stdout.decode().splitlines():
        partition, offset, value = line.split(" ", 2)
        out.setdefault(int(partition), []).append((int(offset), value))
    return out


def partitions_listed(bootstrap: str, topic: str) -> int:
    listed = kcat("-b", bootstrap, "-L", "-t", topic).stdout.decode()
    return next((int(line.split(" with ")[1].split()[0]) for line in listed.splitlines()
                 if line.strip().startswith(f'topic "{topic}" with')), 0)


def test_partitions_dafka_and_reference_producers_write_are_read_by_kafka_consumers_at_numbers_that_stay(
        kafka_cluster, processes, tmp_path):
    confluent_kafka = pytest.importorskip("confluent_kafka")
    tower, store = kafka_cluster
    topic = "mixed"
    with Producer(topic, loopback_config(tower)) as producer:
        for i in range(30):
            producer.send(b"py %d" % i, key=b"k%d" % (i % 3))
        producer.flush(10)
        python_address = producer.address
    reference_address = new_address()
    reference = RawPeer(tower, reference_address, [])
    try:
        reference.wait_subscribed(proto.RECORD)  # the store's SUB
        time.sleep(0.2)
        for i in range(20):
            reference.send(proto.RecordMsg(topic, reference_address, topic, i, b"ref %d" % i))
        reference.send(proto.HeadMsg(topic, reference_address, topic, 19))
        wait_for(lambda: store.heads().get((topic, reference_address)) == 19, 10, what="the store kept the records")
    finally:
        reference.close()
    assert store.heads()[(topic, python_address)] == 29

    log = tmp_path / "gw.log"
    gateway, bootstrap = start_gateway(processes, tower, log)
    assert partitions_listed(bootstrap, topic) == 2
    first = read_all(bootstrap, topic)
    numbers = {address: sorted([python_address, reference_address]).index(address)
               for address in (python_address, reference_address)}  # (no gateway partition: sorted addresses)
    assert first == {numbers[python_address]: [(i, f"py {i}") for i in range(30)],
                     numbers[reference_address]: [(i, f"ref {i}") for i in range(20)]}

    # A Kafka producer cannot write the topic: every record is refused, at once, for good.
    kafka_producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "message.send.max.retries": 3})
    reports: list = []
    kafka_producer.produce(topic, b"kafka", callback=lambda err, msg: reports.append(err))
    kafka_producer.flush(20)
    assert len(reports) == 1 and reports[0] is not None
    assert reports[0].code() == confluent_kafka.KafkaError.TOPIC_EXCEPTION, reports[0]
    assert not reports[0].retriable()
    del kafka_producer  # (librdkafka's handle: it would go on connecting to the gateway restarted below)

    # A partition born after the gateway started follows at the next number, and is read live.
    late = Producer(topic, loopback_config(tower))
    try:
        for i in range(5):
            late.send(b"late %d" % i)
        late.flush(10)
        wait_for(lambda: partitions_listed(bootstrap, topic) == 3, 30, what="the third partition listed")
        assert read_all(bootstrap, topic)[2] == [(i, f"late {i}") for i in range(5)]
        consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": "readers",
                                             "enable.auto.commit": False, "auto.offset.reset": "earliest"})
        try:
            consumer.assign([confluent_kafka.TopicPartition(topic, 2, 5)])
            assert consumer.poll(1.0) is None  # (at the end)
            late.send(b"live")
            late.flush(10)
            deadline = time.monotonic() + 10
            got = None
            while got is None and time.monotonic() < deadline:
                got = consumer.poll(0.2)
            assert got is not None and got.error() is None and (got.partition(), got.offset(), got.value()) == (
                2, 5, b"live")
            # a commit on a foreign partition, kept in the cluster as the others
            consumer.commit(offsets=[confluent_kafka.TopicPartition(topic, p, o)
                                     for p, o in ((0, 7), (1, 9), (2, 6))], asynchronous=False)
        finally:
            consumer.close()
    finally:
        late.close(timeout=5)

    # A restarted gateway gives every partition the number it had, and serves the commits unchanged.
    gateway.terminate()
    gateway.wait(15)
    _, bootstrap = start_gateway(processes, tower, log)
    again = read_all(bootstrap, topic)
    assert {p: rows for p, rows in again.items() if p != 2} == first
    assert again[2] == [(i, f"late {i}") for i in range(5)] + [(5, "live")]
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": "readers"})
    try:
        committed = consumer.committed([confluent_kafka.TopicPartition(topic, p) for p in range(3)], timeout=20)
        assert [(tp.partition, tp.offset) for tp in committed] == [(0, 7), (1, 9), (2, 6)]
    finally:
        consumer.close()


def test_a_kafka_producers_records_reach_a_dafka_consumer_and_a_reference_consumer_as_plain_records(
        kafka_cluster, processes, tmp_path):
    confluent_kafka = pytest.importorskip("confluent_kafka")
    tower, store = kafka_cluster
    topic = "from-kafka"
    _, bootstrap = start_gateway(processes, tower, tmp_path / "gw.log")
    reference = RefConsumer(tower.sub_endpoint, tower.pub_endpoint, new_address(), earliest=True, keep=True)
    try:
        reference.subscribe(topic)
        producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
        values = [b"value %d" % i for i in range(500)]
        for i, value in enumerate(values):
            producer.produce(topic, value, key=b"k%d" % (i % 7), headers=[("i", b"%d" % i)] if i % 2 else None,
                             timestamp=1_600_000_000_000 + i)
        assert producer.flush(30) == 0
        address = address_of(topic, 0)
        assert reference.run(lambda: reference.total() >= 500, 30), reference.delivered
        assert reference.contents[(topic, address)] == values  # the value as the content, nothing else
        assert reference.foreign == 0  # no frame a reference peer would not understand
        with Consumer(topic, config=loopback_config(tower, consumer__offset__reset="earliest")) as consumer:
            got: list = []
            wait_for(lambda: got.extend(consumer.consume(1000, 0.05)) or len(got) >= 500, 20, what="dafka consumer")
        assert [(r.partition, r.offset, r.key, r.value, r.timestamp, r.headers) for r in got] == [
            (address, i, b"k%d" % (i % 7), value, 1_600_000_000_000 + i, (("i", b"%d" % i),) if i % 2 else ())
            for i, value in enumerate(values)]
    finally:
        reference.close()


def test_timestamps_and_headers_round_trip_from_the_stores_and_from_a_dafka_producer(kafka_cluster, processes,
                                                                                    tmp_path):
    """rfc 18.4 between Kafka clients: what a Kafka producer gave each record, read back by a Kafka consumer
    after the gateway restarted (from the stores); and what a dafka-py producer gave its records.  A
    record without a timestamp of its own is served with the time its store received it."""
    confluent_kafka = pytest.importorskip("confluent_kafka")
    tower, _ = kafka_cluster
    log = tmp_path / "gw.log"
    gateway, bootstrap = start_gateway(processes, tower, log)
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
                                         "compression.codec": "zstd"})
    for i in range(300):
        producer.produce("stamped", b"v%d" % i, headers=[("n", b"%d" % i), ("null", None), ("empty", b"")],
                         timestamp=1_500_000_000_000 + 7 * i)
    assert producer.flush(30) == 0
    before = time.time() * 1000
    with Producer("from-dafka", loopback_config(tower)) as dafka_producer:
        for i in range(10):
            dafka_producer.send(b"d%d" % i, headers=[("from", b"dafka")] if i % 2 else None,
                                timestamp_ms=1_400_000_000_000 + i if i % 3 else None)
        dafka_producer.flush(10)
    after = time.time() * 1000
    gateway.terminate()
    gateway.wait(15)
    _, bootstrap = start_gateway(processes, tower, log)

    def read(topic: str, n: int) -> list:
        consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-{topic}",
                                             "auto.offset.reset": "earliest"})
        got: list = []
        try:
            consumer.subscribe([topic])
            deadline = time.monotonic() + 30
            while len(got) < n and time.monotonic() < deadline:
                got += [m for m in consumer.consume(100, 0.2) if m.error() is None]
        finally:
            consumer.close()
        return got
    got = read("stamped", 300)
    assert [(m.value(), m.timestamp(), m.headers()) for m in got] == [
        (b"v%d" % i, (confluent_kafka.TIMESTAMP_CREATE_TIME, 1_500_000_000_000 + 7 * i),
         [("n", b"%d" % i), ("null", None), ("empty", b"")]) for i in range(300)]
    got = read("from-dafka", 10)
    assert [(m.value(), m.headers()) for m in got] == [(b"d%d" % i, [("from", b"dafka")] if i % 2 else None)
                                                       for i in range(10)]
    for i, m in enumerate(got):
        if i % 3:
            assert m.timestamp()[1] == 1_400_000_000_000 + i
        else:  # none of its own: the time its store received it (consumer/store_times)
            assert before - 1 <= m.timestamp()[1] <= after + 1, (before, after, m.timestamp())


def test_a_sharded_cluster_behind_the_gateway_keeps_every_acked_record_on_two_stores(tower, processes, tmp_path):
    """Three stores with ``store/replicas`` 2: a Kafka producer's ``acks=all`` waits for both owners, so
    with one store gone (the gateway restarted: nothing in its memory) every record is still read back."""
    confluent_kafka = pytest.importorskip("confluent_kafka")
    sharded = {"store/replicas": 2, "beacon/interval": 200, "beacon/timeout": 1000}
    stores = [Store(loopback_config(tower, **{k.replace("/", "__"): v for k, v in sharded.items()}),
                    db=str(tmp_path / f"store{i}")).start() for i in range(3)]
    try:
        args = [arg for k, v in sharded.items() for arg in ("-X", f"{k}={v}")]
        gateway, bootstrap = start_gateway(processes, tower, tmp_path / "gw.log", "--num-partitions", "3",
                                           "-X", "producer/min_acks=2", *args)
        producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
        for i in range(3000):
            producer.produce("sharded", b"v%d" % i, key=b"k%d" % i)
        assert producer.flush(60) == 0
        for p in range(3):
            holders = [s for s in stores if s.heads().get(("sharded", address_of("sharded", p)), -1) >= 0]
            # (a third store that had not yet seen the others when the first records came may hold them too)
            assert len(holders) >= 2, f"partition {p} on {len(holders)} stores"
        gateway.terminate()
        gateway.wait(15)
        stores.pop(0).stop()
        _, bootstrap = start_gateway(processes, tower, tmp_path / "gw.log", *args)
        read = read_all(bootstrap, "sharded")
        assert sorted(v for rows in read.values() for _, v in rows) == sorted(f"v{i}" for i in range(3000))
    finally:
        for store in stores:
            store.stop()
