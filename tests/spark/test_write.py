"""df.write.format("dafka") and writeStream: each task is a producer that
succeeds only once minAcks stores have acknowledged its records."""

from __future__ import annotations

import pytest

from helpers import require_pyspark

require_pyspark()

from pyspark.sql import functions as F

from dafka.spark.examples import wordcount

from .conftest import PARTITIONS, RECORDS, TOPIC, expected_rows

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]


def read_values(spark, cluster, topic):
    df = spark.read.format("dafka").option("topic", topic).options(**cluster.tower_options).load()
    return df.collect()


def test_write_10000_rows_and_read_them_back(spark, cluster):
    df = spark.range(10_000).select(F.concat(F.lit("row "), F.col("id").cast("string")).alias("value"))
    (df.write.format("dafka").mode("append").option("topic", "written").option("minAcks", "1")
     .options(**cluster.tower_options).save())
    rows = read_values(spark, cluster, "written")
    assert sorted(bytes(r.value) for r in rows) == sorted(b"row %d" % i for i in range(10_000))
    # Every task was one producer, so one partition, numbered from 0 without gaps.
    by_partition: dict[str, list[int]] = {}
    for r in rows:
        by_partition.setdefault(r.partition, []).append(r.offset)
    assert len(by_partition) == df.rdd.getNumPartitions()
    assert all(sorted(o) == list(range(len(o))) for o in by_partition.values())


def test_binary_values_and_a_topic_column(spark, cluster):
    df = spark.createDataFrame(
        [("left", bytearray(b"\x00\x01")), ("right", bytearray(b"")), ("left", bytearray(b"\xff"))],
        "topic string, value binary",
    ).coalesce(1)
    df.write.format("dafka").mode("append").options(**cluster.tower_options).save()
    assert sorted(bytes(r.value) for r in read_values(spark, cluster, "left")) == [b"\x00\x01", b"\xff"]
    assert [bytes(r.value) for r in read_values(spark, cluster, "right")] == [b""]


def test_keys_are_written_from_a_key_column_and_read_back(spark, cluster):
    df = spark.createDataFrame([("a", "k1"), ("b", None), ("c", "")], "value string, key string").coalesce(1)
    df.write.format("dafka").mode("append").option("topic", "keyed").options(**cluster.tower_options).save()
    rows = sorted(read_values(spark, cluster, "keyed"), key=lambda r: r.offset)
    assert [(bytes(r.value), None if r.key is None else bytes(r.key)) for r in rows] == [
        (b"a", b"k1"), (b"b", None), (b"c", b"")]


def test_a_write_that_is_not_acked_fails_the_task(cluster):
    import pyarrow as pa
    from pyspark.sql.types import StringType, StructField, StructType

    from dafka.spark import DafkaSparkError, DafkaWriter

    schema = StructType([StructField("value", StringType())])
    # Planning (the driver) sees the store...
    writer = DafkaWriter({"topic": "lost", "flushTimeoutMs": "1000", **cluster.tower_options}, schema, False)
    cluster.stop()  # ...which is gone when the task (an executor) runs.
    batch = pa.RecordBatch.from_pydict({"value": ["a", "b"]}, schema=pa.schema([("value", pa.string())]))
    with pytest.raises(DafkaSparkError, match=r"2 of 2 record\(s\) written to topic 'lost' were not acked by 1 store"):
        writer.write(iter([batch]))


def test_stream_copy_from_a_path_to_a_tower(spark, stopped_store, cluster, tmp_path):
    query = (spark.readStream.format("dafka").option("topic", TOPIC).option("path", stopped_store.db)
             .option("startingOffsets", "earliest").load()
             .select("value")
             .writeStream.format("dafka").option("topic", "copy").options(**cluster.tower_options)
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(300)
    assert query.exception() is None
    copied = sorted(bytes(r.value) for r in read_values(spark, cluster, "copy"))
    assert copied == sorted(row[3] for row in expected_rows(stopped_store))
    assert len(copied) == PARTITIONS * RECORDS


def test_wordcount_example(spark, cluster):
    cluster.produce("text", [2])  # 'p0 record 0', 'p0 record 1'
    cluster.produce("text", [3], index_base=1)  # 'p1 record 0' .. 'p1 record 2'
    cluster.stop()
    top = wordcount.main(["--path", cluster.db, "--topic", "text", "--top", "3"], spark=spark)
    assert top == [("record", 5), ("p1", 3), ("0", 2)]
