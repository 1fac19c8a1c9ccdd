"""Two ``dafka kafka`` gateways on one cluster, with real clients bootstrapped with both: the loss of either
loses no acknowledged record, and an idempotent producer stores none twice."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import confluent_kafka  # the test extra's: without it the tests fail, never skip
import pytest

from helpers import wait_for
from kafkahelpers import kcat, start_gateway

pytestmark = [pytest.mark.kafka, pytest.mark.faults]

def two_gateways(processes, tower, tmp_path, *args: str):
    """Gateways of node ids 1 and 2, each once it hears the other: [(process, bootstrap, log)]."""
    started = []
    for node in (1, 2):
        log = tmp_path / f"gw{node}.log"
        proc, bootstrap = start_gateway(processes, tower, log, "--node-id", str(node), *args)
        started.append((proc, bootstrap, log))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if all(brokers(bootstrap) == {1, 2} for _, bootstrap, _ in started):
            return started
        time.sleep(0.2)
    pytest.fail("the gateways did not hear each other: " + " | ".join(log.read_text() for _, _, log in started))


def brokers(bootstrap: str) -> set[int]:
    """The node ids a gateway's metadata lists."""
    listed = kcat("-b", bootstrap, "-L", "-J")
    assert listed.returncode == 0, listed.stderr
    return {b["id"] for b in json.loads(listed.stdout)["brokers"]}


def leaders(bootstrap: str, topic: str) -> dict[int, int]:
    """Kafka partition -> the node id that leads it, as kcat's metadata says."""
    listed = kcat("-b", bootstrap, "-L", "-t", topic, "-J")
    assert listed.returncode == 0, listed.stderr
    [meta] = json.loads(listed.stdout)["topics"]
    return {p["partition"]: p["leader"] for p in meta["partitions"]}


@pytest.fixture
def four_partitions(kafka_cluster, processes, tmp_path):
    """Two gateways whose topics get four partitions."""
    return two_gateways(processes, kafka_cluster[0], tmp_path, "--num-partitions", "4")


def assert_each_once(bootstrap: str, topic: str, partitions: int, n: int) -> None:
    """The topic holds values v0 .. v(n-1), each once."""
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": "check",
                                         "enable.auto.commit": False})
    consumer.assign([confluent_kafka.TopicPartition(topic, p, 0) for p in range(partitions)])
    got: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(got) < n and time.monotonic() < deadline:
        for msg in consumer.consume(1000, 0.5):
            assert msg.error() is None, msg.error()
            got.append(msg.value())
    got += [m.value() for m in consumer.consume(1000, 1.0)]  # and nothing more
    consumer.close()
    assert len(got) == len(set(got)), "a record stored twice"
    assert set(got) == {b"v%d" % i for i in range(n)}


def test_two_gateways_share_the_partitions_and_a_second_with_the_same_node_id_is_refused(kafka_cluster, processes,
                                                                                        tmp_path):
    tower, _ = kafka_cluster
    (_, first, _), (_, second, _) = two_gateways(processes, tower, tmp_path, "--num-partitions", "8")
    listed = kcat("-b", first, "-L")
    assert listed.returncode == 0, listed.stderr
    text = listed.stdout.decode()
    assert f"broker 1 at {first}" in text and f"broker 2 at {second}" in text
    produced = kcat("-b", f"{first},{second}", "-P", "-t", "shared", "-K:",
                    data=b"".join(b"k%d:v%d\n" % (i, i) for i in range(200)))
    assert produced.returncode == 0, produced.stderr
    led = leaders(first, "shared")
    assert led == leaders(second, "shared") and set(led.values()) == {1, 2}  # one view, both lead some
    read = kcat("-b", second, "-C", "-t", "shared", "-e", "-f", "%k=%s\n")
    assert sorted(read.stdout.decode().split()) == sorted(f"k{i}=v{i}" for i in range(200))
    # A third process with node id 2 stops, saying why.
    twin, _ = start_gateway(processes, tower, tmp_path / "twin.log", "--node-id", "2")
    assert twin.wait(30) == 1
    assert "node id 2 is another live gateway's" in (tmp_path / "twin.log").read_text()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("fault", ["killed", "killed-and-restarted", "stopped-and-continued"])
