"""A reference consumer (the raw-frame peer of bench/dafkabench/refconsumer.py, which FETCHes
only on a HEAD, a DIRECT-HEAD or a gap, through the reference's fetch filter)
catches up fully from a dafka-py store after the producer has left, next to a
dafka-py consumer reading the same store in bulk (issue: the in-flight budget
waited for a FETCH that a reference consumer never sends)."""

from __future__ import annotations

import time

import pytest

from dafka import Consumer, Producer
from dafka.core.addresses import new_address
from dafka.store import Store
from helpers import loopback_config
from dafkabench.refconsumer import RefConsumer

TOPIC = "catchup"


def fill(tower, db, count: int, size: int) -> str:
    """``count`` records of ``size`` bytes, stored and acked; the producer then leaves."""
    with Producer(TOPIC, loopback_config(tower)) as producer:
        pad = b"x" * (size - 8)
        for seq in range(count):
            producer.send(seq.to_bytes(8, "big") + pad)
        producer.flush(120)
        return producer.address


def expected(count: int, size: int) -> list[bytes]:
    pad = b"x" * (size - 8)
    return [seq.to_bytes(8, "big") + pad for seq in range(count)]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("count,size,budget", [
    (250_000, 100, None),       # blocks of 100,000 fit the default budget's cap
    (120_000, 1_000, None),
    (30_000, 100, 1 << 20),     # a tight budget: answers pause inside blocks, DIRECT-HEADs pace them
])
def test_a_reference_consumer_gets_every_record_from_a_dafka_store_after_the_producer_left(
        tower, tmp_path, count, size, budget):
    overrides = {} if budget is None else {"store__fetch_inflight_bytes": budget}
    store = Store(loopback_config(tower, **overrides), db=str(tmp_path / "db")).start()
    ref = None
    try:
        partition = fill(tower, tmp_path / "db", count, size)
        ref = RefConsumer(tower.sub_endpoint, tower.pub_endpoint, new_address(), earliest=True, keep=True)
        ref.subscribe(TOPIC)
        assert ref.run(lambda: ref.total() >= count, timeout=240), (ref.delivered, store.stats())
        assert ref.contents[(TOPIC, partition)] == expected(count, size)  # every record, once, in order
        assert ref.foreign == 0  # nothing but exact RFC 46 messages reached it
        stats = store.stats()
        assert stats["paced_heads"] >= 1 and stats["bulk_messages"] == 0
        assert all(f.count <= 100_000 and (f.sequence + f.count) % 100_000 == 0 for f in ref.fetches)
    finally:
        if ref is not None:
            ref.close()
        store.stop()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_reference_and_a_dafka_consumer_catch_up_from_one_store_at_the_same_time(tower, tmp_path):
    count = 150_000
    store = Store(loopback_config(tower), db=str(tmp_path / "db")).start()
    ref = None
    consumer = None
    try:
        partition = fill(tower, tmp_path / "db", count, 100)
        ref = RefConsumer(tower.sub_endpoint, tower.pub_endpoint, new_address(), earliest=True, keep=True)
        ref.subscribe(TOPIC)
        consumer = Consumer(TOPIC, config=loopback_config(tower, consumer__offset__reset="earliest"))
        got: list[bytes] = []
        offsets: list[int] = []
        deadline = time.monotonic() + 240
        while (ref.total() < count or len(got) < count) and time.monotonic() < deadline:
            ref.step(0.005)
            for record in consumer.consume(20_000, 0.005):
                got.append(record.value)
                offsets.append(record.offset)
        assert offsets == list(range(count)) and got == expected(count, 100)
        assert ref.contents[(TOPIC, partition)] == expected(count, 100)
        assert ref.foreign == 0
        stats = store.stats()
        assert stats["bulk_messages"] > 0  # the dafka-py consumer read in bulk...
        assert stats["records_served"] >= 2 * count  # ...and the reference one got DIRECT-RECORDs
    finally:
        if consumer is not None:
            consumer.close()
        if ref is not None:
            ref.close()
        store.stop()


@pytest.mark.timeout(60)
def test_a_reference_consumer_never_gets_the_producers_direct_tail(tower):
    """A no-store producer tells a requester that the records it asks for are held by nobody any more with
    a DIRECT-TAIL (rfc 6.3), to ``T<requester>``: a reference consumer never subscribes to it, so libzmq
    never sends it one, and it keeps getting only RFC 46 messages (``foreign`` counts any other)."""
    config = loopback_config(tower, producer__min_acks=0, producer__max_unacked=500)
    ref = RefConsumer(tower.sub_endpoint, tower.pub_endpoint, new_address(), earliest=True)
    with Producer(TOPIC, config) as producer:
        for seq in range(2000):
            producer.send(b"%d" % seq)
        ref.subscribe(TOPIC)
        assert ref.run(lambda: producer.stats()["tails_sent"] >= 1 and ref.received > 0, 30), producer.stats()
        ref.run(lambda: False, 1.0)  # whatever else comes
        assert ref.foreign == 0 and ref.fetches[0].sequence == 0
    ref.close()
