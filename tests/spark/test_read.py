"""Batch reads: spark.read.format("dafka") through a tower and from a path."""

from __future__ import annotations

import datetime
import json

import pytest

from helpers import require_pyspark

require_pyspark()

from .conftest import PARTITIONS, RECORDS, TOPIC, Cluster, expected_rows

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]


def rows_of(df):
    return sorted((r.topic, r.partition, r.offset, bytes(r.value)) for r in df.collect())


def test_path_read_returns_every_record(spark, stopped_store):
    df = spark.read.format("dafka").option("topic", TOPIC).load(stopped_store.db)
    assert df.columns == ["topic", "partition", "offset", "value", "timestamp", "key"]
    rows = df.collect()
    assert len(rows) == PARTITIONS * RECORDS
    assert all(r.key is None for r in rows)  # written without keys
    assert sorted((r.topic, r.partition, r.offset, bytes(r.value)) for r in rows) == expected_rows(stopped_store)
    # The store's receive time, from its stamps.
    now = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
    assert all(r.timestamp is not None and abs((now - r.timestamp).total_seconds()) < 600 for r in rows)


def test_tower_read_returns_every_record(spark, live_cluster):
    df = spark.read.format("dafka").options(topic=TOPIC, **live_cluster.tower_options).load()
    rows = df.collect()
    assert len(rows) == PARTITIONS * RECORDS
    assert sorted((r.topic, r.partition, r.offset, bytes(r.value)) for r in rows) == expected_rows(live_cluster)
    # dafka-py stores answer in bulk (DIRECT-RECORDS), with their receive times.
    now = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
    assert all(r.timestamp is not None and abs((now - r.timestamp).total_seconds()) < 600 for r in rows)


@pytest.fixture(params=["path", "tower"])
def source(request, spark, stopped_store, live_cluster):
    """(reader with the source options set, cluster) for each way of reading."""
    if request.param == "path":
        return spark.read.format("dafka").option("topic", TOPIC).option("path", stopped_store.db), stopped_store
    return spark.read.format("dafka").option("topic", TOPIC).options(**live_cluster.tower_options), live_cluster


def test_offset_ranges_return_exactly_the_requested_rows(source):
    reader, cluster = source
    a, b, c = sorted(cluster.produced[TOPIC])
    starting = {TOPIC: {a: 100, b: -2, c: 9_990}}
    ending = {TOPIC: {a: 250, b: 3, c: -1}}  # exclusive
    df = (reader.option("startingOffsets", json.dumps(starting))
          .option("endingOffsets", json.dumps(ending)).load())
    want = [r for r in expected_rows(cluster)
            if (r[1] == a and 100 <= r[2] < 250) or (r[1] == b and r[2] < 3) or (r[1] == c and r[2] >= 9_990)]
    assert rows_of(df) == want
    assert len(want) == 150 + 3 + 10


def test_max_records_per_partition_splits_partitions(source):
    reader, cluster = source
    df = reader.option("maxRecordsPerPartition", "4000").load()
    assert df.rdd.getNumPartitions() == PARTITIONS * 3  # 4000 + 4000 + 2000 per partition
    assert rows_of(df) == expected_rows(cluster)


def test_pushed_filters_read_only_what_they_select(source):
    reader, cluster = source
    a, b, _ = sorted(cluster.produced[TOPIC])
    df = reader.option("maxRecordsPerPartition", "1000").load()
    # One 1000-record task per partition remains instead of ten.
    tail = df.where("offset >= 9000")
    assert tail.rdd.getNumPartitions() == PARTITIONS
    assert rows_of(tail) == [r for r in expected_rows(cluster) if r[2] >= 9000]
    # Partition and offset interval together: a single task.
    one = df.where(f"partition = '{a}' and offset > 4100 and offset <= 4200 and topic = '{TOPIC}'")
    assert one.rdd.getNumPartitions() == 1
    assert rows_of(one) == [r for r in expected_rows(cluster) if r[1] == a and 4100 < r[2] <= 4200]
    # IN on offsets narrows to an interval; Spark filters the rest.
    picked = df.where(f"offset in (5, 7, 2500) and partition in ('{a}', '{b}')")
    assert picked.rdd.getNumPartitions() == 2 * 3
    assert rows_of(picked) == [r for r in expected_rows(cluster) if r[1] in (a, b) and r[2] in (5, 7, 2500)]
    # Filters that match nothing.
    assert df.where("topic = 'something-else'").count() == 0
    assert df.where("offset >= 10000").count() == 0


