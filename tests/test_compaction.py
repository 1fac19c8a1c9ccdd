"""Compacted topics between real peers (rfc/dafka.md section 19): stores compact what newer records of the
same key supersede; a dafka-py consumer from the beginning gets the newest value of every key and skips the
holes (DIRECT-GAP) without waiting; a store that joins later fills itself from them; a reference consumer
(the raw-frame peer of bench/dafkabench/refconsumer.py) does not stall: it gets an empty record at each offset compaction
removed, and only RFC 46 messages."""

from __future__ import annotations

import time

import pytest

from dafka import Consumer, Producer, protocol as proto
from dafka.core.addresses import new_address
from dafka.store import Store, cleaner
from helpers import loopback_config, wait_for
from rawpeer import RawPeer
from dafkabench.refconsumer import RefConsumer

TOPIC = "prices"
KEYS = 50
RECORDS = 3_000


def config(tower, **overrides):
    return loopback_config(tower, store__compaction__topics="cdc.*, prices", **overrides)


def take(consumer: Consumer, until, timeout: float = 30) -> list:
    got: list = []
    deadline = time.monotonic() + timeout
    while not until(got) and time.monotonic() < deadline:
        got.extend(consumer.consume(10_000, 0.05))
    return got


@pytest.mark.timeout(180)
def test_stores_compact_and_every_reader_gets_the_newest_value_of_each_key(tower, tmp_path, monkeypatch):
    # A pass may meet part of the burst only (a loaded machine); the rest, too small a share to be due, is
    # compacted once the partition is idle: 0.5 s here, not 10.
    monkeypatch.setattr(cleaner, "IDLE_MS", 500)
    stores = [Store(config(tower), db=str(tmp_path / f"db{i}")).start() for i in range(2)]
    producer = Producer(TOPIC, config(tower, producer__min_acks=2))
    late_store = ref = None
    try:
        wait_for(lambda: producer.stats()["peers"] >= 4, what="the stores")
        values = [b"%d:%d" % (i % KEYS, i) for i in range(RECORDS)]
        record_keys = [b"sku-%d" % (i % KEYS) if i % 100 else None for i in range(RECORDS)]  # every 100th unkeyed
        producer.send_many(values, keys=record_keys)
        producer.send(b"", key=b"sku-7")  # a tombstone: sku-7 deleted (young: it stays)
        producer.flush(30)
        head = RECORDS
        # every keyed record but the newest of each key, and sku-7's newest (the tombstone supersedes it)
        superseded = RECORDS - RECORDS // 100 - KEYS + 1
        wait_for(lambda: all(s.stats()["compaction_deleted"] >= superseded for s in stores), 30,
                 what="the stores compacted")
        assert [s.stats()["compaction_deleted"] for s in stores] == [superseded] * 2
        wait_for(lambda: all(s.stats()["compaction_dirty"] == 0 for s in stores), 30, what="compacted to the head")

        expected = {}
        for value, key in zip(values, record_keys):
            if key is not None:
                expected[key] = value
        expected.pop(b"sku-7")
        with Consumer(TOPIC, config=config(tower, consumer__offset__reset="earliest")) as consumer:
            got = take(consumer, lambda g: g and g[-1].offset == head)
            stats = consumer.stats()
        offsets = [r.offset for r in got]
        assert offsets == sorted(set(offsets)) and offsets[-1] == head
        assert len(got) <= KEYS + RECORDS // 100 + 1  # the newest of each key, the unkeyed ones, the tombstone
        state = {}
        for r in got:
            if r.key is not None:
                if r.value:
                    state[r.key] = r.value
                else:
                    state.pop(r.key, None)
        assert state == expected
        assert [r.value for r in got if r.key is None] == [values[i] for i in range(0, RECORDS, 100)]
        assert stats["compacted_skipped"] == head + 1 - len(got) and stats["records_lost"] == 0

        # The producer goes: a reference consumer FETCHes on its first HEAD only (earliest: nothing later is above
        # its start of 2^64-1), and a HEAD that comes before the stores subscribed to its FETCHes stalls it for
        # good, compaction or not.  With no producer, its first head is a store's answer to its hello.
        address = producer.address
        producer.close(timeout=10)

        # a store that joins now fills itself from the others: it skips the holes, and holds the same
        late_store = Store(config(tower), db=str(tmp_path / "late")).start()
        wait_for(lambda: late_store.heads().get((TOPIC, address)) == head, 60, what="the late store filled")
        assert late_store.stats()["skipped"] == 0

        # a reference consumer: every offset, an empty record where compaction removed one, no foreign frame
        ref = RefConsumer(tower.sub_endpoint, tower.pub_endpoint, new_address(), earliest=True, keep=True)
        ref.subscribe(TOPIC)
        assert ref.run(lambda: ref.total() >= head + 1, 60), ("the reference consumer stalled", ref.delivered,
                                                             [(f.sequence, f.count) for f in ref.fetches])
        contents = ref.contents[(TOPIC, address)]
        kept = {r.offset: r.value for r in got}
        assert contents == [kept.get(offset, b"") for offset in range(head + 1)]
        assert ref.foreign == 0
    finally:
        if ref is not None:
            ref.close()
        producer.close(timeout=5)
        for store in [*stores, *([late_store] if late_store else [])]:
            store.stop()


