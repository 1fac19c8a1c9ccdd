"""Bulk answers (DIRECT-RECORDS, rfc section 12) under faults: through a lossy
and duplicating link, cut short, to a requester that disappears mid-answer,
and from a store killed mid-answer.  Every consumer here catches up from
stores after its producer has gone, so what it delivers came in bulk."""

from __future__ import annotations

import random
import time

import pytest

from dafka import protocol as proto
from dafka.towerd.tower import Tower
from faultcheck import check
from faultkit import Cluster, acked_keys
from helpers import loopback_config
from lossy_proxy import LossyProxy

pytestmark = pytest.mark.faults

TOPIC = "bulk"


def stored(cluster: Cluster, name: str, n: int, size: int = 0):
    """A producer that sends ``n`` records (of ``size`` bytes), gets them all acked, and exits."""
    producer = cluster.producer(name, TOPIC, count=n, size=size, wait_peers=2)
    assert producer.wait_exit(120) == 0, producer.tail()
    return producer


def test_bulk_catch_up_through_a_lossy_duplicating_link(processes, tower, tmp_path, fault_report):
    """A consumer on tower B catches up from a store on tower A through a link
    that drops 10% and duplicates 10% of the FETCH answers (whole
    DIRECT-RECORDS), and cuts answers short: in every block of 10,000
    records, the first time they pass, everything from its 3,000th on is lost
    until the consumer asks for it again."""
    rng = random.Random(1212)
    cutting: dict[int, int] = {}  # block -> the first sequence lost, until the consumer asks for it again
    healed: set[int] = set()
    counts = {"bulk": 0, "cut": 0}

    def fault(frames, direction):
        kind = frames[0][:1]
        if kind not in (proto.DIRECT_RECORDS, proto.DIRECT_KEYED_RECORDS, proto.DIRECT_RECORD):
            return 1  # hellos, heads, FETCHes: this test is about the answers
        if kind != proto.DIRECT_RECORD:  # a bulk answer (with its keys, rfc 18, from a 0.3 consumer's FETCH)
            counts["bulk"] += 1
            first = proto.decode(frames).sequence
            block = first // 10_000
            cut = cutting.get(block)
            if cut is None and block not in healed and first >= block * 10_000 + 3_000:
                cutting[block] = first  # the answer is cut here...
                counts["cut"] += 1
                return 0
            if cut is not None:
                if first > cut:
                    return 0  # ...and the rest of it lost
                del cutting[block]  # asked again from the cut: from now on it flows
                healed.add(block)
        r = rng.random()
        return 0 if r < 0.10 else 2 if r < 0.20 else 1

    tower_b = Tower(loopback_config()).start()
    link = LossyProxy((tower.sub_endpoint, tower.pub_endpoint), (tower_b.sub_endpoint, tower_b.pub_endpoint), fault)
    try:
        side_a = Cluster(processes, tmp_path / "a", tower.sub_endpoint, tower.pub_endpoint)
        side_b = Cluster(processes, tmp_path / "b", tower_b.sub_endpoint, tower_b.pub_endpoint)
        store = side_a.store("s")
        producer = stored(side_a, "p", 60_000, size=300)  # about 70 DIRECT-RECORDS
        consumer = side_b.consumer("c", TOPIC)
        side_b.wait_delivered("c", acked_keys(producer), 120)
        time.sleep(0.5)  # duplicates still in flight must not be delivered
        assert consumer.stop() == 0 and store.stop() == 0
        report = check("bulk catch-up, lossy+dup link", [producer.producer_log()], side_b.consumer_runs(),
                       {"s": store.db}, complete_stores=["s"], value_size=300)
        report.extra.update(bulk_messages=counts["bulk"], cut_short=counts["cut"], dropped=link.dropped,
                            duplicated=link.duplicated)
        fault_report(report)
        assert counts["bulk"] > 0 and counts["cut"] >= 3 and link.dropped["A>B"] > 0
        assert link.duplicated["A>B"] > 0
    finally:
        link.close()
        tower_b.stop()


def test_a_requester_that_disappears_mid_answer(cluster, fault_report):
    """SIGKILL a consumer while it catches up: the store stops reading its
    answers (its pipe is gone) and serves the next consumer in full."""
    store = cluster.store("s", **{"store/fetch_inflight_bytes": 2 << 20})
    producer = stored(cluster, "p", 50_000, size=1_000)
    first = cluster.consumer("gone", TOPIC)
    first.wait_stat(lambda s: s.get("delivered", 0) >= 5_000, 60, "the first consumer reads")
    first.kill()
    # Its answer was paused on its budget (2 MiB of an 8 MiB window): the store drops it and what it owed.
    store.wait_stat(lambda s: s.get("answers_abandoned", 0) >= 1 and s.get("inflight_bytes", 1) == 0, 20,
                    "the store forgets the gone requester")
    cluster.consumer("next", TOPIC)
    cluster.wait_delivered("next", acked_keys(producer), 120)
    for role in cluster.runs["next"]:
        assert role.stop() == 0
    assert store.stop() == 0
    report = check("bulk: requester gone mid-answer", [producer.producer_log()], cluster.consumer_runs(),
                   {"s": store.db}, required_consumers=["next"], complete_stores=["s"], value_size=1_000)
    fault_report(report)


def test_a_store_killed_mid_answer(cluster, fault_report):
    """Two stores hold the records (the second filled from the first, in
    bulk); the one answering is SIGKILLed while a consumer catches up: the
    consumer finishes from the other."""
    s1 = cluster.store("s1")
    producer = cluster.producer("p", TOPIC, count=150_000, wait_peers=2, hold=True)
    producer.wait_stat(lambda s: s.get("acked", 0) >= 150_000, 120, "all acked by s1")
    s2 = cluster.store("s2")  # the producer's HEADs show it the partition: it fills itself from s1
    s2.wait_stat(lambda s: s.get("records_written", 0) >= 150_000, 120, "the second store filled")
    assert s1.fresh_stat("bulk_messages") > 0  # s2's writer read s1 in bulk
    assert producer.stop() == 0, producer.tail()
    consumer = cluster.consumer("c", TOPIC, **{"consumer/fetch_max_bytes": 1 << 20})
    consumer.wait_stat(lambda s: s.get("delivered", 0) >= 10_000, 60, "the consumer reads")
    s1.kill()
    cluster.wait_delivered("c", acked_keys(producer), 120)
    assert consumer.stop() == 0 and s2.stop() == 0
    report = check("bulk: store killed mid-answer", [producer.producer_log()], cluster.consumer_runs(),
                   {"s2": s2.db}, complete_stores=["s2"])
    fault_report(report)
