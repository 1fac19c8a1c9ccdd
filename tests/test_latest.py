"""``latest`` delivers every record produced after the subscription, and none from before (issue 49, rfc 20):
one-shot producers (real processes) against the console consumer and a group, partitions born before,
during and after the subscription, a store that comes late, and a raw-frame reference store beside
short-lived producers."""

from __future__ import annotations

import re
import time

from helpers import loopback_config, wait_for
from dafka import Consumer, Producer, protocol as proto
from dafka.producer.publish_times import STEP
from dafka.store import Store
from rawpeer import RawPeer
from test_cli import Cluster, Tool, assert_no_traceback, partition_of

TOPIC = "t"
LINE = re.compile(rb"^t ([0-9A-F]{32}) (\S+)$")


def one_shot(cluster: Cluster, name: str, count: int, *args: str) -> str:
    """A console producer that sends ``count`` lines ``name-i``, flushes and exits; its partition."""
    lines = b"".join(b"%s-%d\n" % (name.encode(), i) for i in range(count))
    producer = cluster.produce(TOPIC, lines, *args)
    assert producer.wait(20) == 0, producer.err.text
    return partition_of(producer.err.text)


def started(consumer: Tool) -> None:
    """Wait until a ``--verbose`` console consumer has subscribed (it logs its address after)."""
    consumer.err.wait_for(rb"consumer [0-9A-F]{32} on tcp://", timeout=20, what="the consumer to subscribe")


def printed(*consumers: Tool) -> list[tuple[str, str]]:
    """(partition, value) of every record the consumers printed, in order."""
    got = []
    for consumer in consumers:
        for line in consumer.out.lines():
            match = LINE.match(line)
            assert match, line
            got.append((match.group(1).decode(), match.group(2).decode()))
    return got



def before_the_subscription() -> None:
    """Let the records just sent age past :data:`dafka.producer.publish_times.STEP`: a producer's HEADS-AT is exact only
    for records published longer than that before the subscription (the ones within it are delivered: a lower
    bound, never a loss), and the subscription's time is in whole milliseconds."""
    time.sleep(10 * STEP)

def test_one_shot_producers_reach_a_latest_console_consumer_every_record_once(processes, tmp_path):
    """The issue's first scenario: 3 one-shot producers of 3 lines, a second apart, after a latest console
    consumer started (it printed 3 of 6 before, one line of each); a one-shot producer from before the
    subscription is not printed."""
    cluster = Cluster(processes)
    store = cluster.store(tmp_path / "db")
    before = one_shot(cluster, "before", 2)
    consumer = cluster.run("dafka_console_consumer", TOPIC, "--verbose", "--timeout-ms", "6000")
    started(consumer)
    partitions = []
    for k in range(3):
        partitions.append(one_shot(cluster, f"one-shot-{k}", 3))
        time.sleep(1)
    assert consumer.wait(40) == 0, consumer.err.text
    got = printed(consumer)
    assert sorted(got) == sorted((p, f"one-shot-{k}-{i}") for k, p in enumerate(partitions) for i in range(3))
    for k, p in enumerate(partitions):  # each partition in order
        assert [v for q, v in got if q == p] == [f"one-shot-{k}-{i}" for i in range(3)]
    assert before not in {p for p, _ in got}
    assert_no_traceback(store, consumer)


def test_a_group_of_two_without_commits_gets_every_one_shot_record_once(processes, tmp_path):
    """A group member with no commit for a partition starts it by the same rule: the two members together
    print each record written after they joined once, and none from before."""
    cluster = Cluster(processes)
    store = cluster.store(tmp_path / "db")
    before = one_shot(cluster, "before", 2)
    members = [cluster.run("dafka_console_consumer", TOPIC, "-g", "latest-group", "--verbose", "--timeout-ms", "8000")
               for _ in range(2)]
    for member in members:
        started(member)
    for member in members:  # the group formed: each reads its share, and has heard of the other
        member.err.wait_for(rb"reads its share", timeout=30, what="the member to read its share")
        member.err.wait_for(rb"member [0-9A-F]{32} joined", timeout=30, what="the other member")
    partitions = [one_shot(cluster, f"g{k}", 3) for k in range(3)]
    for member in members:
        assert member.wait(60) == 0, member.err.text
    got = printed(*members)
    assert sorted(got) == sorted((p, f"g{k}-{i}") for k, p in enumerate(partitions) for i in range(3))
    assert before not in {p for p, _ in got}
    assert_no_traceback(store, *members)


