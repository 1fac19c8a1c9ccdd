"""Resource limits: floods of FETCH for huge ranges must not make a store or a
producer use unbounded memory.

The flood: requester addresses nobody subscribes to ("phantoms") and
requesters that never read their answers (their SUB connects and subscribes
to its DIRECT-RECORDs, then sleeps) ask again and again (5 rounds in 3 s) for
``count = 2^32-1`` records of a 200,000-record partition; one requester that
reads its answer shows that the flood really reaches the peer.  The peer's RSS
(``/proc/<pid>/status`` VmRSS) is sampled before and during the flood.
"""

from __future__ import annotations

import threading
import time

import plyvel
import pytest
import zmq

from dafka import protocol as proto
from dafka.config import Config
from dafka.core.inflight import FILTER_BLOCK, MESSAGE_OVERHEAD
from dafka.store import keys
from faultkit import FuzzPeer, addr
from helpers import wait_for
from roles import value_for

pytestmark = pytest.mark.faults

TOPIC = "flood"
N = 200_000
SIZE = 100
MIB = 1024


class Flood:
    """FETCH storms at ``target`` (the endpoint the answers come from)."""

    def __init__(self, peer: FuzzPeer, target: str, partition: str, *, slow: int, reading: int, phantom: int) -> None:
        ctx = zmq.Context.instance()
        self.peer = peer
        self.partition = partition
        self.slow = [addr() for _ in range(slow)]
        self.reading = [addr() for _ in range(reading)]
        self.phantom = [addr() for _ in range(phantom)]
        self.socks = []
        for requester in self.slow + self.reading:
            sock = ctx.socket(zmq.SUB)
            sock.linger = 0
            sock.setsockopt(zmq.SUBSCRIBE, proto.subscription(proto.DIRECT_RECORD, requester, exact=True))
            sock.connect(target)
            self.socks.append(sock)
        self.readers = self.socks[slow:]
        # Created last, so that once the target answers it, it has heard the others' subscriptions too.
        self.probe_address = addr()
        self.probe = ctx.socket(zmq.SUB)
        self.probe.linger = 0
        self.probe.setsockopt(zmq.SUBSCRIBE, proto.subscription(proto.DIRECT_RECORD, self.probe_address, exact=True))
        self.probe.connect(target)
        self.socks.append(self.probe)
        self.received = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._drain, name="flood-reader", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        poller = zmq.Poller()
        for sock in self.readers:
            poller.register(sock, zmq.POLLIN)
        while not self._stop.is_set():
            for sock, _ in poller.poll(50):
                while True:
                    try:
                        sock.recv_multipart(zmq.NOBLOCK)
                        self.received += 1
                    except zmq.Again:
                        break

    def wait_heard(self, timeout: float = 30) -> None:
        """Ask for one record from the probe until it comes: the target has then seen our subscriptions,
        and a FETCH of the flood will not wait for them (or be dropped unanswered, rfc 6.7, when they
        take longer than that on a starved machine)."""
        deadline = time.monotonic() + timeout
        while not self.probe.poll(0):
            assert time.monotonic() < deadline, f"the target did not answer a FETCH within {timeout} s"
            self.peer.xpub.send_multipart(proto.encode(proto.FetchMsg(self.partition, self.probe_address, TOPIC, 0, 1)))
            self.probe.poll(500)

    def fire(self, round_: int) -> int:
        """FETCH(0, 2^32-1) from every idle and phantom requester, and (first
        round only) from the reading ones; returns how many were sent."""
        sent = 0
        for requester in self.slow + (self.reading if round_ == 0 else []) + self.phantom:
            self.peer.xpub.send_multipart(
                proto.encode(proto.FetchMsg(self.partition, requester, TOPIC, 0, proto.MAX_COUNT)))
            sent += 1
        return sent

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for sock in self.socks:
            sock.close(0)


