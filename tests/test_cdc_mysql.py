"""dafka cdc mysql against a real MariaDB server (tests/mysqlserver.py) and real
stores: bootstrap, streaming, the envelope, a kill -9 and a server restart,
and the errors."""

from __future__ import annotations

import json
import signal
import time

import pytest

from cdchelpers import WRITER, Running, assert_same, assert_waits_for_the_server, consume_into
from dafka.cdc.apply import TableState, key_of
from dafka.cdc.binlog import KINDS, json_value
from dafka.cdc.connector import CdcError
from dafka.cdc.mysql import MysqlCapture, MysqlSource
from dafka.store import Store
from helpers import loopback_config, script, wait_for
from mysqlserver import MysqlServer

pytestmark = pytest.mark.cdc

TABLES = """CREATE TABLE orders (id BIGINT PRIMARY KEY, customer VARCHAR(40), amount DECIMAL(12,2), paid BOOLEAN,
    placed DATETIME(3), stamp TIMESTAMP(3) NULL, doc JSON, blob_ VARBINARY(16), ratio DOUBLE, flags SET('a','b','c'));
CREATE TABLE items (order_id BIGINT, line INT, sku VARCHAR(20), qty INT, PRIMARY KEY (order_id, line))"""


@pytest.fixture(scope="module")
def my():
    server = MysqlServer()
    yield server
    server.close()


@pytest.fixture
def shop(my, request):
    name = "s_" + request.node.name[5:30].lower()
    my.sql(f"DROP DATABASE IF EXISTS {name}")
    my.sql(f"CREATE DATABASE {name}")
    for statement in TABLES.split(";\n"):
        my.sql(statement, database=name)
    yield name
    my.sql(f"DROP DATABASE IF EXISTS {name}")


def table_rows(my, db: str, table: str) -> dict[str, dict]:
    import pymysql.cursors

    keys = [r[0] for r in my.sql("SELECT column_name FROM information_schema.key_column_usage WHERE table_schema = %s "
                                 "AND table_name = %s AND constraint_name = 'PRIMARY' ORDER BY ordinal_position",
                                 params=(db, table))]
    conn = pymysql.connect(host="127.0.0.1", port=my.port, user="root", database=db,
                           cursorclass=pymysql.cursors.DictCursor, init_command="SET time_zone = '+00:00'")
    try:
        with conn.cursor(pymysql.cursors.Cursor) as cur:
            kinds = MysqlCapture._column_kinds(cur, db, table)
        with conn.cursor() as cur:
            cur.execute(f"SELECT * FROM `{table}`")
            rows = [{k: KINDS[kinds[k]](v) if k in kinds and v is not None else json_value(v) for k, v in row.items()}
                    for row in cur.fetchall()]
    finally:
        conn.close()
    return {key_of({"key": {k: row[k] for k in keys}}): row for row in rows}


def Connector(my, shop, tower, tmp_path, **kw) -> Running:  # noqa: N802 - as cdchelpers.Connector
    """``dafka cdc mysql`` of ``shop``'s orders and items (by default) into topic shop, in a thread."""
    source = MysqlSource(my.dsn(), kw.pop("tables", [f"{shop}.orders", f"{shop}.items"]), kw.pop("topic", "shop"),
                         state_dir=str(tmp_path), **kw)
    return Running(MysqlCapture(source, loopback_config(tower)))


