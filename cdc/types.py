"""PostgreSQL column values, from their text form to JSON values.

pgoutput sends every value as its type's text output, and the bootstrap reads
``column::text``, so one mapping serves both.  The session runs with
``TimeZone = UTC`` and ``DateStyle = ISO`` (the connector sets both), so times
come as ``2026-11-26 13:35:08.123+00``.

| PostgreSQL | JSON |
|---|---|
| boolean | true / false |
| smallint, integer, bigint, oid | number |
| real, double precision | number; ``"NaN"``, ``"Infinity"``, ``"-Infinity"`` as strings |
| numeric, money | string, exact (``"12.50"``; Debezium's ``decimal.handling.mode=string``) |
| json, jsonb | the JSON value itself |
| bytea | string, base64 |
| timestamp with time zone | string, ISO 8601 in UTC: ``"2026-11-26T13:35:08.123Z"`` |
| timestamp, date, time, timetz, interval | string, ISO 8601 where PostgreSQL has it (``T`` between date and time) |
| arrays of any of these | a JSON array (nested for more dimensions), NULL elements as null |
| anything else (text, varchar, uuid, enums, ...) | string, as PostgreSQL writes it |
"""

from __future__ import annotations

import base64
import json
from typing import Any, Callable

BOOL, BYTEA, INT8, INT2, INT4, TEXT, OID, JSON = 16, 17, 20, 21, 23, 25, 26, 114
FLOAT4, FLOAT8, MONEY = 700, 701, 790
TIMESTAMP, TIMESTAMPTZ, DATE, TIME, TIMETZ = 1114, 1184, 1082, 1083, 1266
NUMERIC, JSONB = 1700, 3802

# array type -> element type (pg_type.typelem) for the built-in types above and the common others
ARRAY_ELEMENTS = {
    1000: BOOL, 1001: BYTEA, 1016: INT8, 1005: INT2, 1007: INT4, 1009: TEXT, 1028: OID, 199: JSON,
    1021: FLOAT4, 1022: FLOAT8, 791: MONEY, 1115: TIMESTAMP, 1185: TIMESTAMPTZ, 1182: DATE, 1183: TIME,
    1270: TIMETZ, 1231: NUMERIC, 3807: JSONB, 1015: 1043, 1014: 1042, 2951: 2950, 1003: 19,
}


def _float(text: str) -> float | str:
    value = float(text)
    return text if value != value or value in (float("inf"), float("-inf")) else value


def _bytea(text: str) -> str:
    if text.startswith("\\x"):
        return base64.b64encode(bytes.fromhex(text[2:])).decode()
    raise ValueError(f"bytea value not in hex format: {text[:20]!r} (bytea_output must be 'hex')")


def _timestamptz(text: str) -> str:
    # '2026-11-26 13:35:08.123+00' with TimeZone = UTC; BC dates and infinity stay as they are.
    if text.endswith("+00") and " " in text:
        return text[:-3].replace(" ", "T", 1) + "Z"
    return text


def _iso(text: str) -> str:
    return text.replace(" ", "T", 1) if text[:1].isdigit() else text


SCALARS: dict[int, Callable[[str], Any]] = {
    BOOL: lambda t: t in ("t", "true"),  # boolout says t/f, but boolean::text says true/false
    INT2: int, INT4: int, INT8: int, OID: int,
    FLOAT4: _float, FLOAT8: _float,
    JSON: json.loads, JSONB: json.loads,
    BYTEA: _bytea,
    TIMESTAMPTZ: _timestamptz, TIMESTAMP: _iso,
}


def converter(type_oid: int, element_oid: int | None = None) -> Callable[[str], Any]:
    """The function that turns a column's text into its JSON value.
    ``element_oid``: for an array type not in :data:`ARRAY_ELEMENTS`, its
    element type (from pg_type), if known."""
    scalar = SCALARS.get(type_oid)
    if scalar is not None:
        return scalar
    element = ARRAY_ELEMENTS.get(type_oid, element_oid)
    if element is not None:
        item = SCALARS.get(element, str)
        return lambda text: parse_array(text, item)
    return str


def parse_array(text: str, item: Callable[[str], Any] = str) -> list:
    """A PostgreSQL array literal (``{1,2,NULL}``, ``{{"a b",c},{d,"e\\"f"}}``) as
    nested lists; ``item`` converts each element's text.  A leading dimension
    decoration (``[0:1]={...}``) is dropped."""
    if text.startswith("["):
        text = text[text.index("=") + 1:]
    if not text.startswith("{"):
        raise ValueError(f"not an array literal: {text[:20]!r}")
    pos = 0
    n = len(text)

    def parse() -> list:
        nonlocal pos
        pos += 1  # '{'
        out: list = []
        if pos < n and text[pos] == "}":
            pos += 1
            return out
        while pos < n:
            ch = text[pos]
            if ch == "{":
                out.append(parse())
            elif ch == '"':
                pos += 1
                chars = []
                while pos < n and text[pos] != '"':
                    if text[pos] == "\\":
                        pos += 1
                    chars.append(text[pos])
                    pos += 1
                pos += 1
                out.append(item("".join(chars)))
            else:
                end = pos
                while end < n and text[end] not in ",}":
                    end += 1
                raw = text[pos:end]
                out.append(None if raw == "NULL" else item(raw))
                pos = end
            if pos >= n:
                break
            if text[pos] == ",":
                pos += 1
            elif text[pos] == "}":
                pos += 1
                return out
            else:
                raise ValueError(f"bad array literal at {pos}: {text[:40]!r}")
        raise ValueError(f"unterminated array literal: {text[:40]!r}")

    result = parse()
    if pos != n:
        raise ValueError(f"trailing characters after array literal: {text[:40]!r}")
    return result