def flood_and_measure(role, flood: Flood, seconds: float, rounds: int) -> dict:
    flood.wait_heard()
    baseline = role.rss_kib()
    peak = baseline
    fetches = 0
    started = time.monotonic()
    next_round = started
    fired = 0
    while time.monotonic() - started < seconds:
        if fired < rounds and time.monotonic() >= next_round:
            fetches += flood.fire(fired)
            fired += 1
            next_round += seconds / rounds / 2
        peak = max(peak, role.rss_kib())
        assert role.alive(), role.tail()
        time.sleep(0.05)
    return {"baseline_mib": baseline // MIB, "peak_mib": peak // MIB, "growth_mib": (peak - baseline) // MIB,
            "fetches": fetches, "records_to_readers": flood.received}


def prefill(path, address: str) -> None:
    db = plyvel.DB(str(path), create_if_missing=True)
    with db.write_batch() as wb:
        for seq in range(N):
            wb.put(keys.record_key(TOPIC, address, seq), value_for(address, seq, SIZE))
        wb.put(keys.head_key(TOPIC, address), (N - 1).to_bytes(8, "big"))
    db.close()


@pytest.fixture
def flood_peer(tower):
    peer = FuzzPeer(tower.sub_endpoint, tower.pub_endpoint)
    yield peer
    peer.close()


def endpoint_of(tower, address: str) -> str:
    return wait_for(lambda: tower.peers().get(address), 10, what=f"{address} in the tower")


VARIANTS = [
    # (name, idle requesters, reading requesters, phantom requesters, */high_watermark override)
    pytest.param("1000 phantom requesters", 0, 1, 1000, None, id="phantoms"),
    pytest.param("4 idle + 500 phantom requesters, hwm 10000", 4, 1, 500, 10_000, id="idle-requesters-small-hwm"),
    pytest.param("4 idle requesters, default hwm", 4, 1, 0, None, id="idle-requesters-default-hwm"),
]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("name,slow,reading,phantom,hwm", VARIANTS)
def test_fetch_flood_does_not_grow_a_store_without_bound(cluster, tower, flood_peer, tmp_path, record_property,
                                                          name, slow, reading, phantom, hwm):
    partition = addr()
    db = tmp_path / "flood.db"
    prefill(db, partition)
    config = {} if hwm is None else {"store/high_watermark": hwm}
    store = cluster.store("s", db=db, **config)
    reader = store.wait_ready()[2]
    wait_for(lambda: flood_peer.subscribed(b"F"), 10, what="the reader subscribes F")
    flood = Flood(flood_peer, endpoint_of(tower, reader), partition, slow=slow, reading=reading, phantom=phantom)
    try:
        numbers = flood_and_measure(store, flood, seconds=6, rounds=5)
    finally:
        flood.close()
    stats = store.stats()
    numbers.update(records_served=stats.get("records_served"), answers_dropped=stats.get("answers_dropped"),
                   fetches_unheard=stats.get("fetches_unheard"))
    print(f"store under a FETCH flood ({name}):", numbers)
    record_property("rss", numbers)
    assert numbers["records_to_readers"] > 0, "the flood never reached the store"
    assert store.alive()
    # A requester without bulk answers (a reference peer) may have its answer run to
    # the end of its block of 100,000 sequences (rfc section 6.7).  Ours ask again from
    # sequence 0 every round without reading: a round that comes while less than a
    # budget is in flight starts a new answer, which runs to the end of the block, so
    # each may hold up to its budget plus one block (100,000 DIRECT-RECORDs here), never
    # more: once the budget is spent, an answer from the start of a block does not start.
    block_mib = FILTER_BLOCK * (SIZE + 80 + MESSAGE_OVERHEAD) / 2**20
    budget_mib = Config.load()["store/fetch_inflight_bytes"] / 2**20
    assert numbers["growth_mib"] < 80 + slow * (budget_mib + block_mib), numbers