def test_records_deleted_by_retention(spark, tmp_path):
    from helpers import loopback_config, wait_for
    from dafka import Producer
    from dafka.store import Store
    from dafka.towerd.tower import Tower

    tower = Tower(loopback_config()).start()
    store = Store(loopback_config(tower, store__retention__bytes=50_000), db=str(tmp_path / "db")).start()
    try:
        with Producer("kept", loopback_config(tower)) as producer:
            for seq in range(1000):
                producer.send(b"%099d" % seq)  # 100 bytes each: half of them fit in 50,000
            producer.flush(60)
            partition = producer.address
        wait_for(lambda: store.stats()["retention_deleted"] >= 400, timeout=30, what="retention")
        def live(bulk: bool, **options: str):
            """A new reader (DataFrameReader.option changes the reader it is called on)."""
            return (spark.read.format("dafka").option("topic", "kept").option("tower", tower.pub_endpoint)
                    .option("towerSub", tower.sub_endpoint).option("dafka.consumer/bulk", str(int(bulk)))
                    .options(**options))

        # Without bulk answers (as from reference stores), the tail is learnt while
        # reading (DIRECT-TAIL); with them, at planning (DIRECT-PARTITIONS).
        for bulk in (False, True):
            # From earliest: the records from where the partition now starts.
            offsets = sorted(r.offset for r in live(bulk, maxRecordsPerPartition="300").load().collect())
            tail = offsets[0]
            assert 400 <= tail <= 600 and offsets == list(range(tail, 1000))
        # Asking for deleted records explicitly is data loss...
        explicit = {"startingOffsets": json.dumps({"kept": {partition: 10}}), "maxRecordsPerPartition": "300"}
        with pytest.raises(Exception, match="were deleted by the stores' retention"):
            live(False, **explicit).load().collect()
        with pytest.raises(Exception, match=f"the store keeps only offsets {tail}..999"):
            live(True, **explicit).load().collect()
        # ...unless told to skip them.
        for bulk in (False, True):
            skipped = live(bulk, failOnDataLoss="false", **explicit).load().collect()
            assert sorted(r.offset for r in skipped) == list(range(tail, 1000))
    finally:
        store.stop()
        tower.stop()
    # In a path the tail is known at planning.
    path = spark.read.format("dafka").option("topic", "kept").option("path", str(tmp_path / "db"))
    assert sorted(r.offset for r in path.load().collect()) == list(range(tail, 1000))
    with pytest.raises(Exception, match=f"the store keeps only offsets {tail}..999"):
        path.option("startingOffsets", json.dumps({"kept": {partition: 10}})).load().collect()


def test_sessions_without_filter_pushdown(spark, stopped_store):
    from dafka.spark import PUSHDOWN_CONF, register

    spark.conf.set(PUSHDOWN_CONF, "false")
    register(spark, pushdown=False)
    try:
        df = spark.read.format("dafka").option("topic", TOPIC).load(stopped_store.db)
        assert rows_of(df.where("offset >= 9995")) == [r for r in expected_rows(stopped_store) if r[2] >= 9995]
    finally:
        register(spark)
    assert spark.conf.get(PUSHDOWN_CONF) == "true"


def test_tower_read_of_sharded_stores_reads_each_partition_from_a_store_that_holds_it(spark, tmp_path):
    """Three stores, each partition on two (rfc 16): every record once, and the tasks spread over the
    stores, each reading a partition from one that holds it."""
    from helpers import loopback_config, wait_for
    from dafka.store import Store
    from dafka.towerd.tower import Tower

    sharded = {"beacon__interval": 200, "beacon__timeout": 1000, "store__replicas": 2, "store__dead_ms": 3000}
    tower = Tower(loopback_config()).start()
    stores = [Store(loopback_config(tower, **sharded), db=str(tmp_path / f"s{n}")).start() for n in range(3)]
    try:
        cluster = Cluster(tower, str(tmp_path), None)
        cluster.produce("sharded", [2000] * 6, producer__min_acks=2, **sharded)
        produced = cluster.produced["sharded"]
        wait_for(lambda: sum(len(s.heads()) for s in stores) == 12, 20, what="each partition on 2 stores")
        served = [s.stats()["records_served"] for s in stores]
        rows = (spark.read.format("dafka").options(topic="sharded", tower=tower.pub_endpoint,
                                                   towerSub=tower.sub_endpoint, maxRecordsPerPartition="500")
                .load().collect())
        assert sorted((r.partition, r.offset, bytes(r.value)) for r in rows) == sorted(
            (p, offset, value) for p, values in produced.items() for offset, value in enumerate(values))
        read = [s.stats()["records_served"] - before for s, before in zip(stores, served)]
        assert sum(read) == 12_000  # each record from one store: no store answered a task it was not asked
        assert all(n > 0 for n in read)  # the tasks spread over the three stores
    finally:
        for store in stores:
            store.stop()
        tower.stop()
