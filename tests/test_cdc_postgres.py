"""dafka cdc postgres against a real PostgreSQL server (tests/pgserver.py) and
real stores: bootstrap, streaming, types, schema changes, restarts and errors."""

from __future__ import annotations

import signal
import time

import pytest

from cdchelpers import (WRITER, Connector, Running, assert_same, assert_waits_for_the_server, consume_into,
                        stored_count, stored_values, table_rows)
from dafka.cdc.apply import TableState, key_of
from dafka.cdc.connector import ServerUnavailable
from dafka.cdc.postgres import CdcError, PostgresCapture, PostgresSource
from dafka.store import Store, cleaner
from helpers import loopback_config, script, wait_for
from pgserver import PostgresServer

pytestmark = pytest.mark.cdc

def test_bootstrap_then_stream_rebuilds_both_tables_with_every_type(pg, db, tower, store, tmp_path):
    pg.sql("INSERT INTO orders SELECT g, 'c' || g, g * 1.25, g % 2 = 0, '2026-11-26 10:00:00+01'::timestamptz + g * "
           "interval '1 second', ARRAY['a', 'b c', NULL], jsonb_build_object('n', g), '\\x00ff'::bytea, g / 3.0 "
           "FROM generate_series(1, 500) g", dbname=db)
    pg.sql("INSERT INTO items SELECT g % 100, g, 'sku' || g, g FROM generate_series(1, 300) g", dbname=db)
    connector = Connector(pg, db, tower, tmp_path)
    try:
        wait_for(lambda: connector.capture.stats.snapshot_rows == 800 or connector.error, 30, what="the bootstrap")
        assert connector.error is None
        pg.sql("BEGIN; UPDATE orders SET paid = NOT paid, doc = '{\"x\": [1, 2.5, null]}' WHERE id <= 10; "
               "DELETE FROM orders WHERE id BETWEEN 11 AND 20; INSERT INTO orders (id, customer, amount, ratio) "
               "VALUES (1001, 'new', 'NaN', 'Infinity'); UPDATE items SET qty = qty + 1 WHERE line < 50; COMMIT",
               dbname=db)
        pg.sql("UPDATE orders SET id = 2001 WHERE id = 21", dbname=db)  # a key change
        pg.sql("ALTER TABLE orders ADD COLUMN note text", dbname=db)
        pg.sql("INSERT INTO orders (id, note) VALUES (3001, 'after ALTER')", dbname=db)
        pg.sql("ALTER TABLE orders DROP COLUMN blob", dbname=db)
        pg.sql("UPDATE orders SET note = 'dropped blob' WHERE id = 1", dbname=db)
        state = TableState()
        changes = consume_into(tower, "shop", state,
                               lambda s, c: any(ch["after"] and ch["after"].get("note") == "dropped blob" for ch in c))
        assert connector.error is None
        assert_same(state.rows("public.orders"), table_rows(pg, db, "public.orders"), changes)
        assert_same(state.rows("public.items"), table_rows(pg, db, "public.items"), changes)
        snapshot = [c for c in changes if c["op"] == "r"]
        assert len(snapshot) == 800 and [c["source"]["seq"] for c in snapshot] == list(range(800))
        assert [c["source"]["last"] for c in snapshot].count(True) == 1 and snapshot[-1]["source"]["last"]
        streamed = [c for c in changes if not c["source"]["snapshot"]]
        first = [c for c in streamed if c["source"]["txid"] == streamed[0]["source"]["txid"]]
        assert len(first) == 10 + 10 + 1 + 49  # one transaction, contiguous, the last marked
        assert [c["source"]["seq"] for c in first] == list(range(70)) and first[-1]["source"]["last"]
        assert not any(c["source"]["last"] for c in first[:-1])
        lsns = [c["source"]["lsn"] for c in changes]
        assert lsns == sorted(lsns)  # commit order
        nan = next(c for c in streamed if c["op"] == "c" and c["key"] == {"id": 1001})["after"]
        assert nan["amount"] == "NaN" and nan["ratio"] == "Infinity"
        row = state.rows("public.orders")[key_of({"key": {"id": 2}})]
        assert row["placed"] == "2026-11-26T09:00:02Z" and row["tags"] == ["a", "b c", None]
        assert row["doc"] == {"x": [1, 2.5, None]} and row["amount"] == "2.50" and row["paid"] is False
        assert "blob" not in row
    finally:
        connector.stop()


