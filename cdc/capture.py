"""Change capture from PostgreSQL, free of I/O: pgoutput messages (and
bootstrap rows) in, envelopes out.

:class:`CaptureState` keeps the relations PostgreSQL described and assembles
each transaction: its changes come out in commit order, contiguous, each
with the commit LSN, the transaction id and its place in the transaction,
and the last one marked.  A change is held back until the next one (or the
COMMIT) arrives, so that the last can be marked without holding a whole
transaction in memory.

What the slot may confirm is :class:`dafka.cdc.connector.ConfirmRule`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from . import pgoutput
from .transactions import Out, Transactions
from .types import converter


@dataclass
class _Table:
    relation: pgoutput.Relation
    names: list[str]
    convert: list[Callable[[str], Any]]
    keys: list[int]  # indexes of the key columns


class CaptureState:
    def __init__(self, connector: str, database: str) -> None:
        self.txns = Transactions("postgresql", connector)
        self.txns.database = database
        self.element_types: dict[int, int] = {}  # array type oid -> element oid (pg_type)
        self.tables: dict[int, _Table] = {}
        self.primary_keys: dict[str, list[str]] = {}  # "schema.table" -> its primary key's columns
        self.malformed = 0
        self.unexpected = 0  # well-formed messages that make no sense here (a change of an unknown relation...)
        self.committed_lsn: int | None = None  # set by on_message when the message was a COMMIT: its end LSN

    @property
    def database(self) -> str:
        return self.txns.database

    @database.setter
    def database(self, name: str) -> None:
        self.txns.database = name

    @property
    def changes(self) -> int:
        return self.txns.changes

    @property
    def transactions(self) -> int:
        return self.txns.transactions

    @property
    def in_transaction(self) -> bool:
        """A BEGIN came and its COMMIT not yet."""
        return self.txns.open

    # -- relations --------------------------------------------------------

    def on_relation(self, rel: pgoutput.Relation) -> None:
        """A table's description; its key is its primary key where it has one (the connector fills
        :attr:`primary_keys`), else the replica identity's columns (all of them under FULL)."""
        convert = [converter(c.type_oid, self.element_types.get(c.type_oid)) for c in rel.columns]
        primary = self.primary_keys.get(f"{rel.schema}.{rel.table}")
        if primary:
            keys = [i for i, c in enumerate(rel.columns) if c.name in primary]
        else:
            keys = [i for i, c in enumerate(rel.columns) if c.key]
        self.tables[rel.oid] = _Table(rel, [c.name for c in rel.columns], convert, keys)

    # -- the replication stream ---------------------------------------------

    def on_payload(self, payload: bytes) -> list[Out]:
        """One replication message; malformed ones are counted and dropped."""
        try:
            msg = pgoutput.decode(payload)
        except pgoutput.MalformedMessage:
            self.malformed += 1
            raise
        return self.on_message(msg)

    def on_message(self, msg: pgoutput.Message) -> list[Out]:
        self.committed_lsn = None
        kind = type(msg)
        if kind is pgoutput.Begin:
            self.txns.begin(msg.final_lsn, msg.xid, msg.commit_us // 1000)
            return []
        if kind is pgoutput.Relation:
            self.on_relation(msg)
            return []
        if kind is pgoutput.Commit:
            if not self.txns.open:
                self.unexpected += 1
                return []
            self.committed_lsn = msg.end_lsn
            return self.txns.end()
        if kind in (pgoutput.TypeMsg, pgoutput.Origin, pgoutput.LogicalMessage):
            return []
        if not self.txns.open:
            self.unexpected += 1
            raise ValueError(f"a change outside a transaction: {kind.__name__}")
        if kind is pgoutput.Truncate:
            out: list[Out] = []
            for oid in msg.oids:
                table = self._table(oid)
                out += self._hold("t", table, None, None, None, [])
            return out
        table = self._table(msg.oid)
        if kind is pgoutput.Insert:
            after, unchanged = self._row(table, msg.new, None)
            return self._hold("c", table, None, after, self._key(table, after), unchanged)
        if kind is pgoutput.Update:
            before = self._row(table, msg.old, None)[0] if msg.old is not None else None
            after, unchanged = self._row(table, msg.new, before)
            return self._hold("u", table, before, after, self._key(table, after), unchanged)
        if kind is pgoutput.Delete:
            before = self._row(table, msg.old, None)[0]
            if msg.old_is_key:
                before = {table.names[i]: before[table.names[i]] for i in table.keys}
            return self._hold("d", table, before, None, self._key(table, before), [])
        self.unexpected += 1
        raise ValueError(f"unexpected message {kind.__name__}")

    def reset(self) -> None:
        """The replication connection was lost: the open transaction comes again from its start (what of it
        was published is dropped by consumers by position), and the relations are described anew."""
        self.txns.reset()

    # -- the bootstrap ------------------------------------------------------

    def begin_snapshot(self, lsn: int, commit_ms: int, oids: list[int]) -> list[Out]:
        """Rows read in a slot's exported snapshot follow, as op ``r`` at ``lsn``, in ``seq`` order, after a
        truncate of each of the relations ``oids`` (:meth:`Transactions.truncate_all`)."""
        self.txns.begin(lsn, None, commit_ms, snapshot=True)
        relations = [self._table(oid).relation for oid in oids]
        return self.txns.truncate_all([(rel.schema, rel.table) for rel in relations])

    def snapshot_row(self, oid: int, texts: list[str | None]) -> list[Out]:
        table = self._table(oid)
        row = {name: None if text is None else convert(text)
               for name, convert, text in zip(table.names, table.convert, texts)}
        return self._hold("r", table, None, row, self._key(table, row), [])

    def end_snapshot(self) -> list[Out]:
        return self.txns.end()

    # -- helpers ------------------------------------------------------------

    def _table(self, oid: int) -> _Table:
        table = self.tables.get(oid)
        if table is None:
            self.unexpected += 1
            raise ValueError(f"a change of relation {oid}, which no RELATION message described")
        return table

    def _row(self, table: _Table, values: pgoutput.Tuple, before: dict | None) -> tuple[dict, list[str]]:
        if len(values) != len(table.names):
            self.unexpected += 1
            raise ValueError(f"{table.relation.schema}.{table.relation.table}: a tuple of {len(values)} columns, "
                             f"the relation has {len(table.names)}")
        row: dict[str, Any] = {}
        unchanged: list[str] = []
        for name, convert, (kind, value) in zip(table.names, table.convert, values):
            if kind == pgoutput.TEXT:
                row[name] = convert(value)
            elif kind == pgoutput.NULL:
                row[name] = None
            elif kind == pgoutput.UNCHANGED:
                if before is not None and name in before:
                    row[name] = before[name]  # replica identity FULL: the old tuple has it
                else:
                    unchanged.append(name)
            else:
                row[name] = value.hex()  # binary format: never asked for
        return row, unchanged

    @staticmethod
    def _key(table: _Table, row: dict | None) -> dict | None:
        if row is None or not table.keys:
            return None
        return {table.names[i]: row.get(table.names[i]) for i in table.keys}

    def _hold(self, op: str, table: _Table, before: dict | None, after: dict | None, key: dict | None,
              unchanged: list[str]) -> list[Out]:
        rel = table.relation
        return self.txns.add(op, rel.schema, rel.table, before, after, key, unchanged)
