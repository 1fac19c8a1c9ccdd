"""How the console consumer prints records, and msgpack <-> JSON values.

* default: the reference's line ``subject SP partition SP content``;
* ``--format``: kcat's ``-f`` tokens (``%t %p %o %s %S %T %k %K %%``) and the
  escapes ``\\n \\t \\r \\\\``; like kcat, nothing is added at the end, so
  end the format with ``\\n`` for one line per record;
* ``--json``: one JSON object per line: topic, partition, offset, timestamp
  (null: the protocol carries none), key and ``key_encoding`` (both null for
  a record without a key), value and ``value_encoding`` saying how ``value``
  is written (``utf-8`` text, ``base64`` of bytes that are not UTF-8, or
  ``msgpack``: the decoded value as JSON; a key is never msgpack-decoded).
"""

from __future__ import annotations

import base64
import datetime
import json
from collections.abc import Callable
from typing import Any

import msgpack

from dafka.records import Record

TIMESTAMP_UNKNOWN = -1  # what %T prints: records carry no timestamp on the wire


class FormatError(ValueError):
    pass


# --------------------------------------------------------------------------
# msgpack values
# --------------------------------------------------------------------------


def pack_json_line(line: bytes) -> bytes:
    """One JSON document (a line of producer input) as msgpack."""
    return msgpack.packb(json.loads(line), use_bin_type=True)


def unpack_value(data: bytes) -> Any:
    """A msgpack value as a JSON-compatible object; raises ValueError if
    ``data`` is not exactly one msgpack value."""
    try:
        value = msgpack.unpackb(data, raw=False, strict_map_key=False, timestamp=3)
    except (ValueError, msgpack.UnpackException, TypeError) as exc:
        raise ValueError(f"not a msgpack value ({exc})") from None
    return _jsonable(value)


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k if isinstance(k, str) else json.dumps(_jsonable(k)): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (bytes, bytearray)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, msgpack.ExtType):
        return {"ext": value.code, "data": base64.b64encode(value.data).decode("ascii")}
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    return value


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


# --------------------------------------------------------------------------
# Record printers
# --------------------------------------------------------------------------


class Printer:
    """Turns a record into the bytes to write (``render``).  ``value_format``
    is ``raw`` or ``msgpack``; ``on_bad_value`` is called once per record
    whose value is not valid msgpack."""

    def __init__(self, fmt: str | None, as_json: bool, value_format: str,
                 on_bad_value: Callable[[Record, str], None] | None = None) -> None:
        self.value_format = value_format
        self.on_bad_value = on_bad_value
        if as_json:
            self.render = self._json
        elif fmt is not None:
            self._parts = compile_format(fmt)
            self.render = self._custom
        else:
            self.render = self._default

    def _value_bytes(self, record: Record) -> bytes:
        """The value as printed by the default and --format printers."""
        if self.value_format == "msgpack":
            try:
                return dumps(unpack_value(record.value)).encode("utf-8")
            except ValueError as exc:
                if self.on_bad_value is not None:
                    self.on_bad_value(record, str(exc))
        return record.value

    def _default(self, record: Record) -> bytes:
        head = f"{record.topic} {record.partition} ".encode("utf-8", "surrogateescape")
        return head + self._value_bytes(record) + b"\n"

    def _custom(self, record: Record) -> bytes:
        out = []
        value: bytes | None = None
        for part in self._parts:
            if isinstance(part, bytes):
                out.append(part)
                continue
            if part in ("s", "S") and value is None:
                value = self._value_bytes(record)
            if part == "s":
                out.append(value)
            elif part == "S":
                out.append(str(len(value)).encode())
            elif part == "t":
                out.append(record.topic.encode("utf-8", "surrogateescape"))
            elif part == "p":
                out.append(record.partition.encode("utf-8", "surrogateescape"))
            elif part == "o":
                out.append(str(record.offset).encode())
            elif part == "T":
                out.append(str(TIMESTAMP_UNKNOWN).encode())
            elif part == "k":
                out.append(record.key or b"")  # kcat: nothing for a record without a key
            elif part == "K":
                out.append(b"-1" if record.key is None else str(len(record.key)).encode())
        return b"".join(out)

    def _json(self, record: Record) -> bytes:
        obj: dict[str, Any] = {
            "topic": record.topic,
            "partition": record.partition,
            "offset": record.offset,
            "timestamp": None,
            "key": None,
            "key_encoding": None,
        }
        if record.key is not None:
            obj["key"], obj["key_encoding"] = _text_or_base64(record.key)
        value = record.value
        if self.value_format == "msgpack":
            try:
                obj["value"] = unpack_value(value)
                obj["value_encoding"] = "msgpack"
                return (dumps(obj) + "\n").encode("utf-8")
            except ValueError as exc:
                if self.on_bad_value is not None:
                    self.on_bad_value(record, str(exc))
        obj["value"], obj["value_encoding"] = _text_or_base64(value)
        return (dumps(obj) + "\n").encode("utf-8")


def _text_or_base64(raw: bytes) -> tuple[str, str]:
    """Bytes for JSON, and how they are written: ``utf-8`` text, or ``base64`` when they are not UTF-8."""
    try:
        return raw.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        return base64.b64encode(raw).decode("ascii"), "base64"


_TOKENS = frozenset("tposSTkK")
_ESCAPES = {"n": b"\n", "t": b"\t", "r": b"\r", "\\": b"\\", "0": b"\0"}


def compile_format(fmt: str) -> list[bytes | str]:
    """Split a kcat-style format into literal bytes and one-letter tokens."""
    parts: list[bytes | str] = []
    literal = bytearray()
    i = 0
    while i < len(fmt):
        c = fmt[i]
        if c in "%\\" and i + 1 < len(fmt):
            nxt = fmt[i + 1]
            if c == "%" and nxt == "%":
                literal += b"%"
            elif c == "%" and nxt in _TOKENS:
                if literal:
                    parts.append(bytes(literal))
                    literal.clear()
                parts.append(nxt)
            elif c == "\\" and nxt in _ESCAPES:
                literal += _ESCAPES[nxt]
            elif c == "%":
                raise FormatError(f"unknown token %{nxt} (known: %t topic, %p partition, %o offset, "
                                  "%s value, %S value size, %T timestamp, %k key, %K key size, %%)")
            else:
                literal += (c + nxt).encode()
            i += 2
            continue
        if c == "%":
            raise FormatError("a lone % at the end (write %% for a percent sign)")
        literal += c.encode("utf-8", "surrogateescape")
        i += 1
    if literal:
        parts.append(bytes(literal))
    return parts