def test_wal_level_not_logical_names_the_setting(tower, store, tmp_path):
    server = PostgresServer(wal_level="replica")
    try:
        server.sql("CREATE TABLE t (id int PRIMARY KEY)")
        capture = PostgresCapture(PostgresSource(server.dsn(), ["t"], "x", state_dir=str(tmp_path)),
                                  loopback_config(tower))
        with pytest.raises(CdcError, match="wal_level is 'replica': set wal_level = logical"):
            capture.run()
    finally:
        server.close()


def test_bad_inputs_each_name_what_to_fix(pg, db, tower, store, tmp_path):
    def run(**kw):
        source = PostgresSource(kw.pop("dsn", pg.dsn(db)), kw.pop("tables", ["orders"]), "x", state_dir=str(tmp_path),
                                **kw)
        PostgresCapture(source, loopback_config(tower)).run()

    with pytest.raises(CdcError, match=r"table public.nope does not exist .*\(--table\)"):
        run(tables=["nope"])
    pg.sql("CREATE ROLE weak LOGIN", dbname=db)
    with pytest.raises(CdcError, match="role weak may not replicate: ALTER ROLE weak REPLICATION"):
        run(dsn=pg.dsn(db, user="weak"))
    with pytest.raises(CdcError, match=r"cannot connect to PostgreSQL \(--dsn\): .*\"nosuchdb\" does not exist"):
        run(dsn=f"host=127.0.0.1 port={pg.port} dbname=nosuchdb user=postgres")
    # a server that refuses connections (down, restarting) is waited for, not a reason to stop
    assert_waits_for_the_server(PostgresCapture(PostgresSource("host=127.0.0.1 port=1 dbname=x user=postgres",
                                                               ["orders"], "x", state_dir=str(tmp_path)),
                                                loopback_config(tower)))
    pg.sql("SELECT pg_create_logical_replication_slot('dafka_busy', 'pgoutput')", dbname=db)
    import psycopg2
    import psycopg2.extras

    holder = psycopg2.connect(pg.dsn(db), connection_factory=psycopg2.extras.LogicalReplicationConnection)
    try:
        holder.cursor().start_replication(slot_name="dafka_busy", decode=False,
                                          options={"proto_version": "1", "publication_names": "none"})
        wait_for(lambda: pg.sql("SELECT active_pid FROM pg_replication_slots WHERE slot_name = 'dafka_busy'")[0][0],
                 10, what="the slot to be active")
        with pytest.raises(CdcError, match=r"replication slot dafka_busy is in use by process \d+.*--slot"):
            run(slot="dafka_busy")
    finally:
        holder.close()




def test_a_slot_lost_between_two_connections_is_made_again(pg, db, tower, store, tmp_path):
    """A slot whose bootstrap never finished, gone before the connector reconnects (a server restart between
    dropping it and making it again leaves none): the connector makes it and bootstraps, not drop it for ever."""
    pg.sql("INSERT INTO orders (id, customer) SELECT g, 'c' FROM generate_series(1, 50) g", dbname=db)
    pg.sql("SELECT pg_create_logical_replication_slot('dafka_lost', 'pgoutput')", dbname=db)
    capture = PostgresCapture(PostgresSource(pg.dsn(db), ["public.orders"], "lost", state_dir=str(tmp_path),
                                             slot="dafka_lost"), loopback_config(tower))
    connect = capture._connect

    def first_replication_connection_fails(replication: bool = False):
        if replication and not capture.stats.reconnects:
            pg.sql("SELECT pg_drop_replication_slot('dafka_lost')", dbname=db)
            raise ServerUnavailable("cannot connect to PostgreSQL (--dsn): the database system is shutting down")
        return connect(replication)

    capture._connect = first_replication_connection_fails
    connector = Running(capture)
    try:
        wait_for(lambda: capture.stats.snapshot_rows == 50 or connector.error, 30, what="the bootstrap")
        wait_for(lambda: capture.stats.confirmed_lsn > 0 or connector.error, 30, what="streaming")
        assert connector.error is None and capture.stats.reconnects == 1
    finally:
        connector.stop()


