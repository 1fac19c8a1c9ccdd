"""The store with real sockets on loopback and a real LevelDB in tmp_path."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import plyvel
import pytest
import zmq

from helpers import loopback_config, wait_for
from dafka import Consumer, FlushTimeout, Producer, protocol as proto
from dafka.protocol import bulk as bulk_answers
from dafka.discovery.beacon import Beacon
from dafka.core.addresses import new_address
from dafka.store import Store, StoreLocked, keys

PAD = b"." * 92


def payload(i: int) -> bytes:
    """100 bytes, different for every sequence."""
    return b"%08d" % i + PAD


def loopback_overrides(tower, **extra) -> dict:
    values = {
        "beacon/address": "127.0.0.1",
        "beacon/bind_address": "127.0.0.1",
        "beacon/sub_address": tower.sub_endpoint,
        "beacon/pub_address": tower.pub_endpoint,
    }
    values.update({k.replace("__", "/"): v for k, v in extra.items()})
    return values


@pytest.fixture
def make_store(tower, tmp_path):
    stores: list[Store] = []

    def make(db=None, **overrides) -> Store:
        store = Store(loopback_config(tower, **overrides), db=str(db or tmp_path / "db")).start()
        stores.append(store)
        return store

    yield make
    for store in stores:
        store.stop()


@pytest.fixture
def make_producer(tower):
    producers: list[Producer] = []

    def make(topic: str, **overrides) -> Producer:
        producer = Producer(topic, loopback_config(tower, **overrides))
        producers.append(producer)
        return producer

    yield make
    for producer in producers:
        try:
            producer.close(timeout=1)
        except FlushTimeout:
            pass


@pytest.fixture
def make_consumer(tower):
    consumers: list[Consumer] = []

    def make(*topics: str, **overrides) -> Consumer:
        overrides.setdefault("consumer__offset__reset", "earliest")
        consumer = Consumer(*topics, config=loopback_config(tower, **overrides))
        consumers.append(consumer)
        return consumer

    yield make
    for consumer in consumers:
        consumer.close()


def linked(producer: Producer, *stores: Store) -> None:
    """Wait until the producer and the stores' writers have found each other."""
    wait_for(lambda: producer.stats()["peers"] >= 2 * len(stores)
             and all(s.stats()["writer_peers"] >= 1 for s in stores), 10, what="discovery")


def stored_then_left(store: Store, producer: Producer, n: int, timeout: float = 20.0) -> str:
    """``producer`` sends ``n`` records (``payload(i)``) that ``store`` acks, then closes; its address."""
    linked(producer, store)
    for i in range(n):
        producer.send(payload(i))
    producer.flush(timeout)
    producer.close()
    return producer.address


def read_all(consumer: Consumer, count: int, timeout: float = 30.0) -> list:
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        record = consumer.poll(0.5)
        if record is not None:
            got.append(record)
    return got


def stored_records(path, subject: str, address: str) -> dict[int, bytes]:
    db = plyvel.DB(str(path))
    try:
        prefix = keys.partition_prefix(keys.RECORD, subject, address)
        return {keys.seq_of(k[-8:]): v for k, v in db.iterator(prefix=prefix)}
    finally:
        db.close()


class RawPeer:
    """A hand-driven peer: an XPUB advertised by its own beacon (so the store's
    SUBs connect to it and it sees their subscriptions), and a SUB for answers."""

    def __init__(self, tower) -> None:
        ctx = zmq.Context.instance()
        self.address = new_address()
        self.xpub = ctx.socket(zmq.XPUB)
        self.xpub.setsockopt(zmq.XPUB_VERBOSE, 1)
        self.xpub.linger = 0
        port = self.xpub.bind_to_random_port("tcp://127.0.0.1")
        self.sub = ctx.socket(zmq.SUB)
        self.sub.linger = 0
        self.seen: set[bytes] = set()
        self.beacon = Beacon(ctx, self.address, port, host="127.0.0.1", tower_sub=tower.sub_endpoint,
                             tower_pub=tower.pub_endpoint, name="rawpeer").start()

    def listen(self, endpoint: str, bulk: bool = False) -> None:
        """Subscribe to what is addressed to us (as a reference consumer does;
        with ``bulk``, as a dafka-py one does) and connect to ``endpoint``."""
        for msg_id in (proto.DIRECT_RECORD, proto.DIRECT_HEAD, proto.DIRECT_TAIL, proto.STORE_HELLO):
            self.sub.setsockopt(zmq.SUBSCRIBE, proto.subscription(msg_id, self.address, exact=True))
        if bulk:
            for prefix in bulk_answers.subscriptions(self.address):
                self.sub.setsockopt(zmq.SUBSCRIBE, prefix)
        self.sub.connect(endpoint)

    def wait_subscribed(self, frame: bytes, timeout: float = 10.0) -> None:
        def seen():
            while self.xpub.poll(10):
                self.seen.add(self.xpub.recv())
            return frame in self.seen
        wait_for(seen, timeout, what=f"subscription {frame!r}")

    def send(self, frames: list[bytes]) -> None:
        self.xpub.send_multipart(frames)

    def receive(self, quiet: float = 0.3, limit: float = 20.0, first: float = 5.0) -> list:
        """Every message until none came for ``quiet`` seconds, the first within ``first`` seconds: an answer
        a loaded machine delays past ``quiet`` is still an answer (``nothing()`` waits for none)."""
        out = []
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline and self.sub.poll(int((quiet if out else max(quiet, first)) * 1000)):
            out.append(proto.decode(self.sub.recv_multipart()))
        return out

    def nothing(self, wait: float = 1.0) -> bool:
        """Whether no message comes within ``wait`` seconds."""
        return not self.receive(quiet=wait, first=wait)

    def close(self) -> None:
        self.beacon.stop()
        self.xpub.close(0)
        self.sub.close(0)


