"""``dafka kafka``'s groups, commits and idempotent producers, with kafka-python, aiokafka and confluent-kafka.

Each client runs in its own Python (:func:`kafkahelpers.run_client`)."""

from __future__ import annotations

import json
import random
import socket
import subprocess
import struct
import sys
import time

import pytest

from helpers import free_port, loopback_config, script, wait_for
from test_metrics import scrape, total
from kafkahelpers import exactly, kafka_groups, kcat, run_client, start_gateway

from dafka.kafka import errors
from dafka.kafka.batches import write_batch
from dafka.kafka.messages import INIT_PRODUCER_ID, PRODUCE
from dafka.kafka.wire import Reader
from dafka.store import Store

pytestmark = pytest.mark.kafka

KAFKA_PYTHON_PRODUCE = """
import json, sys
from kafka import KafkaProducer
bootstrap, topic, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")  # idempotence is kafka-python 3's default
futures = [producer.send(topic, key=b"k%d" % i, value=b"v%d" % i) for i in range(n)]
meta = [f.get(timeout=30) for f in futures]
producer.close()
print(json.dumps({"idempotent": producer.config["enable_idempotence"],
                  "offsets": [[m.partition, m.offset] for m in meta]}))
"""

KAFKA_PYTHON_GROUP = """
import json, sys, time
from kafka import KafkaConsumer
bootstrap, topic, group, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest",
                         enable_auto_commit=False, consumer_timeout_ms=20000)
got = []
deadline = time.monotonic() + 60
while len(got) < n and time.monotonic() < deadline:
    for tp, records in consumer.poll(500).items():
        got += [[r.partition, r.offset, r.value.decode()] for r in records]
consumer.commit()
committed = {str(tp.partition): consumer.committed(tp) for tp in consumer.assignment()}
consumer.close()
print(json.dumps({"got": got, "committed": committed}))
"""


def test_kafka_python_produces_idempotently_and_a_group_reads_commits_and_resumes(kafka_cluster, processes, tmp_path):
    tower, _ = kafka_cluster
    metrics = free_port()
    _, bootstrap = start_gateway(processes, tower, tmp_path / "gw.log", "--num-partitions", "2",
                                 "--metrics-port", str(metrics))
    produced = run_client(KAFKA_PYTHON_PRODUCE, tmp_path, bootstrap, "kp", "200")
    assert produced["idempotent"] is True
    by_partition: dict[int, list[int]] = {}
    for partition, offset in produced["offsets"]:
        by_partition.setdefault(partition, []).append(offset)
    assert sorted(by_partition) == [0, 1]
    assert all(sorted(o) == list(range(len(o))) for o in by_partition.values())
    first = run_client(KAFKA_PYTHON_GROUP, tmp_path, bootstrap, "kp", "g1", "200")
    assert sorted(v for _, _, v in first["got"]) == sorted(f"v{i}" for i in range(200))
    assert first["committed"] == {str(p): len(o) for p, o in by_partition.items()}
    assert total(scrape(metrics), "dafka_kafka_group_lag", group="g1") == 0
    run_client(KAFKA_PYTHON_PRODUCE, tmp_path, bootstrap, "kp", "10")
    assert total(scrape(metrics), "dafka_kafka_group_lag", group="g1") == 10  # what the group has not read
    assert total(scrape(metrics), "dafka_kafka_group_members", group="g1") == 0  # it closed: it left
    # dafka status shows the group beside dafka's own, from the gateway's PEER-INFO
    (row,) = [r for r in kafka_groups(tower) if r["group"] == "g1"]
    assert (row["state"], row["members"], row["lag"]) == ("Empty", 0, 10)
    assert {str(p["partition"]): p["committed"] for p in row["partitions"]} == first["committed"]
    assert all(p["topic"] == "kp" for p in row["partitions"]) and sum(p["lag"] for p in row["partitions"]) == 10
    table = subprocess.run([script("dafka"), "status", "--groups", "--pub", tower.pub_endpoint, "--sub",
                            tower.sub_endpoint, "-X", "beacon/address=127.0.0.1"], capture_output=True, timeout=30)
    lines = table.stdout.decode().splitlines()
    assert lines[0].split()[:3] == ["KAFKA", "GROUP", "GATEWAY"], lines
    assert sum(1 for line in lines if line.split()[:1] == ["g1"] and " Empty " in line) == 2  # a line a partition
    again = run_client(KAFKA_PYTHON_GROUP, tmp_path, bootstrap, "kp", "g1", "10")
    assert sorted(v for _, _, v in again["got"]) == sorted(f"v{i}" for i in range(10))  # only the new ones
    assert sum(again["committed"].values()) == 210


