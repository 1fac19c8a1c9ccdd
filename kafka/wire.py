"""The Kafka protocol's primitive types and a small schema language for its messages.

A message is a :class:`Struct` of :class:`Field`\\ s, each present in a range of
versions, as Kafka's own JSON schemas describe them.  From its first flexible
version a message uses compact strings, arrays and bytes (unsigned varint
length + 1) and ends every struct with tagged fields: unknown tags are skipped,
as the protocol says (KIP-482), and we write none but the ones a field names.

Values are plain dicts (a struct) and lists (an array); a ``records`` field is
kept as the bytes it came in, for :mod:`dafka.kafka.batches`.
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass
from typing import Any

_I8, _I16, _I32, _I64, _U32, _F64 = (struct.Struct(f) for f in (">b", ">h", ">i", ">q", ">I", ">d"))
OPEN = 32767  # "every later version"


class DecodeError(ValueError):
    """A request or batch that does not parse: the connection that sent it is closed."""


class Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes | memoryview, pos: int = 0) -> None:
        self.buf = memoryview(buf)
        self.pos = pos

    def take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.buf):
            raise DecodeError(f"{n} bytes wanted at {self.pos}, {len(self.buf) - self.pos} left")
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def fixed(self, codec: struct.Struct) -> Any:
        if self.pos + codec.size > len(self.buf):
            raise DecodeError(f"{codec.size} bytes wanted at {self.pos}, {len(self.buf) - self.pos} left")
        value = codec.unpack_from(self.buf, self.pos)[0]
        self.pos += codec.size
        return value

    def uvarint(self) -> int:
        shift = value = 0
        buf, pos = self.buf, self.pos
        while True:
            if pos >= len(buf):
                raise DecodeError("a varint runs past the end")
            byte = buf[pos]
            pos += 1
            if shift == 63 and byte > 1:
                raise DecodeError("a varint over 64 bits")
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                self.pos = pos
                return int(value)
            shift += 7
            if shift > 63:
                raise DecodeError("a varint longer than 10 bytes")

    def varint(self) -> int:
        value = self.uvarint()
        return (value >> 1) ^ -(value & 1)

    def remaining(self) -> int:
        return len(self.buf) - self.pos


def uvarint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def varint(value: int) -> bytes:
    return uvarint((value << 1) ^ (value >> 63))


class Type:
    """How one value reads and writes; ``flexible`` says whether the message version is."""

    def read(self, r: Reader, flexible: bool) -> Any:
        raise NotImplementedError

    def write(self, out: list[bytes], value: Any, flexible: bool) -> None:
        raise NotImplementedError

    def default(self) -> Any:
        return None


class _Fixed(Type):
    def __init__(self, codec: struct.Struct, zero: Any) -> None:
        self.codec, self.zero = codec, zero

    def read(self, r: Reader, flexible: bool) -> Any:
        return r.fixed(self.codec)

    def write(self, out: list[bytes], value: Any, flexible: bool) -> None:
        out.append(self.codec.pack(value))

    def default(self) -> Any:
        return self.zero


class _Bool(Type):
    def read(self, r: Reader, flexible: bool) -> bool:
        return bool(r.fixed(_I8) != 0)

    def write(self, out: list[bytes], value: Any, flexible: bool) -> None:
        out.append(b"\x01" if value else b"\x00")

    def default(self) -> bool:
        return False


class _Uuid(Type):
    def read(self, r: Reader, flexible: bool) -> uuid.UUID:
        return uuid.UUID(bytes=bytes(r.take(16)))

    def write(self, out: list[bytes], value: Any, flexible: bool) -> None:
        out.append(value.bytes)

    def default(self) -> uuid.UUID:
        return uuid.UUID(int=0)


def _length(r: Reader, flexible: bool, wide: bool) -> int:
    """A string's, bytes' or array's length; -1 for null."""
    if flexible:
        return r.uvarint() - 1
    return int(r.fixed(_I32) if wide else r.fixed(_I16))


def _write_length(out: list[bytes], n: int, flexible: bool, wide: bool) -> None:
    if flexible:
        out.append(uvarint(n + 1))
    else:
        out.append(_I32.pack(n) if wide else _I16.pack(n))


class String(Type):
    def __init__(self, nullable: bool = False) -> None:
        self.nullable = nullable

    def read(self, r: Reader, flexible: bool) -> str | None:
        n = _length(r, flexible, wide=False)
        if n < 0:
            if not self.nullable:
                raise DecodeError("a null string where the schema has none")
            return None
        try:
            return str(r.take(n), "utf-8")
        except UnicodeDecodeError as exc:
            raise DecodeError(f"a string that is not UTF-8: {exc}") from None

    def write(self, out: list[bytes], value: Any, flexible: bool) -> None:
        if value is None:
            _write_length(out, -1, flexible, wide=False)
            return
        data = value.encode()
        _write_length(out, len(data), flexible, wide=False)
        out.append(data)

    def default(self) -> str | None:
        return None if self.nullable else ""


class Bytes(Type):
    def __init__(self, nullable: bool = False) -> None:
        self.nullable = nullable

    def read(self, r: Reader, flexible: bool) -> bytes | memoryview | None:
        n = _length(r, flexible, wide=True)
        if n < 0:
            if not self.nullable:
                raise DecodeError("null bytes where the schema has none")
            return None
        return r.take(n)

    def write(self, out: list[bytes], value: Any, flexible: bool) -> None:
        if value is None:
            _write_length(out, -1, flexible, wide=True)
            return
        _write_length(out, len(value), flexible, wide=True)
        out.append(value)

    def default(self) -> bytes | None:
        return None if self.nullable else b""


