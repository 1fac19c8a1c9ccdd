"""Transaction assembly, shared by every source: changes in, envelopes out.

A source opens a transaction with its position and clock, adds its changes
one by one, and ends it.  Each change comes out as an envelope
(:mod:`dafka.cdc.envelope`) with the transaction's position, its place
``seq`` and ``last`` on the transaction's last change.  A change is held back
until the next one (or the end) arrives, so that the last can be marked
without holding a whole transaction in memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import envelope


@dataclass
class Out:
    """A record to publish: ``table`` is "schema.table" (for one topic per table); ``key`` the record's
    key (:func:`dafka.cdc.envelope.record_key`: the table and the row's key columns; None for a row
    without a key, or a truncate); ``op`` the change's (c, u, d, r, t)."""

    table: str
    value: bytes
    key: bytes | None = None
    op: str = ""


class Transactions:
    def __init__(self, connector: str, name: str) -> None:
        self.connector = connector  # "postgresql", "mysql"
        self.name = name  # the connector's name (source.name)
        self.database = ""
        self.changes = 0  # changes from the log (bootstrap rows are not counted)
        self.transactions = 0
        self._source: envelope.TransactionEncoder | None = None  # the open transaction's
        self._seq = 0  # the next change's place in it
        self._head: tuple[str, str] | None = None  # (envelope.source_head, the database it was made for)
        self._snapshot = False
        self._held: tuple | None = None

    @property
    def open(self) -> bool:
        return self._source is not None

    def begin(self, lsn: int, txid: Any, commit_ms: int, snapshot: bool = False, **extra: Any) -> None:
        """A transaction (or a snapshot) at position ``lsn``; ``extra`` goes into ``source`` as it is."""
        if self._head is None or self._head[1] != self.database:
            self._head = (envelope.source_head(self.connector, self.name, self.database), self.database)
        self._source = envelope.TransactionEncoder(self._head[0], lsn, txid, commit_ms, snapshot, extra)
        self._held = None  # (a change of one that never ended, a bootstrap's read cut short: not this one's)
        self._seq = 0
        self._snapshot = snapshot

    def add(self, op: str, schema: str, table: str, before: dict | None, after: dict | None, key: dict | None,
            unchanged: list[str] | tuple = ()) -> list[Out]:
        """A change of the open transaction; returns the change before it, now that it is not the last."""
        if self._source is None:
            raise ValueError(f"a change of {schema}.{table} outside a transaction")
        out = self._release(last=False)
        self._held = (op, schema, table, before, after, key, unchanged)
        return out

    def truncate_all(self, tables: list[tuple[str, str]]) -> list[Out]:
        """A snapshot's first changes: a truncate of each (schema, table) it reads whose partition has
        records already (the connectors pick them; a first bootstrap has none).  Its rows replace whatever a
        consumer held of those tables, so a row that an earlier snapshot published and that was deleted
        before this one (a bootstrap cut short by a crash or a lost server and started again, a snapshot on
        demand ahead of the stream) is not left behind: its delete stands below this snapshot's position,
        where consumers drop it."""
        out: list[Out] = []
        for schema, table in tables:
            out += self.add("t", schema, table, None, None, None)
        return out

    def end(self) -> list[Out]:
        """The transaction committed: its last change, marked."""
        out = self._release(last=True)
        if self._source is not None and not self._snapshot:
            self.transactions += 1
        self._source = None
        return out

    def reset(self) -> None:
        """Forget the open transaction: it comes again from its start (consumers drop what they applied)."""
        self._source = None
        self._held = None

    def _release(self, last: bool) -> list[Out]:
        held = self._held
        if held is None:
            return []
        self._held = None
        op, schema, table, before, after, key, unchanged = held
        seq = self._seq
        self._seq = seq + 1
        if not self._snapshot:
            self.changes += 1
        value = self._source.encode(op, schema, table, seq, last, before, after, key, list(unchanged))
        return [Out(f"{schema}.{table}", value, envelope.record_key(schema, table, key), op)]