CONFLUENT_GROUP = """
import json, sys, time
import confluent_kafka
bootstrap, topic, group, n, members, strategy = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), \\
    int(sys.argv[5]), sys.argv[6]
consumers = [confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                                       "auto.offset.reset": "earliest", "enable.auto.commit": False,
                                       "partition.assignment.strategy": strategy, "session.timeout.ms": 6000,
                                       "heartbeat.interval.ms": 500})
             for _ in range(members)]
for c in consumers:
    c.subscribe([topic])
got, owners = [], [set() for _ in consumers]
deadline = time.monotonic() + 60
while len(got) < n and time.monotonic() < deadline:
    for i, c in enumerate(consumers):
        for msg in c.consume(100, 0.1):
            if msg.error() is None:
                got.append([msg.partition(), msg.offset(), msg.value().decode()])
                owners[i].add(msg.partition())
for c in consumers:
    if c.assignment():
        c.commit(asynchronous=False)
committed = {}
for c in consumers:
    for tp in c.committed(c.assignment(), timeout=10):
        committed[str(tp.partition)] = tp.offset
for c in consumers:
    c.close()
print(json.dumps({"got": got, "owners": [sorted(o) for o in owners], "committed": committed}))
"""

CONFLUENT_PRODUCE = """
import json, sys
import confluent_kafka
bootstrap, topic, n, start = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
errors = []
for i in range(start, start + n):
    producer.produce(topic, key=b"k%d" % i, value=b"v%d" % i,
                     on_delivery=lambda err, msg: errors.append(str(err)) if err else None)
    producer.poll(0)
left = producer.flush(30)
print(json.dumps({"left": left, "errors": errors}))
"""


@pytest.mark.parametrize("strategy", ["range", "cooperative-sticky"])
def test_a_confluent_kafka_group_of_two_shares_the_partitions_and_resumes_from_its_commits_after_a_restart(
        kafka_cluster, processes, tmp_path, strategy):
    tower, _ = kafka_cluster
    gateway, bootstrap = start_gateway(processes, tower, tmp_path / "gw.log", "--num-partitions", "4")
    produced = run_client(CONFLUENT_PRODUCE, tmp_path, bootstrap, "cg", "400", "0")
    assert produced == {"left": 0, "errors": []}
    first = run_client(CONFLUENT_GROUP, tmp_path, bootstrap, "cg", "g", "400", "2", strategy)
    values = [v for _, _, v in first["got"]]
    assert sorted(values) == sorted(f"v{i}" for i in range(400))  # each once
    assert all(first["owners"]) and not set(first["owners"][0]) & set(first["owners"][1])  # both read, apart
    assert sum(first["committed"].values()) == 400
    # The commits are in the cluster: a restarted gateway reads them back.
    gateway.terminate()
    assert gateway.wait(20) == 0
    _, bootstrap = start_gateway(processes, tower, tmp_path / "gw.log", "--num-partitions", "4")
    assert run_client(CONFLUENT_PRODUCE, tmp_path, bootstrap, "cg", "40", "400") == {"left": 0, "errors": []}
    again = run_client(CONFLUENT_GROUP, tmp_path, bootstrap, "cg", "g", "40", "1", strategy)
    assert sorted(v for _, _, v in again["got"]) == sorted(f"v{i}" for i in range(400, 440))
    assert sum(again["committed"].values()) == 440


AIOKAFKA_ROUND_TRIP = """
import asyncio, json, sys
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
bootstrap, topic, n = sys.argv[1], sys.argv[2], int(sys.argv[3])

async def main():
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, acks="all")
    await producer.start()
    try:
        sent = [await producer.send_and_wait(topic, b"v%d" % i, key=b"k%d" % i) for i in range(n)]
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id="aio", auto_offset_reset="earliest",
                                enable_auto_commit=False)
    await consumer.start()
    got = []
    try:
        while len(got) < n:
            batch = await asyncio.wait_for(consumer.getmany(timeout_ms=500), 30)
            for records in batch.values():
                got += [[r.partition, r.offset, r.value.decode()] for r in records]
        await consumer.commit()
        committed = {str(tp.partition): await consumer.committed(tp) for tp in consumer.assignment()}
    finally:
        await consumer.stop()
    print(json.dumps({"sent": [[m.partition, m.offset] for m in sent], "got": got, "committed": committed}))

asyncio.run(main())
"""