def test_partitions_born_before_during_and_after_the_subscription_without_a_store(tower):
    """No store: an old partition goes on from one past its last record before the subscription, one whose
    producer existed but had sent nothing starts at 0, and one born after the subscription from 0 too,
    though its first records went out before the consumer's SUB had connected to it."""
    config = loopback_config(tower, producer__min_acks=0)
    with Producer(TOPIC, config) as old, Producer(TOPIC, config) as idle:
        for i in range(3):
            old.send(b"old-%d" % i)
        old.flush()
        before_the_subscription()
        with Consumer(TOPIC, config=config) as consumer:
            with Producer(TOPIC, config) as new:  # born after the subscription
                for i in range(3):
                    new.send(b"new-%d" % i)
                for i in range(3, 6):
                    old.send(b"old-%d" % i)
                for i in range(2):
                    idle.send(b"idle-%d" % i)
                got: dict[str, list[tuple[int, bytes]]] = {}

                def every_record() -> bool:
                    record = consumer.poll(0.1)
                    if record is not None:
                        got.setdefault(record.partition, []).append((record.offset, record.value))
                    return sum(map(len, got.values())) >= 8

                wait_for(every_record, timeout=20, interval=0, what="8 records")
                assert consumer.poll(0.5) is None  # and nothing more
                assert got[old.address] == [(i, b"old-%d" % i) for i in range(3, 6)]
                assert got[new.address] == [(i, b"new-%d" % i) for i in range(3)]
                assert got[idle.address] == [(i, b"idle-%d" % i) for i in range(2)]


def test_a_store_that_starts_after_the_subscription_does_not_move_the_start(tower, tmp_path):
    """A store started after the subscription holds nothing from before it, so its answer lists the
    partition as held from nowhere; the producer's own answer is exact and wins: records from before
    the subscription, which the store fetched afterwards, are not delivered."""
    config = loopback_config(tower, producer__min_acks=0)
    with Producer(TOPIC, config) as producer:
        for i in range(2):
            producer.send(b"v%d" % i)
        producer.flush()
        before_the_subscription()
        with Consumer(TOPIC, config=config) as consumer:
            store = Store(loopback_config(tower), db=str(tmp_path / "late")).start()
            try:
                got = []

                def answered() -> bool:  # (the consumer's loop runs in poll: it connects to the store there)
                    record = consumer.poll(0.05)
                    if record is not None:
                        got.append(record)
                    return store.stats()["heads_at_sent"] >= 1

                wait_for(answered, timeout=20, interval=0, what="the late store's answers")
                for i in range(2, 4):
                    producer.send(b"v%d" % i)
                got += [consumer.poll(10) for _ in range(2)]
                assert [(r.offset, r.value) for r in got] == [(2, b"v2"), (3, b"v3")]
                assert consumer.poll(0.5) is None
            finally:
                store.stop()


def test_a_raw_frame_reference_store_learns_every_short_lived_producers_partition(processes, tmp_path):
    """A reference store (SUB ``M`` and ``H``) learns a partition only from a RECORD or a HEAD that reaches
    it. This one connects to new peers only once a second, as a busy C peer may: 6 producers that flush
    to a dafka-py store and exit would leave it none of their partitions, but each waits at close
    (producer/close_linger) until the peers it knows of connected, and sends its last HEAD then."""
    cluster = Cluster(processes)
    store = cluster.store(tmp_path / "db")
    tower = type("T", (), {"sub_endpoint": cluster.sub_address, "pub_endpoint": cluster.pub_address})
    ref = RawPeer(tower, "C" * 32, [proto.RECORD, proto.HEAD])
    try:
        lines = b"".join(b"r%d\n" % i for i in range(50))
        producers = [cluster.produce(TOPIC, lines) for _ in range(6)]
        heard: set[str] = set()
        next_pump = time.monotonic()
        deadline = time.monotonic() + 40
        while any(p.proc.poll() is None for p in producers) and time.monotonic() < deadline:
            if time.monotonic() >= next_pump:
                ref.pump()
                next_pump = time.monotonic() + 1.0
            if ref.sub.poll(20):
                msg = proto.decode(ref.sub.recv_multipart())
                if isinstance(msg, (proto.HeadMsg, proto.RecordMsg)) and msg.subject == TOPIC:
                    heard.add(msg.address)
            for p in producers:
                p.out.pump(0)
                p.err.pump(0)
        while ref.sub.poll(200):
            msg = proto.decode(ref.sub.recv_multipart())
            if isinstance(msg, (proto.HeadMsg, proto.RecordMsg)) and msg.subject == TOPIC:
                heard.add(msg.address)
        codes = [p.wait(20) for p in producers]
        assert codes == [0] * 6, [p.err.text for p in producers]
        assert heard == {partition_of(p.err.text) for p in producers}
    finally:
        ref.close()
    assert_no_traceback(store)
