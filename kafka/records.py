"""The records inside a Kafka record batch (magic 2), decoded and encoded: the gateway's per-record code.

A batch's body, once decompressed, is ``count`` records, each a varint
length, then an attributes byte, a varint timestamp delta and offset delta,
the key and value (varint length, -1 for null), and the headers.  This module
reads and writes those bodies; :mod:`dafka.kafka.batches` does the batch
header, CRC and compression around them.

It has a compiled twin, ``kafka/_crecords.pyx``, that gives the same result
for any input in a C loop (:mod:`dafka.core.extensions`; ``DAFKA_NO_EXTENSIONS=1``
keeps this pure one): the profile of a Produce of 100-byte records had 94 %
of the gateway's CPU in these loops.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Protocol, Sequence

from dafka.core import extensions
from dafka.protocol.attributes import NO_TIME, NULL_VALUE, Attributes, encode_headers
from dafka.protocol.messages import NO_KEY
from dafka.protocol.packing import SWAP, lengths_of

from .wire import DecodeError, Reader, varint

INT64 = range(-(2 ** 63), 2 ** 63)
NO_TIMESTAMP = -1  # a batch's first timestamp when its producer gave none (Kafka's)
Row = tuple[int, int, bytes | None, bytes | None]  # offset, unix ms, key, value (a longer tuple: the rest unread)
Headers = Sequence[tuple[str, bytes | None]]


@dataclass
class KafkaRecord:
    offset_delta: int
    timestamp: int  # unix ms
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]] = field(default_factory=list)


def read_records(body: bytes, count: int, first_ts: int) -> list[KafkaRecord]:
    """The ``count`` records of a batch's (decompressed) body; :class:`DecodeError` on anything else."""
    return _read(body, count, first_ts, None)  # type: ignore[return-value]


def read_columns(body: bytes, count: int, first_ts: int) -> tuple[list[bytes], list[bytes | None] | None,
                                                                  list[Attributes]]:
    """The values, keys (None: no record has one) and attributes (rfc 18.4: the timestamp, NO_TIME when the
    batch has none, and the headers in dafka's encoding) of the ``count`` records of a batch's body, checked
    as :func:`read_records` checks them: what a Produce publishes, with no Python step a record.  A null
    value is empty (a dafka record has no null value; keyed, it is a tombstone, rfc 18)."""
    keys: list[bytes | None] = []
    held: list[Attributes] = []
    values = _read(body, count, first_ts, keys, held)
    return values, (keys if any(k is not None for k in keys) else None), held  # type: ignore[return-value]


def _read(body: bytes, count: int, first_ts: int, keys: list[bytes | None] | None,
          held: list[Attributes] | None = None) -> list[KafkaRecord | bytes | None]:
    """The records (``keys`` None), or their values with their keys appended to ``keys`` and their
    attributes to ``held``."""
    r = Reader(body)
    if count < 0 or count > len(body):
        raise DecodeError(f"{count} records in {len(body)} bytes")
    out: list[KafkaRecord | bytes | None] = []
    for _ in range(count):
        size = r.varint()
        start = r.pos
        r.take(1)  # attributes (unused)
        ts = first_ts + r.varint()
        delta = r.varint()
        n = r.varint()
        key = bytes(r.take(n)) if n >= 0 else None
        n = r.varint()
        value = bytes(r.take(n)) if n >= 0 else None
        headers = []
        for _ in range(r.varint()):
            n = r.varint()
            try:
                name = str(r.take(n), "utf-8")
            except UnicodeDecodeError:
                raise DecodeError("a header key that is not UTF-8") from None
            n = r.varint()
            headers.append((name, bytes(r.take(n)) if n >= 0 else None))
        if r.pos - start != size:
            raise DecodeError(f"a record of {r.pos - start} bytes that said {size}")
        if keys is None:
            out.append(KafkaRecord(delta, ts, key, value, headers))
        else:
            out.append(b"" if value is None else value)
            keys.append(key)
            held.append((NO_TIME if first_ts == NO_TIMESTAMP else ts,  # type: ignore[union-attr]
                         encode_headers(headers) if headers else b""))
    if r.remaining():
        raise DecodeError(f"{r.remaining()} bytes after the batch's last record")
    return out


def encode_records(base_offset: int, first_ts: int, rows: Sequence[Row],
                   headers: Sequence[Headers] | None = None) -> bytes:
    """The body of a batch of ``rows`` (``headers``: each row's, or None), deltas taken from ``base_offset``
    and ``first_ts``; OverflowError for a delta beyond 64 bits."""
    parts = []
    for i, row in enumerate(rows):
        offset, ts, key, value = row[0], row[1], row[2], row[3]
        ts_delta, delta = ts - first_ts, offset - base_offset
        if ts_delta not in INT64 or delta not in INT64:
            raise OverflowError(f"a delta beyond 64 bits: {ts_delta}, {delta}")
        fields = [b"\x00", varint(ts_delta), varint(delta)]
        for blob in (key, value):
            if blob is None:
                fields.append(b"\x01")  # varint(-1)
            else:
                fields += [varint(len(blob)), blob]
        kept = headers[i] if headers else ()
        fields.append(varint(len(kept)))
        for name, header_value in kept:
            raw = name.encode()
            fields += [varint(len(raw)), raw]
            fields += [b"\x01"] if header_value is None else [varint(len(header_value)), header_value]
        record = b"".join(fields)
        parts += [varint(len(record)), record]
    return b"".join(parts)