@pytest.fixture
def raw_peer(tower):
    peer = RawPeer(tower)
    yield peer
    peer.close()


# -----------------------------------------------------------------------------


@pytest.mark.slow
def test_100k_records_are_stored_and_acked(tower, make_store, make_producer, tmp_path):
    store = make_store()
    producer = make_producer("bench")
    linked(producer, store)
    n = 100_000
    started = time.monotonic()
    for i in range(n):
        producer.send(payload(i))
    producer.flush(60)
    elapsed = time.monotonic() - started
    stats = producer.stats()
    assert stats["acked"] == n and stats["buffered"] == 0 and stats["unacked"] == 0
    print(f"\n100k records of 100 bytes stored and acked in {elapsed:.2f}s: {n / elapsed:,.0f} records/s")
    assert store.heads() == {("bench", producer.address): n - 1}
    s = store.stats()
    assert s["records_written"] == n and s["write_errors"] == 0 and s["malformed"] == 0
    assert s["acks_sent"] < n / 10  # ACKs go per batch, not per record
    address = producer.address
    store.stop()
    records = stored_records(tmp_path / "db", "bench", address)
    assert len(records) == n
    assert all(records[i] == payload(i) for i in range(0, n, 997)) and records[n - 1] == payload(n - 1)


def test_consumer_reads_everything_from_the_store_after_the_producer_left(make_store, make_producer, make_consumer):
    store = make_store()
    address = stored_then_left(store, make_producer("news"), 2_000)
    consumer = make_consumer("news")
    got = read_all(consumer, 2_000)
    assert [(r.partition, r.offset) for r in got] == [(address, i) for i in range(2_000)]
    assert all(r.value == payload(r.offset) for r in got)
    assert consumer.poll(0.3) is None  # nothing twice
    s = store.stats()
    assert s["hellos_sent"] >= 1 and s["heads_sent"] >= 1 and s["records_served"] >= 2_000


def test_a_store_keeps_its_identity_in_its_database(tmp_path):
    config = loopback_config()
    first = Store(config, db=str(tmp_path / "a"))
    identity = first.store_id
    first.stop()
    again = Store(config, db=str(tmp_path / "a"))
    other = Store(config, db=str(tmp_path / "b"))
    try:
        assert again.store_id == identity and other.store_id != identity
        assert len(identity) == 32 and int(identity, 16) >= 0
    finally:
        again.stop()
        other.stop()
    # A reference store's database (only 'M' and 'H' keys) gets one, and keeps its records.
    ref = plyvel.DB(str(tmp_path / "ref"), create_if_missing=True)
    ref.put(keys.record_key("t", "P" * 32, 0), b"zero")
    ref.put(keys.head_key("t", "P" * 32), (0).to_bytes(8, "big"))
    ref.close()
    store = Store(config, db=str(tmp_path / "ref"))
    identity = store.store_id
    store.stop()
    ref = plyvel.DB(str(tmp_path / "ref"))
    try:
        assert ref.get(keys.STORE_ID) == identity.encode() and ref.get(keys.record_key("t", "P" * 32, 0)) == b"zero"
    finally:
        ref.close()


def test_heads_are_rebuilt_from_the_database_on_restart(tower, make_store, make_producer, tmp_path):
    store = make_store()
    producer = make_producer("again")
    linked(producer, store)
    for i in range(500):
        producer.send(payload(i))
    producer.flush(20)
    heads = store.heads()
    store.stop()
    store.stop()  # idempotent
    with Store(loopback_config(tower), db=str(tmp_path / "db")) as restarted:
        assert restarted.heads() == heads == {("again", producer.address): 499}
        assert restarted.writer_address != store.writer_address
        # the restarted store carries on the partition where it was
        linked(producer, restarted)
        producer.send(payload(500))
        producer.flush(20)
        wait_for(lambda: restarted.heads()[("again", producer.address)] == 500, 10, what="record 500")
        assert restarted.stats()["records_written"] == 1


