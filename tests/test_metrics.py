"""Prometheus metrics: the collector on peers in this process, and the
--metrics-port of the real daemons and console tools, scraped over HTTP."""

from __future__ import annotations

import asyncio
import re
import subprocess
import time
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from dafka import Consumer, Producer, metrics
from dafka.aio import AsyncConsumer, AsyncProducer
from dafka.store import Store
from helpers import free_port, loopback_config, wait_for
from test_cli import Cluster

SAMPLE = re.compile(r"^(dafka_\w+)\{([^}]*)\} (\S+)$", re.M)


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    out = {}
    for name, labels, value in SAMPLE.findall(text):
        out[(name, frozenset(re.findall(r'(\w+)="([^"]*)"', labels)))] = float(value)
    return out


def total(text: str, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples(text).items() if n == name and want <= ls)


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()


@pytest.fixture
def store(tower, tmp_path):
    s = Store(loopback_config(tower), db=tmp_path / "db").start()
    yield s
    s.stop(5)


def test_collector_values_move_as_records_flow(tower, store):
    config = loopback_config(tower, consumer__offset__reset="earliest")
    producer = Producer("m", config)
    consumer = Consumer("m", config=config)
    registry = CollectorRegistry()
    metrics.register(producer, consumer, store, tower, registry=registry)
    try:
        before = generate_latest(registry).decode()
        for _ in range(500):
            producer.send(b"x" * 10)
        producer.flush(10)
        got = 0
        deadline = time.monotonic() + 10
        while got < 500 and time.monotonic() < deadline:
            got += len(consumer.consume(500, 1))
        assert got == 500
        after = generate_latest(registry).decode()
        for name, role, value in (("dafka_records_published_total", "producer", 500),
                                  ("dafka_published_bytes_total", "producer", 5000),
                                  ("dafka_records_acked_total", "producer", 500),
                                  ("dafka_records_stored_total", "store-writer", 500),
                                  ("dafka_stored_bytes_total", "store-writer", 5000),
                                  ("dafka_records_delivered_total", "consumer", 500),
                                  ("dafka_delivered_bytes_total", "consumer", 5000)):
            assert total(before, name, role=role) == 0 and total(after, name, role=role) == value, name
        assert "dafka_records_lost_total{" in after and total(after, "dafka_records_lost_total", role="consumer") == 0
        head = {"topic": "m", "partition": producer.address}
        assert total(after, "dafka_stored_head", role="store-writer", **head) == 499
        assert total(after, "dafka_producer_head", **head) == 499
        assert total(after, "dafka_consumer_lag", **head) == 0 and total(after, "dafka_consumer_lag_max") == 0
        assert total(after, "dafka_live_peers", role="tower") >= 4  # producer, consumer, store writer and reader
        assert total(after, "dafka_store_db_bytes") > 5000
        assert "# TYPE dafka_records_stored_total counter" in after and "# TYPE dafka_consumer_lag gauge" in after
    finally:
        producer.close(timeout=1)
        consumer.close()


def test_partition_labels_are_capped(tower, store):
    config = loopback_config(tower, consumer__offset__reset="earliest")
    producers = [Producer("capped", config) for _ in range(3)]
    registry = CollectorRegistry()
    metrics.register(store, registry=registry, partitions_cap=2)
    try:
        for p in producers:
            p.send(b"r").get(timeout=10)
        text = generate_latest(registry).decode()
        assert sum(1 for (n, _) in samples(text) if n == "dafka_stored_head") == 2
        assert total(text, "dafka_unlabelled_partitions", metric="dafka_stored_head") == 1
    finally:
        for p in producers:
            p.close(timeout=1)


def test_register_takes_the_asyncio_wrappers_and_refuses_anything_else(tower):
    async def main():
        config = loopback_config(tower, producer__min_acks=0)
        async with AsyncProducer("a", config) as producer, AsyncConsumer("a", config=config) as consumer:
            registry = CollectorRegistry()
            metrics.register(producer, consumer, registry=registry)
            await producer.send(b"x")
            text = generate_latest(registry).decode()
            assert total(text, "dafka_records_published_total", role="producer") == 1
            assert total(text, "dafka_records_delivered_total", role="consumer") == 0

    asyncio.run(main())
    with pytest.raises(TypeError, match="no metrics for str"):
        metrics.register("not a peer", registry=CollectorRegistry())
    with pytest.raises(ValueError, match="partitions_cap"):
        metrics.PeerCollector(partitions_cap=-1)


def test_daemons_and_console_tools_serve_metrics(processes, tmp_path):
    ports = {role: free_port() for role in ("tower", "store", "producer", "consumer")}
    cluster = Cluster(processes, "--metrics-port", str(ports["tower"]))
    cluster.store(tmp_path / "db", "--metrics-port", str(ports["store"]))
    consumer = cluster.run("dafka_console_consumer", "scraped", "--from-beginning",
                           "--metrics-port", str(ports["consumer"]))
    producer = cluster.run("dafka_console_producer", "scraped", "--metrics-port", str(ports["producer"]),
                           stdin=subprocess.PIPE)
    wait_for(lambda: total(scrape(ports["tower"]), "dafka_live_peers", role="tower") >= 4, 15,
             what="the tower sees four peers")
    before = {role: scrape(port) for role, port in ports.items()}
    producer.write(b"".join(b"line %d\n" % i for i in range(300)))
    consumer.out.wait_for(rb"line 299\n", 15, what="the consumer's last line")
    wait_for(lambda: total(scrape(ports["store"]), "dafka_records_stored_total") == 300, 10, what="stored")
    after = {role: scrape(port) for role, port in ports.items()}
    assert total(before["producer"], "dafka_records_published_total") == 0
    assert total(after["producer"], "dafka_records_published_total") == 300
    assert total(after["producer"], "dafka_records_acked_total") == 300
    assert total(after["store"], "dafka_stored_bytes_total") == sum(len(b"line %d" % i) for i in range(300))
    assert total(after["consumer"], "dafka_records_delivered_total") == 300
    assert total(after["consumer"], "dafka_consumer_lag_max") == 0
    assert total(after["tower"], "dafka_malformed_frames_total") == 0
    producer.close_stdin()
    assert producer.wait(15) == 0


def test_a_metrics_port_in_use_names_the_flag(processes, tmp_path):
    cluster = Cluster(processes)
    port = free_port()
    store = cluster.store(tmp_path / "db", "--metrics-port", str(port))
    wait_for(lambda: "dafka_records_stored_total" in scrape(port), 10, what="the first store's metrics")
    second = cluster.run("dafka_console_consumer", "t", "--metrics-port", str(port))
    assert second.wait(10) == 2
    assert "--metrics-port" in second.err.text and f"127.0.0.1:{port}" in second.err.text, second.err.text
    assert store.proc.poll() is None