@pytest.mark.faults
def test_kill_9_mid_load_a_store_lost_and_a_postgres_restart_lose_nothing(pg, db, tower, tmp_path, processes):
    stores = [Store(loopback_config(tower), db=str(tmp_path / f"store{i}")).start() for i in range(3)]
    pg.sql("INSERT INTO orders (id, customer) SELECT g, 'c' FROM generate_series(1, 2000) g", dbname=db)

    def connector():
        return processes.start([script("dafka"), "cdc", "postgres", "--dsn", pg.dsn(db), "--table", "orders",
                                "--table", "items", "--topic", "shop", "--state-dir", str(tmp_path), "--min-acks", "2",
                                "--sub", tower.sub_endpoint, "--pub", tower.pub_endpoint,
                                "-X", "beacon/address=127.0.0.1", "-X", "beacon/timeout=1500"])

    try:
        first = connector()
        writer = processes.python(WRITER, "psycopg2", pg.dsn(db), "7", "14", "21")
        time.sleep(4)
        first.kill()  # SIGKILL, mid-load: transactions are open and unconfirmed
        first.wait(10)
        second = connector()
        time.sleep(3)
        stores[0].stop()  # a store lost: the two left still make min_acks 2
        time.sleep(1)
        pg.restart()  # the connector reconnects
        assert writer.wait(60) == 0
        assert int(writer.stdout.read()) > 20
        pg.sql("INSERT INTO orders (id, customer) VALUES (999999, 'last')", dbname=db)
        state = TableState()
        try:
            changes = consume_into(tower, "shop", state, lambda s, c: any(ch["key"] == {"id": 999999} for ch in c),
                                   timeout=60)
        except AssertionError:
            second.send_signal(signal.SIGINT)
            second.wait(30)
            raise AssertionError(second.stderr.read().decode()[-5000:])
        assert second.poll() is None, second.stderr.read().decode()
        assert_same(state.rows("public.orders"), table_rows(pg, db, "public.orders"), changes)
        assert_same(state.rows("public.items"), table_rows(pg, db, "public.items"), changes)
        # One bootstrap (the writer's first rows may be in it), or more: the kill, or the server's restart,
        # can cut one short before the state file marks it done, and the next then begins with a truncate of
        # each table (CI saw the first cut after 2,048 rows).
        snapshots: dict[int, list[dict]] = {}
        for c in changes:
            if c["source"]["snapshot"]:
                snapshots.setdefault(c["source"]["lsn"], []).append(c)
        *cut, whole = [snapshots[lsn] for lsn in sorted(snapshots)]
        assert all([c["source"]["seq"] for c in part] == list(range(len(part))) for part in cut)
        assert [c["source"]["seq"] for c in whole] == list(range(len(whole))) and whole[-1]["source"]["last"]
        assert [c["op"] for c in whole if c["op"] != "r"] == (["t", "t"] if cut else []) and len(whole) >= 2000
        second.send_signal(signal.SIGINT)
        assert second.wait(30) == 0, second.stderr.read().decode()
    finally:
        for s in stores:
            s.stop()


