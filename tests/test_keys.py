"""Keyed records (rfc/dafka.md section 18) between real peers: a producer's keys reach dafka-py consumers
live and from the stores, in both APIs; a dafka-py 0.2 peer (RECORDS) and a reference consumer (RFC 46
messages only) get every value without ever seeing a frame they would not understand."""

from __future__ import annotations

import asyncio
import time

import pytest

from dafka import Consumer, Producer, protocol as proto
from dafka.protocol import attributes
from dafka.aio import AsyncConsumer, AsyncProducer
from dafka.core.addresses import new_address
from dafka.store import Store
from helpers import loopback_config, take, wait_for
from rawpeer import RawPeer
from dafkabench.refconsumer import RefConsumer

TOPIC = "keyed"


def key_of(i: int) -> str | None:
    return None if i % 3 == 0 else f"k{i % 7}"


def reference_reads_the_values(tower, address: str, n: int) -> RefConsumer:
    """A reference consumer from the beginning gets every value (``v0``, ``v1``, ...) as RFC 46
    DIRECT-RECORDs, and nothing else; returned for the caller to close."""
    ref = RefConsumer(tower.sub_endpoint, tower.pub_endpoint, new_address(), earliest=True, keep=True)
    try:
        ref.subscribe(TOPIC)
        assert ref.run(lambda: ref.total() >= n, 30), ref.delivered
        assert ref.contents[(TOPIC, address)] == [b"v%d" % i for i in range(n)]
        assert ref.foreign == 0
    except BaseException:
        ref.close()
        raise
    return ref


@pytest.mark.timeout(120)
def test_keys_reach_consumers_live_and_from_the_stores_and_a_reference_consumer_gets_the_values(tower, tmp_path):
    stores = [Store(loopback_config(tower), db=str(tmp_path / f"db{i}")).start() for i in range(2)]
    live = Consumer(TOPIC, config=loopback_config(tower, consumer__offset__reset="earliest"),
                    key_deserializer=bytes.decode)
    producer = Producer(TOPIC, loopback_config(tower, producer__min_acks=2), key_serializer=str.encode)
    ref = None
    try:
        wait_for(lambda: producer.stats()["audience_batches"] and live.poll(0.01) is None
                 and producer.stats()["peers"] >= 5, what="the consumer and the stores subscribed")
        for i in range(2_000):
            producer.send(b"v%d" % i, key=key_of(i))
        producer.send_many([b"v%d" % i for i in range(2_000, 3_000)], keys=[key_of(i) for i in range(2_000, 3_000)])
        producer.flush(30)
        expected = [(i, b"v%d" % i, key_of(i)) for i in range(3_000)]
        assert [(r.offset, r.value, r.key) for r in take(live, 3_000)] == expected
        address = producer.address
        producer.close(timeout=10)
        # a late consumer reads it all from the stores (the producer is gone): keys included
        with Consumer(TOPIC, config=loopback_config(tower, consumer__offset__reset="earliest")) as late:
            got = take(late, 3_000)
        assert [(r.offset, r.value, r.key) for r in got] == [
            (i, v, None if k is None else k.encode()) for i, v, k in expected]
        ref = reference_reads_the_values(tower, address, 3_000)
    finally:
        if ref is not None:
            ref.close()
        producer.close(timeout=5)
        live.close()
        for store in stores:
            store.stop()


@pytest.mark.timeout(120)
def test_timestamps_and_headers_reach_consumers_live_and_from_a_restarted_store_and_a_reference_gets_the_values(
        tower, tmp_path):
    """rfc 18.4: what ``send(headers=, timestamp_ms=)`` and ``send_many(attributes=)`` give a record reaches a
    live consumer and, once the producer is gone and the store restarted, a late one from the database; a
    reference consumer gets the values as RFC 46 messages, and nothing else."""
    store = Store(loopback_config(tower), db=str(tmp_path / "db")).start()
    live = Consumer(TOPIC, config=loopback_config(tower, consumer__offset__reset="earliest"))
    producer = Producer(TOPIC, loopback_config(tower, producer__min_acks=1))
    ref = None

    def expected(i: int) -> tuple:
        if i % 4 == 0:
            return i, b"v%d" % i, None, ()
        return i, b"v%d" % i, 1_700_000_000_000 + i, (("n", b"%d" % i), ("null", None))[: 1 + i % 2]

    try:
        wait_for(lambda: producer.stats()["audience_batches"] and live.poll(0.01) is None
                 and producer.stats()["peers"] >= 3, what="the consumer and the store subscribed")
        for i in range(500):
            _, _, ts, headers = expected(i)
            producer.send(b"v%d" % i, headers=None if ts is None else list(headers), timestamp_ms=ts)
        held = [None if expected(i)[2] is None else attributes.record_attributes(expected(i)[3], expected(i)[2])
                for i in range(500, 1_000)]
        producer.send_many([b"v%d" % i for i in range(500, 1_000)], attributes=held)
        with pytest.raises(ValueError, match="timestamp_ms"):
            producer.send(b"x", timestamp_ms=1.5)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="a header is a"):
            producer.send(b"x", headers=[("h", "not bytes")])  # type: ignore[list-item]
        producer.flush(30)
        want = [expected(i) for i in range(1_000)]
        assert [(r.offset, r.value, r.timestamp, r.headers) for r in take(live, 1_000)] == want
        address = producer.address
        producer.close(timeout=10)
        store.stop()
        store = Store(loopback_config(tower), db=str(tmp_path / "db")).start()
        with Consumer(TOPIC, config=loopback_config(tower, consumer__offset__reset="earliest")) as late:
            got = take(late, 1_000)
        assert [(r.offset, r.value, r.timestamp, r.headers) for r in got] == want
        ref = reference_reads_the_values(tower, address, 1_000)
    finally:
        if ref is not None:
            ref.close()
        producer.close(timeout=5)
        live.close()
        store.stop()


