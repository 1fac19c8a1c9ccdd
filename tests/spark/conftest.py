"""Spark tests: one local[2] SparkSession for the whole session, and Dafka
clusters (tower + store + records) on loopback shared by the tests that only
read them.  Everything started here is stopped here."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field

import pytest

from helpers import loopback_config
from dafka import Producer
from dafka.store import Store
from dafka.towerd.tower import Tower

RECORDS = 10_000
PARTITIONS = 3
TOPIC = "readings"


@pytest.fixture(scope="session")
def spark():
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    # PySpark starts its workers with ``python -m``, which puts the working
    # directory first on sys.path: from the checkout's root, its dafka/ folder
    # would shadow the installed package (where dafka.spark lives).
    os.environ["PYTHONSAFEPATH"] = "1"
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"  # else Spark resolves the hostname to a LAN address
    from pyspark.sql import SparkSession

    from dafka.spark import register

    session = (
        SparkSession.builder.master("local[2]").appName("dafka-spark-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.python.worker.faulthandler.enabled", "true")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()


def value_of(index: int, seq: int) -> bytes:
    """The content the fixtures give record ``seq`` of their ``index``-th producer."""
    return b"p%d record %d" % (index, seq)


@dataclass
class Cluster:
    """A tower and a store on loopback, with what was produced: topic ->
    partition address -> list of values (offset = index)."""

    tower: Tower
    db: str
    store: Store | None
    produced: dict[str, dict[str, list[bytes]]] = field(default_factory=dict)

    def config(self, **overrides):
        return loopback_config(self.tower, **overrides)

    @property
    def tower_options(self) -> dict[str, str]:
        return {"tower": self.tower.pub_endpoint, "towerSub": self.tower.sub_endpoint}

    def produce(self, topic: str, counts: list[int], *, index_base: int = 0, **overrides) -> list[str]:
        """Produce ``counts[i]`` records with producer i (min_acks=1 unless ``overrides`` say), flush,
        close; returns the producers' addresses."""
        producers = [Producer(topic, self.config(**{"producer__min_acks": 1, **overrides})) for _ in counts]
        try:
            for i, (producer, count) in enumerate(zip(producers, counts)):
                values = self.produced.setdefault(topic, {}).setdefault(producer.address, [])
                for seq in range(count):
                    value = value_of(index_base + i, seq)
                    producer.send(value)
                    values.append(value)
            for producer in producers:
                producer.flush(60)
        finally:
            for producer in producers:
                producer.close(10)
        return [p.address for p in producers]

    def stop(self) -> None:
        if self.store is not None:
            self.store.stop()
            self.store = None


def _cluster() -> Cluster:
    tower = Tower(loopback_config()).start()
    db = tempfile.mkdtemp(prefix="dafka-spark-test-")
    try:
        store = Store(loopback_config(tower), db=db).start()
    except BaseException:
        tower.stop()
        raise
    return Cluster(tower, db, store)


def _teardown(cluster: Cluster) -> None:
    cluster.stop()
    cluster.tower.stop()
    shutil.rmtree(cluster.db, ignore_errors=True)


@pytest.fixture(scope="session")
def live_cluster():
    """A running store holding 3 partitions x 10,000 records of "readings"."""
    cluster = _cluster()
    try:
        cluster.produce(TOPIC, [RECORDS] * PARTITIONS)
        yield cluster
    finally:
        _teardown(cluster)


@pytest.fixture(scope="session")
def stopped_store():
    """The same data in a store that has been stopped: read it with "path"."""
    cluster = _cluster()
    try:
        cluster.produce(TOPIC, [RECORDS] * PARTITIONS)
        cluster.produce("other-topic", [5])
        cluster.stop()
        yield cluster
    finally:
        _teardown(cluster)


@pytest.fixture
def cluster():
    """A fresh tower and store for one test."""
    c = _cluster()
    try:
        yield c
    finally:
        _teardown(c)


def expected_rows(cluster: Cluster, topic: str = TOPIC):
    """Sorted (topic, partition, offset, value) of everything produced to ``topic``."""
    return sorted((topic, partition, offset, value)
                  for partition, values in cluster.produced.get(topic, {}).items()
                  for offset, value in enumerate(values))