def test_topic_per_table_keeps_each_table_in_its_own_topic_with_the_lsn(pg, db, tower, store, tmp_path):
    pg.sql("INSERT INTO orders (id) SELECT g FROM generate_series(1, 30) g; "
           "INSERT INTO items SELECT g, 1, 's', 1 FROM generate_series(1, 20) g", dbname=db)
    connector = Connector(pg, db, tower, tmp_path, topic_per_table=True)
    try:
        wait_for(lambda: connector.capture.stats.snapshot_rows == 50 or connector.error, 30, what="the bootstrap")
        pg.sql("BEGIN; UPDATE orders SET paid = true WHERE id < 5; DELETE FROM items WHERE order_id < 3; COMMIT",
               dbname=db)
        orders, items = TableState(), TableState()
        got_orders = consume_into(tower, "shop.public.orders", orders, lambda s, c: sum(x["op"] == "u" for x in c) == 4)
        got_items = consume_into(tower, "shop.public.items", items, lambda s, c: sum(x["op"] == "d" for x in c) == 2)
        assert {c["source"]["table"] for c in got_orders} == {"orders"}
        assert {c["source"]["table"] for c in got_items} == {"items"}
        assert_same(orders.rows("public.orders"), table_rows(pg, db, "public.orders"))
        assert_same(items.rows("public.items"), table_rows(pg, db, "public.items"))
        txid = got_orders[-1]["source"]["txid"]
        assert got_items[-1]["source"]["txid"] == txid  # one transaction, both topics, the same LSN
        assert got_items[-1]["source"]["lsn"] == got_orders[-1]["source"]["lsn"]
        assert connector.error is None
    finally:
        connector.stop()


def test_after_retention_a_new_snapshot_lets_a_late_consumer_rebuild_the_table(pg, db, tower, tmp_path):
    # Retention keeps 150 KB per partition: the changes after the bootstrap (75 KB) push its first rows out.
    kept = Store(loopback_config(tower, store__retention__bytes=150_000), db=str(tmp_path / "kept")).start()
    try:
        pg.sql("INSERT INTO items SELECT g, 1, 'first', g FROM generate_series(1, 300) g", dbname=db)
        connector = Connector(pg, db, tower, tmp_path, tables=["public.items"], topic="items")
        try:
            wait_for(lambda: connector.capture.stats.snapshot_rows == 300 or connector.error, 30, what="the bootstrap")
            for round_ in range(6):  # rows with an odd order_id are never changed again
                pg.sql(f"UPDATE items SET qty = qty + {round_} WHERE order_id % 2 = 0; "
                       f"DELETE FROM items WHERE order_id = {round_ * 7 + 1}", dbname=db)
            wait_for(lambda: kept.stats()["retention_deleted"] > 50, 20, what="retention to delete the bootstrap's start")
            pg.sql("INSERT INTO items VALUES (99998, 1, 'marker', 1)", dbname=db)
            late = TableState()
            consume_into(tower, "items", late, lambda s, c: any(x["key"] == {"order_id": 99998, "line": 1} for x in c))
            missing = table_rows(pg, db, "public.items").keys() - late.rows("public.items").keys()
            assert missing  # the start is gone: rows never changed since are unknown to a late consumer
            connector.capture.request_snapshot()
            pg.sql("UPDATE items SET sku = 'while the snapshot is asked for' WHERE order_id = 2", dbname=db)
            wait_for(lambda: connector.capture.stats.snapshot_rows == 300 + 295, 20, what="the second snapshot")
            pg.sql("INSERT INTO items VALUES (99999, 1, 'marker', 1)", dbname=db)
            state = TableState()
            changes = consume_into(tower, "items", state, lambda s, c: any(x["key"] == {"order_id": 99999, "line": 1}
                                                                           for x in c))
            snapshot = [c for c in changes if c["source"]["snapshot"]]
            # all of it, none of the first, after a truncate: a consumer that held the table has it replaced
            assert [c["op"] for c in snapshot] == ["t"] + ["r"] * (300 - 6 + 1) and snapshot[-1]["source"]["last"]
            assert_same(state.rows("public.items"), table_rows(pg, db, "public.items"))
            assert connector.error is None
        finally:
            connector.stop()
    finally:
        kept.stop()


