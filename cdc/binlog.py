"""MySQL/MariaDB row-based binlog into change envelopes, free of I/O.

The I/O side (:mod:`dafka.cdc.mysql`) reads events with ``mysql-replication``
and feeds this state plain values: a transaction's start (its binlog file and
position, its GTID), its row changes, its commit.

The clock.  A binlog holds transactions whole, in commit order, so the
position of a transaction's first event orders them as PostgreSQL's commit
LSN does: ``source.lsn`` is ``file number << 32 | position`` (binlog
``binlog.000007`` at 1234: 7 << 32 | 1234), and the envelope also carries
``source.file``, ``source.pos`` and ``source.gtid`` (MariaDB ``0-1-42``, or
MySQL's ``uuid:n``).  The idempotent-apply rule (:mod:`dafka.cdc.apply`) is
the same.

Values (both from the binlog and from the bootstrap's SELECT) map as the
PostgreSQL ones do: numbers as numbers (BOOLEAN is TINYINT: 0 or 1), DECIMAL
as an exact string, DATETIME, TIMESTAMP, DATE and TIME as ISO 8601 strings
without a zone (TIMESTAMP in UTC: the connector's sessions run in UTC),
binary strings (BLOB, BINARY, VARBINARY) as base64, JSON as JSON (MariaDB's
too), SET as a sorted list.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
from typing import Any

from .transactions import Out, Transactions


def position(file: str, pos: int) -> int:
    """A binlog position as one growing number: the file's number << 32 | the offset in it."""
    try:
        number = int(file.rsplit(".", 1)[1])
    except (IndexError, ValueError) as exc:
        raise ValueError(f"not a binlog file name: {file!r}") from exc
    return number << 32 | pos


def file_of(lsn: int, prefix: str) -> tuple[str, int]:
    """The (file, position) of :func:`position`'s number, for binlog files named ``prefix.NNNNNN``."""
    return f"{prefix}.{lsn >> 32:06d}", lsn & 0xFFFFFFFF


def json_value(value: Any) -> Any:
    """A column value as the envelope carries it."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, datetime.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(datetime.timezone.utc).replace(tzinfo=None)
            return value.isoformat() + "Z"
        return value.isoformat()
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):  # a TIME column, as the drivers return it
        seconds = int(value.total_seconds())
        sign = "-" if seconds < 0 else ""
        seconds = abs(seconds)
        return f"{sign}{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if isinstance(value, dict):
        return {_text(k): json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_value(v) for v in value]
    return str(value)


def _text(key: Any) -> str:
    return key.decode() if isinstance(key, bytes) else str(key)


def _json_column(value: Any) -> Any:
    return json.loads(value) if isinstance(value, (str, bytes)) else json_value(value)


def _set_column(value: Any) -> Any:
    if isinstance(value, str):
        return sorted(v for v in value.split(",") if v)
    return json_value(value)


# Column kinds whose value differs with who reads it: MariaDB's JSON is text with a json_valid() check (MySQL's
# is a JSON type, which mysql-replication decodes), and PyMySQL returns SET as "a,c" where the binlog has a set.
KINDS = {"json": _json_column, "set": _set_column}


class BinlogState:
    def __init__(self, name: str, keys: dict[str, list[str]], kinds: dict[str, dict[str, str]] | None = None) -> None:
        self.txns = Transactions("mysql", name)
        self.keys = keys  # "db.table" -> its primary key columns
        self.kinds = kinds or {}  # "db.table" -> {column: "json" | "set"} (the others map by their value)
        self.committed: tuple[str, int] | None = None  # set by commit(): where the next transaction starts

    def begin(self, file: str, pos: int, gtid: str | None, timestamp: int) -> None:
        self.txns.begin(position(file, pos), gtid, timestamp * 1000, file=file, pos=pos, gtid=gtid)

    def rows(self, kind: str, schema: str, table: str, rows: list[dict]) -> list[Out]:
        """``kind`` is insert, update or delete; ``rows`` as mysql-replication gives them
        (``values``, or ``before_values`` and ``after_values``)."""
        out: list[Out] = []
        for row in rows:
            if kind == "insert":
                before, after, op = None, self._row(row["values"]), "c"
            elif kind == "update":
                before, after, op = self._row(row["before_values"]), self._row(row["after_values"]), "u"
            elif kind == "delete":
                before, after, op = self._row(row["values"]), None, "d"
            else:
                raise ValueError(f"unknown row event kind {kind!r}")
            table_name = f"{schema}.{table}"
            before, after = self._typed(table_name, before), self._typed(table_name, after)
            out += self.txns.add(op, schema, table, before, after, self._key(schema, table, after or before))
        return out

    def commit(self, next_file: str, next_pos: int) -> list[Out]:
        self.committed = (next_file, next_pos)
        return self.txns.end()

    def begin_snapshot(self, file: str, pos: int, commit_ms: int, tables: list[str]) -> list[Out]:
        """Rows read in a snapshot consistent with binlog position ``file:pos`` follow, as op ``r``; they stand
        just below that position, where the first transaction streamed after them starts.  A truncate of each
        of ``tables`` ("db.table") comes first (:meth:`Transactions.truncate_all`)."""
        self.txns.begin(position(file, pos) - 1, None, commit_ms, snapshot=True, file=file, pos=pos, gtid=None)
        return self.txns.truncate_all([table.partition(".")[::2] for table in tables])

    def snapshot_row(self, schema: str, table: str, row: dict) -> list[Out]:
        after = self._typed(f"{schema}.{table}", self._row(row))
        return self.txns.add("r", schema, table, None, after, self._key(schema, table, after))

    def end_snapshot(self) -> list[Out]:
        return self.txns.end()

    def _row(self, values: dict) -> dict:
        return {_text(name): json_value(value) for name, value in values.items()}

    def _typed(self, table: str, row: dict | None) -> dict | None:
        kinds = self.kinds.get(table)
        if not kinds or row is None:
            return row
        for column, kind in kinds.items():
            if row.get(column) is not None:
                row[column] = KINDS[kind](row[column])
        return row

    def _key(self, schema: str, table: str, row: dict | None) -> dict | None:
        columns = self.keys.get(f"{schema}.{table}")
        if row is None or not columns:
            return None
        return {c: row.get(c) for c in columns}
