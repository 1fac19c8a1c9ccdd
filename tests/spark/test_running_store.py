"""Spark's ``path`` on a store's directory: read through the store while it
runs (it leaves its reader's endpoints in the directory), directly once it
has stopped or been killed, with the same rows and receive times."""

from __future__ import annotations

import os
import signal

import pytest

from helpers import loopback_config, require_pyspark, script, wait_for

require_pyspark()

from dafka import Producer  # noqa: E402
from dafka.store import running  # noqa: E402
from dafka.towerd.tower import Tower  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

TOPIC = "through"
RECORDS = 20_000


def rows(spark, path, **options):
    df = spark.read.format("dafka").option("topic", TOPIC).options(**options).load(str(path))
    return sorted((r.partition, r.offset, bytes(r.value), r.timestamp) for r in df.collect())


def test_path_reads_a_running_store_through_it_and_a_killed_one_directly(spark, processes, tmp_path):
    tower = Tower(loopback_config()).start()
    db = tmp_path / "db"
    try:
        store = processes.start([script("dafka_stored"), "--db", str(db), "--sub", tower.sub_endpoint,
                                 "--pub", tower.pub_endpoint, "-X", "beacon/address=127.0.0.1"])
        found = wait_for(lambda: running.read(str(db)), 30, what="the store's endpoints in its directory")
        assert found.pid == store.pid
        with Producer(TOPIC, loopback_config(tower)) as producer:
            for seq in range(RECORDS):
                producer.send(b"%08d" % seq)
            producer.flush(60)
            partition = producer.address

        through = rows(spark, db)
        assert [(p, o, v) for p, o, v, _ in through] == [(partition, s, b"%08d" % s) for s in range(RECORDS)]
        assert all(t is not None for *_, t in through)  # the store's receive times came along
        # The Spark tasks went through the store: it served every record.
        limited = rows(spark, db, maxRecordsPerPartition="5000")
        assert limited == through

        store.send_signal(signal.SIGKILL)
        store.wait(30)
        assert running.read(str(db)) is not None  # left behind: only a live lock holder makes it count
        directly = rows(spark, db)
        assert directly == through  # the same rows, and the same receive times
    finally:
        tower.stop()


def test_a_copy_of_a_running_store_is_read_directly(spark, tmp_path):
    from dafka.store import Store

    tower = Tower(loopback_config()).start()
    db = tmp_path / "db"
    store = Store(loopback_config(tower), db=str(db)).start()
    try:
        with Producer(TOPIC, loopback_config(tower)) as producer:
            for seq in range(1_000):
                producer.send(b"%08d" % seq)
            producer.flush(60)
    finally:
        store.stop()
        tower.stop()
    # A stopped store removes the file; a copy taken while it ran still has it.
    assert running.read(str(db)) is None
    running.write(str(db), running.RunningStore(os.getpid(), "R" * 32, "tcp://127.0.0.1:1", "tcp://127.0.0.1:2",
                                                False))
    assert len(rows(spark, db)) == 1_000  # nobody holds its lock: read directly


def test_a_task_whose_stores_moved_reads_through_the_tower(live_cluster):
    """Tasks reach the readers known at planning directly; a reader restarted
    since (new endpoints) is found through the tower instead."""
    from dafka.spark import live
    from helpers import free_port

    config = loopback_config(live_cluster.tower)
    partition = sorted(live_cluster.produced["readings"])[0]
    gone = live.ReaderAt("X" * 32, f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}")
    chunks = list(live.fetch_range(config, "readings", partition, 0, 500, readers=[], from_earliest=True,
                                   fail_on_data_loss=True, tower_timeout=5, fetch_timeout=20, direct=(gone,)))
    values = [v for _, array, _, _ in chunks for v in array.to_pylist()]
    assert values == live_cluster.produced["readings"][partition][:500]
    with pytest.raises(live.NoStore, match="did not answer"):
        list(live.fetch_range(config, "readings", partition, 0, 500, readers=[], from_earliest=True,
                              fail_on_data_loss=True, tower_timeout=5, fetch_timeout=1, direct=(gone,),
                              tower_fallback=False))