def test_the_command_line_serves_metrics_and_fails_with_one_line(pg, db, tower, store, tmp_path, processes):
    from helpers import free_port

    common = ["--dsn", pg.dsn(db), "--topic", "shop", "--state-dir", str(tmp_path), "--sub", tower.sub_endpoint,
              "--pub", tower.pub_endpoint, "-X", "beacon/address=127.0.0.1"]
    bad = processes.start([script("dafka"), "cdc", "postgres", "--table", "public.nope", *common], text=True)
    assert bad.wait(60) == 1
    err = bad.stderr.read().strip().splitlines()
    assert err[-1] == f"dafka cdc postgres: table public.nope does not exist in database {db} (--table)", err
    usage = processes.start([script("dafka"), "cdc", "postgres", "--table", "orders", *common, "--min-acks", "0"],
                            text=True)
    assert usage.wait(60) == 2 and "--min-acks" in usage.stderr.read()
    port = free_port()
    pg.sql("INSERT INTO orders (id) SELECT g FROM generate_series(1, 25) g", dbname=db)
    good = processes.start([script("dafka"), "cdc", "postgres", "--table", "orders", *common,
                            "--metrics-port", str(port)], text=True)
    import urllib.request

    def metrics() -> str:
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
        except OSError:
            return ""

    wait_for(lambda: "dafka_cdc_records_acked_total{" in metrics() and
             'dafka_cdc_records_acked_total{peer="dafka_shop",role="cdc"} 25.0' in metrics(), 30,
             what="the bootstrap's 25 rows acked, in the metrics")
    pg.sql("UPDATE orders SET paid = true WHERE id <= 3", dbname=db)
    wait_for(lambda: 'dafka_cdc_changes_total{peer="dafka_shop",role="cdc"} 3.0' in metrics(), 30,
             what="3 changes captured")
    text = metrics()
    for name in ("dafka_cdc_snapshot_rows_total", "dafka_cdc_transactions_total", "dafka_cdc_confirmed_lsn",
                 "dafka_cdc_lag_bytes", "dafka_cdc_malformed_total", "dafka_cdc_reconnects_total",
                 "dafka_records_published_total"):
        assert name in text, name
    good.send_signal(signal.SIGTERM)
    assert good.wait(30) == 0
    assert "stopped: 25 rows bootstrapped, 3 changes in 1 transactions" in good.stderr.read()


def test_unchanged_toasted_values_keep_their_old_value(pg, db, tower, store, tmp_path):
    """A TOASTed value an update did not touch is not sent: under the default replica identity the envelope
    names it in "unchanged" and the consumer keeps the old value; under FULL the connector fills it in."""
    pg.sql("CREATE TABLE docs (id int PRIMARY KEY, body text, n int); CREATE TABLE full_docs (id int PRIMARY KEY, "
           "body text, n int); ALTER TABLE full_docs REPLICA IDENTITY FULL", dbname=db)
    big = "SELECT string_agg(md5(g::text || %s), '') FROM generate_series(1, 400) g"  # 12.8 KB, incompressible
    for table in ("docs", "full_docs"):
        pg.sql(f"INSERT INTO {table} VALUES (1, ({big}), 0)", dbname=db, params=(table,))
    connector = Connector(pg, db, tower, tmp_path, tables=["public.docs", "public.full_docs"], topic="docs")
    try:
        wait_for(lambda: connector.capture.stats.snapshot_rows == 2 or connector.error, 30, what="the bootstrap")
        pg.sql("UPDATE docs SET n = 1; UPDATE full_docs SET n = 1", dbname=db)
        state = TableState()
        changes = consume_into(tower, "docs", state, lambda s, c: sum(x["op"] == "u" for x in c) == 2)
        updates = {c["source"]["table"]: c for c in changes if c["op"] == "u"}
        assert updates["docs"]["unchanged"] == ["body"] and "body" not in updates["docs"]["after"]
        assert "unchanged" not in updates["full_docs"] and len(updates["full_docs"]["after"]["body"]) == 12_800
        for table in ("public.docs", "public.full_docs"):
            assert_same(state.rows(table), table_rows(pg, db, table))
    finally:
        connector.stop()


