"""Live records in batches (RECORDS, rfc/dafka.md section 13) between dafka-py
peers, with a reference consumer (the raw-frame peer of bench/dafkabench/refconsumer.py) on
the same topic: it still gets every record as a RECORD, and only while it is
there does the producer send RECORDs at all."""

from __future__ import annotations

import time

import pytest

from dafka import Consumer, Producer, RecordTooLarge
from dafka.core.addresses import new_address
from dafka.store import Store
from helpers import loopback_config, take, wait_for
from dafkabench.refconsumer import RefConsumer

TOPIC = "live"


def send(producer: Producer, first: int, n: int) -> None:
    for seq in range(first, first + n):
        producer.send(b"%08d" % seq)


@pytest.mark.timeout(120)
def test_dafka_peers_get_batches_and_a_reference_consumer_records(tower, tmp_path):
    store = Store(loopback_config(tower), db=str(tmp_path / "db")).start()
    consumer = Consumer(TOPIC, config=loopback_config(tower, consumer__offset__reset="earliest"))
    producer = Producer(TOPIC, loopback_config(tower))
    ref = None
    try:
        wait_for(lambda: producer.stats()["audience_batches"] and consumer.poll(0.01) is None
                 and producer.stats()["peers"] >= 3, what="the consumer and the store subscribed")
        stats = producer.stats()
        assert stats["audience_batches"] == 1 and stats["audience_records"] == 0  # nobody needs RECORDs
        send(producer, 0, 20_000)
        producer.flush(30)
        assert [r.offset for r in take(consumer, 20_000)] == list(range(20_000))
        assert producer.stats()["batches_sent"] < 20_000  # bursts went out in batches

        ref = RefConsumer(tower.sub_endpoint, tower.pub_endpoint, new_address(), earliest=False, keep=True)
        ref.subscribe(TOPIC)
        assert ref.run(lambda: producer.stats()["audience_records"] == 1, 10), "the producer saw the reference"
        time.sleep(0.2)
        send(producer, 20_000, 5_000)
        producer.flush(30)
        # "latest": the HEAD it got on subscribing (19,999) is where it starts, as the reference does.
        assert ref.run(lambda: ref.total() >= 5_001, 30), ref.delivered
        assert ref.contents[(TOPIC, producer.address)] == [b"%08d" % s for s in range(19_999, 25_000)]
        assert ref.foreign == 0  # only RFC 46 messages reached it
        got = take(consumer, 5_000)
        assert [r.offset for r in got] == list(range(20_000, 25_000))  # RECORD and RECORDS: each once

        ref.close()
        ref = None
        wait_for(lambda: producer.stats()["audience_records"] == 0, 10, what="the reference consumer gone")
        send(producer, 25_000, 1_000)
        producer.flush(30)
        assert [r.offset for r in take(consumer, 1_000)] == list(range(25_000, 26_000))
        assert store.heads()[(TOPIC, producer.address)] == 25_999  # the store read the batches too
    finally:
        if ref is not None:
            ref.close()
        producer.close(timeout=5)
        consumer.close()
        store.stop()


@pytest.mark.timeout(60)
def test_a_lone_record_is_not_held_back(tower):
    """Records sent one at a time go out at once, as one-record batches."""
    consumer = Consumer(TOPIC, config=loopback_config(tower))
    producer = Producer(TOPIC, loopback_config(tower, producer__min_acks=0))
    try:
        # (the consumer does its work, connecting included, in poll())
        wait_for(lambda: consumer.poll(0.01) is None and producer.stats()["audience_batches"],
                 what="the consumer subscribed")
        latencies = []
        for seq in range(50):
            sent = time.monotonic()
            producer.send(b"%d" % seq)
            record = consumer.poll(5)
            assert record is not None and record.offset >= 0
            latencies.append(time.monotonic() - sent)
            time.sleep(0.002)
        assert producer.stats()["audience_records"] == 0
        # Not a timing assertion about speed: nothing waits for a batch to fill (1 s would).
        assert sorted(latencies)[len(latencies) // 2] < 0.5
    finally:
        producer.close(timeout=0)
        consumer.close()


@pytest.mark.timeout(120)
def test_send_many_publishes_a_burst_in_full_batches_and_records_to_a_reference_consumer(tower, tmp_path):
    store = Store(loopback_config(tower), db=str(tmp_path / "db")).start()
    consumer = Consumer(TOPIC, config=loopback_config(tower, consumer__offset__reset="earliest"))
    producer = Producer(TOPIC, loopback_config(tower))
    ref = RefConsumer(tower.sub_endpoint, tower.pub_endpoint, new_address(), earliest=True, keep=True)
    try:
        ref.subscribe(TOPIC)
        # (the consumers do their work, connecting included, when they are run: run them first)
        wait_for(lambda: consumer.poll(0.01) is None and ref.run(lambda: False, 0.01) is False
                 and producer.stats()["audience_batches"] and producer.stats()["audience_records"]
                 and producer.stats()["peers"] >= 4, what="the consumers and the store subscribed")
        assert producer.send_many([]) == 0
        assert producer.send_many([b"%08d" % s for s in range(3000)]) == 0
        assert producer.send_many([bytearray(b"%08d" % s) for s in range(3000, 3010)]) == 3000
        assert producer.stats()["batches_sent"] == 2  # 3000 in one RECORDS, then 10: not one each
        assert producer.send_many([b"x" * 4000] * 100) == 3010  # 400,000 bytes: two RECORDS of at most 256 KiB
        assert producer.stats()["batches_sent"] == 4
        producer.flush(30)  # (the store has written them all: it is the one store that acks)
        expected = [b"%08d" % s for s in range(3010)] + [b"x" * 4000] * 100
        assert [(r.offset, r.value) for r in take(consumer, 3110)] == list(enumerate(expected))
        assert ref.run(lambda: ref.total() >= 3110, 30), ref.delivered
        assert ref.contents[(TOPIC, producer.address)] == expected
        assert ref.foreign == 0
        assert store.heads()[(TOPIC, producer.address)] == 3109
        with pytest.raises(RecordTooLarge):
            producer.send_many([b"ok", b"x" * (producer.max_record_bytes + 1)])
        assert producer.stats()["sent"] == 3110  # nothing of a refused burst went out
    finally:
        ref.close()
        producer.close(timeout=5)
        consumer.close()
        store.stop()