@pytest.mark.slow
def test_second_store_catches_up(make_store, make_producer, tmp_path):
    first = make_store(db=tmp_path / "first")
    producer = make_producer("shared")
    linked(producer, first)
    for i in range(50_000):
        producer.send(payload(i))
    producer.flush(60)
    key = ("shared", producer.address)
    assert first.heads()[key] == 49_999
    second = make_store(db=tmp_path / "second")
    wait_for(lambda: second.heads().get(key) == 49_999, 60, interval=0.05, what="second store catches up")
    # everything was released by the producer already: it came from the first store's reader
    assert first.stats()["records_served"] >= 50_000
    for i in range(50_000, 51_000):
        producer.send(payload(i))
    producer.flush(20)
    wait_for(lambda: first.heads()[key] == second.heads()[key] == 50_999, 20, what="both stores")
    address = producer.address
    second.stop()
    records = stored_records(tmp_path / "second", "shared", address)
    assert sorted(records) == list(range(51_000))
    assert all(records[i] == payload(i) for i in range(51_000))


STORE_PROCESS = """
import json, sys
from dafka.store import Store
store = Store(json.loads(sys.argv[1]), db=sys.argv[2]).start()
print("ready", store.writer_address, flush=True)
store.run_forever()
print("stopped", flush=True)
"""


@pytest.mark.slow
def test_sigkill_loses_no_acked_record(tower, processes, make_producer, tmp_path):
    db = str(tmp_path / "db")
    overrides = json.dumps(loopback_overrides(tower))
    proc = processes.python(STORE_PROCESS, overrides, db, text=True)
    assert proc.stdout.readline().startswith("ready")
    producer = make_producer("crash")
    wait_for(lambda: producer.stats()["peers"] >= 2, 10, what="producer finds the store")
    n = 200_000
    done = threading.Event()

    def send_all():
        try:
            for i in range(n):
                producer.send(payload(i))
                if i % 2_000 == 1_999:
                    time.sleep(0.01)  # pace it so that the kill lands mid-run
        finally:
            done.set()

    sender = threading.Thread(target=send_all, name="test-sender")
    sender.start()
    try:
        wait_for(lambda: producer.stats()["acked"] >= 40_000, 60, interval=0.001, what="40k acked")
        acked_before = producer.stats()["acked"]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        assert acked_before < n, "the store finished before it could be killed"
        # Every record the producer saw acked is in the database the killed store left.
        records = stored_records(db, "crash", producer.address)
        missing = [i for i in range(acked_before) if records.get(i) != payload(i)]
        assert missing == []
        # A new store on the same database completes the run.
        again = processes.python(STORE_PROCESS, overrides, db, text=True)
        assert again.stdout.readline().startswith("ready")
        assert done.wait(60)
        producer.flush(60)
        assert producer.stats()["acked"] == n
        again.send_signal(signal.SIGTERM)  # run_forever stops cleanly
        assert again.wait(10) == 0
        assert again.stdout.readline().startswith("stopped")
    finally:
        sender.join(60)
    records = stored_records(db, "crash", producer.address)
    assert len(records) == n and all(records[i] == payload(i) for i in range(0, n, 101))


def _prefill_reference_layout(path) -> None:
    """A database as a reference store leaves it: only 'M' and 'H' keys."""
    db = plyvel.DB(str(path), create_if_missing=True)
    with db.write_batch() as wb:
        for subject, address, seqs in (
            ("hello", "P" * 32, range(0, 30_000)),
            ("hello2", "Q" * 32, range(0, 3)),
            ("hello", "R" * 32, range(10, 20)),  # 0..9 deleted (as retention would)
        ):
            for seq in seqs:
                wb.put(b"M" + subject.encode() + b"\0" + address.encode() + b"\0" + seq.to_bytes(8, "big"),
                       b"%s-%d" % (address[:1].encode(), seq))
            wb.put(b"H" + subject.encode() + b"\0" + address.encode() + b"\0", seqs[-1].to_bytes(8, "big"))
    db.close()


