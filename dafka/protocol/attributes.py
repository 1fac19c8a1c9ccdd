"""Record attributes (rfc section 18.4): a Kafka record's timestamp and headers, which travel with the
records of a KEYED-RECORDS or DIRECT-KEYED-RECORDS between dafka-py peers, in its frames 6, 7 and 8.

A record's attributes are ``(timestamp, headers)``: unix milliseconds (:data:`NO_TIME`: none, the record's
store gives its own), and its headers encoded by :func:`encode_headers` (empty: none).  Frames 6, 7 and 8
are all empty when no record of the message has any; otherwise frame 6 holds a timestamp per record (i64,
little-endian), frame 7 the length of each record's headers (u32, little-endian, 0: none) and frame 8 those
headers back to back.  A record's headers are, for each header in order: its name's length (u32 LE), the
name (UTF-8), its value's length (u32 LE; 2^32-1: a null value) and the value.
"""

from __future__ import annotations

import struct
from array import array
from itertools import accumulate, repeat
from operator import itemgetter
from typing import Any, Callable, NamedTuple, Sequence

from .packing import SWAP, lengths_of

NO_TIME = -1  # a record without a timestamp of its own
NULL_VALUE = 2**32 - 1  # a header value's length that says the value is null (Kafka's), unlike b""
MAX_HEADERS = 4096  # headers of one record a decoder accepts
_U32 = struct.Struct("<I")

Header = tuple[str, "bytes | None"]


class Attributes(NamedTuple):
    """One record's attributes as they travel and are stored: ``headers`` still encoded.  Every function
    here takes any (timestamp, headers) pair as well, and the decoders give plain pairs (built in C)."""

    timestamp: int
    headers: bytes


NONE = Attributes(NO_TIME, b"")
OVERHEAD = 8  # what a record's attributes count in bytes beside its headers: the timestamp
_TIME: Callable[[Any], int] = itemgetter(0)  # of any (timestamp, headers) pair
_HEADERS: Callable[[Any], bytes] = itemgetter(1)


def record_attributes(headers: Sequence[Header] | None, timestamp_ms: int | None) -> Attributes:
    """A record's attributes from what :meth:`dafka.Producer.send` takes; raises ``ValueError`` for a
    timestamp that is not an integer of 64 bits, or a header that is not a (str, bytes or None) pair."""
    if timestamp_ms is None:
        timestamp_ms = NO_TIME
    elif not isinstance(timestamp_ms, int) or isinstance(timestamp_ms, bool) or not -2**63 <= timestamp_ms < 2**63:
        raise ValueError(f"timestamp_ms {timestamp_ms!r} is not unix milliseconds (an integer of 64 bits)")
    return Attributes(timestamp_ms, encode_headers(headers or ()))


def encode_headers(headers: Sequence[Header]) -> bytes:
    """A record's headers as frame 8 carries them; raises ``ValueError`` for a header that is not a
    (str, bytes or None) pair."""
    parts = []
    for name, value in headers:
        if not isinstance(name, str) or not (value is None or isinstance(value, (bytes, bytearray, memoryview))):
            raise ValueError(f"a header is a (str, bytes or None) pair, not ({type(name).__name__}, "
                             f"{type(value).__name__})")
        raw = name.encode("utf-8", "surrogateescape")
        parts.append(_U32.pack(len(raw)) + raw)
        parts.append(_U32.pack(NULL_VALUE) if value is None else _U32.pack(len(value)) + bytes(value))
    return b"".join(parts)


def decode_headers(blob: bytes) -> tuple[Header, ...]:
    """The headers :func:`encode_headers` made; raises ``ValueError`` for bytes that are not."""
    out: list[Header] = []
    pos, end = 0, len(blob)
    while pos < end:
        if len(out) >= MAX_HEADERS:
            raise ValueError(f"more than {MAX_HEADERS} headers")
        if end - pos < 4:
            raise ValueError("a header name's length truncated")
        (n,) = _U32.unpack_from(blob, pos)
        pos += 4
        if n > end - pos:
            raise ValueError(f"a header name of {n} bytes, {end - pos} left")
        name = blob[pos:pos + n].decode("utf-8", "surrogateescape")
        pos += n
        if end - pos < 4:
            raise ValueError("a header value's length truncated")
        (n,) = _U32.unpack_from(blob, pos)
        pos += 4
        if n == NULL_VALUE:
            out.append((name, None))
            continue
        if n > end - pos:
            raise ValueError(f"a header value of {n} bytes, {end - pos} left")
        out.append((name, blob[pos:pos + n]))
        pos += n
    return tuple(out)


def pack(attributes: Sequence[Attributes | None]) -> tuple[bytes, bytes, bytes]:
    """Frames 6, 7 and 8 of a keyed message whose records have ``attributes`` (None: none; any (timestamp,
    headers) pair will do); all three empty when no record has any.  No Python step a record."""
    if attributes.count(None) == len(attributes):
        return b"", b"", b""
    filled = [NONE if a is None else a for a in attributes] if None in attributes else attributes
    n = len(filled)
    blobs: list[bytes] = list(map(_HEADERS, filled))
    return struct.pack(f"<{n}q", *map(_TIME, filled)), struct.pack(f"<{n}I", *map(len, blobs)), b"".join(blobs)


def size(attributes: Attributes | None) -> int:
    """What a record's attributes count in a producer's bytes: 8 and its headers' (0 for None)."""
    return 0 if attributes is None else OVERHEAD + len(attributes[1])


def sizes(attributes: Sequence[Attributes | None]) -> list[int]:
    """:func:`size` of each record's attributes, without a call a record."""
    if None in attributes:
        return [0 if a is None else OVERHEAD + len(a[1]) for a in attributes]
    return [OVERHEAD + size for size in map(len, map(_HEADERS, attributes))]


def check(times: bytes, lengths: bytes, headers: bytes, count: int, error: type[Exception]) -> None:
    """Raise ``error`` unless frames 6, 7 and 8 are all empty, or hold ``count`` records' attributes
    whose headers each decode."""
    if not (times or lengths or headers):
        return
    if len(times) != 8 * count or len(lengths) != 4 * count:
        raise error(f"{count} records with {len(times)} bytes of timestamps and {len(lengths)} of header lengths")
    blob_sizes = lengths_of(lengths)
    if sum(blob_sizes) != len(headers):
        raise error("header lengths do not add up to the headers")
    for start, end in zip(accumulate(blob_sizes, initial=0), accumulate(blob_sizes)):
        if end > start:
            try:
                decode_headers(headers[start:end])
            except ValueError as exc:
                raise error(f"headers: {exc}") from None


def unpack(times: bytes, lengths: bytes, headers: bytes) -> list[Attributes]:
    """Each record's attributes, as (timestamp, headers) pairs, from frames 6, 7 and 8 (not empty, checked
    by :func:`check`).  No Python step a record."""
    stamps = array("q")
    stamps.frombytes(times)
    if SWAP:
        stamps.byteswap()
    if not headers:
        return list(zip(stamps, repeat(b"")))  # type: ignore[arg-type]
    ends = list(accumulate(lengths_of(lengths)))
    blobs = map(headers.__getitem__, map(slice, [0, *ends[:-1]], ends))
    return list(zip(stamps, blobs))  # type: ignore[arg-type]
