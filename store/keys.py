"""The store's LevelDB key layout.

The reference store's keys, unchanged, so that a database written by a
reference ``dafka_stored`` opens in ours and the other way round
(``vectors.txt``: LEVELDB_RECORD_KEY, LEVELDB_HEAD_KEY)::

    'M' subject NUL address NUL seq(8, big-endian)  ->  raw record content
    'H' subject NUL address NUL                     ->  head seq (8, big-endian)

``address`` is the producer's (the partition).  Big-endian sequences make
LevelDB's byte order the sequence order, so one partition's records are one
contiguous key range, oldest first.

This project adds two kinds of key, under prefixes the reference never reads
(it only ever looks at 'M' and 'H' keys, so it is unaffected)::

    'I'                                             ->  empty: the end of the heads
    'k' subject NUL address NUL seq(8, BE)          ->  flag(1) and the record's key (rfc sections 18, 19)
    'a' subject NUL address NUL seq(8, BE)          ->  timestamp(8, LE, signed) and headers (rfc 18.4)
    't' subject NUL address NUL first_seq(8, BE)    ->  msgpack [last_seq, unix_ms, nbytes]
    'v'                                             ->  msgpack format version (an int)
    'i'                                             ->  the store's identity: 32 hex digits, drawn once

A *stamp*: records ``first_seq..last_seq`` of the partition were written at
wall-clock time ``unix_ms`` (milliseconds since the epoch, the time of the
last write that extended the stamp) and their contents add up to ``nbytes``.
The writer emits one stamp per partition per written batch, and extends the
partition's newest stamp instead of starting a new one while that stamp is
younger than :data:`STAMP_SPAN_MS`, so the cost is per batch (and at most a
few per second per partition), never per record.  Retention uses the stamps
(age of the oldest records, bytes per partition without reading contents) and
so can a reader that wants receive timestamps (the Spark connector): a record
``s`` has the ``unix_ms`` of the stamp with the greatest ``first_seq <= s``,
accurate to :data:`STAMP_SPAN_MS`.  The oldest kept sequence of a partition
(its *tail*) is not stored: it is the first 'M' key of the partition.

A record's *key* (:data:`RECORD_KEY`) is kept beside its content, under the
same partition and sequence, after a flag byte (:data:`TOMBSTONE` for a
tombstone: a keyed record with an empty value, which a compacted topic drops
in the end; :data:`KEYED` otherwise), only for a record that has one: a partition of
unkeyed records has no 'k' entry, and the 'M' entries stay the reference's
(a reference store that opens the database serves the values, without their
keys).  Whatever deletes a partition's records (retention, a handover)
deletes their keys with them.

A record's *attributes* (:data:`RECORD_ATTRIBUTES`, rfc 18.4: a Kafka record's timestamp and headers, as
:mod:`dafka.protocol.attributes` encodes them) are kept the same way, only for a record that has some, and deleted
with it.

The *end of the heads* (:data:`HEADS_END`) sorts after every 'H' key and
before every 'M' key.  A listing of heads reads until it sees a key that is not
a head; without a key here, that key would be the first record kept of the
first partition, and LevelDB would step over the tombstone of every record
retention deleted before it to find it (store/reader.py says what that costs).
A store puts it in a database that lacks it when it opens one.

The *store's identity* (:data:`STORE_ID`) is drawn when a store first opens
the database and kept: a restarted store is the same store (sharded stores
place partitions by it, rfc section 16).  Readers of the directory (the
Spark connector's ``path``) neither need nor write it.

The *format version* (:data:`FORMAT_VERSION`) names this layout.  A
database without it (written by the reference, or by dafka-py 0.1.0, whose
layout is the same) is version 1 and gets the key when a store opens it; a
database of a newer version than this code knows is refused, so an older
store never misreads a layout it does not know.  A change that an older
store could misread raises the version.

Subjects and addresses travel as length-prefixed strings and may in theory
hold a NUL byte; such a name cannot be keyed unambiguously in this layout
(nor in the reference's), so the store refuses those records.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

import msgpack

RECORD = b"M"
HEAD = b"H"
STAMP = b"t"
RECORD_KEY = b"k"
RECORD_ATTRIBUTES = b"a"
FORMAT = b"v"
HEADS_END = b"I"
STORE_ID = b"i"

FORMAT_VERSION = 1  # the layout above: 'M', 'H' (the reference's) and 't'

SEQ_BYTES = 8
STAMP_SPAN_MS = 100  # a partition's newest stamp is extended while younger than this

_ENC = "utf-8"
_ERRORS = "surrogateescape"  # the same str <-> bytes mapping as dafka.protocol.codec


def to_bytes(name: str | bytes) -> bytes:
    """A subject or address as the bytes that go into keys."""
    return name if isinstance(name, bytes) else name.encode(_ENC, _ERRORS)


def to_str(raw: bytes) -> str:
    return raw.decode(_ENC, _ERRORS)


def seq_bytes(seq: int) -> bytes:
    return seq.to_bytes(SEQ_BYTES, "big")


def seq_of(raw: bytes) -> int:
    return int.from_bytes(raw, "big")


def partition_prefix(tag: bytes, subject: str | bytes, address: str | bytes) -> bytes:
    """``tag subject NUL address NUL``: the start of every key of one partition."""
    return tag + to_bytes(subject) + b"\0" + to_bytes(address) + b"\0"


def prefix_end(prefix: bytes) -> bytes:
    """The smallest key above every key that starts with ``prefix`` (which ends
    in NUL): an exclusive ``stop`` for an iterator over the partition."""
    assert prefix.endswith(b"\0")
    return prefix[:-1] + b"\x01"


def record_key(subject: str | bytes, address: str | bytes, seq: int) -> bytes:
    return partition_prefix(RECORD, subject, address) + seq_bytes(seq)


def head_key(subject: str | bytes, address: str | bytes) -> bytes:
    return partition_prefix(HEAD, subject, address)


TOMBSTONE = b"\x01"  # first byte of a 'k' entry's value: the record is a tombstone (its value is empty)
KEYED = b"\x00"  # ...a record with a value


def key_entry_value(key: bytes, content: bytes) -> bytes:
    """The value of a record's ``k`` entry: the flag, then the key."""
    return (KEYED if content else TOMBSTONE) + key