def test_reader_serves_a_reference_database_exactly(tower, make_store, raw_peer, tmp_path):
    _prefill_reference_layout(tmp_path / "db")
    store = make_store()
    assert store.heads() == {("hello", "P" * 32): 29_999, ("hello2", "Q" * 32): 2, ("hello", "R" * 32): 19}
    peer = raw_peer
    peer.listen(store.reader_endpoint)
    assert peer.receive(limit=5)[:1] == [proto.StoreHelloMsg(peer.address, store.reader_address)]
    peer.wait_subscribed(b"\x01F")
    peer.wait_subscribed(b"\x01G")
    me = peer.address
    P, Q, R = "P" * 32, "Q" * 32, "R" * 32

    # Exactly the records asked for; then, as the partition holds more and this
    # requester reads no bulk answers, a DIRECT-HEAD that makes a reference
    # consumer ask again (rfc section 6.7).
    peer.send(proto.encode(proto.FetchMsg(P, me, "hello", 5, 3)))
    assert peer.receive() == [proto.DirectRecordMsg(me, P, "hello", s, b"P-%d" % s) for s in (5, 6, 7)] + [
        proto.DirectHeadMsg(me, P, "hello", 29_999)]

    peer.send(proto.encode(proto.GetHeadsMsg("hello", me)))
    assert sorted(peer.receive(), key=repr) == [
        proto.DirectHeadMsg(me, P, "hello", 29_999), proto.DirectHeadMsg(me, R, "hello", 19),
    ]  # nothing of "hello2"

    peer.send(proto.encode(proto.ConsumerHelloMsg(store.reader_address, me, ("hello2",))))
    assert peer.receive() == [proto.DirectHeadMsg(me, Q, "hello2", 2)]

    # Below the oldest record kept: DIRECT-TAIL first, then from the oldest on.
    peer.send(proto.encode(proto.FetchMsg(R, me, "hello", 5, 3)))
    assert peer.receive() == [proto.DirectTailMsg(me, R, "hello", 10)] + [
        proto.DirectRecordMsg(me, R, "hello", s, b"R-%d" % s) for s in (10, 11, 12)
    ] + [proto.DirectHeadMsg(me, R, "hello", 19)]

    # Past the head, from the store's own writer, for an unknown partition: no answer.
    peer.send(proto.encode(proto.FetchMsg(P, me, "hello", 30_000, 10)))
    peer.send(proto.encode(proto.FetchMsg(P, store.writer_address, "hello", 0, 10)))
    peer.send(proto.encode(proto.FetchMsg("Z" * 32, me, "hello", 0, 10)))
    assert peer.nothing()

    # A huge count is streamed in slices and stops at the end of the partition.
    peer.send(proto.encode(proto.FetchMsg(P, me, "hello", 0, 2**32 - 1)))
    got = peer.receive(quiet=1.0)
    assert [m.sequence for m in got] == list(range(30_000))
    assert got[-1] == proto.DirectRecordMsg(me, P, "hello", 29_999, b"P-29999")
    assert store.stats()["tails_sent"] == 1


def test_a_slow_requester_is_held_back_not_dropped(tower, make_store, raw_peer, tmp_path):
    """XPUB_NODROP: with tiny high-water marks and a requester that does not
    read for a while, the answer waits for room instead of losing records."""
    db = plyvel.DB(str(tmp_path / "db"), create_if_missing=True)
    big = b"z" * 10_000
    with db.write_batch() as wb:
        for seq in range(3_000):  # 30 MB: far more than the socket buffers hold
            wb.put(keys.record_key("bulk", "P" * 32, seq), big + seq.to_bytes(8, "big"))
        wb.put(keys.head_key("bulk", "P" * 32), (2_999).to_bytes(8, "big"))
    db.close()
    store = make_store(store__high_watermark=10)
    peer = raw_peer
    peer.sub.rcvhwm = 10
    peer.listen(store.reader_endpoint)
    assert peer.receive(limit=5)[:1] == [proto.StoreHelloMsg(peer.address, store.reader_address)]
    peer.wait_subscribed(b"\x01F")
    peer.send(proto.encode(proto.FetchMsg("P" * 32, peer.address, "bulk", 0, 3_000)))
    time.sleep(1.0)  # not reading: the reader must hold back
    got = peer.receive(quiet=1.0, limit=30)
    assert [m.sequence for m in got] == list(range(3_000))
    assert all(m.content == big + m.sequence.to_bytes(8, "big") for m in got)
    assert store.stats()["answers_dropped"] == 0


def _budget_db(path) -> None:
    db = plyvel.DB(str(path), create_if_missing=True)
    with db.write_batch() as wb:
        for seq in range(2_000):
            wb.put(keys.record_key("budget", "P" * 32, seq), b"%04d" % seq + b"v" * 996)
        wb.put(keys.head_key("budget", "P" * 32), (1_999).to_bytes(8, "big"))
    db.close()


def _records(messages) -> list[int]:
    """The sequences of the records in DIRECT-RECORD and DIRECT-RECORDS messages."""
    out = []
    for m in messages:
        if type(m) is proto.DirectRecordMsg:
            out.append(m.sequence)
        elif type(m) is proto.DirectRecordsMsg:
            out.extend(range(m.sequence, m.sequence + m.count))
    return out


def test_a_bulk_requester_gets_one_budget_of_answers_until_it_shows_progress(tower, make_store, raw_peer,
                                                                              tmp_path):
    """store/fetch_inflight_bytes: what a requester has not shown received
    (by FETCHing further) bounds what the reader queues for it; asking again
    from the same place gets nothing more; asking onward gets the rest."""
    _budget_db(tmp_path / "db")
    budget = 200_000
    store = make_store(store__fetch_inflight_bytes=budget)
    peer = raw_peer
    peer.listen(store.reader_endpoint, bulk=True)
    assert peer.receive(limit=5)[:1] == [proto.StoreHelloMsg(peer.address, store.reader_address)]
    peer.wait_subscribed(b"\x01F")
    def fetch(seq: int) -> None:
        peer.send(proto.encode(proto.FetchMsg("P" * 32, peer.address, "budget", seq, 2_000 - seq)))

    fetch(0)
    messages = peer.receive()
    assert {type(m) for m in messages} == {proto.DirectRecordsMsg}
    first = _records(messages)
    assert first == list(range(len(first)))
    # whole messages: the last one may go past the budget by less than one message
    assert budget - bulk_answers.MAX_BYTES <= len(first) * 1_000 <= budget + bulk_answers.MAX_BYTES
    assert store.stats()["answers_paused"] >= 1
    fetch(0)  # no progress shown: the answer starts over, with no room left
    assert peer.nothing()

    got = first
    while got[-1] < 1_999:
        fetch(got[-1] + 1)
        more = _records(peer.receive())
        assert more and len(more) * 1_000 <= budget + bulk_answers.MAX_BYTES
        got += more
    assert got == list(range(2_000))
    assert store.stats()["answers_dropped"] == 0