@dataclass(frozen=True)
class Field:
    name: str
    type: Type
    lo: int = 0  # first version that has it
    hi: int = OPEN  # last version that has it
    nullable_from: int | None = None  # the version from which a string or array may be null
    tag: int | None = None  # a tagged field (flexible versions only)

    def present(self, version: int) -> bool:
        return self.lo <= version <= self.hi


class Array(Type):
    def __init__(self, element: Type, nullable: bool = False) -> None:
        self.element, self.nullable = element, nullable

    def read(self, r: Reader, flexible: bool, version: int = 0, nullable: bool | None = None) -> list[Any] | None:
        n = _length(r, flexible, wide=True)
        if n < 0:
            if not (self.nullable if nullable is None else nullable):
                raise DecodeError("a null array where the schema has none")
            return None
        if n > r.remaining():  # every element takes a byte at least
            raise DecodeError(f"an array of {n} elements in {r.remaining()} bytes")
        element = self.element
        if isinstance(element, Struct):
            return [element.read_version(r, flexible, version) for _ in range(n)]
        return [element.read(r, flexible) for _ in range(n)]

    def write(self, out: list[bytes], value: Any, flexible: bool, version: int = 0) -> None:
        if value is None:
            _write_length(out, -1, flexible, wide=True)
            return
        _write_length(out, len(value), flexible, wide=True)
        element = self.element
        if isinstance(element, Struct):
            for item in value:
                element.write_version(out, item, flexible, version)
        else:
            for item in value:
                element.write(out, item, flexible)

    def default(self) -> list[Any]:
        return []


class Struct(Type):
    """Fields in order; in a flexible version, followed by tagged fields."""

    def __init__(self, *fields: Field) -> None:
        self.fields = fields
        self.tagged = {f.tag: f for f in fields if f.tag is not None}

    def read_version(self, r: Reader, flexible: bool, version: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in self.fields:
            if f.tag is not None or not f.present(version):
                out[f.name] = f.type.default()
                continue
            out[f.name] = self._read_field(f, r, flexible, version)
        if flexible:
            for _ in range(r.uvarint()):
                tag, size = r.uvarint(), r.uvarint()
                body = Reader(r.take(size))
                known = self.tagged.get(tag)
                if known is not None and known.present(version):
                    out[known.name] = self._read_field(known, body, flexible, version)
        return out

    @staticmethod
    def _read_field(f: Field, r: Reader, flexible: bool, version: int) -> Any:
        t = f.type
        if isinstance(t, Array):
            nullable = t.nullable or (f.nullable_from is not None and version >= f.nullable_from)
            return t.read(r, flexible, version, nullable)
        if isinstance(t, Struct):
            return t.read_version(r, flexible, version)
        if f.nullable_from is not None and version >= f.nullable_from and isinstance(t, String):
            return _NULLABLE_STRING.read(r, flexible)
        return t.read(r, flexible)

    def write_version(self, out: list[bytes], value: dict[str, Any], flexible: bool, version: int) -> None:
        for f in self.fields:
            if f.tag is not None or not f.present(version):
                continue
            self._write_field(f, out, value.get(f.name, f.type.default()), flexible, version)
        if flexible:
            tags = [(f.tag, f) for f in self.fields
                    if f.tag is not None and f.present(version) and value.get(f.name) is not None]
            out.append(uvarint(len(tags)))
            for tag, f in tags:
                body: list[bytes] = []
                self._write_field(f, body, value[f.name], flexible, version)
                data = b"".join(body)
                out.append(uvarint(tag) + uvarint(len(data)))
                out.append(data)

    @staticmethod
    def _write_field(f: Field, out: list[bytes], value: Any, flexible: bool, version: int) -> None:
        t = f.type
        if isinstance(t, Array):
            t.write(out, value, flexible, version)
        elif isinstance(t, Struct):
            t.write_version(out, value, flexible, version)
        else:
            t.write(out, value, flexible)

    def read(self, r: Reader, flexible: bool) -> dict[str, Any]:  # a struct inside a non-versioned context
        return self.read_version(r, flexible, 0)

    def write(self, out: list[bytes], value: Any, flexible: bool) -> None:
        self.write_version(out, value, flexible, 0)

    def default(self) -> dict[str, Any]:
        return {}


_NULLABLE_STRING = String(nullable=True)
INT8, INT16, INT32, INT64 = (_Fixed(c, 0) for c in (_I8, _I16, _I32, _I64))
UINT32, FLOAT64 = _Fixed(_U32, 0), _Fixed(_F64, 0.0)
BOOL, UUID = _Bool(), _Uuid()
STRING, NULLABLE_STRING = String(), _NULLABLE_STRING
class RecordSet(Bytes):
    """RECORDS: a record batch or several back to back, decoded apart (batches.py); written from the list of
    the batches as well, without joining them first (a Fetch's megabyte copied once less)."""

    def write(self, out: list[bytes], value: Any, flexible: bool) -> None:
        if isinstance(value, list):
            _write_length(out, sum(map(len, value)), flexible, wide=True)
            out += value
            return
        super().write(out, value, flexible)


BYTES, NULLABLE_BYTES = Bytes(), Bytes(nullable=True)
RECORDS = RecordSet(nullable=True)
