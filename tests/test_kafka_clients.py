"""``dafka kafka`` with real Kafka clients: Debian's kcat and the Python clients of the test extra."""

from __future__ import annotations

import socket
import struct
import time

import pytest

from helpers import loopback_config, wait_for
from kafkahelpers import exactly, kcat, start_gateway

from dafka import Consumer

pytestmark = pytest.mark.kafka


def test_kcat_lists_produces_keyed_lines_and_reads_them_back_from_the_start_and_from_an_offset(kafka_cluster, processes,
                                                                                                tmp_path):
    tower, store = kafka_cluster
    _, bootstrap = start_gateway(processes, tower, tmp_path / "gw.log")
    listed = kcat("-b", bootstrap, "-L")
    assert listed.returncode == 0, listed.stderr
    assert f"broker 1 at {bootstrap}" in listed.stdout.decode()
    lines = b"".join(b"k%d:line %d\n" % (i, i) for i in range(5))
    produced = kcat("-b", bootstrap, "-P", "-t", "lines", "-K:", data=lines)
    assert produced.returncode == 0, produced.stderr
    read = kcat("-b", bootstrap, "-C", "-t", "lines", "-e", "-f", "%k %s %o\n")
    assert read.returncode == 0, read.stderr
    assert read.stdout.decode().splitlines() == [f"k{i} line {i} {i}" for i in range(5)]
    later = kcat("-b", bootstrap, "-C", "-t", "lines", "-o", "3", "-e", "-f", "%s|")
    assert later.stdout == b"line 3|line 4|"
    listed = kcat("-b", bootstrap, "-L", "-t", "lines")
    assert 'topic "lines" with 1 partitions' in listed.stdout.decode()
    # The records are dafka records: a dafka consumer reads them with their keys.
    with Consumer("lines", config=loopback_config(tower, consumer__offset__reset="earliest")) as consumer:
        got: list = []
        wait_for(lambda: got.extend(consumer.consume(100, 0.05)) or len(got) >= 5, what="the dafka consumer")
    assert [(r.offset, r.key, r.value) for r in got] == [(i, b"k%d" % i, b"line %d" % i) for i in range(5)]


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_confluent_kafka_produces_with_every_codec_at_acks_all_and_reads_every_record_back(kafka_cluster, processes,
                                                                                           tmp_path, codec):
    confluent_kafka = pytest.importorskip("confluent_kafka")
    tower, store = kafka_cluster
    _, bootstrap = start_gateway(processes, tower, tmp_path / "gw.log", "--num-partitions", "2")
    topic, n = f"codec-{codec}", 3000
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all", "compression.codec": codec,
                                         "linger.ms": 5, "enable.idempotence": False})
    reports: list = []
    for i in range(n):
        producer.produce(topic, key=b"k%d" % i, value=b"v%d-" % i + b"x" * 90,
                         on_delivery=lambda err, msg: reports.append((err, msg.partition(), msg.offset())))
        producer.poll(0)
    assert producer.flush(30) == 0
    assert [r for r in reports if r[0] is not None] == []
    by_partition: dict[int, list[int]] = {}
    for _, partition, offset in reports:
        by_partition.setdefault(partition, []).append(offset)
    assert set(by_partition) == {0, 1}  # the keys spread over both
    for offsets in by_partition.values():
        assert sorted(offsets) == list(range(len(offsets)))  # dafka offsets, from 0, no gap
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": "readers",
                                         "enable.auto.commit": False})
    consumer.assign([confluent_kafka.TopicPartition(topic, p, 0) for p in (0, 1)])
    got: dict[bytes, bytes] = {}
    deadline = time.monotonic() + 30
    while len(got) < n and time.monotonic() < deadline:
        for msg in consumer.consume(1000, 0.5):
            assert msg.error() is None, msg.error()
            got[msg.key()] = msg.value()
    consumer.close()
    assert got == {b"k%d" % i: b"v%d-" % i + b"x" * 90 for i in range(n)}


def test_confluent_kafka_produces_100000_idempotent_records_with_keys_headers_and_timestamps_all_reported_ok(
        kafka_cluster, processes, tmp_path):
    """... and every record read back by kcat with its own headers and timestamp (rfc 18.4)."""
    confluent_kafka = pytest.importorskip("confluent_kafka")
    tower, store = kafka_cluster
    _, bootstrap = start_gateway(processes, tower, tmp_path / "gw.log", "--num-partitions", "3")
    n, topic = 100_000, "hundred-thousand"
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                                         "linger.ms": 5, "compression.codec": "lz4"})
    failed: list = []
    last: dict[int, int] = {}
    now_ms = int(time.time() * 1000)

    def report(err, msg):
        if err is not None:
            failed.append(str(err))
        else:
            last[msg.partition()] = max(last.get(msg.partition(), -1), msg.offset())
    for i in range(n):
        producer.produce(topic, key=b"k%d" % i, value=b"v%d" % i, headers=[("n", b"%d" % i), ("origin", b"test")],
                         timestamp=now_ms - n + i, on_delivery=report)
        producer.poll(0)
    assert producer.flush(60) == 0 and failed == []
    assert sum(offset + 1 for offset in last.values()) == n and len(last) == 3  # every one, no gap
    read = kcat("-b", bootstrap, "-C", "-t", topic, "-e", "-f", "%k=%s %T %h\n", timeout=120)
    assert read.returncode == 0, read.stderr
    assert sorted(read.stdout.decode().splitlines()) == sorted(f"k{i}=v{i} {now_ms - n + i} n={i},origin=test"
                                                               for i in range(n))