def test_a_reference_requester_gets_its_answer_to_the_end_of_a_block_of_100000_within_four_budgets(
        tower, make_store, raw_peer, tmp_path):
    """A reference consumer FETCHes a block of 100,000 sequences at most once
    a second: its answers pause only at the end of a block, or at four budgets
    in flight, and a DIRECT-HEAD after them tells it to ask again."""
    _budget_db(tmp_path / "db")
    budget = 200_000
    store = make_store(store__fetch_inflight_bytes=budget)
    peer = raw_peer
    peer.listen(store.reader_endpoint)
    assert peer.receive(limit=5)[:1] == [proto.StoreHelloMsg(peer.address, store.reader_address)]
    peer.wait_subscribed(b"\x01F")
    per_record = 1_000 + len(proto.record_prefix(proto.DIRECT_RECORD, peer.address, "P" * 32, "budget")) + 8 + 192
    def fetch(seq: int) -> None:
        peer.send(proto.encode(proto.FetchMsg("P" * 32, peer.address, "budget", seq, 2_000 - seq)))

    fetch(0)
    messages = peer.receive()
    first = _records(messages)
    assert first == list(range(len(first)))
    assert 4 * budget // per_record <= len(first) <= 4 * budget // per_record + 1
    assert messages[-1] == proto.DirectHeadMsg(peer.address, "P" * 32, "budget", 1_999)  # ask again
    assert store.stats()["answers_paused"] >= 1
    fetch(0)  # no progress shown: nothing more, only the DIRECT-HEAD again
    assert peer.receive() == [proto.DirectHeadMsg(peer.address, "P" * 32, "budget", 1_999)]

    got = first
    while got[-1] < 1_999:
        fetch(got[-1] + 1)
        more = _records(peer.receive())
        assert more and len(more) <= 4 * budget // per_record + 1
        got += more
    assert got == list(range(2_000))
    assert store.stats()["answers_dropped"] == 0


def test_write_failure_stops_acks_until_the_database_recovers(make_store, make_producer, make_consumer, monkeypatch):
    store = make_store()
    producer = make_producer("disk")
    linked(producer, store)
    for i in range(100):
        producer.send(payload(i))
    producer.flush(10)

    def disk_full(*args, **kwargs):
        raise plyvel.IOError(b"IO error: /x/000005.log: No space left on device")

    monkeypatch.setattr(store._writer, "_write_batch", disk_full)
    for i in range(100, 200):
        producer.send(payload(i))
    wait_for(lambda: store.stats()["write_errors"] >= 2, 10, what="a failed write and a failed retry")
    assert producer.stats()["acked"] == 100  # nothing unwritten is ACKed
    assert store.heads()[("disk", producer.address)] == 99
    assert store.stats()["unwritten"] > 0

    # Reads go on meanwhile: 0..99 were released by the producer, only the store has them.
    consumer = make_consumer("disk")
    got = read_all(consumer, 100, timeout=15)
    assert [r.offset for r in got] == list(range(100))

    monkeypatch.undo()  # the disk has room again
    producer.flush(15)
    assert producer.stats()["acked"] == 200
    assert store.heads()[("disk", producer.address)] == 199
    assert store.stats()["unwritten"] == 0


def test_malformed_frames_are_dropped_and_counted(tower, make_store, make_producer, raw_peer):
    store = make_store()
    peer = raw_peer
    peer.wait_subscribed(b"\x01M")  # the writer's SUB
    peer.wait_subscribed(b"\x01F")  # the reader's SUB
    writer_junk = [
        [b"Mjunk"],  # a record needs two frames
        [b"Mt\0\x02\x01P\x01t" + bytes(8), b"x"],  # version 2
        [b"H"],
        [b"D" + store.writer_address.encode() + b"\0\x01\x05", b"x"],  # truncated
        [b"Mzz", b"a", b"b"],  # three frames
    ]
    reader_junk = [
        [b"Fjunk"],
        [b"G\0\x01"],
        [b"W" + store.reader_address.encode() + b"\0\x01\x01A\0\0\0\x09"],
        proto.encode(proto.FetchMsg("P" * 32, peer.address, "t", 0, 1)) + [b"extra"],
    ]
    for frames in writer_junk + reader_junk:
        peer.send(frames)
    xsub = zmq.Context.instance().socket(zmq.XSUB)
    xsub.linger = 0
    xsub.connect(store.reader_endpoint)
    try:
        time.sleep(0.2)
        xsub.send(b"\x07junk")  # not a subscription: the XPUB hands it up
        xsub.send(b"")
        wait_for(lambda: store.stats()["writer_malformed"] >= 5 and store.stats()["reader_malformed"] >= 6,
                 10, what="malformed counted")
    finally:
        xsub.close(0)
    assert store.stats()["records_written"] == 0
    producer = make_producer("after")
    linked(producer, store)
    for i in range(10):
        producer.send(payload(i))
    producer.flush(10)  # still working
    assert store.heads() == {("after", producer.address): 9}
    # A known partition's record header alone: counted, neither waited for nor
    # mistaken for a record with the next message's first frame as content.
    before = store.stats()["writer_malformed"]
    peer.send([proto.encode(proto.RecordMsg("after", producer.address, "after", 10, b""))[0]])
    wait_for(lambda: store.stats()["writer_malformed"] == before + 1, 10, what="the lone header counted")
    producer.send(payload(10))
    producer.flush(10)
    assert store.heads() == {("after", producer.address): 10}


