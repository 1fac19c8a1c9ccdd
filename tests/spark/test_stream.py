"""spark.readStream.format("dafka"): micro-batches over per-partition sequences."""

from __future__ import annotations

import pytest

from helpers import require_pyspark, wait_for

require_pyspark()

from dafka import Producer

from .conftest import PARTITIONS, RECORDS, TOPIC, expected_rows, value_of

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]


def sink_rows(spark, path):
    return sorted((r.topic, r.partition, r.offset, bytes(r.value)) for r in spark.read.parquet(str(path)).collect())


class Producing:
    """Producers kept open across the phases of a test (each is a partition)."""

    def __init__(self, cluster, topic):
        self.cluster = cluster
        self.topic = topic
        self.producers: list[Producer] = []

    def add(self) -> Producer:
        self.producers.append(Producer(self.topic, self.cluster.config(producer__min_acks=1)))
        return self.producers[-1]

    def send(self, producer: Producer, count: int) -> None:
        index = self.producers.index(producer)
        values = self.cluster.produced.setdefault(self.topic, {}).setdefault(producer.address, [])
        for _ in range(count):
            value = value_of(index, len(values))
            producer.send(value)
            values.append(value)
        producer.flush(60)

    def close(self) -> None:
        for p in self.producers:
            p.close(10)


@pytest.fixture
def producing(cluster):
    p = Producing(cluster, "events")
    yield p
    p.close()


def stream(spark, cluster, **options):
    return (spark.readStream.format("dafka").option("topic", "events").options(**cluster.tower_options)
            .options(**options).load())


def test_records_produced_while_running_then_restart_adds_exactly_the_new_ones(spark, cluster, producing, tmp_path):
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    first = producing.add()
    producing.send(first, 200)
    query = (stream(spark, cluster, startingOffsets="earliest").writeStream.format("parquet")
             .option("path", str(out)).option("checkpointLocation", str(checkpoint))
             .trigger(processingTime="500 milliseconds").start())
    try:
        query.processAllAvailable()
        assert sink_rows(spark, out) == expected_rows(cluster, "events")
        # While it runs: more records, and a new producer (a new partition).
        producing.send(first, 300)
        second = producing.add()
        producing.send(second, 250)
        query.processAllAvailable()
        assert sink_rows(spark, out) == expected_rows(cluster, "events")
    finally:
        query.stop()
    assert query.exception() is None

    # Stopped: more records in both partitions, and a third partition.
    producing.send(first, 100)
    producing.send(second, 50)
    third = producing.add()
    producing.send(third, 75)
    before = len(sink_rows(spark, out))
    restarted = (stream(spark, cluster).writeStream.format("parquet")
                 .option("path", str(out)).option("checkpointLocation", str(checkpoint))
                 .trigger(availableNow=True).start())
    assert restarted.awaitTermination(300)
    assert restarted.exception() is None
    rows = sink_rows(spark, out)
    assert len(rows) - before == 100 + 50 + 75
    assert rows == expected_rows(cluster, "events")  # nothing lost, nothing twice
    assert len(rows) == 200 + 300 + 250 + 100 + 50 + 75


def test_available_now_with_max_records_per_trigger(spark, stopped_store, tmp_path):
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    query = (spark.readStream.format("dafka").option("topic", TOPIC).option("path", stopped_store.db)
             .option("startingOffsets", "earliest").option("maxRecordsPerTrigger", "7000").load()
             .writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(300)
    assert query.exception() is None
    batches = [p for p in query.recentProgress if p["numInputRows"] > 0]
    assert [p["numInputRows"] for p in batches] == [7000] * 4 + [2000]
    assert sink_rows(spark, out) == expected_rows(stopped_store)
    assert len(expected_rows(stopped_store)) == PARTITIONS * RECORDS


def test_latest_gets_every_record_of_one_shot_producers_born_after_the_start(spark, cluster):
    """startingOffsets=latest: nothing from before the query started, and every record of the partitions born
    after it (issue 49: 9 of 9, a partition it had not seen at the start is read from offset 0)."""
    (old,) = cluster.produce("events", [5])
    query = (stream(spark, cluster, startingOffsets="latest").writeStream.format("memory").queryName("latest_rows")
             .trigger(processingTime="500 milliseconds").start())

    def rows():
        return sorted((r.topic, r.partition, r.offset, bytes(r.value))
                      for r in spark.sql("SELECT * FROM latest_rows").collect())
    try:
        query.processAllAvailable()
        born = cluster.produce("events", [3, 3, 3], index_base=1)  # three one-shot producers, flushed and closed
        wanted = sorted(row for row in expected_rows(cluster, "events") if row[1] in born)
        wait_for(lambda: query.processAllAvailable() or len(rows()) >= 9, timeout=120, interval=0.5,
                 what="the 9 records of the one-shot producers")
        assert rows() == wanted
        assert old not in {row[1] for row in rows()}
    finally:
        query.stop()
    assert query.exception() is None
