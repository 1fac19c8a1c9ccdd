"""The change envelope: one JSON object per row change (rfc/cdc.md).

Debezium's shape, which users of CDC know::

    {"op": "u",                                  # c create, u update, d delete, r snapshot read, t truncate
     "before": {...} | null, "after": {...} | null,
     "key": {"id": 7},                           # the replica identity's columns
     "source": {"version": 1, "connector": "postgresql", "name": "shop", "db": "shop",
                "schema": "public", "table": "orders",
                "lsn": 23488520, "txid": 741, "commit_ms": 1795700108123,
                "seq": 0, "last": false, "snapshot": false},
     "ts_ms": 1795700108123}

``source.lsn`` (the transaction's commit LSN) and ``source.seq`` (the change's
place in its transaction) order every change: the idempotent-apply rule of
:mod:`dafka.cdc.apply` rests on them.  ``source.last`` marks a transaction's
last change.  ``unchanged`` (present only when not empty) names the columns
of ``after`` that PostgreSQL did not send (TOASTed values an update left
alone, with a replica identity other than FULL): keep their old values.
"""

from __future__ import annotations

import json
from typing import Any

VERSION = 1

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def encode(op: str, before: dict | None, after: dict | None, key: dict | None, source: dict[str, Any],
           unchanged: list[str] | None = None) -> bytes:
    """The envelope's bytes (UTF-8 JSON)."""
    doc: dict[str, Any] = {"op": op, "before": before, "after": after, "key": key, "source": source,
                           "ts_ms": source["commit_ms"]}
    if unchanged:
        doc["unchanged"] = unchanged
    return _dumps(doc).encode()


def position(change: dict[str, Any]) -> tuple[int, int]:
    """Where a decoded envelope stands in the database's history: (commit LSN, seq)."""
    source = change["source"]
    return source["lsn"], source["seq"]
