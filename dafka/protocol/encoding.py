"""Encoding the Dafka messages into their ZeroMQ frames: RFC 46's and this project's extensions
(rfc/dafka.md sections 7.5 and 12-20), one encoder per message type in a table.

Byte-exact with the reference C encoder (see ``rfc/dafka.md``).  Frame 1 of
every message is::

    id(1) topic NUL version(=1) fields...

where a ``string`` is a 1-byte length and bytes, a ``strings`` list is a u32
count then u32 length + bytes each, and integers are big-endian.  RECORD and
DIRECT-RECORD carry the record content as a second frame; no other type has
one.

DIRECT-RECORDS carries many records in three frames: frame 1 as above with a
first sequence, a count and receive stamps; frame 2 the contents' lengths
(u32 **little-endian**, so that frames 2 and 3 become an Arrow binary column's
buffers as they are); frame 3 the contents, one after the other.
"""

from __future__ import annotations

from array import array
from typing import Any, Callable, Sequence

import msgpack

from . import attributes
from .messages import (
    _NAMES,
    ACK,
    CONSUMER_HELLO,
    DIRECT_GAP,
    DIRECT_PARTITIONS,
    FETCH,
    GROUP_MEMBER,
    HEADS_AT,
    MAX_COUNT,
    MAX_PEER_INFO,
    MAX_SEQUENCE,
    MAX_STRING,
    MESSAGE_IDS,
    NO_KEY,
    PEER_INFO,
    STORE_MEMBER,
    AckMsg,
    ConsumerHelloMsg,
    DirectGapMsg,
    DirectHeadMsg,
    DirectKeyedRecordsMsg,
    DirectPartitionsMsg,
    DirectRecordMsg,
    DirectRecordsMsg,
    DirectTailMsg,
    FetchMsg,
    GetHeadsMsg,
    GroupMemberMsg,
    HeadMsg,
    HeadsAtMsg,
    KeyedRecordsMsg,
    Message,
    PeerInfoMsg,
    RecordMsg,
    RecordsMsg,
    StoreHelloMsg,
    StoreMemberMsg,
    _b,
)

# the per-record loop over a batch's contents has a compiled twin (dafka/protocol/packing.py)
from .packing import SWAP as _SWAP
from .packing import U32 as _U32
from .packing import lengths_of as _lengths


def _string(value: str, field: str) -> bytes:
    raw = _b(value)
    if len(raw) > MAX_STRING:
        raise ValueError(f"{field} is {len(raw)} bytes long; the wire allows at most {MAX_STRING}")
    return bytes((len(raw),)) + raw


def _topic(value: str) -> bytes:
    raw = _b(value)
    if b"\0" in raw:
        raise ValueError("topic must not contain a NUL byte")
    return raw


def _u64(value: int, field: str = "sequence") -> bytes:
    if not 0 <= value <= MAX_SEQUENCE:
        raise ValueError(f"{field} {value} is outside 0..2^64-1")
    return value.to_bytes(8, "big")


def _u32(value: int, field: str) -> bytes:
    if not 0 <= value <= MAX_COUNT:
        raise ValueError(f"{field} {value} is outside 0..2^32-1")
    return value.to_bytes(4, "big")


def _strings(values: Sequence[str]) -> bytes:
    """A ``strings`` field: a u32 count, then each as a u32 length and its bytes."""
    parts = [_u32(len(values), "subjects count")]
    for value in values:
        raw = _b(value)
        if len(raw) > MAX_STRING:
            raise ValueError(f"subject is {len(raw)} bytes long; at most {MAX_STRING}")
        parts.append(len(raw).to_bytes(4, "big") + raw)
    return b"".join(parts)


def _u8(value: int, field: str) -> bytes:
    if not 0 <= value <= 255:
        raise ValueError(f"{field} {value} does not fit in a byte")
    return bytes((value,))


def _header(msg_id: bytes, topic: str) -> bytes:
    return msg_id + _topic(topic) + b"\0\x01"

def _encode_record(msg: RecordMsg | DirectRecordMsg) -> list[bytes]:
    frame = (
        _header(MESSAGE_IDS[type(msg)], msg.topic)
        + _string(msg.address, "address")
        + _string(msg.subject, "subject")
        + _u64(msg.sequence)
    )
    return [frame, bytes(msg.content)]


def _encode_fetch(msg: FetchMsg) -> list[bytes]:
    return [
        _header(FETCH, msg.topic)
        + _string(msg.address, "address")
        + _string(msg.subject, "subject")
        + _u64(msg.sequence)
        + _u32(msg.count, "count")
    ]


def _encode_ack(msg: AckMsg) -> list[bytes]:
    return [_header(ACK, msg.topic) + _string(msg.subject, "subject") + _u64(msg.sequence)]