def test_retention_by_bytes_and_a_consumer_resumes_at_the_oldest_kept(make_store, make_producer, make_consumer):
    store = make_store(store__retention__bytes=100 * 100)  # 100 records of 100 bytes
    address = stored_then_left(store, make_producer("short"), 300)
    wait_for(lambda: store.stats()["retention_deleted"] == 200, 10, what="retention")
    prefix = keys.partition_prefix(keys.RECORD, "short", address)
    wait_for(lambda: store._db.floors.get(prefix) == 200, 5, what="the partition's floor shared with the reader")
    seeks = _SeekRecorder(store._db)
    consumer = make_consumer("short")
    got = read_all(consumer, 100, timeout=15)
    assert [(r.partition, r.offset) for r in got] == [(address, i) for i in range(200, 300)]
    assert all(r.value == payload(r.offset) for r in got)
    assert consumer.stats()["records_lost"] == 200
    assert store.stats()["tails_sent"] >= 1
    # The consumer's hello (its heads and tails) and its FETCH from 0 were answered without seeking over the
    # tombstones of the 200 deleted records: every seek of the partition started at 200 or later.
    mine = [start for start in seeks.starts if start is not None and start.startswith(prefix)]
    assert mine and min(mine) >= prefix + keys.seq_bytes(200), mine


class _SeekRecorder:
    """Wraps a running store's database handle to record where each iterator starts."""

    def __init__(self, shared) -> None:
        self.starts: list[bytes | None] = []
        self._db = shared.db
        shared.db = self

    def iterator(self, **kwargs):
        self.starts.append(kwargs.get("start", kwargs.get("prefix")))
        return self._db.iterator(**kwargs)

    def __getattr__(self, name):
        return getattr(self._db, name)


class _LookPast:
    """Wraps a running store's database handle so that each iterator of its reader thread runs without its
    ``stop``, applied here instead: the key LevelDB found at or past the stop is seen.  A record or stamp key
    outside the iterator's partition (or the end of the database) means LevelDB looked past the partition's
    last key into keys that retention deletes; in a store with retention it would have stepped over their
    tombstones to find one.  (Heads are not deleted: a listing of heads may end on the next one.)"""

    def __init__(self, shared) -> None:
        self.past: list[tuple[bytes, bytes | None]] = []  # (where the read started, the key found past it)
        self._db = shared.db
        shared.db = self

    def iterator(self, *, start=None, stop=None, prefix=None, reverse=False, include_key=True, include_value=True,
                 **options):
        if not threading.current_thread().name.startswith("dafka-store-reader"):
            return self._db.iterator(start=start, stop=stop, prefix=prefix, reverse=reverse, include_key=include_key,
                                     include_value=include_value, **options)
        if prefix is not None:
            start, stop, region = prefix, keys.prefix_end(prefix), prefix
        else:
            region = (stop if reverse else start)[:-keys.SEQ_BYTES]  # a partition's keys end in a sequence
        if reverse:  # plyvel seeks to the stop first
            found = next(self._db.iterator(start=stop), (None, None))[0]
            if self._beyond(found, region):
                self.past.append((stop, found))
            return self._db.iterator(start=start, stop=stop, reverse=True, include_key=include_key,
                                     include_value=include_value, **options)
        return self._forward(self._db.iterator(start=start, **options), start, stop, region, include_key, include_value)

    def _forward(self, it, start, stop, region, include_key, include_value):
        for key, value in it:
            if (stop is not None and key >= stop) or not key.startswith(region):
                if self._beyond(key, region):
                    self.past.append((start, key))
                return
            yield (key, value) if include_key and include_value else key if include_key else value
        self.past.append((start, None))

    @staticmethod
    def _beyond(found: bytes | None, region: bytes) -> bool:
        return found is None or (not found.startswith(region) and found[:1] in (keys.RECORD, keys.STAMP))

    def __getattr__(self, name):
        return getattr(self._db, name)


