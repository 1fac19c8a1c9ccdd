"""What the CDC tests share: the tables, a connector in a thread, the source
table read as envelopes show it, and a consumer that applies the changes."""

from __future__ import annotations

import json
import threading
import time

from dafka import Consumer
from dafka.cdc.apply import TableState, key_of
from dafka.cdc.postgres import PostgresCapture, PostgresSource
from dafka.cdc.types import converter
from helpers import loopback_config

TABLES = """
CREATE TABLE orders (id bigint PRIMARY KEY, customer text, amount numeric(12,2), paid boolean,
                     placed timestamptz, tags text[], doc jsonb, blob bytea, ratio double precision);
CREATE TABLE items (order_id bigint, line int, sku text, qty int, PRIMARY KEY (order_id, line));
"""


class Connector:
    """A PostgresCapture running in a thread."""

    def __init__(self, pg, db, tower, tmp_path, **kw) -> None:
        self.source = PostgresSource(pg.dsn(db), kw.pop("tables", ["public.orders", "public.items"]), kw.pop("topic", "shop"),
                                     state_dir=str(tmp_path), **kw)
        self.capture = PostgresCapture(self.source, loopback_config(tower))
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


def assert_same(materialized: dict[str, dict], table: dict[str, dict]) -> None:
    """Equal, or the first difference in full."""
    assert materialized.keys() == table.keys(), (sorted(materialized.keys() - table.keys())[:5],
                                                 sorted(table.keys() - materialized.keys())[:5])
    for key, row in table.items():
        assert materialized[key] == row, (key, materialized[key], row)


def consume_into(tower, topic: str, state: TableState, until, timeout: float = 30) -> list[dict]:
    changes = []
    with Consumer(topic, config=loopback_config(tower, consumer__offset__reset="earliest")) as consumer:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for record in consumer.consume(1000, timeout=0.2):
                change = json.loads(record.value)
                changes.append(change)
                state.apply(change, record.partition)
            if until(state, changes):
                return changes
    raise AssertionError(f"consumer did not get there in {timeout}s: {len(changes)} changes, {state.tables.keys()}")
