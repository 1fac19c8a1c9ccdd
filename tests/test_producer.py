"""Producer behaviour: min acks, back pressure, oversize records, closing."""

from __future__ import annotations

import threading
import time

import msgpack
import pytest
import zmq

from helpers import loopback_config, wait_for
from dafka import BufferFull, Closed, FlushTimeout, Producer, RecordTooLarge, protocol as proto
from rawpeer import RawPeer

STORE_A = "A" * 32
STORE_B = "B" * 32


def fake_store(tower, address):
    """A store made of raw frames: a bound socket that publishes ACKs."""
    return RawPeer(tower, address, [])


def test_min_acks_two_needs_two_distinct_stores(tower):
    a, b = fake_store(tower, STORE_A), fake_store(tower, STORE_B)
    producer = Producer("acks", loopback_config(tower, producer__min_acks=2))
    try:
        handles = [producer.send(b"r%d" % i) for i in range(5)]
        topic = b"K" + producer.address.encode()
        a.wait_subscribed(topic)
        b.wait_subscribed(topic)
        a.send(proto.AckMsg(producer.address, "acks", 4))
        a.send(proto.AckMsg(producer.address, "acks", 4))  # the same store twice counts once
        time.sleep(0.3)
        assert not any(h.done() for h in handles)
        assert producer.stats()["unacked"] == 5
        with pytest.raises(FlushTimeout) as err:
            producer.flush(timeout=0.1)
        assert err.value.unacked == 5
        b.send(proto.AckMsg(producer.address, "acks", 2))
        meta = handles[2].get(timeout=5)
        assert (meta.topic, meta.partition, meta.offset) == ("acks", producer.address, 2)
        assert not handles[3].done()
        b.send(proto.AckMsg(producer.address, "acks", 4))
        producer.flush(timeout=5)
        assert producer.stats()["buffered"] == 0
    finally:
        producer.close(timeout=1)
        a.close()
        b.close()


def test_released_records_are_no_longer_served_but_held_ones_are_exact(tower):
    store = fake_store(tower, STORE_A)
    tester = RawPeer(tower, "C" * 32, [proto.subscription(proto.DIRECT_RECORD, "C" * 32),
                                       proto.subscription(proto.HEAD, "partial")])
    producer = Producer("partial", loopback_config(tower))
    try:
        for i in range(300):  # crosses the reference's 256-entry chunk boundary
            producer.send(b"value-%d" % i)
        store.wait_subscribed(b"K" + producer.address.encode())
        store.send(proto.AckMsg(producer.address, "partial", 99))  # partial ack
        wait_for(lambda: producer.stats()["acked"] == 100, 5, what="partial ack")
        tester.wait_subscribed(b"F" + producer.address.encode())
        tester.recv(proto.HeadMsg)  # our SUB is connected to the producer too
        tester.send(proto.FetchMsg(producer.address, "C" * 32, "partial", 90, 200))
        answers = [tester.recv(proto.DirectRecordMsg) for _ in range(190)]
        assert [m.sequence for m in answers] == list(range(100, 290))
        assert all(m.content == b"value-%d" % m.sequence for m in answers)
    finally:
        with pytest.raises(FlushTimeout):
            producer.close(timeout=0.01)
        store.close()
        tester.close()


def test_send_blocks_then_raises_buffer_full_and_drops_nothing(tower):
    producer = Producer("bp", loopback_config(tower, producer__max_unacked=10, producer__terminate_unacked=1))
    try:
        for i in range(10):
            producer.send(b"x")
        started = time.monotonic()
        with pytest.raises(BufferFull, match="max_unacked=10"):
            producer.send(b"y", timeout=0.2)
        assert 0.15 < time.monotonic() - started < 2
        assert producer.stats()["sent"] == 10 and producer.stats()["buffered"] == 10
    finally:
        producer.close()


def test_back_pressure_releases_when_a_store_acks(tower):
    store = fake_store(tower, STORE_A)
    producer = Producer("bp2", loopback_config(tower, producer__max_unacked_bytes=100))
    try:
        producer.send(b"x" * 100)
        store.wait_subscribed(b"K" + producer.address.encode())
        threading.Timer(0.2, lambda: store.send(proto.AckMsg(producer.address, "bp2", 0))).start()
        producer.send(b"y" * 100, timeout=5)  # waits for the ack above
        assert producer.stats()["acked"] == 1
    finally:
        store.send(proto.AckMsg(producer.address, "bp2", 1))
        producer.close(timeout=5)
        store.close()


def test_oversize_record_is_refused_at_send(tower):
    producer = Producer("big", loopback_config(tower, producer__max_record_bytes=100, producer__min_acks=0))
    try:
        producer.send(b"x" * 100)
        with pytest.raises(RecordTooLarge, match="101 bytes"):
            producer.send(b"x" * 101)
        assert producer.stats()["sent"] == 1
    finally:
        producer.close()