def test_the_slot_follows_the_wal_while_the_captured_tables_are_idle(pg, db, tower, store, tmp_path):
    pg.sql("CREATE TABLE other (id serial PRIMARY KEY, v text)", dbname=db)
    connector = Connector(pg, db, tower, tmp_path, tables=["public.items"], topic="items")
    try:
        wait_for(lambda: connector.capture.stats.confirmed_lsn > 0 or connector.error, 30, what="streaming")
        for _ in range(20):  # WAL written by a table nobody captures
            pg.sql("INSERT INTO other (v) SELECT repeat('x', 1000) FROM generate_series(1, 500)", dbname=db)
        (written,) = pg.sql("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn", dbname=db)[0]

        def confirmed() -> int:
            return int(pg.sql("SELECT confirmed_flush_lsn - '0/0'::pg_lsn FROM pg_replication_slots "
                              "WHERE slot_name = 'dafka_items'", dbname=db)[0][0])

        wait_for(lambda: confirmed() >= written, 20, what="the slot to confirm past the idle tables' WAL")
        assert connector.error is None
    finally:
        connector.stop()


def _table_scans(pg, db, table: str) -> int:
    """Every scan of ``table`` PostgreSQL has counted (sequential and index): a query that read its rows."""
    ((seq, idx),) = pg.sql("SELECT seq_scan, COALESCE(idx_scan, 0) FROM pg_stat_user_tables WHERE relname = %s",
                           dbname=db, params=(table,))
    return seq + idx


@pytest.mark.serial  # PostgreSQL writing 1,000,000 changes, the connector and the store keep 2 cores busy for a minute
@pytest.mark.timeout(900)
def test_a_compacted_cdc_topic_rebuilds_the_table_for_a_new_consumer_without_asking_postgres(pg, db, tower, tmp_path):
    """rfc 19 and rfc/cdc.md: 100,000 rows updated 1,000,000 times (ten UPDATEs of every row) and 100 deleted;
    the store compacts the topic to about one record per row; a consumer that starts then rebuilds the table
    equal to the source from the stores alone: PostgreSQL counts no scan of the table meanwhile."""
    rows, rounds = 100_000, 10
    pg.sql("CREATE TABLE kv (id int PRIMARY KEY, v bigint NOT NULL, note text)", dbname=db)
    pg.sql(f"INSERT INTO kv SELECT g, 0, 'row ' || g FROM generate_series(1, {rows}) g", dbname=db)
    store = Store(loopback_config(tower, store__compaction__topics="kv"), db=str(tmp_path / "kv.db")).start()
    connector = Connector(pg, db, tower, tmp_path, tables=["public.kv"], topic="kv")
    try:
        wait_for(lambda: connector.capture.stats.snapshot_rows == rows or connector.error, 120, what="the bootstrap")
        for _ in range(rounds):
            pg.sql("UPDATE kv SET v = v + 1", dbname=db)  # one transaction of 100,000 changes
        pg.sql("DELETE FROM kv WHERE id % 1000 = 0", dbname=db)  # op d envelopes, which supersede their rows
        pg.sql("INSERT INTO kv VALUES (0, -1, 'the last change')", dbname=db)
        published = rows + rounds * rows + rows // 1000 + 1

        wait_for(lambda: sum(h + 1 for (t, _), h in store.heads().items() if t == "kv") >= published
                 or connector.error, 300, interval=0.5, what="the store to hold every change")
        # the store compacts the 1,100,101 records to about one a row: each row's newest change (a deleted
        # row's is its delete); the partition is compacted to its head once idle (store/cleaner.IDLE_MS)
        wait_for(lambda: stored_count(store, "kv") <= rows * 1.05, 300, interval=1.0,
                 what="the topic compacted to a record a row")
        assert connector.error is None
        scans = _table_scans(pg, db, "kv")
        state = TableState()
        changes = consume_into(tower, "kv", state, lambda s, c: any(ch["key"] == {"id": 0} for ch in c), timeout=120)
        assert _table_scans(pg, db, "kv") == scans, "the new consumer's bootstrap made PostgreSQL read the table"
        assert connector.capture.stats.snapshot_rows == rows  # (no snapshot asked again)
        assert len(changes) <= rows * 1.05, len(changes)
        assert_same(state.rows("public.kv"), table_rows(pg, db, "public.kv"))
        assert all(row["v"] == rounds for key, row in state.rows("public.kv").items() if row["id"])
    finally:
        connector.stop()
        store.stop()