def test_aiokafka_produces_idempotently_and_its_group_reads_and_commits(kafka_cluster, processes, tmp_path):
    tower, _ = kafka_cluster
    _, bootstrap = start_gateway(processes, tower, tmp_path / "gw.log", "--num-partitions", "3")
    out = run_client(AIOKAFKA_ROUND_TRIP, tmp_path, bootstrap, "aio", "90")
    assert sorted(v for _, _, v in out["got"]) == sorted(f"v{i}" for i in range(90))
    assert sorted(map(tuple, out["sent"])) == sorted((p, o) for p, o, _ in out["got"])
    assert sum(out["committed"].values()) == 90


def _call(sock: socket.socket, api, version: int, body: dict, correlation: int) -> dict:
    """One request as a client writes it (header v1: these versions are not flexible), and its answer."""
    out = [struct.pack(">hhih", api.key, version, correlation, 3), b"raw"]
    api.request.write_version(out, body, False, version)
    frame = b"".join(out)
    sock.sendall(struct.pack(">i", len(frame)) + frame)
    size = struct.unpack(">i", exactly(sock, 4))[0]
    answer = exactly(sock, size)
    assert struct.unpack_from(">i", answer)[0] == correlation
    return api.response.read_version(Reader(answer[4:]), False, version)


def _produce_idempotent(sock: socket.socket, topic: str, pid: int, epoch: int, seq: int, values: list[bytes],
                        correlation: int) -> tuple[int, int]:
    """One idempotent batch of ``values`` to partition 0 of ``topic``, as a client writes it: (error, base offset)."""
    batch = write_batch(0, [(i, 0, None, v) for i, v in enumerate(values)], producer_id=pid, producer_epoch=epoch,
                        base_sequence=seq)
    answer = _call(sock, PRODUCE, 7, {"transactional_id": None, "acks": -1, "timeout_ms": 10000, "topic_data": [
        {"name": topic, "partition_data": [{"index": 0, "records": batch}]}]}, correlation)
    part = answer["responses"][0]["partition_responses"][0]
    return part["error_code"], part["base_offset"]


def test_a_retried_idempotent_batch_gets_its_first_answer_and_is_stored_once(kafka_cluster, processes, tmp_path):
    """What a client does when an answer is lost: it sends the same batch (producer id, epoch, sequence)
    again. The gateway answers with the offset the first one got and appends nothing; a gap in the
    sequence is refused.  So does a gateway SIGKILLed and restarted in between: it reads the batches
    back from the topic's sequences partition."""
    tower, _ = kafka_cluster
    metrics, port = free_port(), free_port()
    gateway, bootstrap = start_gateway(processes, tower, tmp_path / "gw.log", "--metrics-port", str(metrics),
                                       "--port", str(port))
    host = bootstrap.split(":")[0]

    def produce(sock, seq: int, values: list[bytes], correlation: int) -> tuple[int, int]:
        return _produce_idempotent(sock, "idem", pid, epoch, seq, values, correlation)

    with socket.create_connection((host, int(port)), timeout=30) as sock:
        ids = _call(sock, INIT_PRODUCER_ID, 1, {"transactional_id": None, "transaction_timeout_ms": 60000}, 1)
        assert ids["error_code"] == 0 and ids["producer_id"] >= 0
        pid, epoch = ids["producer_id"], ids["producer_epoch"]
        assert produce(sock, 0, [b"a0", b"a1", b"a2"], 2) == (0, 0)
        assert produce(sock, 0, [b"a0", b"a1", b"a2"], 3) == (0, 0)  # the retry
        assert produce(sock, 3, [b"b0", b"b1"], 4) == (0, 3)
        assert produce(sock, 3, [b"b0", b"b1"], 5) == (0, 3)
        assert produce(sock, 9, [b"c0"], 6)[0] == errors.OUT_OF_ORDER_SEQUENCE_NUMBER
    read = kcat("-b", bootstrap, "-C", "-t", "idem", "-e", "-f", "%s %o\n")
    assert read.stdout.decode().splitlines() == ["a0 0", "a1 1", "a2 2", "b0 3", "b1 4"]
    assert total(scrape(metrics), "dafka_kafka_duplicates_total") == 2
    gateway.kill()
    gateway.wait(10)
    start_gateway(processes, tower, tmp_path / "gw.log", "--metrics-port", str(metrics), "--port", str(port))
    with socket.create_connection((host, port), timeout=30) as sock:
        assert produce(sock, 3, [b"b0", b"b1"], 7) == (0, 3)  # the last batch again: its first answer
        assert produce(sock, 0, [b"a0", b"a1", b"a2"], 8) == (0, 0)  # and the one before it
        assert produce(sock, 5, [b"d0"], 9) == (0, 5)  # the next one follows
        assert produce(sock, 9, [b"e0"], 10)[0] == errors.OUT_OF_ORDER_SEQUENCE_NUMBER
    read = kcat("-b", bootstrap, "-C", "-t", "idem", "-e", "-f", "%s %o\n")
    assert read.stdout.decode().splitlines() == ["a0 0", "a1 1", "a2 2", "b0 3", "b1 4", "d0 5"]
    assert total(scrape(metrics), "dafka_kafka_duplicates_total") == 2


