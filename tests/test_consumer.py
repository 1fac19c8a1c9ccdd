"""Consumer API: offsets file, seek/position, iteration, deserializer, bad input."""

from __future__ import annotations

import msgpack
import pytest

from helpers import loopback_config
from dafka import Closed, Consumer, Producer, protocol as proto
from rawpeer import RawPeer

P = "9" * 32


def test_running_consumer_gets_first_records_without_waiting_for_a_head_interval(tower):
    """The producer sends HEAD when a subscriber appears, so with a head
    interval of a minute the consumer still learns about record 0 at once."""
    config = loopback_config(tower, producer__head_interval=60_000, producer__min_acks=0,
                             consumer__offset__reset="earliest")
    with Producer("first", config) as producer:
        producer.send(b"early")  # before any consumer exists: lost on the wire
        with Consumer("first", config=config) as consumer:
            record = consumer.poll(5)
            assert (record.offset, record.value) == (0, b"early")


def test_offsets_file_resumes_without_loss_or_repeat(tower, tmp_path):
    path = tmp_path / "offsets"
    config = loopback_config(tower, producer__min_acks=0, consumer__offset__reset="earliest")
    with Producer("resume", config) as producer:
        for i in range(100):
            producer.send(b"%d" % i)
        with Consumer("resume", config=config, offsets_path=str(path)) as first:
            got = [first.poll(5).offset for _ in range(40)]
            assert got == list(range(40))
            assert first.position(producer.address) == 40
        with Consumer("resume", config=config, offsets_path=str(path)) as second:
            got = [second.poll(5).offset for _ in range(60)]
            assert got == list(range(40, 100))
            assert second.poll(0.3) is None


def test_seek_and_position(tower):
    config = loopback_config(tower, producer__min_acks=0, consumer__offset__reset="earliest")
    with Producer("seek", config) as producer, Consumer("seek", config=config) as consumer:
        for i in range(20):
            producer.send(b"%d" % i)
        assert [consumer.poll(5).offset for _ in range(20)] == list(range(20))
        consumer.seek(producer.address, 5)
        assert consumer.position(producer.address) == 5
        assert [consumer.poll(5).offset for _ in range(3)] == [5, 6, 7]
        assert consumer.positions() == {("seek", producer.address): 8}


def test_iteration_and_deserializer(tower):
    config = loopback_config(tower, producer__min_acks=0, consumer__offset__reset="earliest")
    with Producer("it", config, value_serializer=msgpack.packb) as producer:
        with Consumer("it", config=config, value_deserializer=msgpack.unpackb) as consumer:
            for i in range(5):
                producer.send({"n": i})
            values = []
            for record in consumer:
                values.append(record.value)
                if len(values) == 5:
                    break
            assert values == [{"n": i} for i in range(5)]


def test_poll_timeout_and_closed(tower):
    consumer = Consumer("quiet", config=loopback_config(tower))
    assert consumer.poll(0.1) is None
    consumer.close()
    with pytest.raises(Closed):
        consumer.poll(0)
    consumer.close()


def test_malformed_frames_are_dropped_and_counted(tower):
    peer = RawPeer(tower, P, [])
    consumer = Consumer("bad", config=loopback_config(tower))
    try:
        peer.wait_subscribed(b"Mbad", also=lambda: consumer.poll(0.005))
        peer.data.send_multipart([b"Mbad\x00\x02junk", b"x"])  # wrong version
        peer.data.send_multipart([b"Mbad\x00\x01", b"x"])  # truncated
        peer.data.send_multipart([b"Hbad\x00\x01", b"x", b"y"])  # extra frames
        peer.send(proto.RecordMsg("bad", P, "bad", 0, b"fine"))
        record = consumer.poll(5)
        assert record.value == b"fine"
        assert consumer.stats()["malformed"] == 3
    finally:
        consumer.close()
        peer.close()


def test_bad_reset_value_is_a_config_error(tower):
    from dafka import ConfigError
    with pytest.raises(ConfigError, match="consumer/offset/reset"):
        Consumer("x", config={"consumer/offset/reset": "beginning"})


def test_a_known_partition_record_without_its_content_frame_is_counted_not_waited_for(tower):
    """The hot path reads a known partition's content frame without RCVMORE:
    a record header that arrives alone (a broken or hostile peer) must be
    dropped and counted, must not block poll, and must not make the next
    message's frames be taken for its content."""
    peer = RawPeer(tower, P, [])
    consumer = Consumer("alone", config=loopback_config(tower, consumer__offset__reset="earliest"))
    try:
        peer.wait_subscribed(b"Malone", also=lambda: consumer.poll(0.005))
        peer.send(proto.RecordMsg("alone", P, "alone", 0, b"zero"))
        assert consumer.poll(5).value == b"zero"  # the partition is known now: its headers take the fast path
        header = proto.encode(proto.RecordMsg("alone", P, "alone", 1, b""))[0]
        peer.data.send(header)  # frame 1 of record 1, alone
        assert consumer.poll(0.5) is None
        assert consumer.stats()["malformed"] == 1
        peer.send(proto.RecordMsg("alone", P, "alone", 1, b"one"))
        peer.send(proto.RecordMsg("alone", P, "alone", 2, b"two"))
        assert [(r.offset, r.value) for r in (consumer.poll(5), consumer.poll(5))] == [(1, b"one"), (2, b"two")]
        assert consumer.stats()["malformed"] == 1
    finally:
        consumer.close()
        peer.close()


def test_consume_returns_batches_in_order_and_an_empty_list_after_its_timeout(tower):
    config = loopback_config(tower, producer__min_acks=0, consumer__offset__reset="earliest")
    with Producer("batch", config) as producer, \
            Consumer("batch", config=config, value_deserializer=lambda v: int(v)) as consumer:
        for i in range(1000):
            producer.send(b"%d" % i)
        got = []
        while len(got) < 1000:
            batch = consumer.consume(300, timeout=5)
            assert 0 < len(batch) <= 300
            got += batch
        assert [r.offset for r in got] == list(range(1000)) and [r.value for r in got] == list(range(1000))
        assert consumer.consume(10, timeout=0.2) == []
        with pytest.raises(ValueError, match="max_records"):
            consumer.consume(0)
    with pytest.raises(Closed):
        consumer.consume(1, timeout=0)


def test_a_consumed_batch_is_committed_when_the_caller_comes_back(tower, tmp_path):
    path = str(tmp_path / "offsets")
    config = loopback_config(tower, producer__min_acks=0, consumer__offset__reset="earliest")
    with Producer("batch2", config) as producer:
        for i in range(100):
            producer.send(b"%d" % i)
        with Consumer("batch2", config=config, offsets_path=path) as first:
            got = []
            while len(got) < 60:
                got += first.consume(60 - len(got), timeout=5)
            assert [r.offset for r in got] == list(range(60))
        with Consumer("batch2", config=config, offsets_path=path) as second:  # close committed the batch
            rest = []
            while len(rest) < 40:
                rest += second.consume(100, timeout=5)
            assert [r.offset for r in rest] == list(range(60, 100))
