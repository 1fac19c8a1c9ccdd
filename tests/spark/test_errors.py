"""Bad options fail at planning, on the driver, with a message saying what to fix."""

from __future__ import annotations

import os
import time

import pytest

from helpers import free_port, require_pyspark

require_pyspark()

from pyspark.sql.types import StringType, StructField, StructType

from dafka.spark import OptionError, SCHEMA
from dafka.spark.leveldb import PathLocked
from dafka.spark.live import TowerUnreachable
from dafka.spark.source import DafkaReader, DafkaStreamReader, DafkaWriter
from dafka.store import running

from .conftest import TOPIC

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]


def planning_error(df_or_action) -> str:
    """The message of the error Spark raises for a query (or action)."""
    with pytest.raises(Exception) as info:
        df_or_action() if callable(df_or_action) else df_or_action.collect()
    return str(info.value)


# -- through Spark: the message reaches the user at planning ---------------


def test_unknown_topic_in_a_path(spark, stopped_store):
    message = planning_error(lambda: spark.read.format("dafka").option("topic", "nope").load(stopped_store.db).collect())
    assert "topic 'nope' has no records in" in message
    assert "'other-topic', 'readings'" in message  # what is there instead


def test_unknown_topic_through_a_tower(spark, live_cluster):
    message = planning_error(spark.read.format("dafka").option("topic", "nope").options(**live_cluster.tower_options)
                             .load())
    assert "no store holds records of topic 'nope'" in message


def test_malformed_offsets(spark, stopped_store):
    reader = spark.read.format("dafka").option("topic", TOPIC).option("path", stopped_store.db)
    message = planning_error(reader.option("startingOffsets", "{readings: 5").load())
    assert '"startingOffsets" is neither "earliest", "latest" nor JSON like' in message
    message = planning_error(reader.option("startingOffsets", '{"readings": {"NOPE": 3}}').load())
    assert "names partition(s) NOPE that topic 'readings' does not have" in message


def test_unreachable_tower(spark):
    dead = f"tcp://127.0.0.1:{free_port()}"
    started = time.monotonic()
    message = planning_error(spark.read.format("dafka").option("topic", TOPIC).option("tower", dead)
                             .option("towerSub", dead).option("towerTimeoutMs", "1000").load())
    assert f"no Dafka tower answered within 1 s at {dead}" in message
    assert time.monotonic() - started < 60


def test_path_held_by_something_else_than_a_running_store(spark, live_cluster, tmp_path):
    """Without the file a running store leaves (store/running.py), a locked
    directory is refused, naming the process that holds it."""
    copy = tmp_path / "running.json"
    os.replace(os.path.join(live_cluster.db, running.FILE), copy)
    try:
        message = planning_error(spark.read.format("dafka").option("topic", TOPIC).load(live_cluster.db))
    finally:
        os.replace(copy, os.path.join(live_cluster.db, running.FILE))
    assert f"is locked by process {os.getpid()}" in message
    assert "Stop the store first" in message


def test_unknown_option_gets_a_suggestion(spark, stopped_store):
    message = planning_error(spark.read.format("dafka").option("topic", TOPIC).option("startingOffset", "earliest")
                             .load(stopped_store.db))
    assert "unknown option 'startingoffset' (did you mean 'startingOffsets'?)" in message


# -- directly: the checks themselves ---------------------------------------


