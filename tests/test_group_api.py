"""The consumer group API in one process: callbacks, commits, the handover on
close, a whole group restarting from the commits the store kept, asyncio."""

from __future__ import annotations

import asyncio
import time

import pytest

from dafka import Consumer, ConsumerRebalanceListener, Producer, TopicPartition
from dafka import metrics
from dafka.aio import AsyncConsumer
from dafka.store import Store
from helpers import loopback_config

TOPIC = "orders"
GROUP = "billing"

# Members expire after a second without a beacon: other tests' load would expire them.
pytestmark = pytest.mark.serial


def config(tower, **extra):
    return loopback_config(tower, **{"beacon__interval": 200, "beacon__timeout": 1000,
                                     "consumer__offset__reset": "earliest", "consumer__group__join_wait": 100,
                                     **extra})


@pytest.fixture
def store(tower, tmp_path):
    store = Store(config(tower), db=str(tmp_path / "db")).start()
    yield store
    store.stop()


def publish(tower, partitions: int, count: int) -> list[str]:
    """``count`` records in each of ``partitions`` partitions, acked by the store; the producers leave."""
    addresses = []
    for _ in range(partitions):
        with Producer(TOPIC, config(tower)) as producer:
            for i in range(count):
                producer.send(b"%d" % i)
            producer.flush(10)
            addresses.append(producer.address)
    return addresses


def read(consumers: list[Consumer], until, timeout: float = 15) -> list:
    got = []
    deadline = time.monotonic() + timeout
    while not until(got):
        assert time.monotonic() < deadline, f"timed out with {len(got)} records"
        for c in consumers:
            got.extend(c.consume(1000, timeout=0.02))
    return got


class Recorder(ConsumerRebalanceListener):
    def __init__(self) -> None:
        self.events: list[tuple[str, set[TopicPartition]]] = []

    def on_partitions_assigned(self, assigned):
        self.events.append(("assigned", set(assigned)))

    def on_partitions_revoked(self, revoked):
        self.events.append(("revoked", set(revoked)))

    def owned(self) -> set[TopicPartition]:
        """What the callbacks said, in order, leaves this member reading."""
        owned: set[TopicPartition] = set()
        for kind, partitions in self.events:
            owned = owned | partitions if kind == "assigned" else owned - partitions
        return owned


def test_bad_group_arguments_name_themselves(tower, tmp_path):
    with pytest.raises(ValueError, match="offsets_path and group"):
        Consumer(TOPIC, config=config(tower), group=GROUP, offsets_path=str(tmp_path / "o"))
    with pytest.raises(ValueError, match="group name"):
        Consumer(TOPIC, config=config(tower), group="")
    with pytest.raises(ValueError, match="too long"):
        Consumer(TOPIC, config=config(tower), group="g" * 250)
    with pytest.raises(ValueError, match="auto_commit_interval_ms"):
        Consumer(TOPIC, config=config(tower), group=GROUP, auto_commit_interval_ms=0)
    with Consumer(TOPIC, config=config(tower)) as plain:
        with pytest.raises(ValueError, match="needs a consumer group"):
            plain.commit()
        assert plain.committed("P") is None
        assert "group_members" not in plain.stats()


def test_a_closing_member_hands_over_at_once_at_its_last_commit(tower, store):
    producers = [Producer(TOPIC, config(tower)) for _ in range(4)]
    partitions = [p.address for p in producers]

    def send(offsets: range) -> None:
        for producer in producers:
            for i in offsets:
                producer.send(b"%d" % i)
        for producer in producers:
            producer.flush(10)

    listener = Recorder()
    a = Consumer(TOPIC, config=config(tower), group=GROUP, listener=listener)
    b = None
    try:
        # B joins once A has read the first half: A hands two partitions over at its commit and B reads on
        # from there.  B listens for 1 s before it reads its share: a newcomer that has not heard the reader
        # by then reads beside it until the views agree (rfc 14.4), and this file's 100 ms are short on a
        # loaded machine.  (Members that start together may both read for a while too, and B commits
        # nothing by itself: its first records could come twice, as in Kafka.)
        send(range(50))
        got = read([a], lambda got: len(a.assignment()) == 4 and len(got) == 200)
        b = Consumer(TOPIC, config=config(tower, consumer__group__join_wait=1000), group=GROUP,
                     enable_auto_commit=False)
        got += read([a, b], lambda got: len(a.assignment()) == 2 and len(b.assignment()) == 2)
        send(range(50, 100))
        got += read([a, b], lambda got: len(got) >= 200)
        time.sleep(0.3)
        got += a.consume(1000, timeout=0.1) + b.consume(1000, timeout=0.1)
        assert sorted((r.partition, r.offset) for r in got) == sorted((p, o) for p in partitions for o in range(100))
        assert a.assignment() | b.assignment() == {TopicPartition(TOPIC, p) for p in partitions}
        assert listener.owned() == a.assignment()
        # B, without auto commit, commits 60 of each of its partitions by hand.
        b_parts = {tp.partition for tp in b.assignment()}
        b.commit({(TOPIC, p): 60 for p in b_parts})
        assert all(b.committed(p) == 60 for p in b_parts)
        started = time.monotonic()
        b.close()
        again = read([a], lambda got: {tp.partition for tp in a.assignment()} == set(partitions), timeout=5)
        assert time.monotonic() - started < 1.0  # not after the member timeout (2 s): at once
        again += read([a], lambda got: len(again) + len(got) >= 80)
        time.sleep(0.3)
        again += a.consume(1000, timeout=0.2)
        assert sorted((r.partition, r.offset) for r in again) == sorted((p, o) for p in b_parts for o in range(60, 100))
        assert listener.events[-1] == ("assigned", {TopicPartition(TOPIC, p) for p in b_parts})
        assert listener.owned() == a.assignment() == {TopicPartition(TOPIC, p) for p in partitions}
    finally:
        a.close()
        if b is not None:
            b.close()
        for producer in producers:
            producer.close()