@pytest.mark.timeout(180)
def test_tombstones_let_a_compacted_topic_forget_deleted_rows(pg, db, tower, tmp_path, monkeypatch):
    """--tombstones (Debezium's tombstones.on.delete): after each delete, the row's key with an empty value.
    A consumer that reads live skips them; on a compacted topic the tombstone supersedes the row's every
    record, its delete included, and goes itself after store/compaction/tombstone_ms: a deleted row leaves
    nothing behind, and a consumer from the beginning still rebuilds the table."""
    monkeypatch.setattr(cleaner, "IDLE_MS", 500)  # the partition is compacted to its head once idle 0.5 s
    pg.sql("INSERT INTO items SELECT g % 100, g, 'sku' || g, g FROM generate_series(1, 300) g", dbname=db)
    store = Store(loopback_config(tower, store__compaction__topics="items", store__compaction__tombstone_ms=0),
                  db=str(tmp_path / "items.db")).start()
    connector = Connector(pg, db, tower, tmp_path, tables=["public.items"], topic="items", tombstones=True)
    try:
        wait_for(lambda: connector.capture.stats.snapshot_rows == 300 or connector.error, 30, what="the bootstrap")
        pg.sql("UPDATE items SET qty = qty + 1 WHERE line <= 100", dbname=db)
        pg.sql("DELETE FROM items WHERE line > 250", dbname=db)  # 50 deletes, 50 tombstones
        pg.sql("INSERT INTO items VALUES (0, 0, 'the last change', 1)", dbname=db)
        published = 300 + 100 + 2 * 50 + 1
        wait_for(lambda: store.stats()["records_written"] == published or connector.error, 60,
                 what="the store to hold every change and tombstone")
        live = TableState()
        consume_into(tower, "items", live, lambda s, c: any(ch["key"] == {"order_id": 0, "line": 0} for ch in c))
        expected = table_rows(pg, db, "public.items")
        assert_same(live.rows("public.items"), expected)

        # compacted: each row's newest change; the deleted rows' records (their bootstrap, their delete and the
        # tombstone, once a later pass finds it old enough) all gone
        wait_for(lambda: stored_count(store, "items") == 251 and store.stats()["compaction_dirty"] == 0, 60, interval=0.5,
                 what="the deleted rows gone from the compacted topic")
        assert b"" not in stored_values(store, "items")
        late = TableState()
        changes = consume_into(tower, "items", late, lambda s, c: any(ch["key"] == {"order_id": 0, "line": 0}
                                                                       for ch in c))
        assert len(changes) == 251 and not any(ch["op"] == "d" for ch in changes)
        assert_same(late.rows("public.items"), expected)
        assert connector.error is None
    finally:
        connector.stop()
        store.stop()
