"""A simulated year of auto-commits keeps a group's offsets topic bounded, and
the group resumes from what is left (issue 24, rfc 14.6).

A raw peer plays 365 member runs (a restart a day), each committing every 5 s
for a day: 17,280 snapshot records per run, 6.3 million in all, as a member
writes them (KEYED-RECORDS, the batch a dafka-py store subscribes).  The store compacts each run's
partition to its newest record and, with ``store/offsets/retention_ms`` at
1.5 s, deletes the runs that went silent, keeping the newest (the last run
starts after a pause longer than the settling time, as a day would be).  A real group
member then starts at the last commit."""

from __future__ import annotations

import time

import pytest

from helpers import loopback_config, wait_for
from rawpeer import RawPeer
from dafka import Consumer, Producer, protocol as proto
from dafka.protocol import batching
from dafka.protocol.commits import encode_commits, offsets_topic
from dafka.core.addresses import new_address
from dafka.store import Store, keys

GROUP = "billing"
TOPIC = offsets_topic(GROUP)
DAYS = 365
COMMITS_A_DAY = 24 * 3600 // 5  # consumer/group/auto_commit_interval = 5 s
RESUME_AT = 60

# 6.3 million records through one store against a 1.5 s retention: 33 s alone, over 300 s beside 3 other
# test workers on 2 cores.
pytestmark = pytest.mark.serial


def topic_keys(store: Store, tag: bytes) -> list[bytes]:
    prefix = tag + TOPIC.encode() + b"\0"
    return list(store._db.db.iterator(prefix=prefix, include_value=False))


@pytest.mark.faults
@pytest.mark.timeout(300)
def test_a_year_of_auto_commits_leaves_one_record_and_the_group_resumes_there(tower, tmp_path):
    store = Store(loopback_config(tower, store__offsets__retention_ms=1500), db=str(tmp_path / "db")).start()
    orders = Producer("orders", loopback_config(tower, producer__min_acks=1))
    raw = RawPeer(tower, new_address(), [])
    consumer = None
    try:
        for i in range(100):
            orders.send(b"order %d" % i)
        orders.flush(timeout=30)
        partition = orders.address
        raw.wait_subscribed(batching.WRITER_SUBSCRIPTION, timeout=10)
        started = time.monotonic()
        offset = 0
        for day in range(DAYS):
            if day == DAYS - 1:
                time.sleep(1.0)  # the last restart comes later than store/compaction.py's settling time
            member = new_address()
            values = []
            for _ in range(COMMITS_A_DAY):
                offset = min(offset + 1, RESUME_AT * (day + 1) // DAYS)
                values.append(encode_commits(member, {("orders", partition): offset}, snapshot=True))
            for first in range(0, COMMITS_A_DAY, 2048):
                lengths, contents = proto.pack_contents(values[first:first + 2048])
                raw.send(proto.KeyedRecordsMsg(TOPIC, member, TOPIC, first, lengths, contents))
            wait_for(lambda: store.heads().get((TOPIC, member)) == COMMITS_A_DAY - 1, 30,
                     what=f"day {day} written")
        written = time.monotonic() - started
        assert offset == RESUME_AT

        # What stays: the newest run's newest record.
        wait_for(lambda: len(topic_keys(store, keys.HEAD)) == 1 and len(topic_keys(store, keys.RECORD)) == 1,
                 60, what="the offsets topic compacted to one record")
        stats = store.stats()
        print(f"{DAYS * COMMITS_A_DAY:,} commits written in {written:.1f} s; compacted "
              f"{stats['offsets_compacted']:,} records, expired {stats['offsets_expired']} partitions")
        assert stats["offsets_expired"] == DAYS - 1
        assert stats["records_written"] == DAYS * COMMITS_A_DAY + 100

        # The group restarts: it resumes at the last commit.
        consumer = Consumer("orders", group=GROUP,
                            config=loopback_config(tower, consumer__offset__reset="earliest"))
        first = None
        deadline = time.monotonic() + 30
        while first is None and time.monotonic() < deadline:
            first = consumer.poll(timeout=0.5)
        assert first is not None and (first.partition, first.offset) == (partition, RESUME_AT)
        assert first.value == b"order %d" % RESUME_AT
    finally:
        if consumer is not None:
            consumer.close()
        raw.close()
        orders.close()
        store.stop()