def test_a_gateway_killed_mid_run_loses_no_acknowledged_record_and_an_idempotent_producer_stores_none_twice(
        four_partitions, kafka_cluster, processes, tmp_path, fault):
    """... and, restarted under load while the other serves, it takes its partitions back: nothing lost,
    none produced twice (the twin rule: one writer a partition), and both views settle.  Stopped (SIGSTOP)
    for longer than the others wait to hear it, it is taken over; continued, its producers and the ones
    that took over see each other, both let go, and each partition is resumed by the one that leads it."""
    restarted = fault != "killed"
    (victim, first, _), (_, second, _) = four_partitions
    topic, n = "failover", 6000
    producer = confluent_kafka.Producer({"bootstrap.servers": f"{first},{second}", "acks": "all",
                                         "enable.idempotence": True, "linger.ms": 5,
                                         "topic.metadata.refresh.interval.ms": 1000})
    reports: list = []
    killed_at = None
    for i in range(n):
        producer.produce(topic, key=b"k%d" % i, value=b"v%d" % i,
                         on_delivery=lambda err, msg: reports.append((err, msg.partition(), msg.value())))
        producer.poll(0)
        if i == n // 3:
            producer.flush(30)
            assert set(leaders(first, topic).values()) == {1, 2}
            if fault == "stopped-and-continued":
                victim.send_signal(signal.SIGSTOP)
            else:
                victim.send_signal(signal.SIGKILL)
                victim.wait(5)
            killed_at = time.monotonic()
        if i == 2 * n // 3 and fault == "killed-and-restarted":
            start_gateway(processes, kafka_cluster[0], tmp_path / "gw1.log", "--node-id", "1", "--num-partitions", "4")
        if i == 2 * n // 3 and fault == "stopped-and-continued":
            # taken over (unheard for longer than 3 s): every record sent so far acked by node 2, then it goes on
            wait_for(lambda: producer.flush(0.5) == 0, 60, what="node 2 to take every partition over")
            assert set(leaders(second, topic).values()) == {2}
            victim.send_signal(signal.SIGCONT)
        time.sleep(0.002 if i > n // 3 else 0)
    assert producer.flush(120) == 0
    failed = [r for r in reports if r[0] is not None]
    assert failed == [], failed[:5]
    assert len(reports) == n
    assert killed_at is not None
    if restarted:  # both lead some again, and say so alike
        wait_for(lambda: set(leaders(second, topic).values()) == {1, 2}, 20, 0.5, what="node 1 to lead again")
    else:
        assert set(leaders(second, topic).values()) == {2}
    assert_each_once(second, topic, 4, n)


def group_led_by(node_id: int, prefix: str) -> str:
    """A group name whose coordinator, of gateways 1 and 2, is ``node_id`` (the hashing is the gateways')."""
    from dafka.kafka.gateways import Gateways, Node, group_key
    view = Gateways(Node(1, "h", 1))
    view.on_announcement(Node(2, "h", 2), False, now=0.0)
    return next(name for i in range(1000) if view.leader(group_key(name := f"{prefix}{i}")).node_id == node_id)


@pytest.mark.timeout(240)
def test_the_group_coordinators_gateway_killed_the_group_rebalances_on_the_other_and_resumes_from_its_commits(
        kafka_cluster, processes, tmp_path):
    tower, _ = kafka_cluster
    (victim, first, _), (_, second, _) = two_gateways(processes, tower, tmp_path, "--num-partitions", "2")
    topic, n, group = "grouped", 4000, group_led_by(1, "readers-")
    producer = confluent_kafka.Producer({"bootstrap.servers": f"{first},{second}", "acks": "all"})
    for i in range(n):
        producer.produce(topic, key=b"k%d" % i, value=b"v%d" % i)
    assert producer.flush(30) == 0
    consumer = confluent_kafka.Consumer({"bootstrap.servers": f"{first},{second}", "group.id": group,
                                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                                         "session.timeout.ms": 6000, "topic.metadata.refresh.interval.ms": 1000})
    consumer.subscribe([topic])
    seen: list[tuple[int, int]] = []

    def read(until, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not until() and time.monotonic() < deadline:
            msgs = consumer.consume(200, 0.5)
            for msg in msgs:
                assert msg.error() is None, msg.error()
                seen.append((msg.partition(), msg.offset()))
            if msgs:
                try:
                    consumer.commit(asynchronous=False)
                except confluent_kafka.KafkaException as exc:  # the group moving: its records come again
                    assert exc.args[0].code() in (confluent_kafka.KafkaError.UNKNOWN_MEMBER_ID,
                                                  confluent_kafka.KafkaError.REBALANCE_IN_PROGRESS,
                                                  confluent_kafka.KafkaError.ILLEGAL_GENERATION,
                                                  confluent_kafka.KafkaError.NOT_COORDINATOR), exc

    try:
        read(lambda: len(seen) >= n // 2, 60)
        assert len(seen) >= n // 2
        committed = {tp.partition: tp.offset for tp in consumer.committed(
            [confluent_kafka.TopicPartition(topic, p) for p in (0, 1)], timeout=10)}
        before = len(seen)
        victim.send_signal(signal.SIGKILL)
        victim.wait(5)
        killed_at = time.monotonic()
        read(lambda: len(set(seen)) >= n, 90)
        took = time.monotonic() - killed_at
    finally:
        consumer.close()
    per_partition = {p: sorted({o for q, o in seen if q == p}) for p in (0, 1)}
    assert sum(len(v) for v in per_partition.values()) == n, (len(seen), took)
    assert all(offsets == list(range(len(offsets))) for offsets in per_partition.values())
    # After the move it went on from its commits: what came twice is at or after the last commit of its partition.
    again = [s for s in seen[before:] if s in set(seen[:before])]
    assert all(offset >= committed[p] for p, offset in again), (again[:5], committed)


KAFKA_PYTHON_THROUGH_A_KILL = """
import json, sys, time
from kafka import KafkaProducer
bootstrap, topic, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", metadata_max_age_ms=1000)  # idempotent: its default
futures = [producer.send(topic, key=b"k%d" % i, value=b"v%d" % i) for i in range(n // 2)]
producer.flush(30)
print("HALF", flush=True)
sys.stdin.readline()  # the test killed a gateway
futures += [producer.send(topic, key=b"k%d" % i, value=b"v%d" % i) for i in range(n // 2, n)]
failed = []
for f in futures:
    try:
        f.get(timeout=120)
    except Exception as exc:
        failed.append(repr(exc))
producer.close()
print(json.dumps({"idempotent": producer.config["enable_idempotence"], "failed": failed[:5]}))
"""


@pytest.mark.timeout(240)
def test_kafka_pythons_idempotent_producer_goes_on_through_a_gateways_kill_with_no_record_lost_or_twice(
        four_partitions, tmp_path):
    (victim, first, _), (_, second, _) = four_partitions
    topic, n = "kp-failover", 3000
    client = subprocess.Popen([sys.executable, "-c", KAFKA_PYTHON_THROUGH_A_KILL, f"{first},{second}", topic, str(n)],
                              cwd=tmp_path, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert client.stdout.readline() == b"HALF\n", client.stderr.read().decode(errors="replace")[-3000:]
        victim.send_signal(signal.SIGKILL)
        victim.wait(5)
        client.stdin.write(b"\n")
        client.stdin.flush()
        out, err = client.communicate(timeout=180)
    finally:
        if client.poll() is None:
            client.kill()
    assert client.returncode == 0, err.decode(errors="replace")[-3000:]
    result = json.loads(out.decode().strip().splitlines()[-1])
    assert result == {"idempotent": True, "failed": []}
    assert_each_once(second, topic, 4, n)
