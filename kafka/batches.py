"""Kafka record batches (magic 2): decode what producers send, encode what consumers fetch.

A batch is a 61-byte header (base offset, length, leader epoch, magic,
CRC-32C of everything after the CRC, attributes, last offset delta, first and
max timestamps, producer id, epoch, base sequence, record count) and its
records, compressed as the attributes say: none, gzip, snappy (raw, or in
xerial's framing as the Java client writes it), lz4 (frame) or zstd.  The
compressions other than gzip need ``cramjam`` (the ``kafka`` extra); a batch
in a codec that is missing gets UNSUPPORTED_COMPRESSION_TYPE, not a crash.
"""

from __future__ import annotations

import gzip
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from dafka.protocol.attributes import Attributes

from .records import NO_TIMESTAMP, KafkaRecord, RecordFrames, encode_frames, encode_records, read_columns, read_records
from .wire import DecodeError, uvarint

cramjam: Any
crc32c: Callable[..., int] | None
try:
    import cramjam
except ImportError:  # pragma: no cover - the kafka extra installs it
    cramjam = None
try:
    from crc32c import crc32c
except ImportError:  # pragma: no cover - the kafka extra installs it
    crc32c = None

HEADER = struct.Struct(">qiibIhiqqqhii")  # base offset .. record count: 61 bytes
AFTER_CRC = 21  # the CRC covers the batch from the attributes on
NONE, GZIP, SNAPPY, LZ4, ZSTD = range(5)
CODECS = {NONE: "none", GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}
TIMESTAMP_LOG_APPEND = 0x08
TRANSACTIONAL = 0x10
CONTROL = 0x20
XERIAL = b"\x82SNAPPY\x00"


class UnsupportedCompression(DecodeError):
    """A codec this installation lacks (or one Kafka does not define)."""


@dataclass
class Batch:
    base_offset: int
    attributes: int
    last_offset_delta: int
    first_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records: list[KafkaRecord]  # empty when read as columns (read_batches(..., columns=True))
    body_bytes: int = 0  # the records' bytes, decompressed (at least their keys' and values')
    count: int = 0
    values: list[bytes] = field(default_factory=list)  # read as columns: each record's value (null: empty)...
    keys: list[bytes | None] | None = None  # ...and key (None: no record has one)...
    record_attributes: list[Attributes] = field(default_factory=list)  # ...and timestamp and headers (rfc 18.4)

    @property
    def compression(self) -> int:
        return self.attributes & 0x07


def _crc(*parts: bytes | memoryview) -> int:
    """The CRC-32C of ``parts`` back to back."""
    if crc32c is not None:
        value = 0
        for part in parts:
            value = crc32c(part, value)
        return value
    return _crc32c_pure(b"".join(parts))


def _crc32c_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc32c_table()


