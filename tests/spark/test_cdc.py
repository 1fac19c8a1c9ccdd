"""Spark rebuilds a table from a CDC topic (dafka.spark.cdc): in batch, equal to
the source table; streaming with foreachBatch into a Parquet copy that stays
current, and that a re-run of a batch leaves the same."""

from __future__ import annotations

import json

import pytest

from helpers import require_pyspark, wait_for

require_pyspark()

from cdchelpers import Connector, assert_same, stored_count, table_rows, wait_all_acked  # noqa: E402
from dafka.cdc.apply import key_of  # noqa: E402
from dafka.spark.cdc import apply_batch, materialize, read_state  # noqa: E402
from dafka.spark.examples import cdc_table  # noqa: E402
from dafka.store import Store, cleaner  # noqa: E402
from helpers import loopback_config  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.cdc, pytest.mark.timeout(300)]


def as_rows(df, table: str, pg, db) -> dict[str, dict]:
    """Spark's rows keyed like table_rows(): JSON values back to Python."""
    keys = [r[0] for r in pg.sql("SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND "
                                 "a.attnum = ANY(i.indkey) WHERE i.indrelid = %s::regclass AND i.indisprimary "
                                 "ORDER BY a.attnum", dbname=db, params=(table,))]
    out = {}
    for line in df.toJSON().collect():
        row = json.loads(line)
        row = {c: row.get(c) for c in df.columns}
        out[key_of({"key": {k: row[k] for k in keys}})] = row
    return out


def load(pg, db) -> None:
    pg.sql("INSERT INTO items SELECT g % 50, g, 'sku' || g, g FROM generate_series(1, 400) g", dbname=db)


def change(pg, db, round_: int) -> None:
    pg.sql(f"BEGIN; UPDATE items SET qty = qty * 2 + {round_} WHERE line % 3 = {round_ % 3}; "
           f"DELETE FROM items WHERE line % 7 = {round_}; "
           f"INSERT INTO items SELECT 1000 + g, {round_}, 'new', g FROM generate_series(1, 20) g; COMMIT", dbname=db)


def loaded_and_changed(pg, db, tower, tmp_path, rounds: int, tombstones: bool = False):
    """The items table loaded, captured into topic items, its bootstrap read, then ``rounds`` of changes."""
    load(pg, db)
    connector = Connector(pg, db, tower, tmp_path, tables=["public.items"], topic="items", tombstones=tombstones)
    wait_for(lambda: connector.capture.stats.snapshot_rows == 400 or connector.error, 30, what="the bootstrap")
    for round_ in range(rounds):
        change(pg, db, round_)
    return connector


def test_batch_materialize_equals_the_table(spark, pg, db, tower, store, tmp_path):
    # with a tombstone after each delete (--tombstones): an empty record, which materialize skips
    connector = loaded_and_changed(pg, db, tower, tmp_path, 3, tombstones=True)
    try:
        pg.sql("ALTER TABLE items ADD COLUMN note text", dbname=db)
        pg.sql("UPDATE items SET note = 'x' WHERE line = 5", dbname=db)
        pg.sql("INSERT INTO items (order_id, line, sku, qty, note) VALUES (99999, 1, 'marker', 1, 'end')", dbname=db)
        pg.sql("TRUNCATE items", dbname=db)  # and again after the truncate
        pg.sql("INSERT INTO items (order_id, line, sku, qty, note) SELECT g, 1, 'after', g, 'n' "
               "FROM generate_series(1, 30) g", dbname=db)
        wait_all_acked(pg, db, connector)
        records = (spark.read.format("dafka").option("topic", "items").option("tower", tower.pub_endpoint)
                   .option("towerSub", tower.sub_endpoint).option("dafka.beacon/address", "127.0.0.1").load())
        table = materialize(records, "public.items")
        assert table.columns == ["order_id", "line", "sku", "qty", "note"]
        assert_same(as_rows(table, "public.items", pg, db), table_rows(pg, db, "public.items"))
        out = tmp_path / "items.parquet"  # the example job, reading through the running store's directory
        count = cdc_table.main(["--path", store.path, "--topic", "items", "--table", "public.items", "--out", str(out)],
                               spark=spark)
        assert count == 30
        assert_same(as_rows(spark.read.parquet(str(out)), "public.items", pg, db), table_rows(pg, db, "public.items"))
    finally:
        connector.stop()