def test_kcat_reads_from_a_moment_the_first_record_produced_after_it(kafka_cluster, processes, tmp_path):
    """ListOffsets by timestamp (kcat -o s@MS, librdkafka's offsets_for_times): the first record produced at
    or after the moment, from what the producers and stores held then (HEADS-AT, rfc 20.1); none after the
    last record; and a restarted gateway tells it from the stores' receive stamps."""
    tower, store = kafka_cluster
    gateway, bootstrap = start_gateway(processes, tower, tmp_path / "gw.log")
    first = b"".join(b"early %d\n" % i for i in range(5))
    assert kcat("-b", bootstrap, "-P", "-t", "moments", data=first).returncode == 0
    time.sleep(0.5)
    moment = int(time.time() * 1000)
    time.sleep(0.5)
    later = b"".join(b"late %d\n" % i for i in range(3))
    assert kcat("-b", bootstrap, "-P", "-t", "moments", data=later).returncode == 0
    read = kcat("-b", bootstrap, "-C", "-t", "moments", "-o", f"s@{moment}", "-e", "-f", "%o %s\n")
    assert read.returncode == 0, read.stderr
    assert read.stdout.decode().splitlines() == [f"{5 + i} late {i}" for i in range(3)]
    consumer = pytest.importorskip("confluent_kafka").Consumer({"bootstrap.servers": bootstrap, "group.id": "t"})
    try:
        import confluent_kafka
        found = [consumer.offsets_for_times([confluent_kafka.TopicPartition("moments", 0, ms)], timeout=20)[0].offset
                 for ms in (0, moment, int(time.time() * 1000) + 1)]
        assert found == [0, 5, -1]
    finally:
        consumer.close()
    gateway.terminate()
    gateway.wait(15)
    _, bootstrap = start_gateway(processes, tower, tmp_path / "gw.log")  # only the store can tell now
    # (its partition resumes once its old beacons expire, rfc 15: up to beacon/timeout after the restart)
    wait_for(lambda: 'topic "moments" with 1 partitions' in kcat("-b", bootstrap, "-L", "-t", "moments").stdout.decode(),
             30, what="the restarted gateway serving the topic")
    read = kcat("-b", bootstrap, "-C", "-t", "moments", "-o", f"s@{moment}", "-e", "-f", "%o %s\n")
    assert read.stdout.decode().splitlines() == [f"{5 + i} late {i}" for i in range(3)]


def _request(api_key: int, version: int, correlation: int, body: bytes = b"", client: bytes = b"raw") -> bytes:
    header = struct.pack(">hhih", api_key, version, correlation, len(client)) + client
    return struct.pack(">i", len(header) + len(body)) + header + body


def _response(sock: socket.socket) -> bytes:
    size = struct.unpack(">i", exactly(sock, 4))[0]
    return exactly(sock, size)


def test_an_unsupported_api_versions_gets_v0_with_unsupported_version_and_a_malformed_request_closes_its_connection(
        kafka_cluster, processes, tmp_path):
    tower, _ = kafka_cluster
    log = tmp_path / "gw.log"
    _, bootstrap = start_gateway(processes, tower, log)
    host, port = bootstrap.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(_request(18, 99, 7))
        answer = _response(sock)
        correlation, error, count = struct.unpack_from(">ihi", answer)
        assert (correlation, error) == (7, 35)
        keys = {struct.unpack_from(">hhh", answer, 10 + 6 * i) for i in range(count)}
        assert (18, 0, 3) in keys and (1, 4, 12) in keys
        # The same connection goes on: ApiVersions v2 (non-flexible) is answered.
        sock.sendall(_request(18, 2, 8))
        correlation, error = struct.unpack_from(">ih", _response(sock))
        assert (correlation, error) == (8, 0)
        # A Metadata v1 whose topic array claims more than the frame holds: the connection closes.
        sock.sendall(_request(3, 1, 9, struct.pack(">i", 1000)))
        assert sock.recv(10) == b""
    wait_for(lambda: b"malformed request" in log.read_bytes(), what="the log line")
    with socket.create_connection((host, int(port)), timeout=10) as sock:  # and the gateway serves others
        sock.sendall(_request(18, 0, 10))
        assert struct.unpack_from(">ih", _response(sock)) == (10, 0)


def test_a_restarted_gateway_goes_on_at_the_stores_head(kafka_cluster, processes, tmp_path):
    tower, _ = kafka_cluster
    proc, bootstrap = start_gateway(processes, tower, tmp_path / "gw.log")
    assert kcat("-b", bootstrap, "-P", "-t", "again", data=b"a\nb\n").returncode == 0
    proc.terminate()
    assert proc.wait(20) == 0
    _, bootstrap = start_gateway(processes, tower, tmp_path / "gw2.log")
    assert kcat("-b", bootstrap, "-P", "-t", "again", data=b"c\n").returncode == 0
    read = kcat("-b", bootstrap, "-C", "-t", "again", "-e", "-f", "%s %o\n")
    assert read.stdout.decode().splitlines() == ["a 0", "b 1", "c 2"]