def _crc32c_pure(data: bytes) -> int:
    c = 0xFFFFFFFF
    table = _TABLE
    for b in data:
        c = table[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def _need_cramjam(codec: int) -> None:
    if cramjam is None:
        raise UnsupportedCompression(f"{CODECS[codec]} needs cramjam (pip install 'dafka[kafka]')")


def decompress(codec: int, data: bytes | memoryview) -> bytes:
    if codec == NONE:
        return bytes(data)
    if codec == GZIP:
        try:
            return gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:
            raise DecodeError(f"gzip: {exc}") from None
    if codec not in CODECS:
        raise UnsupportedCompression(f"compression type {codec} is not Kafka's")
    _need_cramjam(codec)
    try:
        if codec == SNAPPY:
            raw = bytes(data)
            if raw.startswith(XERIAL):
                return _unxerial(raw)
            return bytes(cramjam.snappy.decompress_raw(raw))
        if codec == LZ4:
            return bytes(cramjam.lz4.decompress(data))
        return bytes(cramjam.zstd.decompress(data))
    except cramjam.DecompressionError as exc:
        raise DecodeError(f"{CODECS[codec]}: {exc}") from None


def _unxerial(raw: bytes) -> bytes:
    """xerial's snappy framing: magic, version and compatible version, then (length, raw snappy block)s."""
    pos, parts = 16, []
    while pos < len(raw):
        if pos + 4 > len(raw):
            raise DecodeError("xerial snappy: a block length runs past the end")
        (n,) = struct.unpack_from(">i", raw, pos)
        if n < 0 or pos + 4 + n > len(raw):
            raise DecodeError("xerial snappy: a block runs past the end")
        parts.append(bytes(cramjam.snappy.decompress_raw(raw[pos + 4:pos + 4 + n])))
        pos += 4 + n
    return b"".join(parts)


def compress(codec: int, data: bytes) -> bytes:
    if codec == NONE:
        return data
    if codec == GZIP:
        return gzip.compress(data, compresslevel=1)
    _need_cramjam(codec)
    if codec == SNAPPY:
        return bytes(cramjam.snappy.compress_raw(data))
    if codec == LZ4:
        return bytes(cramjam.lz4.compress(data))
    if codec == ZSTD:
        return bytes(cramjam.zstd.compress(data))
    raise UnsupportedCompression(f"compression type {codec} is not Kafka's")


def read_batches(data: bytes | memoryview, columns: bool = False) -> list[Batch]:
    """Every batch of a Produce partition's ``records``; raises :class:`DecodeError` on a damaged one.
    ``columns``: each batch's values and keys, checked as the records are (what a Produce publishes),
    without an object a record."""
    view = memoryview(data)
    out, pos = [], 0
    while pos < len(view):
        if len(view) - pos < HEADER.size:
            raise DecodeError(f"a batch header of {len(view) - pos} bytes")
        (base, length, _epoch, magic, crc, attributes, last_delta, first_ts, max_ts, pid, pepoch, base_seq,
         count) = HEADER.unpack_from(view, pos)
        if magic != 2:
            raise DecodeError(f"record batch magic {magic}: only magic 2 is served")
        end = pos + 12 + length
        if length < HEADER.size - 12 or end > len(view):
            raise DecodeError(f"a batch of {length} bytes in {len(view) - pos - 12}")
        if _crc(view[pos + AFTER_CRC:end]) != crc:
            raise DecodeError("a batch whose CRC-32C does not match")
        if attributes & CONTROL:
            pos = end
            continue
        body = decompress(attributes & 0x07, view[pos + HEADER.size:end])
        if columns:
            values, keys, held = read_columns(body, count, NO_TIMESTAMP if attributes & TIMESTAMP_LOG_APPEND else first_ts)
            out.append(Batch(base, attributes, last_delta, first_ts, max_ts, pid, pepoch, base_seq, [], len(body),
                             count, values, keys, held))
        else:
            out.append(Batch(base, attributes, last_delta, first_ts, max_ts, pid, pepoch, base_seq,
                             read_records(body, count, first_ts), len(body), count))
        pos = end
    return out


def write_batch(base_offset: int, records: Sequence[tuple[Any, ...]], *,
                codec: int = NONE, producer_id: int = -1, producer_epoch: int = -1, base_sequence: int = -1,
                headers: Sequence[Sequence[tuple[str, bytes | None]]] | None = None) -> bytes:
    """One batch of ``(offset, unix ms, key, value)`` records, offsets rising from ``base_offset`` (a compacted
    partition's may skip: offset deltas carry the gaps)."""
    if not records:
        raise ValueError("a batch holds one record at least")
    first_ts = min(r[1] for r in records)
    max_ts = max(r[1] for r in records)
    body = encode_records(base_offset, first_ts, records, headers)
    return _framed(base_offset, records[-1][0] - base_offset, first_ts, max_ts, len(records), compress(codec, body),
                   codec, producer_id, producer_epoch, base_sequence)


def write_frames_batch(frames: RecordFrames, lo: int, hi: int, default_ts: int) -> bytes:
    """One uncompressed batch of the records ``lo`` to ``hi`` (exclusive) of a dafka message, offsets from
    ``frames.sequence + lo`` (:func:`~dafka.kafka.records.encode_frames`: what a Fetch sends of a store's
    answer, with no record object on the way)."""
    body, first_ts, max_ts = encode_frames(frames, lo, hi, default_ts)
    return _framed(frames.sequence + lo, hi - lo - 1, first_ts, max_ts, hi - lo, body)


def _framed(base_offset: int, last_delta: int, first_ts: int, max_ts: int, count: int, body: bytes,
            codec: int = NONE, producer_id: int = -1, producer_epoch: int = -1, base_sequence: int = -1) -> bytes:
    """A batch around its (compressed) body: its header and CRC-32C."""
    after = struct.pack(">hiqqqhii", codec, last_delta, first_ts, max_ts, producer_id, producer_epoch,
                        base_sequence, count)
    length = 4 + 1 + 4 + len(after) + len(body)  # leader epoch, magic, crc, the rest
    return b"".join((struct.pack(">qiibI", base_offset, length, 0, 2, _crc(after, body)), after, body))


__all__ = ["Batch", "CODECS", "KafkaRecord", "UnsupportedCompression", "compress", "decompress", "read_batches",
           "write_batch", "write_frames_batch", "uvarint"]