def contents_received(peer: RawPeer, kind: type, count: int, kinds: set[type]) -> dict[int, bytes]:
    """The contents of the ``kind`` messages of TOPIC the raw peer receives, by sequence, until it has ``count``
    (or 20 s passed); ``kinds`` collects the type of every message it received."""
    got: dict[int, bytes] = {}
    deadline = time.monotonic() + 20
    while len(got) < count and time.monotonic() < deadline:
        peer.pump()
        if peer.sub.poll(20):
            msg = proto.decode(peer.sub.recv_multipart())
            kinds.add(type(msg))
            if type(msg) is kind and msg.subject == TOPIC:
                got[msg.sequence] = msg.content
    return got


@pytest.mark.timeout(120)
def test_a_reference_store_beside_a_compacting_one_keeps_everything_and_fills_holes_with_empty_records(
        tower, tmp_path, monkeypatch):
    """A reference store (raw RFC 46 frames: SUB ``M``, ``H`` and ``D<writer>``, as zeromq/dafka's) knows no keys:
    it gets every record as a RECORD, value only, and nothing else, and keeps them all. One that fills the
    partition from a compacting store (a FETCH from 0, as it sends on a HEAD it is behind) gets a DIRECT-RECORD
    at every offset, empty where compaction removed the record: it stays in step, and holds empty records there
    (rfc 19.2). (Below the oldest kept record, as below retention's, it gets nothing: the partition starts there.)"""
    monkeypatch.setattr(cleaner, "IDLE_MS", 500)
    ours = Store(config(tower), db=str(tmp_path / "ours")).start()
    writer = new_address()
    ref = RawPeer(tower, writer, [proto.subscription(proto.DIRECT_RECORD, writer, exact=True),
                                  proto.subscription(proto.RECORD), proto.subscription(proto.HEAD)])
    producer = Producer(TOPIC, config(tower, producer__min_acks=1))
    try:
        wait_for(lambda: (ref.pump(), producer.stats()["peers"] >= 3 and producer._state.audience.records)[1],
                 20, what="the stores subscribed")
        time.sleep(0.2)  # (the reference's prefix settled: it gets RECORDs)
        values = [b"%d:%d" % (i % 20, i) for i in range(400)]
        record_keys = [b"k%d" % (i % 20) if i % 50 else None for i in range(400)]  # every 50th unkeyed, the 1st too
        producer.send_many(values, keys=record_keys)
        producer.flush(20)
        address = producer.address
        kinds: set[type] = set()
        live = contents_received(ref, proto.RecordMsg, 400, kinds)
        assert live == dict(enumerate(values)) and kinds <= {proto.RecordMsg, proto.HeadMsg}, kinds
        newest = {key: i for i, key in enumerate(record_keys) if key is not None}
        kept = set(newest.values()) | {i for i, key in enumerate(record_keys) if key is None}
        wait_for(lambda: ours.stats()["compaction_deleted"] == 400 - len(kept), 30, what="our store compacted")
        producer.close(timeout=10)  # (nothing left to answer: the store alone holds the partition)

        ref.send(proto.FetchMsg(address, writer, TOPIC, 0, 400))  # a reference store that joins late
        filled = contents_received(ref, proto.DirectRecordMsg, 400, kinds)
        assert filled == {i: values[i] if i in kept else b"" for i in range(400)}
        assert kinds <= {proto.RecordMsg, proto.HeadMsg, proto.DirectRecordMsg}, kinds
    finally:
        producer.close(timeout=5)
        ref.close()
        ours.stop()