def test_no_read_of_the_store_looks_past_a_partitions_head(tower, make_store, make_producer):
    """A LevelDB seek or step finds the next key that is not deleted: asked for a key past a partition's last
    record, it steps over every tombstone at the start of the next partition first (285 ms a seek past
    300,000, /tmp/probe/edge.py), which made a store's answers take seconds once retention deleted.  Reads
    to the head and past it, in both kinds of answer, and head listings, never look beyond the partition."""
    store = make_store()
    P = stored_then_left(store, make_producer("edge"), 300)
    looks = _LookPast(store._db)
    peers = [RawPeer(tower), RawPeer(tower)]  # one answered as a reference consumer is, one in bulk
    try:
        for peer, bulk in zip(peers, (False, True)):
            peer.listen(store.reader_endpoint, bulk=bulk)
            assert peer.receive(limit=5)[:1] == [proto.StoreHelloMsg(peer.address, store.reader_address)]
            peer.wait_subscribed(b"\x01F")
            peer.wait_subscribed(b"\x01G")
        direct, bulk = peers
        direct.send(proto.encode(proto.FetchMsg(P, direct.address, "edge", 250, 100)))  # up to the head and past
        assert direct.receive() == [proto.DirectRecordMsg(direct.address, P, "edge", s, payload(s))
                                    for s in range(250, 300)]
        direct.send(proto.encode(proto.FetchMsg(P, direct.address, "edge", 400, 10)))  # beyond the head
        direct.send(proto.encode(proto.GetHeadsMsg("edge", direct.address)))
        assert direct.receive() == [proto.DirectHeadMsg(direct.address, P, "edge", 299)]
        bulk.send(proto.encode(proto.FetchMsg(P, bulk.address, "edge", 0, 1000)))
        got = [m for m in bulk.receive() if type(m) is proto.DirectRecordsMsg]
        assert [r for m in got for r in proto.split_contents(m.lengths, m.contents)] == [payload(i) for i in range(300)]
        assert all(m.stamps and all(t != proto.UNKNOWN_TIME for _, t in m.stamps) for m in got)  # receive times
        bulk.send(proto.encode(proto.FetchMsg(P, bulk.address, "edge", 400, 10)))
        bulk.send(proto.encode(proto.GetHeadsMsg("edge", bulk.address)))
        answers = bulk.receive()
        assert [type(m) for m in answers] == [proto.DirectPartitionsMsg]
        assert [(p.tail, p.head) for p in answers[0].partitions] == [(0, 299)]
    finally:
        for peer in peers:
            peer.close()
    assert looks.past == []


def test_retention_by_age_keeps_the_head_and_every_record_of_the_kafka_partition_registry(make_store, make_producer,
                                                                                         tmp_path):
    from dafka.kafka.numbering import REGISTRY_TOPIC
    from dafka.store.retention import KEPT_TOPICS
    assert REGISTRY_TOPIC in KEPT_TOPICS  # (a number the registry lost would be given again)
    store = make_store(store__retention__ms=300)
    producer = make_producer("old")
    registry = make_producer(REGISTRY_TOPIC)
    linked(producer, store)
    linked(registry, store)
    for i in range(50):
        producer.send(payload(i))
        registry.send(payload(i))
    producer.flush(10)
    registry.flush(10)
    wait_for(lambda: store.stats()["retention_deleted"] == 49, 10, what="retention")
    time.sleep(1.2)  # another pass or two: the head record is never deleted, nor the registry's records
    assert store.stats()["retention_deleted"] == 49
    address = producer.address
    store.stop()
    assert stored_records(tmp_path / "db", "old", address) == {49: payload(49)}
    assert stored_records(tmp_path / "db", REGISTRY_TOPIC, registry.address) == {i: payload(i) for i in range(50)}


def test_locked_database_gives_a_clear_error(tower, processes, tmp_path):
    path = str(tmp_path / "db")
    config = loopback_config(tower)
    first = Store(config, db=path)
    try:
        with pytest.raises(StoreLocked) as err:
            Store(config, db=path)
        assert err.value.path == path and path in str(err.value) and "locked" in str(err.value)
    finally:
        first.stop()
    Store(config, db=path).stop()  # free again
    holder = processes.python("import plyvel, sys, time\ndb = plyvel.DB(sys.argv[1])\nprint('open', flush=True)\n"
                              "time.sleep(60)", path, text=True)
    assert holder.stdout.readline().strip() == "open"
    with pytest.raises(StoreLocked, match="is locked: another store"):
        Store(config, db=path)


def test_get_heads_with_an_empty_subject_lists_every_topic(tower, tmp_path):
    """`dafka status` asks this way; a reference store (prefix match) answers the same."""
    from rawpeer import RawPeer
    store = Store(loopback_config(tower), db=str(tmp_path / "db")).start()
    me = "7" * 32
    peer = RawPeer(tower, me, [proto.subscription(proto.DIRECT_HEAD, me)])
    try:
        for topic in ("alpha", "beta"):
            with Producer(topic, loopback_config(tower)) as producer:
                for _ in range(3):
                    producer.send(b"x")
                producer.flush(10)
        peer.wait_subscribed(b"G")
        heads = set()

        def ask():
            peer.send(proto.GetHeadsMsg("", me))
            try:
                heads.add((peer.recv(proto.DirectHeadMsg, timeout=0.3).subject))
            except AssertionError:
                pass
            return heads == {"alpha", "beta"}
        wait_for(ask, 10, what="heads of both topics")
    finally:
        peer.close()
        store.stop()


