"""The decoder of PostgreSQL's ``pgoutput`` logical replication messages
(protocol version 1), free of I/O.

One replication message's payload in, one message object out.  Anything
short, long or unknown raises :class:`MalformedMessage`: the capture counts
it and reports it (it never guesses at a half-read change).

The format is PostgreSQL's "Logical Replication Message Formats": big-endian
integers, NUL-terminated strings, a tuple as a count of columns each tagged
``n`` (NULL), ``u`` (an unchanged TOASTed value, not sent), ``t`` (text) or
``b`` (binary, with the ``binary`` option; not asked for here).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

# Column kinds in a tuple.
NULL = "n"
UNCHANGED = "u"  # a TOASTed value the update did not touch: PostgreSQL does not send it
TEXT = "t"
BINARY = "b"

PG_EPOCH_US = 946_684_800_000_000  # 2000-01-01 in microseconds since 1970-01-01


class MalformedMessage(ValueError):
    """A replication message that is not a well-formed pgoutput message."""


@dataclass(frozen=True, slots=True)
class Begin:
    final_lsn: int  # the LSN of the transaction's commit record
    commit_us: int  # commit time, microseconds since 1970-01-01 (UTC)
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    flags: int
    commit_lsn: int
    end_lsn: int  # the LSN just past the commit record: what to confirm once it is safe
    commit_us: int


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type_oid: int
    typmod: int
    key: bool  # part of the replica identity


@dataclass(frozen=True, slots=True)
class Relation:
    oid: int
    schema: str
    table: str
    replica_identity: str  # d(efault), n(othing), f(ull), i(ndex)
    columns: tuple[Column, ...]


@dataclass(frozen=True, slots=True)
class TypeMsg:
    oid: int
    schema: str
    name: str


@dataclass(frozen=True, slots=True)
class Origin:
    lsn: int
    name: str


# A tuple: per column, (kind, value): value is the text (str) for TEXT, bytes for BINARY, None otherwise.
Tuple = tuple[tuple[str, "str | bytes | None"], ...]


@dataclass(frozen=True, slots=True)
class Insert:
    oid: int
    new: Tuple


@dataclass(frozen=True, slots=True)
class Update:
    oid: int
    old: Tuple | None  # with replica identity FULL ('O'), or when the key changed ('K'); else None
    old_is_key: bool  # old holds only the key columns (the others are NULL)
    new: Tuple


@dataclass(frozen=True, slots=True)
class Delete:
    oid: int
    old: Tuple
    old_is_key: bool


@dataclass(frozen=True, slots=True)
class Truncate:
    options: int  # 1: CASCADE, 2: RESTART IDENTITY
    oids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class LogicalMessage:
    transactional: bool
    lsn: int
    prefix: str
    content: bytes


Message = Begin | Commit | Relation | TypeMsg | Origin | Insert | Update | Delete | Truncate | LogicalMessage

_U8 = struct.Struct(">B")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")
_BEGIN = struct.Struct(">QqI")
_COMMIT = struct.Struct(">BQQq")


class _Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 1  # after the message type

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if n < 0 or end > len(self.data):
            raise MalformedMessage(f"{chr(self.data[0])!r} message ends early at byte {self.pos} (wanted {n} more)")
        chunk = self.data[self.pos:end]
        self.pos = end
        return chunk

    def unpack(self, fmt: struct.Struct) -> int:
        return self.fields(fmt)[0]

    def fields(self, fmt: struct.Struct) -> tuple:
        """All of ``fmt``'s fields at once (one call for a BEGIN's or COMMIT's, the hot path)."""
        pos = self.pos
        if pos + fmt.size > len(self.data):
            raise MalformedMessage(f"{chr(self.data[0])!r} message ends early at byte {pos} (wanted {fmt.size} more)")
        self.pos = pos + fmt.size
        return fmt.unpack_from(self.data, pos)

    def string(self) -> str:
        end = self.data.find(b"\0", self.pos)
        if end < 0:
            raise MalformedMessage(f"{chr(self.data[0])!r} message: a string has no terminating NUL")
        raw = self.data[self.pos:end]
        self.pos = end + 1
        try:
            return raw.decode()
        except UnicodeDecodeError as exc:
            raise MalformedMessage(f"{chr(self.data[0])!r} message: a string is not UTF-8") from exc

    def tuple_data(self) -> Tuple:
        count = self.unpack(_I16)
        if count < 0:
            raise MalformedMessage(f"tuple with {count} columns")
        values = []
        data = self.data
        for _ in range(count):
            if self.pos >= len(data):
                raise MalformedMessage("a tuple ends early")
            kind = chr(data[self.pos])
            self.pos += 1
            if kind == TEXT or kind == BINARY:
                raw = self.take(self.unpack(_I32))
                if kind == TEXT:
                    try:
                        values.append((TEXT, raw.decode()))
                    except UnicodeDecodeError as exc:
                        raise MalformedMessage("a text column value is not UTF-8") from exc
                else:
                    values.append((BINARY, raw))
            elif kind == NULL or kind == UNCHANGED:
                values.append((kind, None))
            else:
                raise MalformedMessage(f"unknown tuple column kind {kind!r}")
        return tuple(values)

    def done(self, what: str) -> None:
        if self.pos != len(self.data):
            raise MalformedMessage(f"{what} message has {len(self.data) - self.pos} trailing bytes")


