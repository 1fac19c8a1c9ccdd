"""``dafka kafka --sasl-users``: SASL/SCRAM-SHA-256, -512 and PLAIN with kcat, confluent-kafka, kafka-python and
aiokafka; a wrong password, no SASL at all, a request before authenticating and an oversized SASL frame each get
nothing and write nothing, and are counted; ``dafka kafka-user`` and its bad input."""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import urllib.request

import pytest

from dafka.kafka.messages import API_VERSIONS, METADATA, SASL_AUTHENTICATE, SASL_HANDSHAKE
from dafka.kafka.wire import Reader
from helpers import free_port, script
from kafkahelpers import exactly, kcat, run_client, start_gateway

pytestmark = pytest.mark.kafka


def add_user(path, name: str, password: str) -> None:
    done = subprocess.run([script("dafka"), "kafka-user", "add", name, "--file", str(path), "--password-stdin"],
                          input=password.encode() + b"\n", capture_output=True, timeout=30)
    assert done.returncode == 0, done.stderr.decode()


def sasl(mechanism: str, user: str, password: str) -> tuple[str, ...]:
    return ("-X", "security.protocol=sasl_plaintext", "-X", f"sasl.mechanisms={mechanism}",
            "-X", f"sasl.username={user}", "-X", f"sasl.password={password}")