def test_a_consumer_gets_records_it_missed_from_a_producer_that_left(tower, make_store, tmp_path):
    """The producer's last record and its HEADs never reached the consumer,
    then the producer left: nothing it sends can show the gap any more, so
    when its beacon expires the consumer asks the stores for the heads."""
    from rawpeer import RawPeer

    P = "A" * 32
    db = plyvel.DB(str(tmp_path / "db"), create_if_missing=True)
    with db.write_batch() as wb:
        for seq in range(10):
            wb.put(keys.record_key("tail", P, seq), payload(seq))
        wb.put(keys.head_key("tail", P), (9).to_bytes(8, "big"))
    db.close()
    store = make_store()
    consumer = Consumer("tail", config=loopback_config(tower, beacon__timeout=800))
    producer = RawPeer(tower, P, [])
    try:
        producer.wait_subscribed(b"Mtail\0", also=lambda: consumer.poll(0.005))
        for seq in range(9):  # record 9 is "lost" on the way: only the store has it
            producer.send(proto.RecordMsg("tail", P, "tail", seq, payload(seq)))
        got = [consumer.poll(5) for _ in range(9)]
        assert [r.offset for r in got] == list(range(9))
        wait_for(lambda: store.stats()["reader_peers"] >= 2, 10, what="the store reader connects to the consumer")
        producer.close()
        last = consumer.poll(10)
        assert last is not None and (last.offset, last.value) == (9, payload(9))
    finally:
        producer.close()
        consumer.close()


def test_stop_returns_when_the_thread_ends_on_its_own_at_the_same_moment(tower, ctx):
    """Regression: stop() saw the thread alive, then did a blocking send on
    the wake-up pipe; a thread that had meanwhile ended on its own timer (and
    closed its end of the pipe) left stop() blocked forever: store.stop()
    hung in about one run in seven of test_second_store_catches_up."""
    from dafka.store.role import RoleThread

    class EndsByItself(RoleThread):
        def _run(self) -> None:
            self._wake.close(0)  # its loop is over and its end of the pipe closed...
            release.wait(5)  # ...but the thread is not dead yet when stop() looks

    release = threading.Event()
    role = EndsByItself(ctx, loopback_config(tower), ctx.socket(zmq.PUB), ctx.socket(zmq.SUB), new_address(), "t")
    role.start()
    time.sleep(0.2)
    stopper = threading.Thread(target=role.stop, args=(10,), name="stopper", daemon=True)
    stopper.start()
    time.sleep(0.5)
    release.set()
    stopper.join(5)
    assert not stopper.is_alive(), "stop() is blocked on the wake-up pipe"
    for sock in (role._sub, role._data_sock):
        sock.close(0)


def test_bulk_readers_are_served_in_turn_not_one_after_the_other(tower, make_store, tmp_path):
    """Two requesters ask for a whole 200,000-record partition at once: their
    DIRECT-RECORDS interleave, neither waits for the other to finish."""
    db = plyvel.DB(str(tmp_path / "db"), create_if_missing=True)
    with db.write_batch() as wb:
        for seq in range(200_000):
            wb.put(keys.record_key("turns", "P" * 32, seq), b"v" * 100)
        wb.put(keys.head_key("turns", "P" * 32), (199_999).to_bytes(8, "big"))
    db.close()
    store = make_store(store__fetch_inflight_bytes=0)  # no budget: only the turns keep them fair
    peers = [RawPeer(tower), RawPeer(tower)]
    try:
        for peer in peers:
            peer.listen(store.reader_endpoint, bulk=True)
            assert peer.receive(limit=5)[:1] == [proto.StoreHelloMsg(peer.address, store.reader_address)]
            peer.wait_subscribed(b"\x01F")
        for peer in peers:
            peer.send(proto.encode(proto.FetchMsg("P" * 32, peer.address, "turns", 0, 200_000)))
        poller = zmq.Poller()
        for peer in peers:
            poller.register(peer.sub, zmq.POLLIN)
        order: list[int] = []  # which requester each DIRECT-RECORDS went to, in arrival order
        got = [0, 0]
        deadline = time.monotonic() + 60
        while min(got) < 200_000 and time.monotonic() < deadline:
            for sock, _ in poller.poll(100):
                who = 0 if sock is peers[0].sub else 1
                msg = proto.decode(sock.recv_multipart())
                assert type(msg) is proto.DirectRecordsMsg and msg.sequence == got[who]
                got[who] += msg.count
                order.append(who)
        assert got == [200_000, 200_000]
        first_done = min(len(order) - order[::-1].index(who) for who in (0, 1))  # one's last message
        assert order[:first_done].count(0) > 1 and order[:first_done].count(1) > 1, order  # both had turns
    finally:
        for peer in peers:
            peer.close()