def test_default_max_record_is_one_mebibyte(tower):
    producer = Producer("big", loopback_config(tower, producer__min_acks=0))
    try:
        producer.send(b"x" * (1 << 20))
        with pytest.raises(RecordTooLarge):
            producer.send(b"x" * ((1 << 20) + 1))
    finally:
        producer.close()


def test_close_with_unacked_records_times_out_with_a_count(tower):
    producer = Producer("unacked", loopback_config(tower))
    for _ in range(7):
        producer.send(b"x")
    started = time.monotonic()
    with pytest.raises(FlushTimeout, match="7 record") as err:
        producer.close(timeout=0.3)
    assert err.value.unacked == 7
    assert 0.25 < time.monotonic() - started < 3
    with pytest.raises(Closed):
        producer.send(b"x")
    producer.close()  # idempotent


def test_close_timeout_comes_from_config(tower):
    producer = Producer("unacked", loopback_config(tower, producer__close_timeout=200))
    producer.send(b"x")
    started = time.monotonic()
    with pytest.raises(FlushTimeout):
        producer.close()
    assert time.monotonic() - started < 3


def test_terminate_unacked_closes_at_once(tower, caplog):
    producer = Producer("unacked", loopback_config(tower, producer__terminate_unacked=1))
    producer.send(b"x")
    started = time.monotonic()
    producer.close()
    assert time.monotonic() - started < 1
    assert "1 records unacked" in caplog.text


def test_no_store_mode_resolves_at_once(tower):
    with Producer("nostore", loopback_config(tower, producer__min_acks=0)) as producer:
        handle = producer.send(b"x")
        assert handle.done()
        assert handle.get(timeout=0).offset == 0


