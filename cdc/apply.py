"""The consumer's side of change capture: apply each change once, in order.

**The idempotent-apply rule.** Every change carries its position,
``(source.lsn, source.seq)``: the commit LSN of its transaction and its
place in it.  Within a partition positions only grow, except where the
connector restarted and PostgreSQL sent again what the slot had not
confirmed: those come again, whole transactions from their first change.
So a consumer keeps the last position it applied (per partition, with its
state), and drops every change at or below it.  The bootstrap's rows
(``op r``) all stand at the slot's consistent point, in ``seq`` order, so
the rule holds for them too.

:class:`TableState` applies changes to rows kept in memory: a reference
implementation of the rule, and what the tests compare with the database.
"""

from __future__ import annotations

import json
from typing import Any

from . import envelope


def key_of(change: dict[str, Any]) -> str:
    """A row's identity within its table: its key columns as canonical JSON."""
    return _canonical(change["key"])


def _canonical(key: dict[str, Any] | None) -> str:
    return json.dumps(key, sort_keys=True, separators=(",", ":"))


class TableState:
    """Rows by table ("schema.table") and key, built from change envelopes."""

    def __init__(self) -> None:
        self.positions: dict[Any, tuple[int, int]] = {}  # partition -> last applied (lsn, seq)
        self.tables: dict[str, dict[str, dict[str, Any]]] = {}
        self.columns: dict[str, list[str]] = {}  # table -> its columns, as its newest change shows them
        self.applied = 0
        self.dropped = 0

    def apply(self, change: dict[str, Any] | bytes, partition: Any = None) -> bool:
        """Apply one change (an envelope, decoded or not); False if it was
        at or below the partition's last position, and so dropped, or if it
        is a tombstone (an empty record after a delete: ``--tombstones``),
        which changes nothing."""
        if not change:
            return False
        if not isinstance(change, dict):
            change = dict(json.loads(change))
        position = envelope.position(change)
        if position <= self.positions.get(partition, (-1, -1)):
            self.dropped += 1
            return False
        self.positions[partition] = position
        source = change["source"]
        table = f"{source['schema']}.{source['table']}"
        rows = self.tables.setdefault(table, {})
        op = change["op"]
        if op == "t":
            rows.clear()
        elif op == "d":
            rows.pop(key_of(change), None)
        else:
            after = dict(change["after"])
            key = key_of(change)
            before = change.get("before")
            if op == "u" and before is not None and change["key"] is not None:
                old = _canonical({k: before.get(k) for k in change["key"]})
                previous = rows.pop(old, None) if old != key else rows.get(key)
            else:
                previous = rows.get(key)
            unchanged = change.get("unchanged", ())
            for column in unchanged:
                if previous is not None and column in previous:
                    after[column] = previous[column]
            rows[key] = after
            self.columns[table] = [*change["after"], *unchanged]
        self.applied += 1
        return True

    def rows(self, table: str) -> dict[str, dict[str, Any]]:
        """The table's rows by key, each with the columns the table's newest
        change has: a column added later reads as null in rows that no
        change touched since (as a column added without a default); a column
        dropped is gone from every row."""
        columns = self.columns.get(table, [])
        return {key: {c: row.get(c) for c in columns} for key, row in self.tables.get(table, {}).items()}