@pytest.mark.timeout(60)
def test_a_02_peer_gets_records_without_keys_beside_a_consumer_that_reads_them(tower):
    """A dafka-py 0.2 consumer subscribes RECORDS (``S<topic>``), not KEYED-RECORDS: the producer sends it
    the same batches, without their keys, and sends the keyed ones to whoever asked for them."""
    old = RawPeer(tower, new_address(), [proto.subscription(proto.RECORD, TOPIC, exact=True),
                                         proto.subscription(proto.RECORDS, TOPIC, exact=True)])
    consumer = Consumer(TOPIC, config=loopback_config(tower, consumer__offset__reset="earliest"))
    producer = Producer(TOPIC, loopback_config(tower, producer__min_acks=0))
    try:
        wait_for(lambda: (old.pump(), producer.stats()["peers"] >= 2)[1] and consumer.poll(0.01) is None
                 and producer._state.audience.plain and producer._state.audience.keyed,
                 what="both subscribed")
        producer.send_many([b"a", b"b", b"c"], keys=[b"ka", None, b"kc"])
        plain = old.recv(proto.RecordsMsg)
        assert proto.split_contents(plain.lengths, plain.contents) == [b"a", b"b", b"c"]
        assert not producer._state.audience.records  # it reads batches: no RECORD for it
        got = take(consumer, 3, timeout=10)
        assert [(r.value, r.key) for r in got] == [(b"a", b"ka"), (b"b", None), (b"c", b"kc")]
    finally:
        producer.close(timeout=5)
        consumer.close()
        old.close()


@pytest.mark.timeout(60)
def test_beside_a_reference_consumer_a_dafka_py_consumer_still_gets_every_key(tower):
    """The reference consumer needs RECORDs, which PUB sends to the dafka-py consumer too: the producer sends
    a keyed record's batch first, so that the form with the key is the one the consumer takes."""
    ref = RefConsumer(tower.sub_endpoint, tower.pub_endpoint, new_address(), earliest=False)
    ref.subscribe(TOPIC)
    consumer = Consumer(TOPIC, config=loopback_config(tower, consumer__offset__reset="earliest"))
    producer = Producer(TOPIC, loopback_config(tower, producer__min_acks=0))
    try:
        assert ref.run(lambda: producer.stats()["audience_records"] == 1 and consumer.poll(0.01) is None
                       and producer._state.audience.keyed, 20), "both subscribed"
        time.sleep(0.2)  # (the reference's prefix settled: it gets RECORDs)
        for i in range(300):
            producer.send(b"v%d" % i, key=key_of(i) and key_of(i).encode())
        got = take(consumer, 300, timeout=20)
        assert [(r.value, r.key) for r in got] == [(b"v%d" % i, key_of(i) and key_of(i).encode()) for i in range(300)]
        assert ref.run(lambda: ref.total() >= 299, 20), ref.delivered  # (latest: from the HEAD on)
    finally:
        producer.close(timeout=5)
        consumer.close()
        ref.close()


@pytest.mark.timeout(60)
def test_the_async_api_sends_and_reads_keys(tower):
    async def main() -> list:
        config = loopback_config(tower, consumer__offset__reset="earliest", producer__min_acks=0)
        async with AsyncConsumer(TOPIC, config=config, key_deserializer=bytes.decode,
                                 value_deserializer=bytes.decode) as consumer:
            async with AsyncProducer(TOPIC, config, key_serializer=str.encode) as producer:
                await asyncio.sleep(0.5)
                for i in range(5):
                    await producer.send(b"v%d" % i, key=key_of(i))
                got = []
                while len(got) < 5:
                    got.append(await asyncio.wait_for(consumer.getone(), 20))
                return got

    got = asyncio.run(main())
    assert [(r.value, r.key) for r in got] == [(f"v{i}", key_of(i)) for i in range(5)]


def test_bad_keys_are_refused_before_anything_is_sent(tower):
    with Producer(TOPIC, loopback_config(tower, producer__min_acks=0, producer__max_record_bytes=10)) as producer:
        with pytest.raises(TypeError, match="record key must be bytes .or set key_serializer., got str"):
            producer.send(b"v", key="text")
        with pytest.raises(ValueError, match="2 keys for 1 values"):
            producer.send_many([b"v"], keys=[b"a", b"b"])
        with pytest.raises(Exception, match="record of 11 bytes is over producer/max_record_bytes=10"):
            producer.send(b"v" * 6, key=b"k" * 5)  # the key counts
        assert producer._state.next_seq == 0  # nothing was sent