def test_value_serializer_and_callbacks_and_threads(tower):
    store = fake_store(tower, STORE_A)
    delivered = []
    producer = Producer("ser", loopback_config(tower), value_serializer=msgpack.packb)
    try:
        def worker():
            for i in range(500):
                producer.send({"i": i}, on_delivery=lambda meta, err: delivered.append(meta.offset))
        threads = [threading.Thread(target=worker, name="dafka-test-sender") for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert producer.stats()["sent"] == 2000
        store.wait_subscribed(b"K" + producer.address.encode())
        store.send(proto.AckMsg(producer.address, "ser", 1999))
        producer.flush(timeout=5)
        wait_for(lambda: len(delivered) == 2000, 5, what="callbacks")
        assert delivered == list(range(2000))
    finally:
        producer.close()
        store.close()


def test_producer_without_tower_does_not_hang():
    config = loopback_config(beacon__sub_address="tcp://127.0.0.1:9", beacon__pub_address="tcp://127.0.0.1:9",
                             producer__min_acks=0)
    started = time.monotonic()
    with Producer("alone", config) as producer:
        producer.send(b"x")
        assert not producer.connected
    assert time.monotonic() - started < 3


def test_bad_topic_is_refused(tower):
    with pytest.raises(ValueError):
        Producer("bad\0topic", loopback_config(tower))
    with pytest.raises(ValueError):
        Producer("x" * 256, loopback_config(tower))


def test_dafka_producers_do_not_connect_to_each_other_but_to_every_other_peer(tower):
    """rfc 5.5, tagged producer addresses: P dafka-py producers make no P
    squared mesh between them.  A peer with a random address (a reference
    producer, a store) is connected to as before, and gets the producer's
    subscriptions."""
    from dafka.core.addresses import is_tagged_producer, new_address

    assert is_tagged_producer(new_address(producer=True)) and not is_tagged_producer(new_address())
    reference = fake_store(tower, new_address())  # a random address: could be anything, even a producer
    producers = [Producer("mesh", loopback_config(tower)) for _ in range(3)]
    try:
        wait_for(lambda: all(p.stats()["peers_seen"] == 3 for p in producers), 10, what="every peer seen")
        for p in producers:
            reference.wait_subscribed(b"K" + p.address.encode())  # connected to the random address
        time.sleep(0.3)
        assert [p.stats()["peers"] for p in producers] == [1, 1, 1], "producers connected to each other"
        assert all(is_tagged_producer(p.address) for p in producers)
    finally:
        for p in producers:
            p.close(timeout=1)
        reference.close()


def test_a_peer_that_subscribes_to_the_records_later_gets_a_head_at_once(tower):
    """A group member subscribes to a partition's records only once the group gives it the
    partition, on a connection open long before (rfc 14.2): what the producer published
    before that subscription arrived passed it by.  The producer notices the subscription
    as it publishes, and sends a HEAD at once, not at its next HEAD timer, so that the
    member fetches what it missed."""
    watcher = RawPeer(tower, "W" * 32, [proto.subscription(proto.HEAD, "late", exact=True)])
    producer = Producer("late", loopback_config(tower, producer__head_interval=60_000, producer__min_acks=0))
    stop = threading.Event()

    def publish() -> None:
        while not stop.is_set():
            producer.send(b"x")
            time.sleep(0.002)

    publisher = threading.Thread(target=publish, daemon=True)
    try:
        wait_for(lambda: watcher.pump() or watcher.peers, what="the watcher to meet the producer")
        time.sleep(0.3)  # its subscription reaches the producer
        publisher.start()
        watcher.recv(proto.HeadMsg, timeout=5)  # the first record's HEAD
        time.sleep(0.2)  # records pass the watcher by
        subscribed = time.monotonic()
        watcher.sub.setsockopt(zmq.SUBSCRIBE, proto.record_prefix(proto.RECORD, "late", producer.address, "late"))
        head = watcher.recv(proto.HeadMsg, timeout=5)
        assert time.monotonic() - subscribed < 1.0
        assert head.address == producer.address and head.sequence >= 50  # it missed about 100 records
    finally:
        stop.set()
        if publisher.is_alive():
            publisher.join(5)
        producer.close(timeout=1)
        watcher.close()


def test_a_head_follows_the_first_record_at_once_and_the_producer_leaves_with_one(tower):
    """Who subscribes to a topic's HEADs only (a consumer group's member, rfc 14.2) learns of a new
    partition from its first record, not a head_interval later, and of its last records as it leaves."""
    watcher = RawPeer(tower, "W" * 32, [proto.subscription(proto.HEAD, "new", exact=True)])
    producer = Producer("new", loopback_config(tower, producer__head_interval=60_000, producer__min_acks=0))
    try:
        wait_for(lambda: watcher.pump() or watcher.peers, what="the watcher to meet the producer")
        time.sleep(0.3)  # its subscription reaches the producer
        sent = time.monotonic()
        producer.send(b"first")
        head = watcher.recv(proto.HeadMsg, timeout=5)
        assert (head.address, head.sequence) == (producer.address, 0)
        assert time.monotonic() - sent < 1.0
        producer.send(b"second")
        producer.send(b"third")
        with pytest.raises(AssertionError):
            watcher.recv(proto.HeadMsg, timeout=0.5)  # only the first: the rest wait for head_interval...
        producer.close(timeout=1)
        head = watcher.recv(proto.HeadMsg, timeout=5)  # ...or for the last HEAD, as the producer leaves
        assert (head.address, head.sequence) == (producer.address, 2)
    finally:
        producer.close(timeout=1)
        watcher.close()


_WINDOW_SCRIPT = """
import json, subprocess, sys, time
from dafka import Config, Producer

def anon():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("RssAnon:"))

sub, pub, db = sys.argv[1:4]
config = Config.load(overrides={"beacon/address": "127.0.0.1", "beacon/sub_address": sub,
                                "beacon/pub_address": pub, "producer/min_acks": 1})
producer = Producer("trim", config)
pad = b"x" * 10_000
base = anon()
for i in range(4000):  # 40 MB held unacked: no store yet
    producer.send(b"%08d" % i + pad)
pinned = [bytes(3000) for _ in range(100)]  # live blocks above the window's, as in any busy process
held = anon()
store = subprocess.Popen(["dafka_stored", "--db", db, "--pub", pub, "--sub", sub, "-X", "beacon/address=127.0.0.1"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
try:
    deadline = time.monotonic() + 60
    while producer.stats()["acked"] < 4000 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    stats = producer.stats()
    print(json.dumps({"base": base, "held": held, "after": anon(), "acked": stats["acked"],
                      "trims": stats["heap_trims"]}), flush=True)
    producer.close()
finally:
    store.terminate()
    store.wait(30)
"""


def test_a_drained_unacked_window_gives_its_memory_back(tower, tmp_path):
    """glibc keeps freed blocks below live ones: the soak's producers of 10 KB records stayed at 130-150
    MiB once their 128 MiB windows had filled (stores behind) and drained (issue 24).  A window that held
    16 MiB or more and drains to an eighth of it is followed by a trim of the heap.  In a process of its
    own, so that no other test's freed memory blurs the figures."""
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _WINDOW_SCRIPT, tower.sub_endpoint, tower.pub_endpoint,
                          str(tmp_path / "db")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["acked"] == 4000
    assert r["held"] - r["base"] > 30 * 2**20, r
    assert r["trims"] >= 1, r
    assert r["after"] - r["base"] < 12 * 2**20, r


def test_the_producer_state_asks_for_a_trim_only_after_a_large_window_drains():
    from dafka.producer.state import TRIM_AFTER_BYTES, ProducerState

    state = ProducerState("P" * 32, "T", min_acks=1)
    big = b"x" * 10_000
    for _ in range(100):  # 1 MB: too little to trim for
        state.publish(big)
    state.on_ack("S", proto.AckMsg("P" * 32, "T", 99))
    assert not state.trim_due
    for _ in range(TRIM_AFTER_BYTES // len(big) + 1):
        state.publish(big)
    state.on_ack("S", proto.AckMsg("P" * 32, "T", state.next_seq - 500))  # 5 MB still held: not drained yet
    assert not state.trim_due
    state.on_ack("S", proto.AckMsg("P" * 32, "T", state.next_seq - 1))
    assert state.trim_due and state.held_peak == 0
