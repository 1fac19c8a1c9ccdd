"""What the CDC tests share: the tables, a connector in a thread, the source
table read as envelopes show it, and a consumer that applies the changes."""

from __future__ import annotations

import json
import threading
import time

from dafka import Consumer
from dafka.cdc.apply import TableState, key_of
from dafka.cdc.envelope import record_key
from dafka.cdc.postgres import PostgresCapture, PostgresSource
from dafka.cdc.types import converter
from dafka.store import keys
from helpers import loopback_config, wait_for

TABLES = """
CREATE TABLE orders (id bigint PRIMARY KEY, customer text, amount numeric(12,2), paid boolean,
                     placed timestamptz, tags text[], doc jsonb, blob bytea, ratio double precision);
CREATE TABLE items (order_id bigint, line int, sku text, qty int, PRIMARY KEY (order_id, line));
"""


class Running:
    """A connector (PostgresCapture, MysqlCapture) running in a thread; ``error`` is what stopped it."""

    def __init__(self, capture) -> None:
        self.capture = capture
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="cdc-connector")
        self.thread.start()

    def _run(self) -> None:
        try:
            self.capture.run()
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            self.error = exc

    def stop(self) -> None:
        self.capture.stop()
        self.thread.join(30)
        assert not self.thread.is_alive()


def Connector(pg, db, tower, tmp_path, **kw) -> Running:  # noqa: N802 - reads as the class it stands for
    """``dafka cdc postgres`` of ``db``'s orders and items (by default) into topic shop, in a thread."""
    source = PostgresSource(pg.dsn(db), kw.pop("tables", ["public.orders", "public.items"]), kw.pop("topic", "shop"),
                            state_dir=str(tmp_path), **kw)
    return Running(PostgresCapture(source, loopback_config(tower)))


# A separate writer process: transactions of 1-100 row changes over orders and items until its time is up,
# reconnecting when the server restarts; prints how many transactions committed.  argv: driver (psycopg2 or
# pymysql), connection (a DSN, or port,database), seed, seconds, and the transactions it commits at least (it
# goes on past its time until then: a machine too busy to commit them in time still gets the load a test asks).
WRITER = r"""
import random, sys, time
driver = __import__(sys.argv[1])
def connect():
    if sys.argv[1] == "psycopg2":
        return driver.connect(sys.argv[2])
    port, database = sys.argv[2].split(",")
    return driver.connect(host="127.0.0.1", port=int(port), user="root", database=database)
rng = random.Random(int(sys.argv[3])); next_id = 100000
deadline = time.monotonic() + float(sys.argv[4])
at_least = int(sys.argv[5])
conn = None
transactions = 0
while time.monotonic() < deadline or transactions < at_least:
    try:
        if conn is None:
            conn = connect()
        with conn.cursor() as cur:
            for _ in range(rng.randint(1, 100)):
                action = rng.random()
                if action < 0.5:
                    next_id += 1
                    cur.execute("INSERT INTO orders (id, customer, amount, paid) VALUES (%s, 'w', %s, %s)",
                                (next_id, rng.randint(0, 10**6) / 100, rng.random() < 0.5))
                    cur.execute("INSERT INTO items VALUES (%s, 1, 'sku', %s)", (next_id, rng.randint(1, 9)))
                elif action < 0.8:
                    cur.execute("UPDATE orders SET amount = amount + 1, paid = NOT paid WHERE id = %s",
                                (rng.randint(1, next_id),))
                else:
                    victim = rng.randint(1, next_id)
                    cur.execute("DELETE FROM items WHERE order_id = %s", (victim,))
                    cur.execute("DELETE FROM orders WHERE id = %s", (victim,))
        conn.commit()
        transactions += 1
    except driver.Error:  # the server restarted: that transaction never happened
        conn = None
        time.sleep(0.2)
    time.sleep(0.005)
print(transactions, flush=True)
"""