def _encode_head(msg: HeadMsg | DirectHeadMsg | DirectTailMsg) -> list[bytes]:
    return [
        _header(MESSAGE_IDS[type(msg)], msg.topic)
        + _string(msg.address, "address")
        + _string(msg.subject, "subject")
        + _u64(msg.sequence)
    ]


def _encode_direct_gap(msg: DirectGapMsg) -> list[bytes]:
    if msg.end <= msg.sequence:
        raise ValueError(f"DIRECT-GAP of nothing: {msg.sequence}..{msg.end}")
    return [_header(DIRECT_GAP, msg.topic) + _string(msg.address, "address") + _string(msg.subject, "subject")
            + _u64(msg.sequence) + _u64(msg.end, "end")]


def _encode_get_heads(msg: GetHeadsMsg | StoreHelloMsg) -> list[bytes]:
    return [_header(MESSAGE_IDS[type(msg)], msg.topic) + _string(msg.address, "address")]


def _encode_consumer_hello(msg: ConsumerHelloMsg) -> list[bytes]:
    return [_header(CONSUMER_HELLO, msg.topic) + _string(msg.address, "address") + _strings(msg.subjects)]


def _encode_group_member(msg: GroupMemberMsg) -> list[bytes]:
    parts = [
        _header(GROUP_MEMBER, msg.topic),
        _string(msg.address, "address"),
        bytes((1 if msg.leaving else 0,)),
        _strings(msg.subjects),
        _u32(len(msg.entries), "entries count"),
    ]
    for entry in msg.entries:
        parts.append(_string(entry.subject, "subject") + _string(entry.address, "address")
                     + _u64(entry.offset, "offset") + _u8(entry.state, "entry state"))
    return [b"".join(parts)]


def _encode_store_member(msg: StoreMemberMsg) -> list[bytes]:
    if msg.topic:
        raise ValueError("STORE-MEMBER has an empty topic")
    parts = [
        _header(STORE_MEMBER, ""),
        _string(msg.address, "address"),
        bytes((1 if msg.leaving else 0,)),
        _string(msg.store, "store"),
        _string(msg.rack, "rack"),
        _u8(msg.replicas, "replicas"),
        _string(msg.reader, "reader"),
        _u32(len(msg.filling), "filling count"),
    ]
    parts.extend(_string(subject, "subject") + _string(address, "address") for subject, address in msg.filling)
    return [b"".join(parts)]


def _encode_peer_info(msg: PeerInfoMsg) -> list[bytes]:
    body = msgpack.packb(msg.info)
    if len(body) > MAX_PEER_INFO:
        raise ValueError(f"PEER-INFO body of {len(body)} bytes is over {MAX_PEER_INFO}")
    return [_header(PEER_INFO, msg.topic) + _string(msg.address, "address") + _string(msg.role, "role"), body]


def _encode_direct_records(msg: DirectRecordsMsg) -> list[bytes]:  # RecordsMsg too
    count = msg.count
    if count < 1 or len(msg.lengths) != 4 * count:
        raise ValueError("DIRECT-RECORDS needs at least one record, and 4 bytes of lengths per record")
    if msg.sequence + count - 1 > MAX_SEQUENCE:
        raise ValueError(f"records {msg.sequence}.. of {count} run past sequence 2^64-1")
    if sum(_lengths(msg.lengths)) != len(msg.contents):
        raise ValueError("DIRECT-RECORDS lengths do not add up to the contents")
    frame = (
        record_prefix(MESSAGE_IDS[type(msg)], msg.topic, msg.address, msg.subject)
        + _u64(msg.sequence)
        + _u32(count, "count")
        + encode_stamps(msg.stamps)
    )
    if msg.keyed:
        _check_keys(msg.key_lengths, msg.keys, count, ValueError)
        attributes.check(msg.times, msg.header_lengths, msg.headers, count, ValueError)
        return [frame, bytes(msg.lengths), bytes(msg.contents), bytes(msg.key_lengths), bytes(msg.keys),
                bytes(msg.times), bytes(msg.header_lengths), bytes(msg.headers)]
    if msg.key_lengths or msg.keys or msg.times or msg.header_lengths or msg.headers:
        raise ValueError(f"{_NAMES[MESSAGE_IDS[type(msg)]]} carries no keys: send {_NAMES[MESSAGE_IDS[type(msg)]][:-7]}"
                         "KEYED-RECORDS")
    return [frame, bytes(msg.lengths), bytes(msg.contents)]


def _encode_direct_partitions(msg: DirectPartitionsMsg) -> list[bytes]:
    parts = [
        _header(DIRECT_PARTITIONS, msg.topic),
        _string(msg.address, "address"),
        _string(msg.subject, "subject"),
        _string(msg.endpoint, "endpoint"),
        _u32(len(msg.partitions), "partitions count"),
    ]
    for info in msg.partitions:
        parts.append(_string(info.subject, "subject") + _string(info.address, "address")
                     + _u64(info.tail, "tail") + _u64(info.head, "head"))
    return [b"".join(parts)]