def test_option_checks(stopped_store, live_cluster):
    path = {"topic": TOPIC, "path": stopped_store.db}
    cases = [
        ({"path": stopped_store.db}, 'option "topic" is required'),
        ({"topic": TOPIC}, 'say where to read from'),
        ({**path, "tower": "tcp://127.0.0.1:5557"}, 'give either "path"'),
        ({"topic": TOPIC, "tower": "tcp://127.0.0.1:6000"}, 'also say where its XSUB is'),
        ({"topic": TOPIC, "tower": "udp://x"}, 'expected tcp://HOST:PORT'),
        ({**path, "endingOffsets": "earliest"}, '"endingOffsets" cannot be earliest'),
        ({**path, "startingOffsets": '{"other": {"A": 1}}'}, "names topic 'other', but option \"topic\" is 'readings'"),
        ({**path, "startingOffsets": '{"readings": {"A": -3}}'}, "offset -3 of partition 'A' is invalid"),
        ({**path, "maxRecordsPerPartition": "0"}, 'must be at least 1'),
        ({**path, "maxRecordsPerTrigger": "10"}, 'only applies to streaming reads'),
        ({**path, "failOnDataLoss": "maybe"}, 'must be true or false'),
        ({**path, "dafka.beacon/adress": "x"}, "(did you mean dafka.beacon/address?)"),
        ({"topic": TOPIC, "path": "/nonexistent/db"}, "is not a directory"),
    ]
    for options, expected in cases:
        with pytest.raises(OptionError) as info:
            DafkaReader(options, SCHEMA).partitions()
        assert expected in str(info.value), options
    with pytest.raises(OptionError, match='"endingOffsets" only applies to batch reads'):
        DafkaStreamReader({**path, "endingOffsets": "latest"}, SCHEMA)
    with pytest.raises(OptionError, match="fixed schema"):
        DafkaReader(path, StructType(SCHEMA.fields + [StructField("extra", StringType())]))


def test_tower_forms():
    from dafka.spark.options import parse_tower

    assert parse_tower("tcp://h:5557", None) == ("tcp://h:5556", "tcp://h:5557")
    assert parse_tower("tcp://h:7001,tcp://h:7002", None) == ("tcp://h:7001", "tcp://h:7002")
    assert parse_tower("tcp://h:7002", "tcp://h:7001") == ("tcp://h:7001", "tcp://h:7002")
    assert parse_tower("towerhost", None) == ("tcp://towerhost:5556", "tcp://towerhost:5557")


def test_a_store_running_in_this_process_is_never_opened_twice(live_cluster, tmp_path):
    # Opening it would fail and, on the way out, silently drop the store's lock:
    # it is read through the store, or refused.
    ranges = DafkaReader({"topic": TOPIC, "path": live_cluster.db}, SCHEMA).partitions()
    store = running.read(live_cluster.db)
    assert store.pid == os.getpid()
    assert ranges and all(r.through_path and [d.requests for d in r.via] == [store.requests] for r in ranges)
    copy = tmp_path / "running.json"
    os.replace(os.path.join(live_cluster.db, running.FILE), copy)
    try:
        with pytest.raises(PathLocked, match="open in this very process"):
            DafkaReader({"topic": TOPIC, "path": live_cluster.db}, SCHEMA).partitions()
    finally:
        os.replace(copy, os.path.join(live_cluster.db, running.FILE))
    live_cluster.produce(TOPIC + "-after", [3])  # the store still owns its database and writes


def test_unreachable_tower_directly():
    dead = f"tcp://127.0.0.1:{free_port()}"
    with pytest.raises(TowerUnreachable, match="check that the tower runs"):
        DafkaReader({"topic": TOPIC, "tower": dead, "towerSub": dead, "towerTimeoutMs": "300"}, SCHEMA).partitions()


def test_write_checks(live_cluster):
    from pyspark.sql.types import BinaryType, LongType, StructField, StructType

    values = StructType([StructField("value", BinaryType())])
    tower = live_cluster.tower_options
    with pytest.raises(OptionError, match="append-only"):
        DafkaWriter({"topic": "w", **tower}, values, overwrite=True)
    with pytest.raises(OptionError, match="needs a column 'value' of type binary or string"):
        DafkaWriter({"topic": "w", **tower}, StructType([StructField("v", LongType())]), overwrite=False)
    with pytest.raises(OptionError, match="say which topic to write to"):
        DafkaWriter(tower, values, overwrite=False)
    with pytest.raises(OptionError, match=r"minAcks is 2 but 1 store\(s\) answered"):
        DafkaWriter({"topic": "w", "minAcks": "2", **tower}, values, overwrite=False)
    with pytest.raises(OptionError, match='"path" cannot be written to'):
        DafkaWriter({"topic": "w", "path": "/tmp"}, values, overwrite=False)