def test_rebalance_callbacks_may_commit_and_ask_the_assignment(tower, store):
    partitions = publish(tower, 2, 10)
    seen = []

    def on_assign(assigned):
        seen.append(("assigned", set(assigned), member.assignment()))

    def on_revoke(revoked):
        member.commit()  # kafka-python's usual place for a manual commit
        seen.append(("revoked", set(revoked), member.assignment()))

    member = Consumer(TOPIC, config=config(tower), group=GROUP, enable_auto_commit=False,
                      on_assign=on_assign, on_revoke=on_revoke)
    try:
        got = read([member], lambda got: len(got) == 20)
        assert len(got) == 20
    finally:
        member.close()
    everything = {TopicPartition(TOPIC, p) for p in partitions}
    assert seen[-1] == ("revoked", everything, everything)  # on close, before it lets go
    assert all(kind != "assigned" or tps <= now for kind, tps, now in seen)
    with Consumer(TOPIC, config=config(tower), group=GROUP) as again:
        assert read([again], lambda got: len(again.assignment()) == 2) == []
        assert all(again.committed(p) == 10 for p in partitions)  # the commit made in on_revoke


def test_a_group_that_restarts_whole_resumes_from_the_commits_the_store_kept(tower, store):
    partitions = publish(tower, 3, 50)
    with Consumer(TOPIC, config=config(tower), group=GROUP) as first:
        got = read([first], lambda got: len(got) == 150)
        assert len(got) == 150
    # auto commit committed everything on close; the producers are gone; the store answers for all.
    publish(tower, 1, 10)
    with Consumer(TOPIC, config=config(tower), group=GROUP) as second:
        got = read([second], lambda got: len(got) >= 10)
        time.sleep(0.5)
        got += second.consume(1000, timeout=0.2)
        assert len(got) == 10 and {r.partition for r in got}.isdisjoint(partitions)
        assert all(second.committed(p) == 50 for p in partitions)
        assert second.stats()["group_members"] == 1
        collector = metrics.PeerCollector()
        collector.add(second)
        scraped = {m.name: m.samples for m in collector.collect()}
        assert [(s.labels["group"], s.value) for s in scraped["dafka_group_members"]] == [(GROUP, 1)]
        assert scraped["dafka_group_partitions"][0].value == 4


def test_without_auto_commit_a_restart_resumes_at_the_last_explicit_commit(tower, store):
    (partition,) = publish(tower, 1, 30)
    with Consumer(TOPIC, config=config(tower), group=GROUP, enable_auto_commit=False) as first:
        got = read([first], lambda got: len(got) == 30)
        first.commit({(TOPIC, partition): 12})
    with Consumer(TOPIC, config=config(tower), group=GROUP) as second:
        got = read([second], lambda got: len(got) == 18)
        assert [r.offset for r in got] == list(range(12, 30))


def test_async_consumer_in_a_group(tower, store):
    partitions = publish(tower, 2, 20)

    async def main():
        assigned = []
        async with AsyncConsumer(TOPIC, config=config(tower), group=GROUP, on_assign=assigned.extend) as c:
            got = []
            while len(got) < 40:
                for records in (await c.getmany(timeout_ms=100)).values():
                    got.extend(records)
            await c.commit()
            assert {await c.committed(p) for p in partitions} == {20}
            assert c.assignment() == set(assigned) == {TopicPartition(TOPIC, p) for p in partitions}
            return got

    got = asyncio.run(main())
    assert sorted((r.partition, r.offset) for r in got) == sorted((p, o) for p in partitions for o in range(20))


def test_auto_commit_happens_while_a_read_waits(tower, store):
    (partition,) = publish(tower, 1, 20)
    with Consumer(TOPIC, config=config(tower), group=GROUP, auto_commit_interval_ms=200) as c:
        got = read([c], lambda got: len(got) == 20)
        assert c.committed(partition) is None or c.committed(partition) < 20  # the last batch is not consumed yet
        assert c.poll(0.6) is None  # the caller came back: what it got is consumed, committed while it waits
        assert c.committed(partition) == 20
        assert [r.offset for r in got] == list(range(20))