def _encode_heads_at(msg: HeadsAtMsg) -> list[bytes]:
    parts = [
        heads_at_prefix(msg.topic, msg.since, msg.subject),
        _string(msg.address, "address"),
        bytes((1 if msg.complete else 0,)),
        _u32(len(msg.entries), "entries count"),
    ]
    parts.extend(_string(entry.address, "address") + _u64(entry.sequence) for entry in msg.entries)
    return [b"".join(parts)]


_ENCODERS: dict[type, Callable[[Any], list[bytes]]] = {
    RecordMsg: _encode_record,
    DirectRecordMsg: _encode_record,
    FetchMsg: _encode_fetch,
    AckMsg: _encode_ack,
    HeadMsg: _encode_head,
    DirectHeadMsg: _encode_head,
    DirectTailMsg: _encode_head,
    DirectGapMsg: _encode_direct_gap,
    GetHeadsMsg: _encode_get_heads,
    StoreHelloMsg: _encode_get_heads,
    ConsumerHelloMsg: _encode_consumer_hello,
    GroupMemberMsg: _encode_group_member,
    StoreMemberMsg: _encode_store_member,
    PeerInfoMsg: _encode_peer_info,
    DirectRecordsMsg: _encode_direct_records,
    DirectPartitionsMsg: _encode_direct_partitions,
    HeadsAtMsg: _encode_heads_at,
    RecordsMsg: _encode_direct_records,
    KeyedRecordsMsg: _encode_direct_records,
    DirectKeyedRecordsMsg: _encode_direct_records,
}


def encode(msg: Message) -> list[bytes]:
    """Encode a message into its ZeroMQ frames (one, or two for records).

    Raises ``ValueError`` for values the wire cannot carry (strings over 255
    bytes, NUL in a topic, integers out of range)."""
    encoder = _ENCODERS.get(type(msg))
    if encoder is None:
        raise TypeError(f"not a Dafka message: {msg!r}")
    return encoder(msg)


def heads_at_prefix(requester: str, since: int, subject: str) -> bytes:
    """The start of a HEADS-AT's frame 1, and so the subscription that asks
    for it: ``A`` requester NUL 0x01 since(u64) subject."""
    return _header(HEADS_AT, requester) + _u64(since, "since") + _string(subject, "subject")


def record_prefix(msg_id: bytes, topic: str, address: str, subject: str) -> bytes:
    """Frame 1 of a RECORD/DIRECT-RECORD/HEAD/DIRECT-HEAD without its sequence
    (of a RECORDS or DIRECT-RECORDS without ``sequence count stamps``).

    The hot paths build frame 1 as ``prefix + seq.to_bytes(8, "big")`` and
    recognise known partitions by ``frame[:-8]``."""
    return _header(msg_id, topic) + _string(address, "address") + _string(subject, "subject")


def encode_stamps(stamps: Sequence[tuple[int, int]]) -> bytes:
    """The stamps field of DIRECT-RECORDS: a u32 count, then (u64 sequence, u64 unix ms) pairs."""
    return _u32(len(stamps), "stamps count") + b"".join(
        _u64(first, "stamp sequence") + _u64(ms, "stamp time") for first, ms in stamps)


def pack_contents(values: Sequence[bytes]) -> tuple[bytes, bytes]:
    """Frames 2 and 3 of a DIRECT-RECORDS carrying ``values``, built in C
    (``map``, ``array``, ``join``): no Python bytecode runs per record."""
    lengths = array(_U32, map(len, values))
    if _SWAP:
        lengths.byteswap()
    return lengths.tobytes(), b"".join(values)


def pack_keys(keys: Sequence[bytes | None]) -> tuple[bytes, bytes]:
    """Frames 4 and 5 of a KEYED-RECORDS or DIRECT-KEYED-RECORDS carrying ``keys`` (None: no key); both
    empty when no record has a key."""
    if not any(key is not None for key in keys):
        return b"", b""
    lengths = array(_U32, (NO_KEY if key is None else len(key) for key in keys))
    if _SWAP:
        lengths.byteswap()
    return lengths.tobytes(), b"".join(key for key in keys if key is not None)


def _check_keys(lengths: bytes, keys: bytes, count: int, error: type[Exception]) -> None:
    if not lengths:
        if keys:
            raise error("keys without their lengths")
        return
    if len(lengths) != 4 * count:
        raise error(f"{count} records with {len(lengths)} bytes of key lengths")
    if sum(size for size in _lengths(lengths) if size != NO_KEY) != len(keys):
        raise error("key lengths do not add up to the keys")