def test_bootstrap_then_stream_rebuilds_the_tables(my, shop, tower, store, tmp_path):
    my.sql(f"INSERT INTO {shop}.orders VALUES (1, 'ann', 12.50, true, '2026-11-26 10:00:00.123', "
           f"'2026-11-26 10:00:00.5', '{{\"n\": [1, 2.5, null]}}', x'00ff', 0.25, 'a,c')")
    my.sql(f"INSERT INTO {shop}.items VALUES (1, 1, 'x', 3), (1, 2, 'y', 4)")
    connector = Connector(my, shop, tower, tmp_path)
    try:
        wait_for(lambda: connector.capture.stats.snapshot_rows == 3 or connector.error, 30, what="the bootstrap")
        assert connector.error is None
        my.sql(f"INSERT INTO {shop}.orders (id, customer, amount) VALUES (2, 'bob', 7), (3, 'cy', 8)")
        conn_sql = (f"START TRANSACTION;\nUPDATE {shop}.orders SET paid = false, doc = '[1]' WHERE id = 1;\n"
                    f"DELETE FROM {shop}.items WHERE line = 1;\nINSERT INTO {shop}.items VALUES (2, 1, 'z', 9);\n"
                    "COMMIT")
        my.sql(conn_sql)
        my.sql(f"UPDATE {shop}.orders SET id = 30 WHERE id = 3")  # a key change
        my.sql(f"ALTER TABLE {shop}.orders ADD COLUMN note VARCHAR(10)")
        my.sql(f"INSERT INTO {shop}.orders (id, note) VALUES (99, 'end')")
        state = TableState()
        changes = consume_into(tower, "shop", state, lambda s, c: any(x["key"] == {"id": 99} for x in c))
        assert connector.error is None
        assert_same(state.rows(f"{shop}.orders"), table_rows(my, shop, "orders"))
        assert_same(state.rows(f"{shop}.items"), table_rows(my, shop, "items"))
        first = state.rows(f"{shop}.orders")[key_of({"key": {"id": 1}})]
        assert first["amount"] == "12.50" and first["placed"] == "2026-11-26T10:00:00.123000" and first["doc"] == [1]
        assert first["blob_"] == "AP8=" and first["flags"] == ["a", "c"]
        gtid = next(c for c in changes if c["op"] == "u")["source"]["gtid"]
        txn = [c for c in changes if c["source"]["gtid"] == gtid]
        assert [(c["op"], c["source"]["seq"], c["source"]["last"]) for c in txn] == [("u", 0, False), ("d", 1, False),
                                                                                   ("c", 2, True)]
        assert len({c["source"]["lsn"] for c in txn}) == 1
        lsns = [c["source"]["lsn"] for c in changes]
        assert lsns == sorted(lsns)
        streamed = [c for c in changes if not c["source"]["snapshot"]]
        assert all(c["source"]["gtid"] and c["source"]["file"].startswith("binlog.") for c in streamed)
        assert [c["source"]["last"] for c in changes if c["op"] == "r"] == [False, False, True]
    finally:
        connector.stop()


def test_errors_name_the_setting(tower, store, tmp_path):
    server = MysqlServer(binlog_format="MIXED")
    try:
        server.sql("CREATE DATABASE d")
        server.sql("CREATE TABLE d.t (id INT PRIMARY KEY)")
        with pytest.raises(CdcError, match="binlog_format is 'MIXED': set binlog_format = ROW"):
            MysqlCapture(MysqlSource(server.dsn(), ["d.t"], "x", state_dir=str(tmp_path)), loopback_config(tower)).run()
    finally:
        server.close()


def test_bad_inputs_each_name_what_to_fix(my, shop, tower, store, tmp_path):
    def run(dsn=None, tables=None):
        MysqlCapture(MysqlSource(dsn or my.dsn(), tables or [f"{shop}.orders"], "x", state_dir=str(tmp_path)),
                     loopback_config(tower)).run()

    with pytest.raises(CdcError, match=rf"table {shop}.nope does not exist \(--table\)"):
        run(tables=[f"{shop}.nope"])
    with pytest.raises(CdcError, match="name it with its database"):
        run(tables=["orders"])
    with pytest.raises(CdcError, match=r"cannot connect to MySQL \(--dsn\): Access denied for user 'nobody'"):
        run(dsn=f"mysql://nobody@127.0.0.1:{my.port}/")
    # a server that refuses connections (down, restarting) is waited for, not a reason to stop
    assert_waits_for_the_server(MysqlCapture(MysqlSource("mysql://root@127.0.0.1:1/", [f"{shop}.orders"], "x",
                                                         state_dir=str(tmp_path)), loopback_config(tower)))
    my.sql("CREATE USER IF NOT EXISTS 'weak'@'%'")
    my.sql(f"GRANT SELECT ON {shop}.* TO 'weak'@'%'")
    with pytest.raises(CdcError, match="may not read the binlog: GRANT REPLICATION SLAVE, REPLICATION CLIENT"):
        run(dsn=f"mysql://weak@127.0.0.1:{my.port}/")


