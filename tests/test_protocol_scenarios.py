"""The reference's own protocol scenarios, played against our peers by a test
peer that speaks raw frames (as a C peer would)."""

from __future__ import annotations

import time

import pytest

from helpers import loopback_config
from dafka import Consumer, FlushTimeout, Producer, protocol as proto
from rawpeer import RawPeer

READER = "5" * 32
PRODUCER = "9" * 32
TESTER = "7" * 32


def poller(consumer):
    return lambda: consumer.poll(0.005)


@pytest.mark.parametrize("topics,earliest,expected", [
    ((), True, ()),
    (("hello",), True, ("hello",)),
    (("hello",), False, ("hello",)),  # latest too (rfc 8.3): a partition born after its subscription may be
    # known only to the stores (its producer gone), and the reader tells when each record came
])
def test_store_hello_gets_consumer_hello(tower, topics, earliest, expected):
    reader = RawPeer(tower, READER, [proto.subscription(proto.CONSUMER_HELLO, READER)])
    reset = "earliest" if earliest else "latest"
    consumer = Consumer(*topics, config=loopback_config(tower, consumer__offset__reset=reset))
    try:
        reader.wait_subscribed(b"L" + consumer.address.encode(), also=poller(consumer))
        reader.send(proto.StoreHelloMsg(consumer.address, READER))
        hello = reader.recv(proto.ConsumerHelloMsg, also=poller(consumer))
        assert hello == proto.ConsumerHelloMsg(READER, consumer.address, expected)
    finally:
        consumer.close()
        reader.close()


def test_subscribe_sends_get_heads(tower):
    store = RawPeer(tower, READER, [proto.subscription(proto.GET_HEADS),
                                    proto.subscription(proto.CONSUMER_HELLO, READER)])
    consumer = Consumer(config=loopback_config(tower, consumer__offset__reset="earliest"))
    try:
        # the consumer greets the store as soon as the store's SUB reaches it
        store.recv(proto.ConsumerHelloMsg, also=poller(consumer))
        consumer.subscribe("hello")
        msg = store.recv(proto.GetHeadsMsg, also=poller(consumer))
        assert msg == proto.GetHeadsMsg("hello", consumer.address)
    finally:
        consumer.close()
        store.close()


def test_earliest_record_one_first_fetches_zero_then_delivers(tower):
    producer = RawPeer(tower, PRODUCER, [proto.subscription(proto.FETCH, PRODUCER)])
    consumer = Consumer("hello", config=loopback_config(tower, consumer__offset__reset="earliest"))
    try:
        producer.wait_subscribed(b"Mhello", also=poller(consumer))
        producer.send(proto.RecordMsg("hello", PRODUCER, "hello", 1, b"SECOND"))
        fetch = producer.recv(proto.FetchMsg, also=poller(consumer))
        assert (fetch.topic, fetch.address, fetch.subject, fetch.sequence) == (PRODUCER, consumer.address, "hello", 0)
        assert fetch.count >= 1
        producer.send(proto.RecordMsg("hello", PRODUCER, "hello", 0, b"CONTENT"))
        first = consumer.poll(5)
        second = consumer.poll(5)
        assert (first.partition, first.offset, first.value) == (PRODUCER, 0, b"CONTENT")
        assert (second.offset, second.value) == (1, b"SECOND")
    finally:
        consumer.close()
        producer.close()


def test_latest_record_two_first_is_delivered_at_once(tower):
    producer = RawPeer(tower, PRODUCER, [proto.subscription(proto.FETCH, PRODUCER)])
    consumer = Consumer("hello", config=loopback_config(tower, consumer__offset__reset="latest"))
    try:
        producer.wait_subscribed(b"Mhello", also=poller(consumer))
        producer.send(proto.RecordMsg("hello", PRODUCER, "hello", 2, b"CONTENT"))
        record = consumer.poll(5)
        assert (record.topic, record.partition, record.offset, record.value) == ("hello", PRODUCER, 2, b"CONTENT")
    finally:
        consumer.close()
        producer.close()


def test_consumer_ignores_other_topics_even_with_shared_prefix(tower):
    producer = RawPeer(tower, PRODUCER, [])
    consumer = Consumer("hello", config=loopback_config(tower))
    try:
        producer.wait_subscribed(b"Mhello", also=poller(consumer))
        producer.send(proto.RecordMsg("hello2", PRODUCER, "hello2", 0, b"WRONG"))
        producer.send(proto.RecordMsg("hello", PRODUCER, "hello", 0, b"RIGHT"))
        assert consumer.poll(5).value == b"RIGHT"
        assert consumer.poll(0.2) is None
    finally:
        consumer.close()
        producer.close()


def test_producer_answers_fetch_with_direct_record(tower):
    tester = RawPeer(tower, TESTER, [proto.subscription(proto.DIRECT_RECORD, TESTER),
                                     proto.subscription(proto.HEAD, "hello")])
    producer = Producer("hello", loopback_config(tower, producer__min_acks=1))
    try:
        producer.send(b"CONTENT")
        tester.wait_subscribed(b"F" + producer.address.encode())
        tester.recv(proto.HeadMsg)  # sent to every new subscriber: our SUB is connected
        tester.send(proto.FetchMsg(producer.address, TESTER, "hello", 0, 1))
        answer = tester.recv(proto.DirectRecordMsg)
        assert answer == proto.DirectRecordMsg(TESTER, producer.address, "hello", 0, b"CONTENT")
    finally:
        with pytest.raises(FlushTimeout):  # no store ever acked it
            producer.close(timeout=0.01)
        tester.close()


def test_producer_sends_head_at_regular_intervals(tower):
    tester = RawPeer(tower, TESTER, [proto.subscription(proto.HEAD, "hello")])
    producer = Producer("hello", loopback_config(tower, producer__head_interval=100, producer__min_acks=0))
    try:
        tester.wait_subscribed(b"F" + producer.address.encode())
        producer.send(b"a")
        producer.send(b"b")
        # The producer's loop may send a HEAD between the two sends (its interval is due, or it answers our
        # subscription): that one says 0.  From the first that says 1, every HEAD says 1.
        tester.recv(proto.HeadMsg, where=lambda h: h.sequence == 1)
        heads = [tester.recv(proto.HeadMsg) for _ in range(6)]
        stamps = []
        for _ in range(11):
            tester.recv(proto.HeadMsg)
            stamps.append(time.monotonic())
        assert all(h == proto.HeadMsg("hello", producer.address, "hello", 1) for h in heads)
        # Every 100 ms on average; one HEAD late and the next on time arrive 12 ms apart on a loaded machine.
        gaps = [b - a for a, b in zip(stamps, stamps[1:])]
        assert 0.05 < sum(gaps) / len(gaps) < 0.3 and max(gaps) < 1.0, gaps
    finally:
        producer.close()
        tester.close()
