"""Sharded stores (rfc 16) under load, with real processes: a store joins and another leaves mid-run, and a
store is SIGKILLed while a consumer catches up from it.  Nothing acked is lost or delivered twice, and every
partition ends on exactly store/replicas stores."""

from __future__ import annotations

import collections

import pytest

from faultcheck import check, read_store
from faultkit import acked_keys
from helpers import wait_for

pytestmark = [pytest.mark.faults, pytest.mark.timeout(300)]

TOPIC = "sharded"
CLUSTER_CONFIG = {  # every role's
    "store/replicas": 2, "beacon/interval": 300, "beacon/timeout": 1500, "store/dead_ms": 4000,
    "store/handoff_ms": 1000, "producer/min_acks": 2, "consumer/heads_interval": 500}


def settled(stores, partitions: int, timeout: float = 60) -> None:
    """Wait until the live stores hold exactly 2 copies of each partition, none under-replicated."""
    def done() -> bool:
        stats = [s.fresh_stats() for s in stores]
        return all(s.get("under_replicated", 1) == 0 for s in stats) and \
            sum(s.get("partitions", 0) for s in stats) == 2 * partitions
    try:
        wait_for(done, timeout, interval=0.5, what="2 copies of every partition, none under-replicated")
    except BaseException:
        print([(s.name, s.stats().get("partitions"), s.stats().get("under_replicated")) for s in stores])
        raise


def copies(stores, producers) -> collections.Counter:
    """How many stopped stores' databases hold each producer's acked records, all of them."""
    acked = {log.address: set(log.acked) for log in (p.producer_log() for p in producers)}
    held: collections.Counter = collections.Counter()
    for store in stores:
        content = read_store(store.db, TOPIC)
        for address, offsets in acked.items():
            if offsets and all((address, o) in content for o in offsets):
                held[address] += 1
    return held


# Alone, after the parallel phase: beside three other workers on 2 cores its starved stores took each other for
# dead and placed partitions again, and the group delivered thousands of records twice (CI, three runs of five).
# That false death under starvation is an open bug of its own; this test is about a join and a leave.
@pytest.mark.serial
def test_a_store_joins_and_another_leaves_mid_load(cluster, fault_report):
    stores = {name: cluster.store(name) for name in ("s1", "s2", "s3", "s4")}
    cluster.consumer("live", TOPIC)
    cluster.consumer("g1", TOPIC, group="billing")
    cluster.consumer("g2", TOPIC, group="billing")
    producers = [cluster.producer(f"p{n}", TOPIC, count=10_000, rate=800, wait_peers=10) for n in range(6)]
    producers[0].wait_stat(lambda s: s.get("acked", 0) >= 2_000, 30, "2000 acked")
    stores["s5"] = cluster.store("s5")  # joins: takes up its share, fetched from the others
    producers[0].wait_stat(lambda s: s.get("acked", 0) >= 5_000, 30, "5000 acked")
    assert stores.pop("s1").stop() == 0  # leaves: its partitions are placed again after store/dead_ms
    for producer in producers:
        assert producer.wait_exit(90) == 0, producer.tail()
    cluster.consumer("late", TOPIC)  # from the beginning, after the moves
    expected = acked_keys(*producers)
    for name in ("live", "late"):
        cluster.wait_delivered(name, expected, 90)
    wait_for(lambda: expected <= cluster.delivered("g1") | cluster.delivered("g2"), 90, interval=0.5,
             what="the group to deliver every acked record")
    settled(list(stores.values()), len(producers) + 2)  # and the offsets topic's partition of each member
    for role in [r for runs in cluster.runs.values() for r in runs]:
        assert role.stop() == 0
    for store in stores.values():
        assert store.stop() == 0
    held = copies(stores.values(), producers)
    assert sorted(held.values()) == [2] * len(producers), held
    logs = [p.producer_log() for p in producers]
    runs = cluster.consumer_runs()
    report = check("sharded: a store joins, another leaves", logs, runs, {name: s.db for name, s in stores.items()},
                   required_consumers=["live", "late"], stores_required=True)
    # The group's two members together: every acked record once (each member's order is checked above).
    group = collections.Counter((address, offset) for name in ("g1", "g2") for run in runs[name]
                                for address, offset, _ in run.deliveries)
    report.lost += len(expected - set(group))
    report.dup += sum(n - 1 for n in group.values() if n > 1)
    report.extra["group_members"] = {name: len(cluster.delivered(name)) for name in ("g1", "g2")}
    fault_report(report)


def test_a_store_killed_while_a_consumer_catches_up_from_it(cluster, fault_report):
    stores = [cluster.store(name) for name in ("s1", "s2", "s3")]
    producers = [cluster.producer(f"p{n}", TOPIC, count=15_000, wait_peers=6) for n in range(4)]
    for producer in producers:
        assert producer.wait_exit(90) == 0, producer.tail()
    settled(stores, len(producers))
    catching_up = cluster.consumer("late", TOPIC, slow_seconds=30, slow_delay=0.0002)
    catching_up.wait_stat(lambda s: s.get("delivered", 0) >= 10_000, 60, "10000 delivered")
    stores[0].kill()  # it holds about 2 of every 3 partitions, the consumer is part way through them
    delivered_at_kill = catching_up.fresh_stat("delivered")
    cluster.wait_delivered("late", acked_keys(*producers), 90)  # finished from the other copies
    assert catching_up.stop() == 0
    for store in stores[1:]:
        assert store.stop() == 0
    report = check("sharded: store SIGKILL during catch-up", [p.producer_log() for p in producers],
                   cluster.consumer_runs(), {"s2": stores[1].db, "s3": stores[2].db}, stores_required=True)
    report.extra["delivered_at_kill"] = delivered_at_kill
    assert delivered_at_kill < 60_000
    fault_report(report)
