"""More than one tower: every peer lists both, one is killed mid-run, and nothing is lost or stalls."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
import zmq

from dafka import Consumer, Producer, protocol as proto
from dafka.discovery.beacon import Beacon
from dafka.store import Store
from helpers import free_port, loopback_config, wait_for

pytestmark = pytest.mark.slow


def tower_process(processes) -> tuple[object, str, str]:
    sub, pub = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    proc = processes.start([sys.executable, "-c", "from dafka.towerd.main import main; main()", "--sub", sub,
                            "--pub", pub], stderr=subprocess.PIPE, text=True)
    assert "beacons in" in proc.stderr.readline()  # bound
    return proc, sub, pub


def take(consumer: Consumer, seen: dict[tuple[str, int], int], timeout: float = 0.05) -> None:
    """Poll once (a consumer meets its peers as it polls), noting what arrived."""
    for record in consumer.consume(1000, timeout=timeout):
        key = (record.partition, record.offset)
        seen[key] = seen.get(key, 0) + 1


def read(consumer: Consumer, seen: dict[tuple[str, int], int], until: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while len(seen) < until and time.monotonic() < deadline:
        take(consumer, seen, 0.2)
    assert len(seen) >= until, f"{consumer.address}: {len(seen)} of {until} records"


@pytest.mark.timeout(120)
def test_two_towers_one_killed_a_newcomer_is_still_found_and_nothing_is_lost(processes, tmp_path):
    first, sub_a, pub_a = tower_process(processes)
    _, sub_b, pub_b = tower_process(processes)
    config = loopback_config(**{"beacon/sub_address": f"{sub_a},{sub_b}", "beacon/pub_address": f"{pub_a},{pub_b}",
                                "beacon/interval": 200, "beacon/timeout": 1000,
                                "consumer/offset/reset": "earliest", "producer/min_acks": 1})
    store = Store(config, db=str(tmp_path / "store")).start()
    producer = Producer("towers", config)
    early = Consumer("towers", config=config)
    try:
        seen_early: dict[tuple[str, int], int] = {}
        wait_for(lambda: take(early, seen_early) or producer.stats()["peers"] >= 3 and early.stats()["peers"] >= 3,
                 20, what="the producer and the consumer to meet the cluster")
        # Heard through both towers, each peer counts once.
        assert producer.stats()["peers"] == 3 and early.stats()["peers"] == 3
        for i in range(500):
            producer.send(b"before %d" % i)
        producer.flush(20)
        read(early, seen_early, 500, 30)

        first.send_signal(signal.SIGKILL)
        first.wait(10)
        time.sleep(1.5)  # past beacon/timeout: a peer heard only through the dead tower would have expired
        take(early, seen_early)
        assert producer.stats()["peers"] == 3 and early.stats()["peers"] == 3

        # A newcomer meets everyone through the tower that is left, and reads from the beginning.
        late = Consumer("towers", config=config)
        seen_late: dict[tuple[str, int], int] = {}
        try:
            wait_for(lambda: take(late, seen_late) or late.stats()["peers"] >= 3, 20,
                     what="the newcomer to meet the cluster")
            for i in range(500, 1000):
                producer.send(b"after %d" % i)
            producer.flush(20)
            read(late, seen_late, 1000, 30)
            read(early, seen_early, 1000, 30)
        finally:
            late.close()
        # every record once, to both
        assert sorted(seen_early) == sorted(seen_late) == [(producer.address, n) for n in range(1000)]
        assert set(seen_early.values()) == set(seen_late.values()) == {1}
    finally:
        early.close()
        producer.close(10)
        store.stop()


@pytest.mark.timeout(60)
def test_a_tower_of_the_list_that_is_down_does_not_unscope_the_others_peers(tower):
    """Scoped discovery (rfc 5.6) counts the towers that welcomed the peer, not the ones it lists: with
    one of two towers down, a consumer still hears only the producers of its topic (and the stores)."""
    dead_sub, dead_pub = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    subs, pubs = f"{tower.sub_endpoint},{dead_sub}", f"{tower.pub_endpoint},{dead_pub}"

    def beacon(sender: str, port: int, role: bytes, topic: str) -> Beacon:
        b = Beacon(zmq.Context.instance(), sender, port, host="127.0.0.1", tower_sub=subs, tower_pub=pubs,
                   interval_ms=200, timeout_ms=1000, name="test", scoped=True)
        b.add_profile(role, topic)
        return b.start()

    consumer = beacon("CA" * 16, 43001, proto.ROLE_CONSUMER, "a")
    mine = beacon("PA" * 16, 43002, proto.ROLE_PRODUCER, "a")
    other = beacon("PB" * 16, 43003, proto.ROLE_PRODUCER, "b")
    try:
        wait_for(lambda: set(consumer.peers().values()) == {"PA" * 16} and consumer.scoped, 10,
                 what=f"the consumer scoped, hearing its producer: {consumer.peers()}")
        time.sleep(1.0)  # five intervals: a peer waiting for the dead tower's answer would have unscoped
        assert consumer.scoped and set(consumer.peers().values()) == {"PA" * 16}
    finally:
        for b in (consumer, mine, other):
            b.stop()