def test_a_bootstrap_started_again_leaves_no_row_deleted_in_between(my, shop, tower, store, tmp_path):
    """A connector that published its bootstrap but died before saving its position (its state file has
    none) bootstraps again; a row the first read published and the database deleted since is gone from
    what a consumer rebuilds, though its delete was never streamed (it stands below the second snapshot)."""
    my.sql("INSERT INTO orders (id, customer) SELECT seq, 'c' FROM seq_1_to_5", database=shop)
    first = Connector(my, shop, tower, tmp_path)
    try:
        wait_for(lambda: first.capture.stats.confirmed_lsn > 0 or first.error, 30, what="the first bootstrap")
    finally:
        first.stop()
    (tmp_path / "shop.dafka-cdc-mysql.json").unlink()  # as if killed before it was written
    my.sql(f"DELETE FROM {shop}.orders WHERE id IN (2, 4)")
    my.sql(f"INSERT INTO {shop}.orders (id, customer) VALUES (6, 'new')")
    second = Connector(my, shop, tower, tmp_path)
    try:
        wait_for(lambda: second.capture.stats.confirmed_lsn > 0 or second.error, 30, what="the second bootstrap")
        my.sql(f"INSERT INTO {shop}.orders (id, customer) VALUES (99, 'end')")
        state = TableState()
        changes = consume_into(tower, "shop", state, lambda s, c: any(x["key"] == {"id": 99} for x in c))
        ops = [c["op"] for c in changes]
        assert ops.count("r") == 5 + 4 and ops.count("t") == 2  # the second bootstrap's truncates
        assert_same(state.rows(f"{shop}.orders"), table_rows(my, shop, "orders"), changes)
        assert sorted(json.loads(k)["id"] for k in state.rows(f"{shop}.orders")) == [1, 3, 5, 6, 99]
    finally:
        second.stop()


@pytest.mark.faults
def test_kill_9_mid_load_and_a_server_restart_lose_nothing(my, shop, tower, tmp_path, processes):
    my.sql("INSERT INTO orders (id, customer) SELECT seq, 'c' FROM seq_1_to_1000", database=shop)
    stores = [Store(loopback_config(tower), db=str(tmp_path / f"store{i}")).start() for i in range(2)]

    def connector():
        return processes.start([script("dafka"), "cdc", "mysql", "--dsn", my.dsn(), "--table", f"{shop}.orders",
                                "--table", f"{shop}.items", "--topic", "shop", "--state-dir", str(tmp_path),
                                "--min-acks", "2", "--sub", tower.sub_endpoint, "--pub", tower.pub_endpoint,
                                "-X", "beacon/address=127.0.0.1", "-X", "beacon/timeout=1500"])

    try:
        first = connector()
        writer = processes.python(WRITER, "pymysql", f"{my.port},{shop}", "5", "12", "21")
        time.sleep(4)
        first.kill()
        first.wait(10)
        second = connector()
        time.sleep(3)
        my.restart()
        assert writer.wait(60) == 0
        assert int(writer.stdout.read()) > 20
        my.sql(f"INSERT INTO {shop}.orders (id, customer) VALUES (999999, 'last')")
        state = TableState()
        try:
            changes = consume_into(tower, "shop", state, lambda s, c: any(x["key"] == {"id": 999999} for x in c),
                                   timeout=60)
        except AssertionError:
            second.kill()
            second.wait(30)
            raise AssertionError(second.stderr.read().decode()[-5000:])
        try:
            assert_same(state.rows(f"{shop}.orders"), table_rows(my, shop, "orders"), changes)
            assert_same(state.rows(f"{shop}.items"), table_rows(my, shop, "items"), changes)
        except AssertionError as exc:  # with what each connector said: where it bootstrapped, resumed, lost
            second.kill()
            second.wait(30)
            logs = [p.stderr.read().decode()[-3000:] for p in (first, second)]
            raise AssertionError(f"{exc}\nfirst connector:\n{logs[0]}\nsecond connector:\n{logs[1]}") from None
        second.send_signal(signal.SIGINT)
        assert second.wait(30) == 0, second.stderr.read().decode()
    finally:
        for s in stores:
            s.stop()


def test_envelope_records_are_json_a_console_consumer_prints(my, shop, tower, store, tmp_path):
    connector = Connector(my, shop, tower, tmp_path, tables=[f"{shop}.items"], topic="items")
    try:
        wait_for(lambda: connector.capture.stats.confirmed_lsn > 0 or connector.error, 30, what="the start")
        my.sql(f"INSERT INTO {shop}.items VALUES (5, 5, 'five', 5)")
        state = TableState()
        changes = consume_into(tower, "items", state, lambda s, c: len(c) >= 1)
        assert changes[0]["op"] == "c" and changes[0]["after"] == {"order_id": 5, "line": 5, "sku": "five", "qty": 5}
        assert json.loads(json.dumps(changes[0])) == changes[0]
    finally:
        connector.stop()