@pytest.mark.timeout(180)
@pytest.mark.parametrize("name,slow,reading,phantom,hwm", VARIANTS)
def test_fetch_flood_does_not_grow_a_producer_without_bound(cluster, tower, flood_peer, record_property,
                                                             name, slow, reading, phantom, hwm):
    config = {} if hwm is None else {"producer/high_watermark": hwm}
    producer = cluster.producer("p", TOPIC, count=N, hold=True, size=SIZE, **config)  # no store: it keeps all N
    producer.wait_stat(lambda s: s.get("sent", 0) == N, 60, f"{N} sent and held")
    p = producer.address
    wait_for(lambda: flood_peer.subscribed(b"F" + p.encode() + b"\0"), 10, what="the producer subscribes F<p>")
    flood = Flood(flood_peer, endpoint_of(tower, p), p, slow=slow, reading=reading, phantom=phantom)
    try:
        numbers = flood_and_measure(producer, flood, seconds=6, rounds=5)
    finally:
        flood.close()
    print(f"producer under a FETCH flood ({name}):", numbers)
    record_property("rss", numbers)
    assert numbers["records_to_readers"] > 0, "the flood never reached the producer"
    assert producer.alive()
    assert numbers["growth_mib"] < 200, numbers


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (/proc/<pid>/stat), in seconds."""
    import os

    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_share(pid: int, seconds: float) -> float:
    """The share of one core the process used over the next ``seconds``."""
    before = cpu_seconds(pid)
    time.sleep(seconds)
    return (cpu_seconds(pid) - before) / seconds


@pytest.mark.timeout(120)
def test_a_store_serves_nobody_for_requesters_that_never_listen_or_leave(cluster, tower, flood_peer, tmp_path):
    """Issue 24: FETCHes whose requester never subscribed to the answers ("phantoms")
    are held UNHEARD_WAIT for the subscription, then dropped unanswered; a requester
    that leaves in the middle of its answer stops costing anything."""
    from dafka.protocol.bulk import UNHEARD_WAIT

    partition = addr()
    db = tmp_path / "phantoms.db"
    prefill(db, partition)
    store = cluster.store("s", db=db)
    reader = store.wait_ready()[2]
    wait_for(lambda: flood_peer.subscribed(b"F"), 10, what="the reader subscribes F")
    time.sleep(1.0)  # the store settles after its start
    idle = cpu_share(store.pid, 1.0)

    # 200 phantoms ask for the whole partition, 3 times.
    flood = Flood(flood_peer, endpoint_of(tower, reader), partition, slow=0, reading=0, phantom=200)
    try:
        for round_ in range(3):
            flood.fire(round_)
            time.sleep(0.2)
        store.wait_stat(lambda s: s.get("fetches_received", 0) >= 600, 10, "the phantoms' FETCHes")
        busy = cpu_share(store.pid, 1.0)
        assert store.fresh_stat("records_served") == 0
        store.wait_stat(lambda s: s.get("fetches_unheard", 0) == 200, UNHEARD_WAIT + 5, "the phantoms dropped")
    finally:
        flood.close()

    # A requester that reads part of its answer, then leaves.
    leaving = Flood(flood_peer, endpoint_of(tower, reader), partition, slow=0, reading=1, phantom=0)
    try:
        time.sleep(0.5)  # its SUB connects and subscribes
        leaving.fire(0)
        wait_for(lambda: leaving.received >= 1_000, 10, what="the leaving requester reads")
    finally:
        leaving.close()  # its SUB closes: the store sees the unsubscription
    store.wait_stat(lambda s: s.get("answers_abandoned", 0) >= 1, 10, "the answer abandoned")
    served = store.fresh_stat("records_served")
    time.sleep(0.5)
    after = cpu_share(store.pid, 2.0)
    print(f"store CPU: idle {idle:.1%}, with 200 phantoms {busy:.1%}, after the reader left {after:.1%}; "
          f"records served {served:,} of {N:,}")
    assert served < N
    assert store.fresh_stat("records_served") == served
    assert busy < 0.25 and after < 0.05 + idle


class PeakRss(threading.Thread):
    """The RSS of some roles every 20 ms: their growth over their first sample."""

    def __init__(self, **roles) -> None:
        super().__init__(daemon=True)
        self.roles = roles
        self.base = {name: role.rss_kib() for name, role in roles.items()}
        self.peak = dict(self.base)
        self._done = threading.Event()
        self.start()

    def run(self) -> None:
        while not self._done.wait(0.02):
            for name, role in self.roles.items():
                try:
                    self.peak[name] = max(self.peak[name], role.rss_kib())
                except (OSError, ValueError):
                    pass

    def growth_mib(self) -> dict[str, float]:
        self._done.set()
        self.join(5)
        return {name: (self.peak[name] - self.base[name]) / MIB for name in self.roles}


@pytest.mark.timeout(180)
def test_a_slow_consumer_and_its_producer_stay_within_their_byte_bounds_and_lose_nothing(cluster, fault_report):
    """Issue 24: consumer/receive_bytes and producer/send_bytes bound the queues
    between a producer and a consumer that reads too slowly, whatever the size of
    the records: beyond them libzmq stops reading (the consumer) or drops (the
    producer's queue for that consumer), and the consumer fetches what it missed
    from the store."""
    from dafka.core.sockets import MAX_MESSAGE_BYTES
    from faultcheck import check
    from faultkit import acked_keys

    receive, send = 1024 * 1024, 16 * 1024 * 1024
    n, size = 60_000, 1000  # 60 MB, far more than either queue may hold
    store = cluster.store("s")
    # A producer slower than the consumer's sleep (a loaded machine) runs ahead of the gap the consumer fetches
    # when it wakes: what it keeps out of order meanwhile is bounded in bytes too.
    buffered = 4 * 1024 * 1024
    slow = cluster.consumer("slow", TOPIC, slow_seconds=8.0, consumer__receive_bytes=receive,
                            consumer__max_buffered_bytes=buffered)
    rss = PeakRss(consumer=slow)
    # The producer keeps what the store has not acked: that too is bounded in bytes.  send_bytes is larger,
    # as it should be: then the store's queue (which holds no more than that) never overflows.
    unacked = 8 * 1024 * 1024
    producer = cluster.producer("p", TOPIC, count=n, size=size, wait_peers=3, producer__send_bytes=send,
                                producer__max_unacked_bytes=unacked)
    rss.roles["producer"] = producer
    rss.base["producer"] = rss.peak["producer"] = producer.rss_kib()
    assert producer.wait_exit(60) == 0, producer.tail()
    cluster.wait_delivered("slow", acked_keys(producer), 60)
    growth = rss.growth_mib()
    assert slow.stop() == 0 and store.stop() == 0
    print(f"RSS growth (MiB), receive_bytes 1 MiB, send_bytes 16 MiB, {n:,} records of {size} B: {growth}")
    # What the queues may hold (each bound is per connected peer, rounded up to one 256 KiB message),
    # plus the records the consumer takes off its socket per wake-up (4,096), what it keeps out of order, and
    # Python's own working set.
    queued_mib = (max(receive, MAX_MESSAGE_BYTES) + 4096 * size + buffered) / 2**20
    # Without the bounds (1,000,000 messages a queue) the consumer grew by 101 MiB, or the producer by 59 MiB.
    assert growth["consumer"] < queued_mib + 16, growth
    assert growth["producer"] < (max(send, MAX_MESSAGE_BYTES) + unacked) / 2**20 + 16, growth
    fault_report(check("slow consumer, queues bounded in bytes", [producer.producer_log()], cluster.consumer_runs(),
                       {"s": store.db}, complete_stores=["s"], value_size=size, topic=TOPIC))