def record_key_entry(subject: str | bytes, address: str | bytes, seq: int) -> bytes:
    """The LevelDB key under which record ``seq``'s own key (rfc section 18) is kept."""
    return partition_prefix(RECORD_KEY, subject, address) + seq_bytes(seq)


ENTRY_TIME = struct.Struct("<q")  # the start of an ``a`` entry's value: the record's timestamp, as frame 6's


def attributes_entry_value(timestamp: int, headers: bytes) -> bytes:
    """The value of a record's ``a`` entry: its timestamp (:data:`ENTRY_TIME`) and its encoded headers."""
    return ENTRY_TIME.pack(timestamp) + headers


def attributes_of_entry(value: bytes) -> tuple[int, bytes]:
    """(timestamp, encoded headers) of an ``a`` entry's value."""
    return ENTRY_TIME.unpack_from(value)[0], value[ENTRY_TIME.size:]


def stamp_key(subject: str | bytes, address: str | bytes, first: int) -> bytes:
    return partition_prefix(STAMP, subject, address) + seq_bytes(first)


def valid_name(raw: bytes) -> bool:
    """Can this subject/address be part of a key?"""
    return b"\0" not in raw


class ParsedKey(NamedTuple):
    tag: bytes
    subject: str
    address: str
    seq: int | None  # None for head keys


def parse_key(key: bytes) -> ParsedKey:
    """Split any store key; raises ``ValueError`` for a key not in the layout."""
    if len(key) < 3:
        raise ValueError(f"key {key!r} is too short")
    tag = key[:1]
    if tag == HEAD:
        body, seq = key[1:], None
        if not body.endswith(b"\0"):
            raise ValueError(f"head key {key!r} does not end with NUL")
        body = body[:-1]
    elif tag in (RECORD, STAMP, RECORD_KEY, RECORD_ATTRIBUTES):
        if len(key) < 1 + 2 + SEQ_BYTES or key[-SEQ_BYTES - 1] != 0:
            raise ValueError(f"key {key!r} has no NUL-separated sequence")
        body, seq = key[1 : -SEQ_BYTES - 1], seq_of(key[-SEQ_BYTES:])
    else:
        raise ValueError(f"unknown key tag {tag!r}")
    parts = body.split(b"\0")
    if len(parts) != 2:
        raise ValueError(f"key {key!r} does not hold exactly subject NUL address")
    return ParsedKey(tag, to_str(parts[0]), to_str(parts[1]), seq)


class Stamp(NamedTuple):
    first: int
    last: int
    unix_ms: int
    nbytes: int


def encode_stamp(last: int, unix_ms: int, nbytes: int) -> bytes:
    return msgpack.packb([last, unix_ms, nbytes])


def decode_stamp(key: bytes, value: bytes) -> Stamp:
    """A stamp entry; raises ``ValueError`` if it is not one."""
    parsed = parse_key(key)
    if parsed.tag != STAMP:
        raise ValueError(f"{key!r} is not a stamp key")
    try:
        last, unix_ms, nbytes = msgpack.unpackb(value)
        return Stamp(parsed.seq, int(last), int(unix_ms), int(nbytes))
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise ValueError(f"bad stamp value {value!r}: {exc}") from None
