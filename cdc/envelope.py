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
import json.encoder
from typing import Any

VERSION = 1

_encoder = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
_c_make_encoder: Any = getattr(json.encoder, "c_make_encoder", None)  # the C accelerator, not in typeshed
if _c_make_encoder is not None:
    # JSONEncoder.encode builds this C encoder anew on every call, which cost more than the encoding of a
    # change's rows (py-spy of the connector); one built once encodes the same, byte for byte.
    _c_encode = _c_make_encoder(None, _encoder.default, json.encoder.encode_basestring, None, ":", ",",
                                            False, False, True)

    def _dumps(value: Any) -> str:
        if type(value) is str:
            return json.encoder.encode_basestring(value)
        return "".join(_c_encode(value, 0))
else:  # pragma: no cover - a Python without the json accelerator
    def _dumps(value: Any) -> str:
        return _encoder.encode(value)


def source_head(connector: str, name: str, db: str) -> str:
    """The start of every ``source`` object of a connector, up to the schema's value."""
    return _dumps({"version": VERSION, "connector": connector, "name": name, "db": db})[:-1] + ',"schema":'


class TransactionEncoder:
    """Encodes the changes of one transaction: what their ``source`` objects
    share is rendered once, and each change costs the JSON of its rows.
    ``source`` fields, in order: version, connector, name, db, schema,
    table, lsn, txid, commit_ms, seq, last, snapshot, then ``extra``."""

    def __init__(self, head: str, lsn: int, txid: Any, commit_ms: int, snapshot: bool,
                 extra: dict[str, Any]) -> None:
        """``head``: :func:`source_head` of the connector (the same for all its transactions)."""
        self._head = head
        self._middle = f',"lsn":{lsn:d},"txid":{_dumps(txid)},"commit_ms":{commit_ms:d}'
        self._tail = ((',"snapshot":true' if snapshot else ',"snapshot":false')
                      + ("," + _dumps(extra)[1:-1] if extra else "") + f'}},"ts_ms":{commit_ms:d}')

    def encode(self, op: str, schema: str, table: str, seq: int, last: bool, before: dict[str, Any] | None,
               after: dict[str, Any] | None, key: dict[str, Any] | None, unchanged: list[str]) -> bytes:
        """The envelope's bytes (UTF-8 JSON)."""
        text = ('{"op":"' + op + '","before":' + _dumps(before) + ',"after":' + _dumps(after) + ',"key":'
                + _dumps(key) + ',"source":' + self._head + _dumps(schema) + ',"table":' + _dumps(table)
                + self._middle + ',"seq":' + str(seq) + (',"last":true' if last else ',"last":false') + self._tail)
        if unchanged:
            text += ',"unchanged":' + _dumps(unchanged)
        return (text + "}").encode()


def record_key(schema: str, table: str, key: dict[str, Any] | None) -> bytes | None:
    """The record key of a change (rfc/cdc.md): the JSON ``["schema.table",{key columns}]``, the columns
    as the envelope's ``key`` has them (in the table's key order), so that one topic can carry every
    table; None for a change without key columns (a truncate, a table without a replica identity)."""
    if not key:
        return None
    return ("[" + _dumps(f"{schema}.{table}") + "," + _dumps(key) + "]").encode()


def position(change: dict[str, Any]) -> tuple[int, int]:
    """Where a decoded envelope stands in the database's history: (commit LSN, seq)."""
    source = change["source"]
    return source["lsn"], source["seq"]