def decode(payload: bytes) -> Message:
    """The pgoutput message in ``payload``; raises :class:`MalformedMessage`."""
    if not payload:
        raise MalformedMessage("empty message")
    kind = chr(payload[0])
    r = _Reader(payload)
    msg: Message
    if kind == "B":
        final_lsn, commit_us, xid = r.fields(_BEGIN)
        msg = Begin(final_lsn, commit_us + PG_EPOCH_US, xid)
    elif kind == "C":
        flags, commit_lsn, end_lsn, commit_us = r.fields(_COMMIT)
        msg = Commit(flags, commit_lsn, end_lsn, commit_us + PG_EPOCH_US)
    elif kind == "R":
        oid, schema, table = r.unpack(_U32), r.string(), r.string()
        identity = chr(r.unpack(_U8))
        ncols = r.unpack(_I16)
        if ncols < 0:
            raise MalformedMessage(f"relation with {ncols} columns")
        columns = []
        for _ in range(ncols):
            flags = r.unpack(_U8)
            name = r.string()
            columns.append(Column(name, r.unpack(_U32), r.unpack(_I32), bool(flags & 1)))
        msg = Relation(oid, schema, table, identity, tuple(columns))
    elif kind == "Y":
        msg = TypeMsg(r.unpack(_U32), r.string(), r.string())
    elif kind == "O":
        msg = Origin(r.unpack(_U64), r.string())
    elif kind == "I":
        oid = r.unpack(_U32)
        if r.take(1) != b"N":
            raise MalformedMessage("insert without its new tuple")
        msg = Insert(oid, r.tuple_data())
    elif kind == "U":
        oid = r.unpack(_U32)
        tag = r.take(1)
        old = None
        old_is_key = False
        if tag in (b"K", b"O"):
            old_is_key = tag == b"K"
            old = r.tuple_data()
            tag = r.take(1)
        if tag != b"N":
            raise MalformedMessage("update without its new tuple")
        msg = Update(oid, old, old_is_key, r.tuple_data())
    elif kind == "D":
        oid = r.unpack(_U32)
        tag = r.take(1)
        if tag not in (b"K", b"O"):
            raise MalformedMessage("delete without its old tuple")
        msg = Delete(oid, r.tuple_data(), tag == b"K")
    elif kind == "T":
        count = r.unpack(_I32)
        if count < 0:
            raise MalformedMessage(f"truncate of {count} relations")
        options = r.unpack(_U8)
        msg = Truncate(options, tuple(r.unpack(_U32) for _ in range(count)))
    elif kind == "M":
        flags = r.unpack(_U8)
        lsn, prefix = r.unpack(_U64), r.string()
        msg = LogicalMessage(bool(flags & 1), lsn, prefix, r.take(r.unpack(_I32)))
    else:
        raise MalformedMessage(f"unknown pgoutput message type {kind!r}")
    r.done(kind)
    return msg


def lsn_text(lsn: int) -> str:
    """PostgreSQL's way of writing an LSN: ``16/B374D848``."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def parse_lsn(text: str) -> int:
    high, _, low = text.partition("/")
    return (int(high, 16) << 32) | int(low, 16)