def table_rows(pg, db, table: str) -> dict[str, dict]:
    """The table as the envelope would show it: every column through the same text mapping."""
    cols = pg.sql("SELECT a.attname, a.atttypid FROM pg_attribute a WHERE a.attrelid = %s::regclass AND a.attnum > 0 "
                  "AND NOT a.attisdropped ORDER BY a.attnum", dbname=db, params=(table,))
    keys = [r[0] for r in pg.sql("SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND "
                                 "a.attnum = ANY(i.indkey) WHERE i.indrelid = %s::regclass AND i.indisprimary "
                                 "ORDER BY a.attnum", dbname=db, params=(table,))]
    select = ", ".join(f'"{name}"::text' for name, _ in cols)
    rows = {}
    for values in pg.sql(f"SELECT {select} FROM {table}", dbname=db):
        row = {name: None if v is None else converter(oid)(v) for (name, oid), v in zip(cols, values)}
        rows[key_of({"key": {k: row[k] for k in keys}})] = row
    return rows


def stored_values(store, topic: str) -> list[bytes]:
    """What a running store (in this process) holds of ``topic``: every record's content, by offset."""
    with store._db.lock:
        return list(store._db.db.iterator(prefix=keys.RECORD + topic.encode() + b"\0", include_key=False))


def stored_count(store, topic: str) -> int:
    """How many records of ``topic`` a running store (in this process) holds, contents unread."""
    with store._db.lock:
        return sum(1 for _ in store._db.db.iterator(prefix=keys.RECORD + topic.encode() + b"\0",
                                                    include_value=False))


def wait_all_acked(pg, db, connector: Running, timeout: float = 30) -> None:
    """Until the connector confirmed every change committed so far: the server's WAL position now, not the
    end of what the connector has heard of (its wal_end lags the server's while a transaction is on its
    way, and every change it has heard of may be acked before the last ones come: CI read 135 more)."""
    (written,) = pg.sql("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn", dbname=db)[0]
    wait_for(lambda: connector.capture.stats.confirmed_lsn >= int(written) or connector.error, timeout,
             what="every change acked")
    assert connector.error is None


def assert_same(materialized: dict[str, dict], table: dict[str, dict], changes: list[dict] | None = None) -> None:
    """Equal, or the first difference in full; with ``changes`` (consume_into's), every change the consumer
    read of the first keys that differ: (offset, op, position, applied), to tell a change never published
    from one the consumer dropped."""
    def seen(keys: list[str]) -> dict[str, list]:
        return {key: [(c["_offset"], c["op"], c["source"].get("lsn", c["source"].get("pos")), c["source"].get("seq"),
                       c["_applied"]) for c in changes or () if key_of(c) == key]
                for key in keys[:3]}
    extra, missing = sorted(materialized.keys() - table.keys())[:5], sorted(table.keys() - materialized.keys())[:5]
    assert materialized.keys() == table.keys(), (extra, missing, seen(extra + missing))
    for key, row in table.items():
        assert materialized[key] == row, (key, materialized[key], row, seen([key]))


def consume_into(tower, topic: str, state: TableState, until, timeout: float = 30) -> list[dict]:
    changes = []
    with Consumer(topic, config=loopback_config(tower, consumer__offset__reset="earliest")) as consumer:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for record in consumer.consume(1000, timeout=0.2):
                if not record.value:  # a tombstone (--tombstones): the key of a row deleted just before
                    assert not state.apply(record.value, record.partition) and record.key is not None, record
                    continue
                change = json.loads(record.value)
                source = change["source"]
                # every change has its row's identity as its record key (rfc/cdc.md), live and from the stores
                assert record.key == record_key(source["schema"], source["table"], change["key"]), record
                changes.append(change)
                change["_applied"] = state.apply(change, record.partition)
                change["_offset"] = record.offset
            if until(state, changes):
                return changes
    raise AssertionError(f"consumer did not get there in {timeout}s: {len(changes)} changes, {state.tables.keys()}")


def assert_waits_for_the_server(capture) -> None:
    """A connector whose server refuses connections tries again (reconnects counted) until it is stopped,
    and then returns: a server restart at any moment never stops a connector (connector.ServerUnavailable)."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            capture.run()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while capture.stats.reconnects < 2 and not errors and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not errors, errors
        assert capture.stats.reconnects >= 2 and thread.is_alive()
    finally:
        capture.stop()
        thread.join(15)
    assert not thread.is_alive() and not errors, errors