def test_an_idempotent_batch_refused_as_too_large_leaves_no_note_that_a_restart_would_believe(kafka_cluster,
                                                                                              processes, tmp_path):
    """A record over producer/max_record_bytes is found once the batch is noted: MESSAGE_TOO_LARGE, and
    the note is voided, so that the batch appended next at the same offsets is the one a restarted gateway
    answers retries of."""
    tower, _ = kafka_cluster
    port = free_port()
    args = ("--port", str(port), "-X", "producer/max_record_bytes=1000")
    gateway, bootstrap = start_gateway(processes, tower, tmp_path / "gw.log", *args)

    def produce(sock, seq: int, values: list[bytes], correlation: int) -> tuple[int, int]:
        return _produce_idempotent(sock, "big", pid, epoch, seq, values, correlation)

    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        ids = _call(sock, INIT_PRODUCER_ID, 1, {"transactional_id": None, "transaction_timeout_ms": 60000}, 1)
        pid, epoch = ids["producer_id"], ids["producer_epoch"]
        assert produce(sock, 0, [b"x" * 2000], 2)[0] == errors.MESSAGE_TOO_LARGE
        assert produce(sock, 0, [b"a", b"b"], 3) == (0, 0)
    gateway.kill()
    gateway.wait(10)
    start_gateway(processes, tower, tmp_path / "gw.log", *args)
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        assert produce(sock, 0, [b"a", b"b"], 4) == (0, 0)  # a retry: answered again
        assert produce(sock, 2, [b"c"], 5) == (0, 2)
    read = kcat("-b", bootstrap, "-C", "-t", "big", "-e", "-f", "%s %o\n")
    assert read.stdout.decode().splitlines() == ["a 0", "b 1", "c 2"]


CONFLUENT_ADMIN = """
import json, sys, time
import confluent_kafka
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic
bootstrap = sys.argv[1]
admin = AdminClient({"bootstrap.servers": bootstrap})
out = {}
created = admin.create_topics([NewTopic("made", 3), NewTopic("bad name!", 1),
                               NewTopic("rf", 1, replication_factor=3)], operation_timeout=20)
for name, future in created.items():
    try:
        future.result(30)
        out[name] = "ok"
    except confluent_kafka.KafkaException as exc:
        out[name] = exc.args[0].name()
again = admin.create_topics([NewTopic("made", 3)])["made"]
try:
    again.result(30)
    out["again"] = "ok"
except confluent_kafka.KafkaException as exc:
    out["again"] = exc.args[0].name()
out["partitions"] = len(admin.list_topics(timeout=10).topics["made"].partitions)
producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap})
producer.produce("made", b"x", partition=2)
producer.flush(10)
consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": "adm", "auto.offset.reset": "earliest"})
consumer.subscribe(["made"])
deadline = time.monotonic() + 30
while time.monotonic() < deadline and consumer.poll(0.2) is None:
    pass
consumer.commit(asynchronous=False)
groups = admin.list_consumer_groups().result(10)
out["listed"] = sorted(g.group_id for g in groups.valid)
described = admin.describe_consumer_groups(["adm"])["adm"].result(10)
out["members"] = len(described.members)
out["state"] = str(described.state)
consumer.close()
config = admin.describe_configs([ConfigResource("topic", "made")])
entries = list(config.values())[0].result(10)
out["cleanup.policy"] = entries["cleanup.policy"].value
from confluent_kafka.admin import OffsetSpec
asked = {confluent_kafka.TopicPartition("made", 2): OffsetSpec.latest(),
         confluent_kafka.TopicPartition("made", 1): OffsetSpec.earliest(),
         confluent_kafka.TopicPartition("made", 0): OffsetSpec.for_timestamp(int(time.time() * 1000) + 60000)}
out["offsets"] = {str(tp.partition): f.result(20).offset for tp, f in admin.list_offsets(asked).items()}
out["deleted"] = [f.result(10) is None for f in admin.delete_consumer_groups(["adm"]).values()]
try:
    admin.delete_topics(["made"])["made"].result(10)
    out["delete_topic"] = "ok"
except confluent_kafka.KafkaException as exc:
    out["delete_topic"] = [exc.args[0].name(), exc.args[0].str()]
print(json.dumps(out))
"""