class RecordFrames(Protocol):
    """A run of dafka records as a (DIRECT-)RECORDS message carries them, frame by frame (rfc 18 and 18.4):
    :class:`dafka.protocol.messages.DirectRecordsMsg` is one."""

    @property
    def sequence(self) -> int: ...
    @property
    def lengths(self) -> bytes: ...
    @property
    def contents(self) -> bytes: ...
    @property
    def key_lengths(self) -> bytes: ...
    @property
    def keys(self) -> bytes: ...
    @property
    def times(self) -> bytes: ...
    @property
    def header_lengths(self) -> bytes: ...
    @property
    def headers(self) -> bytes: ...
    @property
    def stamps(self) -> tuple[tuple[int, int], ...]: ...




def encode_frames(frames: RecordFrames, lo: int, hi: int, default_ts: int) -> tuple[bytes, int, int]:
    """The body of a batch of the records ``lo`` to ``hi`` (exclusive) of ``frames``, read where they lie (a
    Fetch's path from the stores: no record object on the way), with its first timestamp and its greatest.

    Offset deltas count from record ``lo``.  A record's timestamp is its own, else its store's (the last of
    ``frames.stamps``, taken in their order, at or below its sequence), else ``default_ts``; its headers are
    rewritten from dafka's encoding to Kafka's.  ``frames`` is as a decoded message is, checked: ValueError
    where it is not."""
    if not 0 <= lo < hi <= len(frames.lengths) // 4:
        raise ValueError(f"records {lo} to {hi} of {len(frames.lengths) // 4}")
    if len(frames.lengths) % 4 or len(frames.key_lengths) % 4 or len(frames.times) % 8 or len(frames.header_lengths) % 4:
        raise ValueError("a frame of lengths or times cut short")
    timed = bool(frames.times)
    if (frames.key_lengths and len(frames.key_lengths) < 4 * hi) or \
            (timed and (len(frames.times) < 8 * hi or len(frames.header_lengths) < 4 * hi)):
        raise ValueError(f"frames shorter than {hi} records")
    sizes = lengths_of(frames.lengths)
    key_sizes = lengths_of(frames.key_lengths) if frames.key_lengths else None
    if timed:
        times = array("q")
        times.frombytes(frames.times)
        if SWAP:
            times.byteswap()
        header_sizes = lengths_of(frames.header_lengths)
    contents, keys, headers, stamps = frames.contents, frames.keys, frames.headers, frames.stamps
    value_at = sum(sizes[:lo])
    key_at = sum(n for n in key_sizes[:lo] if n != NO_KEY) if key_sizes is not None else 0
    header_at = sum(header_sizes[:lo]) if timed else 0
    stamp, stamp_ts = 0, _int64(default_ts)
    parts: list[bytes] = []
    first_ts = max_ts = 0
    for i in range(lo, hi):
        seq = frames.sequence + i
        while stamp < len(stamps) and stamps[stamp][0] <= seq:
            stamp_ts = _int64(stamps[stamp][1])
            stamp += 1
        ts = times[i] if timed and times[i] != NO_TIME else stamp_ts
        if i == lo:
            first_ts = max_ts = ts
        max_ts = max(max_ts, ts)
        fields = [b"\x00", varint(_int64(ts - first_ts)), varint(i - lo)]
        n = key_sizes[i] if key_sizes is not None else NO_KEY
        if n == NO_KEY:
            fields.append(b"\x01")
        else:
            fields += [varint(n), _cut(keys, key_at, n, "a key")]
            key_at += n
        n = sizes[i]
        fields += [varint(n), _cut(contents, value_at, n, "a value")]
        value_at += n
        if timed and header_sizes[i]:
            blob = _cut(headers, header_at, header_sizes[i], "headers")
            header_at += header_sizes[i]
            fields += _kafka_headers(blob)
        else:
            fields.append(b"\x00")
        record = b"".join(fields)
        parts += [varint(len(record)), record]
    return b"".join(parts), first_ts, max_ts


def _int64(value: int) -> int:
    if value not in INT64:
        raise OverflowError(f"{value} is beyond 64 bits")
    return value


def _cut(blob: bytes, at: int, n: int, what: str) -> bytes:
    if at + n > len(blob):
        raise ValueError(f"{what} of {n} bytes at {at} of {len(blob)}")
    return blob[at:at + n]


def _kafka_headers(blob: bytes) -> list[bytes]:
    """A record's headers in dafka's encoding (u32 little-endian lengths; NULL_VALUE: a null value), as a
    Kafka record's: their count, then each name and value with varint lengths (-1: null)."""
    out: list[bytes] = []
    pos, count = 0, 0
    while pos < len(blob):
        n = int.from_bytes(_cut(blob, pos, 4, "a header name's length"), "little")
        out += [varint(n), _cut(blob, pos + 4, n, "a header name")]
        pos += 4 + n
        n = int.from_bytes(_cut(blob, pos, 4, "a header value's length"), "little")
        pos += 4
        if n == NULL_VALUE:
            out.append(b"\x01")
        else:
            out += [varint(n), _cut(blob, pos, n, "a header value")]
            pos += n
        count += 1
    return [varint(count), *out]


PURE = {"read_records": read_records, "read_columns": read_columns, "encode_records": encode_records,
        "encode_frames": encode_frames}
"""The pure-Python functions, whichever run (the twin's tests compare them)."""

_twin = extensions.twin(__name__)
if _twin is not None:
    read_records = _twin.read_records
    read_columns = _twin.read_columns
    encode_records = _twin.encode_records
    encode_frames = _twin.encode_frames
