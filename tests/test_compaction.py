"""Compacted topics between real peers (rfc/dafka.md section 19): stores compact what newer records of the
same key supersede; a dafka-py consumer from the beginning gets the newest value of every key and skips the
holes (DIRECT-GAP) without waiting; a store that joins later fills itself from them; a reference consumer
(the raw-frame peer of refconsumer.py) does not stall: it gets an empty record at each offset compaction
removed, and only RFC 46 messages."""

from __future__ import annotations

import time

import pytest

from dafka import Consumer, Producer
from dafka.peer import new_address
from dafka.store import Store, cleaner
from helpers import loopback_config, wait_for
from refconsumer import RefConsumer

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
        if not ref.run(lambda: ref.total() >= head + 1, 60):
            print("DEBUG", ref.delivered, ref.received, [(f.sequence, f.count) for f in ref.fetches], len(ref.peers),
                  ref.foreign, [{k: v for k, v in s.stats().items() if k in ("fetch_answers", "records_served",
                  "fetches_received", "tails_sent", "gaps_sent", "fillers_sent", "answers_paused", "paced_heads",
                  "hellos_sent", "heads_sent")} for s in [*stores, late_store]])
            raise AssertionError("the reference consumer stalled")
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