def test_materialize_of_a_compacted_topic_equals_the_table(spark, pg, db, tower, tmp_path, monkeypatch):
    """rfc 19: the store keeps each row's newest change only; Spark reads the holes compaction left, live (DIRECT-GAP)
    and through the store's directory, and the table it rebuilds is SELECT *."""
    monkeypatch.setattr(cleaner, "IDLE_MS", 500)  # the partition is compacted to its head once idle 0.5 s
    store = Store(loopback_config(tower, store__compaction__topics="items"), db=str(tmp_path / "compacted")).start()
    try:
        connector = loaded_and_changed(pg, db, tower, tmp_path, 6)
        try:
            wait_all_acked(pg, db, connector)
            published = connector.capture.stats.changes + connector.capture.stats.snapshot_rows
            wait_for(lambda: store.stats()["records_written"] == published, 30, what="every change stored")
            # compacted up to the head: a pass ended after the last record came (not just a pause between passes)
            wait_for(lambda: store.stats()["compaction_dirty"] == 0, 60, what="the store to compact the topic")
            deleted = store.stats()["compaction_deleted"]
            assert connector.error is None
            records = (spark.read.format("dafka").option("topic", "items").option("tower", tower.pub_endpoint)
                       .option("towerSub", tower.sub_endpoint).option("dafka.beacon/address", "127.0.0.1").load())
            # what the store holds: each row's newest change
            assert records.count() == published - deleted == stored_count(store, "items") < published
            expected = table_rows(pg, db, "public.items")
            assert_same(as_rows(materialize(records, "public.items"), "public.items", pg, db), expected)
            out = tmp_path / "items.parquet"
            cdc_table.main(["--path", store.path, "--topic", "items", "--table", "public.items", "--out", str(out)],
                           spark=spark)
            assert_same(as_rows(spark.read.parquet(str(out)), "public.items", pg, db), expected)
        finally:
            connector.stop()
    finally:
        store.stop()


def test_streaming_foreach_batch_keeps_a_parquet_copy_current_and_reruns_are_idempotent(spark, pg, db, tower, store,
                                                                                          tmp_path):
    load(pg, db)
    connector = Connector(pg, db, tower, tmp_path, tables=["public.items"], topic="items")
    state_path = str(tmp_path / "state")
    try:
        wait_for(lambda: connector.capture.stats.snapshot_rows == 400 or connector.error, 30, what="the bootstrap")
        stream = (spark.readStream.format("dafka").option("topic", "items").option("tower", tower.pub_endpoint)
                  .option("towerSub", tower.sub_endpoint).option("dafka.beacon/address", "127.0.0.1")
                  .option("startingOffsets", "earliest").load())

        def run_once() -> None:
            query = (stream.writeStream.foreachBatch(lambda df, i: apply_batch(df, i, state_path))
                     .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True).start())
            query.awaitTermination(120)
            assert query.exception() is None

        run_once()
        assert_same(as_rows(read_state(spark, state_path, "public.items"), "public.items", pg, db),
                    table_rows(pg, db, "public.items"))
        for round_ in range(2):
            change(pg, db, round_)
        wait_all_acked(pg, db, connector)
        run_once()  # the next batches, as after a driver restart from its checkpoint
        after = read_state(spark, state_path, "public.items")
        assert_same(as_rows(after, "public.items", pg, db), table_rows(pg, db, "public.items"))
        # The same batch again (Spark re-runs the last uncommitted one after a crash): the same version.
        import os
        versions = sorted(n for n in os.listdir(state_path) if n.startswith("v="))
        last = int(versions[-1][2:])
        records = (spark.read.format("dafka").option("topic", "items").option("tower", tower.pub_endpoint)
                   .option("towerSub", tower.sub_endpoint).option("dafka.beacon/address", "127.0.0.1").load())
        apply_batch(records, last, state_path)  # every change again, as a replay: dropped by position
        assert_same(as_rows(read_state(spark, state_path, "public.items"), "public.items", pg, db),
                    table_rows(pg, db, "public.items"))
    finally:
        connector.stop()