def test_confluent_kafkas_admin_client_creates_topics_lists_topics_and_offsets_describes_and_deletes_groups(
        kafka_cluster, processes, tmp_path):
    tower, _ = kafka_cluster
    _, bootstrap = start_gateway(processes, tower, tmp_path / "gw.log")
    out = run_client(CONFLUENT_ADMIN, tmp_path, bootstrap)
    assert out["made"] == "ok" and out["again"] == "TOPIC_ALREADY_EXISTS"
    assert out["bad name!"] == "TOPIC_EXCEPTION"  # librdkafka's name for INVALID_TOPIC_EXCEPTION (17)
    assert out["rf"] == "INVALID_REPLICATION_FACTOR"
    assert out["partitions"] == 3
    assert "adm" in out["listed"] and out["members"] == 1 and "STABLE" in out["state"]
    assert out["cleanup.policy"] == "delete"
    assert out["offsets"] == {"2": 1, "1": 0, "0": -1}  # latest after one record, earliest, none past the end
    assert out["deleted"] == [True]
    assert out["delete_topic"][0] == "TOPIC_DELETION_DISABLED"  # (librdkafka asks DeleteTopics v4: no message)


def test_two_kcat_group_members_split_the_partitions_and_read_every_record_once(kafka_cluster, processes, tmp_path):
    tower, _ = kafka_cluster
    _, bootstrap = start_gateway(processes, tower, tmp_path / "gw.log", "--num-partitions", "4")
    lines = b"".join(b"k%d:v%d\n" % (i, i) for i in range(40))
    assert kcat("-b", bootstrap, "-P", "-t", "kg", "-K:", data=lines).returncode == 0
    members = [subprocess.Popen(["kcat", "-b", bootstrap, "-G", "grp", "kg", "-e", "-f", "%p %o %s\n",
                                 "-X", "auto.offset.reset=earliest"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
               for _ in range(2)]
    try:
        outs = [m.communicate(timeout=60)[0].decode().split("\n")[:-1] for m in members]
    finally:
        for m in members:
            m.kill()
    partitions = [{line.split()[0] for line in out} for out in outs]
    assert all(partitions) and not partitions[0] & partitions[1]  # both members read, each its own partitions
    assert sorted(line.split()[2] for out in outs for line in out) == sorted(f"v{i}" for i in range(40))


KILLED_PRODUCE = """
import json, sys, time
import confluent_kafka
bootstrap, topic, n, acked_path = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                                     "linger.ms": 5, "message.timeout.ms": 60000, "reconnect.backoff.max.ms": 500})
acked, failed = [], []
def report(err, msg):
    (failed if err else acked).append(msg.key().decode())
for i in range(n):
    producer.produce(topic, b"v%d" % i, key=b"k%d" % i, on_delivery=report)
    producer.poll(0)
    if i % 500 == 0:
        time.sleep(0.05)  # about 10,000 records/s: the kill comes mid-run
left = producer.flush(90)
with open(acked_path, "w") as out:
    json.dump(acked, out)
print(json.dumps({"acked": len(acked), "failed": len(failed), "left": left}))
"""


@pytest.mark.faults
def test_a_gateway_killed_under_load_loses_no_acknowledged_record(kafka_cluster, processes, tmp_path):
    """SIGKILL mid-run with acks=all and idempotence, and a restart on the same port: every record the
    client had acknowledged is in the partition after the restart, once: the restarted gateway reads the
    idempotent batches back from the topic's sequences partition, and answers the client's retries of
    those the stores hold without a second append."""
    tower, _ = kafka_cluster
    port = str(free_port())
    gateway, bootstrap = start_gateway(processes, tower, tmp_path / "gw.log", "--port", port)
    acked_path = tmp_path / "acked.json"
    client = subprocess.Popen([sys.executable, "-c", KILLED_PRODUCE, bootstrap, "killed", "40000", str(acked_path)],
                              cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        time.sleep(1.0)
        assert client.poll() is None  # mid-run
        gateway.kill()
        gateway.wait(10)
        start_gateway(processes, tower, tmp_path / "gw.log", "--port", port)
        out, err = client.communicate(timeout=120)
    finally:
        client.kill()
    assert client.returncode == 0, err.decode()[-3000:]
    summary = json.loads(out.decode().splitlines()[-1])
    acked = json.loads(acked_path.read_text())
    assert summary["acked"] == len(acked) > 0
    read = kcat("-b", bootstrap, "-C", "-t", "killed", "-e", "-f", "%k\n", timeout=60)
    stored = read.stdout.decode().split()
    missing = set(acked) - set(stored)
    assert not missing, (len(missing), sorted(missing)[:5])
    assert len(stored) == len(set(stored)), f"{len(stored) - len(set(stored))} records stored twice"
    print(f"{len(acked):,} acknowledged, {summary['failed']} failed, {len(stored):,} stored, none twice")


@pytest.mark.timeout(120)
def test_a_compacted_topic_reads_with_its_gaps_as_kafkas_compacted_topics_do(tower, processes, tmp_path, monkeypatch):
    from dafka.store import cleaner

    monkeypatch.setattr(cleaner, "IDLE_MS", 500)  # compact once the partition is idle for 0.5 s (not 10)
    store = Store(loopback_config(tower, store__compaction__topics="kc"), db=str(tmp_path / "store")).start()
    try:
        _, bootstrap = start_gateway(processes, tower, tmp_path / "gw.log")
        lines = b"".join(b"key%d:v%d\n" % (i % 10, i) for i in range(300))
        assert kcat("-b", bootstrap, "-P", "-t", "kc", "-K:", "-X", "acks=all", data=lines).returncode == 0
        wait_for(lambda: store.stats()["compaction_deleted"] >= 290, 60, what="the store compacted")
        read = kcat("-b", bootstrap, "-C", "-t", "kc", "-e", "-f", "%o %k %s\n", timeout=60)
        rows = [line.split() for line in read.stdout.decode().splitlines()]
        assert [int(o) for o, _, _ in rows] == list(range(290, 300))  # the newest of each key, at its offset
        assert {k: v for _, k, v in rows} == {f"key{i % 10}": f"v{i}" for i in range(290, 300)}
    finally:
        store.stop()


def test_a_produce_whose_answer_fails_closes_its_connection_and_nothing_waits(tower, monkeypatch):
    """A failure while a pipelined Produce is answered (a bug) closes that connection, logged; the reader
    waiting on the queue of answers does not wait for ever, and the gateway serves the next client."""
    import asyncio

    from dafka.kafka.server import KafkaGateway

    async def main() -> None:
        gateway = KafkaGateway(loopback_config(tower), port=0)
        await gateway.start()

        async def broken(*args):
            raise RuntimeError("a bug")

        monkeypatch.setattr(gateway, "_produce", broken)
        monkeypatch.setattr(gateway, "_known", lambda names, create: asyncio.sleep(0, {}))
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
            out = [struct.pack(">hhih", PRODUCE.key, 7, 1, 3), b"raw"]
            PRODUCE.request.write_version(out, {"transactional_id": None, "acks": -1, "timeout_ms": 1000,
                                                "topic_data": []}, False, 7)
            frame = b"".join(out)
            for _ in range(3):  # pipelined
                writer.write(struct.pack(">i", len(frame)) + frame)
            await writer.drain()
            assert await asyncio.wait_for(reader.read(), 10) == b""  # closed, without an answer
            writer.close()
            reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
            out = [struct.pack(">hhih", 18, 0, 9, 3), b"raw"]
            frame = b"".join(out)
            writer.write(struct.pack(">i", len(frame)) + frame)
            size = struct.unpack(">i", await asyncio.wait_for(reader.readexactly(4), 10))[0]
            assert struct.unpack_from(">i", await reader.readexactly(size))[0] == 9  # the next client is served
            writer.close()
        finally:
            await gateway.close()

    asyncio.run(main())


CONFLUENT_MEMBER = """
import json, os, sys
import confluent_kafka
bootstrap, topic, group, out_path = sys.argv[1:5]
out = open(out_path, "w", buffering=1)
consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                                     "auto.offset.reset": "earliest", "enable.auto.commit": False,
                                     "partition.assignment.strategy": "cooperative-sticky",
                                     "session.timeout.ms": 6000, "heartbeat.interval.ms": 500})

def commit():
    try:
        done = consumer.commit(asynchronous=False)
    except confluent_kafka.KafkaException as exc:
        if exc.args[0].code() != confluent_kafka.KafkaError._NO_OFFSET:  # (else nothing read since the last one)
            out.write(json.dumps(["commit-failed", exc.args[0].name()]) + "\\n")
        return
    out.write(json.dumps(["c", [[tp.partition, tp.offset] for tp in done]]) + "\\n")

def revoked(c, partitions):  # what was read of them is committed before another member takes them
    commit()
    out.write(json.dumps(["revoked", [tp.partition for tp in partitions]]) + "\\n")

consumer.subscribe([topic], on_revoke=revoked,
                   on_assign=lambda c, ps: out.write(json.dumps(["assigned", [tp.partition for tp in ps]]) + "\\n"))
since = 0
while not os.path.exists(out_path + ".stop"):
    for msg in consumer.consume(100, 0.1):
        if msg.error() is None:
            out.write(json.dumps(["r", msg.partition(), msg.offset(), msg.value().decode()]) + "\\n")
            since += 1
    if since >= 200:
        commit()
        since = 0
commit()
consumer.close()
out.write(json.dumps(["closed"]) + "\\n")
"""


def test_a_cooperative_sticky_group_of_three_under_load_survives_a_leave_a_join_and_a_kill(kafka_cluster, processes,
                                                                                          tmp_path):
    """Six partitions, records coming all along: one member leaves, one joins, one is SIGKILLed.  Every record
    is read, and the only ones read twice are what the killed member read after its last commit."""
    confluent_kafka = pytest.importorskip("confluent_kafka")
    tower, _ = kafka_cluster
    _, bootstrap = start_gateway(processes, tower, tmp_path / "gw.log", "--num-partitions", "6",
                                 "--initial-rebalance-delay-ms", "500")
    n, topic = 24_000, "busy"
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    producer.produce(topic, b"v-first")  # (the topic, before the members ask for it)
    assert producer.flush(20) == 0
    outs = {name: tmp_path / f"{name}.jsonl" for name in "ABCD"}

    def member(name: str) -> subprocess.Popen:
        return processes.start([sys.executable, "-c", CONFLUENT_MEMBER, bootstrap, topic, "busy-group",
                                str(outs[name])], cwd=tmp_path)

    def lines(name: str) -> list:
        text = outs[name].read_text() if outs[name].exists() else ""
        return [json.loads(line) for line in text.splitlines() if line.endswith("]")]

    members = {name: member(name) for name in "ABC"}
    wait_for(lambda: all(any(e[0] == "assigned" and e[1] for e in lines(m)) for m in "ABC"), 30,
             what="three members assigned")
    (row,) = [r for r in kafka_groups(tower) if r["group"] == "busy-group"]
    assert (row["state"], row["members"], row["protocol"]) == ("Stable", 3, "cooperative-sticky")
    errors_seen: list = []
    start = time.monotonic()
    for i in range(n):  # about 2,000 records/s for 12 s
        producer.produce(topic, b"v%d" % i, key=b"k%d" % i,
                         on_delivery=lambda err, msg: errors_seen.append(err) if err else None)
        producer.poll(0)
        if i % 200 == 199:
            time.sleep(max(0.0, start + (i + 1) / 2000 - time.monotonic()))
        if i == 6000:  # B leaves, once it has read (on a loaded machine its first fetch can come after 3 s)
            wait_for(lambda: producer.poll(0.05) is not None and any(e[0] == "r" for e in lines("B")), 30,
                     what="B reading before it leaves")
            (tmp_path / "B.jsonl.stop").touch()
        elif i == 10_000:
            members["D"] = member("D")  # D joins
        elif i == 16_000:
            members["C"].kill()  # C dies
    assert producer.flush(30) == 0 and not errors_seen
    members["B"].wait(20)
    expected = {"v-first", *(f"v{i}" for i in range(n))}

    def read_by() -> dict[str, list]:
        return {name: [e for e in lines(name) if e[0] == "r"] for name in "ABCD"}
    wait_for(lambda: {e[3] for rows in read_by().values() for e in rows} >= expected, 90,
             what="every record read")
    for name in "AD":
        (tmp_path / f"{name}.jsonl.stop").touch()
    for name in "AD":
        members[name].wait(20)
    reads = read_by()
    assert all(reads[name] for name in "ABCD"), {name: (len(rows), [e for e in lines(name) if e[0] not in "rc"])
                                                 for name, rows in reads.items()}
    assert ["closed"] in lines("B")
    # What C committed last, per partition; a record read twice must be one C read at or after it.
    c_commits: dict[int, int] = {}
    for e in lines("C"):
        if e[0] == "c":
            c_commits.update({p: o for p, o in e[1]})
    seen: dict[tuple[int, int], list[str]] = {}
    for name, rows in reads.items():
        for _, partition, offset, _value in rows:
            seen.setdefault((partition, offset), []).append(name)
    twice = {key: names for key, names in seen.items() if len(names) > 1}
    # A member whose commit was refused (during a rebalance) may have its uncommitted records read again, by
    # itself or another: Kafka's at-least-once; said by the member, so that any other duplicate still fails.
    refused = {name: [e[1] for e in lines(name) if e[0] == "commit-failed"] for name in "ABCD"}
    for (partition, offset), names in twice.items():
        if any(refused[name] for name in names):
            continue
        assert "C" in names and names.count("C") == 1 and len(names) == 2, (partition, offset, names, refused)
        assert offset >= c_commits.get(partition, 0), (partition, offset, c_commits)
    print(f"{len(seen):,} records read by {', '.join(f'{k} {len(v):,}' for k, v in reads.items())}; "
          f"{len(twice)} twice, after C's last commit or a refused commit ({refused})")


def test_an_idempotent_producer_through_dropped_and_delayed_responses_stores_every_record_once(kafka_cluster, processes,
                                                                                               tmp_path):
    """tests/lossy_proxy.py between confluent-kafka and the gateway drops 5% of the Produce responses (each
    with its connection) and delays a fifth of the others: librdkafka retries the batches it got no answer
    for, the gateway answers each retry with its first answer, and every record is stored once."""
    confluent_kafka = pytest.importorskip("confluent_kafka")
    from lossy_proxy import KafkaResponseProxy
    tower, _ = kafka_cluster
    chance = random.Random(46)

    def fault(api_key: int) -> tuple[bool, float]:
        if api_key != PRODUCE.key:
            return False, 0.0
        roll = chance.random()
        return roll < 0.05, (chance.random() * 0.03 if roll < 0.25 else 0.0)

    port, metrics = free_port(), free_port()
    proxy = KafkaResponseProxy(("127.0.0.1", port), fault)
    try:
        start_gateway(processes, tower, tmp_path / "gw.log", "--port", str(port), "--advertise",
                      f"127.0.0.1:{proxy.port}", "--num-partitions", "2", "--metrics-port", str(metrics))
        producer = confluent_kafka.Producer({"bootstrap.servers": f"127.0.0.1:{proxy.port}", "acks": "all",
                                             "enable.idempotence": True, "linger.ms": 2, "batch.num.messages": 200})
        failed: list = []
        n = 20_000
        for i in range(n):
            producer.produce("lossy", b"v%d" % i, key=b"k%d" % i,
                             on_delivery=lambda err, msg: failed.append(str(err)) if err else None)
            producer.poll(0)
        assert producer.flush(120) == 0 and failed == []
        assert proxy.dropped > 0 and proxy.delayed > 0
        duplicates = total(scrape(metrics), "dafka_kafka_duplicates_total")
        proxy.fault = lambda api_key: (False, 0.0)
        read = kcat("-b", f"127.0.0.1:{proxy.port}", "-C", "-t", "lossy", "-e", "-f", "%k\n", timeout=60)
        keys = read.stdout.decode().split()
        assert sorted(keys) == sorted(f"k{i}" for i in range(n))  # every record, once
        assert duplicates > 0  # (retries came, and were answered without a second append)
        print(f"{proxy.dropped} responses dropped, {proxy.delayed} delayed, {duplicates:.0f} retried batches "
              f"answered again, {len(keys):,} records stored once")
    finally:
        proxy.close()