def metric(port: int, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


KAFKA_PYTHON = """
import json, sys
from kafka import KafkaConsumer, KafkaProducer
bootstrap, mechanism, user, password, topic = sys.argv[1:6]
auth = dict(security_protocol="SASL_PLAINTEXT", sasl_mechanism=mechanism, sasl_plain_username=user,
            sasl_plain_password=password)
producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", **auth)
for i in range(50):
    producer.send(topic, b"kp%d" % i)
producer.flush(30)
producer.close()
consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=10000,
                         **auth)
print(json.dumps([r.value.decode() for r in consumer]))
"""

AIOKAFKA = """
import asyncio, json, sys
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
bootstrap, mechanism, user, password, topic, expected = *sys.argv[1:6], int(sys.argv[6])
auth = dict(security_protocol="SASL_PLAINTEXT", sasl_mechanism=mechanism, sasl_plain_username=user,
            sasl_plain_password=password)

async def main():
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", **auth)
    await producer.start()
    try:
        for i in range(50):
            await producer.send_and_wait(topic, b"aio%d" % i)
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", **auth)
    await consumer.start()
    got = []
    try:
        while len(got) < expected:
            batch = await asyncio.wait_for(consumer.getmany(timeout_ms=500), 30)
            for records in batch.values():
                got += [r.value.decode() for r in records]
    finally:
        await consumer.stop()
    print(json.dumps(got))

asyncio.run(main())
"""

CONFLUENT_WRONG = """
import json, sys
import confluent_kafka
bootstrap, topic = sys.argv[1:3]
p = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "security.protocol": "sasl_plaintext",
                              "sasl.mechanisms": "SCRAM-SHA-256", "sasl.username": "alice",
                              "sasl.password": "wrong", "message.timeout.ms": 5000})
errors = []
p.produce(topic, b"never", on_delivery=lambda e, m: errors.append(str(e)))
p.flush(15)
print(json.dumps(errors))
"""


def _frame(api, version: int, body: dict, correlation: int) -> bytes:
    out = [struct.pack(">hhih", api.key, version, correlation, 3), b"raw"]
    api.request.write_version(out, body, False, version)
    frame = b"".join(out)
    return struct.pack(">i", len(frame)) + frame


def _call(sock: socket.socket, api, version: int, body: dict, correlation: int = 1) -> dict:
    sock.sendall(_frame(api, version, body, correlation))
    answer = exactly(sock, struct.unpack(">i", exactly(sock, 4))[0])
    assert struct.unpack_from(">i", answer)[0] == correlation
    return api.response.read_version(Reader(answer[4:]), False, version)


def _closed(sock: socket.socket) -> bool:
    sock.settimeout(10)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_scram_and_plain_with_every_client_and_the_refused_get_and_write_nothing(kafka_cluster, processes, tmp_path):
    tower, _ = kafka_cluster
    users = tmp_path / "users.json"
    add_user(users, "alice", "s3cret-alice")
    add_user(users, "bob", "s3cret-bob")
    metrics = free_port()
    log = tmp_path / "gw.log"
    _, bootstrap = start_gateway(processes, tower, log, "--sasl-users", str(users), "--metrics-port", str(metrics))
    assert "with SASL (SCRAM-SHA-512, SCRAM-SHA-256, PLAIN)" in log.read_text()
    assert "SASL/PLAIN without TLS" in log.read_text()
    # kcat (librdkafka) with each mechanism
    for i, mechanism in enumerate(("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN")):
        put = kcat("-b", bootstrap, *sasl(mechanism, "alice", "s3cret-alice"), "-P", "-t", "vault",
                   data=b"kc%d\n" % i)
        assert put.returncode == 0, put.stderr
    read = kcat("-b", bootstrap, *sasl("SCRAM-SHA-256", "bob", "s3cret-bob"), "-C", "-t", "vault", "-e", "-f", "%s\n")
    assert read.returncode == 0 and read.stdout == b"kc0\nkc1\nkc2\n", read.stderr
    # kafka-python (SCRAM-SHA-512) and aiokafka (SCRAM-SHA-256) produce and read back
    kp = run_client(KAFKA_PYTHON, tmp_path, bootstrap, "SCRAM-SHA-512", "bob", "s3cret-bob", "kp")
    assert kp == [f"kp{i}" for i in range(50)]
    aio = run_client(AIOKAFKA, tmp_path, bootstrap, "SCRAM-SHA-256", "alice", "s3cret-alice", "aio", "50")
    assert aio == [f"aio{i}" for i in range(50)]
    aio = run_client(AIOKAFKA, tmp_path, bootstrap, "PLAIN", "bob", "s3cret-bob", "aio", "100")
    assert aio == [f"aio{i}" for i in range(50)] * 2
    # refused: a wrong password (confluent-kafka), no SASL, a user that does not exist; each writes nothing
    failed_before = metric(metrics, "dafka_kafka_authentication_failed_total")
    errors = run_client(CONFLUENT_WRONG, tmp_path, bootstrap, "vault")
    assert len(errors) == 1 and ("Authentication" in errors[0] or "timed out" in errors[0]), errors
    plain = kcat("-b", bootstrap, "-m", "5", "-P", "-t", "vault", data=b"anonymous\n", timeout=60)
    nobody = kcat("-b", bootstrap, "-m", "5", *sasl("SCRAM-SHA-512", "mallory", "x"), "-P", "-t", "vault",
                  data=b"mallory\n", timeout=60)
    assert plain.returncode != 0 and nobody.returncode != 0
    assert b"Authentication failed" in nobody.stderr or b"SASL authentication error" in nobody.stderr, nobody.stderr
    assert metric(metrics, "dafka_kafka_authentication_failed_total") >= failed_before + 3
    read = kcat("-b", bootstrap, *sasl("PLAIN", "alice", "s3cret-alice"), "-C", "-t", "vault", "-e", "-f", "%s\n")
    assert read.stdout == b"kc0\nkc1\nkc2\n", read.stderr
    host, port = bootstrap.split(":")
    # raw: ApiVersions is answered before authenticating, anything else closes the connection
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        assert _call(sock, API_VERSIONS, 1, {})["error_code"] == 0
        sock.sendall(_frame(METADATA, 1, {"topics": None}, 2))
        assert _closed(sock)
    # raw: a SASL frame over sasl.server.max.receive.size (512 KiB) closes the connection unread
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        assert _call(sock, SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"})["error_code"] == 0
        sock.sendall(struct.pack(">i", 600_000) + b"\0" * 1000)
        assert _closed(sock)
    # raw: an unknown mechanism is refused with the list of those offered; then the connection goes
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        answer = _call(sock, SASL_HANDSHAKE, 1, {"mechanism": "GSSAPI"})
        assert answer == {"error_code": 33, "mechanisms": ["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"]}
        assert _closed(sock)
    # raw, SaslHandshake v0: the PLAIN token goes bare (a size, the bytes), and Kafka requests follow
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        assert _call(sock, SASL_HANDSHAKE, 0, {"mechanism": "PLAIN"})["error_code"] == 0
        token = b"\0bob\0s3cret-bob"
        sock.sendall(struct.pack(">i", len(token)) + token)
        assert exactly(sock, 4) == b"\0\0\0\0"
        brokers = _call(sock, METADATA, 1, {"topics": None}, 3)["brokers"]
        assert [b["port"] for b in brokers] == [int(port)]
    # raw: a wrong PLAIN password in SaslAuthenticate gets error 58 and its message, then the connection goes
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        _call(sock, SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"})
        answer = _call(sock, SASL_AUTHENTICATE, 1, {"auth_bytes": b"\0bob\0nope"}, 4)
        assert answer["error_code"] == 58 and "invalid username or password" in answer["error_message"]
        assert _closed(sock)
    assert "SASL PLAIN refused" in log.read_text() and "before authenticating" in log.read_text()


def test_kafka_user_manages_the_file_and_bad_input_names_itself(tmp_path):
    users = tmp_path / "users.json"
    add_user(users, "carol", "one")
    add_user(users, "dave", "two")
    listed = subprocess.run([script("dafka"), "kafka-user", "list", "--file", str(users)], capture_output=True,
                            timeout=30)
    assert listed.stdout.decode().splitlines() == ["carol\tSCRAM-SHA-256,SCRAM-SHA-512",
                                                   "dave\tSCRAM-SHA-256,SCRAM-SHA-512"]
    assert "one" not in users.read_text() and "two" not in users.read_text()
    removed = subprocess.run([script("dafka"), "kafka-user", "remove", "dave", "--file", str(users)],
                             capture_output=True, timeout=30)
    assert removed.returncode == 0 and "dave" not in users.read_text()
    for args, named in ((["kafka-user", "remove", "nobody", "--file", str(users)], "no user 'nobody'"),
                        (["kafka-user", "add", "a,b", "--file", str(users), "--password-stdin"], "NAME"),
                        (["kafka-user", "list", "--file", str(tmp_path / "none.json")], "no such file"),
                        (["kafka", "--port", "0", "--sasl-users", str(tmp_path / "none.json")], "--sasl-users"),
                        (["kafka", "--port", "0", "--sasl-users", str(users), "--sasl-mechanisms", "GSSAPI"],
                         "--sasl-mechanisms")):
        done = subprocess.run([script("dafka"), *args], input=b"pw\n", capture_output=True, timeout=30)
        assert done.returncode == 2 and named in done.stderr.decode(), (args, done.stderr.decode())


CONFLUENT_GROUP = """
import json, sys
import confluent_kafka
bootstrap, user, password, group, topic = sys.argv[1:6]
c = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "security.protocol": "sasl_plaintext",
                              "sasl.mechanisms": "SCRAM-SHA-512", "sasl.username": user, "sasl.password": password,
                              "group.id": group, "auto.offset.reset": "earliest"})
c.subscribe([topic])
got, failed = [], []
for _ in range(40):
    m = c.poll(0.5)
    if m is None:
        if got:
            break
        continue
    if m.error() is not None:
        failed.append(m.error().name())
        break
    got.append(m.value().decode())
c.close()
print(json.dumps({"got": got, "errors": failed}))
"""


def test_acls_limit_each_user_to_its_topics_and_groups(kafka_cluster, processes, tmp_path):
    tower, _ = kafka_cluster
    users = tmp_path / "users.json"
    add_user(users, "alice", "pa")
    add_user(users, "bob", "pb")
    acl = tmp_path / "acl.txt"
    acl.write_text("alice  read,write,create  topic  orders\n"
                   "alice  write,create       topic  hidden\n"
                   "alice  read               group  billing\n"
                   "bob    read               topic  orders   # and describe, which read implies\n")
    metrics = free_port()
    _, bootstrap = start_gateway(processes, tower, tmp_path / "gw.log", "--sasl-users", str(users), "--acl", str(acl),
                                 "--sasl-mechanisms", "SCRAM-SHA-512", "--metrics-port", str(metrics))
    alice, bob = sasl("SCRAM-SHA-512", "alice", "pa"), sasl("SCRAM-SHA-512", "bob", "pb")
    assert kcat("-b", bootstrap, *alice, "-P", "-t", "orders", data=b"o1\no2\n").returncode == 0
    assert kcat("-b", bootstrap, *alice, "-P", "-t", "hidden", data=b"h1\n").returncode == 0
    denied_before = metric(metrics, "dafka_kafka_denied_total")
    refused = kcat("-b", bootstrap, *bob, "-P", "-t", "orders", data=b"bob\n", timeout=60)
    assert refused.returncode != 0 and b"Topic authorization failed" in refused.stderr, refused.stderr
    read = kcat("-b", bootstrap, *bob, "-C", "-t", "orders", "-e", "-f", "%s\n")
    assert read.returncode == 0 and read.stdout == b"o1\no2\n", read.stderr
    hidden = kcat("-b", bootstrap, *alice, "-C", "-t", "hidden", "-e", "-f", "%s\n")  # alice may write it, not read
    assert hidden.returncode != 0 and b"authorization failed" in hidden.stderr.lower(), hidden.stderr
    listed = kcat("-b", bootstrap, *bob, "-L", "-J")
    assert [t["topic"] for t in json.loads(listed.stdout)["topics"]] == ["orders"], listed.stdout
    # groups: alice reads in billing; bob may not join it
    mine = run_client(CONFLUENT_GROUP, tmp_path, bootstrap, "alice", "pa", "billing", "orders")
    assert mine == {"got": ["o1", "o2"], "errors": []}
    theirs = run_client(CONFLUENT_GROUP, tmp_path, bootstrap, "bob", "pb", "billing", "orders")
    assert theirs == {"got": [], "errors": ["GROUP_AUTHORIZATION_FAILED"]}
    assert metric(metrics, "dafka_kafka_denied_total") >= denied_before + 3
    read = kcat("-b", bootstrap, *alice, "-C", "-t", "orders", "-e", "-f", "%s\n")
    assert read.stdout == b"o1\no2\n"  # bob wrote nothing
    bad = subprocess.run([script("dafka"), "kafka", "--port", "0", "--acl", str(tmp_path / "missing.txt")],
                         capture_output=True, timeout=30)
    acl.write_text("bob fly topic orders\n")
    worse = subprocess.run([script("dafka"), "kafka", "--port", "0", "--acl", str(acl)], capture_output=True, timeout=30)
    assert bad.returncode == 2 and "--acl" in bad.stderr.decode() and "cannot read it" in bad.stderr.decode()
    assert worse.returncode == 2 and "line 1: unknown operation 'fly'" in worse.stderr.decode(), worse.stderr
