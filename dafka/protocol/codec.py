"""The RFC 46 (Dafka) wire codec: the reference's message types, XPUB subscription
frames, the tower/beacon frames, and this project's extensions, which only
dafka-py peers ask for (DIRECT-TAIL, bulk answers, live batches, groups,
sharded stores, PEER-INFO, keyed records and their attributes, DIRECT-GAP,
HEADS-AT: rfc/dafka.md sections 7.5 and 12-20).

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

Strings travel as bytes; this module maps them to ``str`` with UTF-8 and
``surrogateescape`` so that any byte string from a peer round-trips exactly.
Decoding anything that is not a valid message raises :class:`MalformedMessage`
and nothing else.
"""

from __future__ import annotations

import re
from array import array
from dataclasses import dataclass
from itertools import accumulate, compress
from typing import ClassVar, Sequence, Union

import msgpack

# the per-record loop over a batch's contents has a compiled twin (dafka/protocol/packing.py)
from . import attributes
from .packing import SWAP as _SWAP
from .packing import U32 as _U32
from .packing import lengths_of as _lengths
from .packing import split_contents

VERSION = 1
MAX_STRING = 255
MAX_SEQUENCE = 2**64 - 1
MAX_COUNT = 2**32 - 1
UNKNOWN_TIME = 2**64 - 1  # a DIRECT-RECORDS stamp for records whose receive time is not known

# Message ids (frame 1, byte 0).
RECORD = b"M"
DIRECT_RECORD = b"D"
FETCH = b"F"
ACK = b"K"
HEAD = b"H"
DIRECT_HEAD = b"E"
GET_HEADS = b"G"
CONSUMER_HELLO = b"W"
STORE_HELLO = b"L"
# Extension of this project (rfc/dafka.md): a store tells a consumer the oldest
# sequence it still keeps of a partition. Reference peers never subscribe to it.
DIRECT_TAIL = b"T"
# Extensions between dafka-py peers, negotiated: a requester that subscribes to
# them (``R<own address>``, ``P<own address>``) gets its answers in bulk.
DIRECT_RECORDS = b"R"
DIRECT_PARTITIONS = b"P"
# ...and a live stream of records in batches, which a producer sends to the
# dafka-py consumers and stores that subscribed to it (``S<topic>`` NUL, ``S``).
RECORDS = b"S"
# ...and the heartbeat of a consumer group's member (rfc section 14), which only the members of
# its group (``J<group>`` NUL) and observers of every group (``J``) subscribe to.
GROUP_MEMBER = b"J"
# ...and the heartbeat of a store placing partitions with store/replicas (rfc section 16), which only other
# dafka-py store writers (``Y`` NUL) and ``dafka status`` subscribe to.
STORE_MEMBER = b"Y"
# ...and what a dafka-py peer says of itself (rfc section 17): its role, version, host, uptime, memory and CPU,
# sent once to each requester that subscribes ``I<own address>`` (``dafka ui``).
PEER_INFO = b"I"
MAX_PEER_INFO = 65536  # bytes of a PEER-INFO's body at most
# ...and records with keys (rfc section 18): RECORDS and DIRECT-RECORDS with two more frames, the keys' lengths
# and the keys, for the dafka-py consumers and stores that subscribe ``Q<topic>`` NUL or ``Q`` (in place of
# ``S``) and requesters that subscribe ``V<own address>`` NUL (beside ``R``).
KEYED_RECORDS = b"Q"
DIRECT_KEYED_RECORDS = b"V"
NO_KEY = 2**32 - 1  # a key length that says the record has no key (None), unlike an empty key (b"")
# ...and the answer that says that compaction removed records (rfc section 19), for requesters that subscribe
# ``N<own address>`` NUL: nothing is kept from ``sequence`` up to ``end``, exclusive.
DIRECT_GAP = b"N"
# ...and what a peer held of a topic at a given time (rfc section 8.1), which a dafka-py ``latest`` consumer asks
# for by subscribing ``A<own address>`` NUL 0x01 ``since`` ``subject``: each dafka-py producer and store reader
# that sees that subscription answers once with the last sequence of each partition it held at ``since``.
HEADS_AT = b"A"
NOTHING_HELD = 2**64 - 1  # a HEADS-AT entry: the sender held no record of the partition at ``since``
NOT_KNOWN = 2**64 - 2  # ...or it cannot tell (a database without receive stamps)

# Tower / beacon frames.
BEACON = b"B"
WELCOME = b"W"
# Extension (rfc 5.5): a dafka-py peer subscribes to REPLAY_END + its address on the tower's XPUB, after
# B; a dafka-py tower answers with that one frame, which follows the beacons it replayed for the B.
REPLAY_END = b"Z"
# Extension (rfc 5.6, scoped discovery): a dafka-py peer's beacon SUB subscribes to PROFILE + its address +
# NUL + a role + a topic, saying what it is; a dafka-py tower then also publishes its beacons under
# SCOPE + role + topic + NUL, and each peer subscribes to the scopes it needs (scope_needs).
PROFILE = b"P"
SCOPE = b"S"
ROLE_PRODUCER = b"p"  # of its topic
ROLE_CONSUMER = b"c"  # of its topic ("" for a consumer that reads none yet)
ROLE_GROUP = b"g"  # a member of the consumer group named by the topic field
ROLE_STORE = b"s"  # a store's writer or reader (no topic)
ROLES = (ROLE_PRODUCER, ROLE_CONSUMER, ROLE_GROUP, ROLE_STORE)
SCOPE_UNKNOWN = b"S*"  # the scope of a peer that gave no profile (a reference peer): every scoped peer hears it
SCOPED_REPLAY_END = b"S1"  # second frame of Z<address>: the replay was scoped (version 1 of rfc 5.6)

_ENC = "utf-8"
_ERRORS = "surrogateescape"


class MalformedMessage(ValueError):
    """Raised by every decoder in this module for input that is not a valid
    message; ``reason`` says what is wrong."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _b(s: str) -> bytes:
    return s.encode(_ENC, _ERRORS)


def _s(b: bytes) -> str:
    return b.decode(_ENC, _ERRORS)


# --------------------------------------------------------------------------
# Message values
# --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RecordMsg:
    """RECORD: a record published by a producer. topic = topic name."""

    topic: str
    address: str
    subject: str
    sequence: int
    content: bytes


@dataclass(frozen=True, slots=True)
class DirectRecordMsg:
    """DIRECT-RECORD: a record sent in answer to FETCH. topic = requester address."""

    topic: str
    address: str
    subject: str
    sequence: int
    content: bytes


@dataclass(frozen=True, slots=True)
class FetchMsg:
    """FETCH: ask for ``count`` records from ``sequence``. topic = producer address;
    address = the requester's own address."""

    topic: str
    address: str
    subject: str
    sequence: int
    count: int


@dataclass(frozen=True, slots=True)
class AckMsg:
    """ACK: a store has written the partition through ``sequence``. topic = producer address."""

    topic: str
    subject: str
    sequence: int


@dataclass(frozen=True, slots=True)
class HeadMsg:
    """HEAD: a producer's last published sequence. topic = topic name."""

    topic: str
    address: str
    subject: str
    sequence: int


@dataclass(frozen=True, slots=True)
class DirectHeadMsg:
    """DIRECT-HEAD: a store tells a consumer a partition's head. topic = consumer address."""

    topic: str
    address: str
    subject: str
    sequence: int


@dataclass(frozen=True, slots=True)
class GetHeadsMsg:
    """GET-HEADS: a consumer asks stores for the heads of a topic. topic = topic name."""

    topic: str
    address: str


@dataclass(frozen=True, slots=True)
class ConsumerHelloMsg:
    """CONSUMER-HELLO: a consumer greets a store reader. topic = reader address."""

    topic: str
    address: str
    subjects: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class StoreHelloMsg:
    """STORE-HELLO: a store reader greets a consumer. topic = consumer address."""

    topic: str
    address: str


@dataclass(frozen=True, slots=True)
class DirectTailMsg:
    """DIRECT-TAIL (extension): the oldest sequence a store still keeps of a
    partition, sent when a FETCH asks for deleted records, or (from a producer)
    the oldest it holds when no store ever held what was asked. topic = requester address."""

    topic: str
    address: str
    subject: str
    sequence: int


@dataclass(frozen=True, slots=True)
class DirectGapMsg:
    """DIRECT-GAP (extension, rfc section 19): records ``sequence .. end-1``
    of a partition are not kept, compaction removed them (a newer record of
    each one's key is).  topic = requester address; ``end`` > ``sequence``."""

    topic: str
    address: str
    subject: str
    sequence: int
    end: int


@dataclass(frozen=True, slots=True)
class DirectRecordsMsg:
    """DIRECT-RECORDS (extension): records ``sequence .. sequence+count-1`` of a
    partition in one message, in answer to FETCH from a requester that
    subscribed to them.  topic = requester address.

    ``lengths`` (frame 2) holds each content's length as a u32,
    little-endian; ``contents`` (frame 3) the contents back to back (see
    :func:`split_contents` and :func:`pack_contents`).  ``stamps`` are
    (first sequence, unix milliseconds) pairs, ascending: a record received
    by a store at the time of the last pair whose sequence is at or below
    its own (empty: not known, as in a producer's answers)."""

    topic: str
    address: str
    subject: str
    sequence: int
    lengths: bytes
    contents: bytes
    stamps: tuple[tuple[int, int], ...] = ()
    # The keyed kinds' frames 4 and 5 (rfc section 18): each key's length as a u32, little-endian, NO_KEY for
    # a record without one, and the keys back to back; both empty when no record has a key.  Always empty in
    # RECORDS and DIRECT-RECORDS.
    key_lengths: bytes = b""
    keys: bytes = b""
    # Their frames 6, 7 and 8 (rfc section 18.4, dafka.protocol.attributes): each record's timestamp and headers; all
    # three empty when no record has any.
    times: bytes = b""
    header_lengths: bytes = b""
    headers: bytes = b""

    live: ClassVar[bool] = False  # sent live to the topic (RECORDS), not to a requester
    keyed: ClassVar[bool] = False  # has the frames of keys

    @property
    def count(self) -> int:
        return len(self.lengths) // 4

    def key_list(self) -> list[bytes | None] | None:
        """Each record's key (None: it has none), or None when no record has one."""
        return split_keys(self.key_lengths, self.keys) if self.key_lengths else None

    def attribute_list(self) -> list[attributes.Attributes] | None:
        """Each record's attributes (timestamp and encoded headers), or None when no record has any."""
        return attributes.unpack(self.times, self.header_lengths, self.headers) if self.times else None


@dataclass(frozen=True, slots=True)
class RecordsMsg(DirectRecordsMsg):
    """RECORDS (extension): records of a producer published live in one
    message, laid out as DIRECT-RECORDS.  topic = topic name; no stamps."""

    live: ClassVar[bool] = True


@dataclass(frozen=True, slots=True)
class DirectKeyedRecordsMsg(DirectRecordsMsg):
    """DIRECT-KEYED-RECORDS (extension, rfc section 18): a DIRECT-RECORDS with the records' keys."""

    keyed: ClassVar[bool] = True


@dataclass(frozen=True, slots=True)
class KeyedRecordsMsg(DirectRecordsMsg):
    """KEYED-RECORDS (extension, rfc section 18): a RECORDS with the records' keys."""

    live: ClassVar[bool] = True
    keyed: ClassVar[bool] = True


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    """One entry of DIRECT-PARTITIONS: a store holds records ``tail .. head`` of
    the partition (tail = head + 1 when retention deleted them all)."""

    subject: str
    address: str
    tail: int
    head: int


@dataclass(frozen=True, slots=True)
class DirectPartitionsMsg:
    """DIRECT-PARTITIONS (extension): every partition a store reader holds of
    ``subject`` ("" = of every subject), in one message, in answer to
    GET-HEADS or CONSUMER-HELLO from a requester that subscribed to it.
    topic = requester address; address = the store reader's own address;
    ``endpoint`` its request endpoint (rfc section 7.3)."""

    topic: str
    address: str
    subject: str
    partitions: tuple[PartitionInfo, ...] = ()
    endpoint: str = ""  # where the reader takes requests without a tower (its bound SUB); "" = nowhere


@dataclass(frozen=True, slots=True)
class HeldAt:
    """One entry of HEADS-AT: the last sequence of partition ``address`` that
    the sender held at the message's ``since`` (:data:`NOTHING_HELD`: none;
    :data:`NOT_KNOWN`: it cannot tell)."""

    address: str
    sequence: int


@dataclass(frozen=True, slots=True)
class HeadsAtMsg:
    """HEADS-AT (extension, rfc section 8.1): what the sender (``address``, a
    producer or a store reader) held of ``subject`` at ``since`` (unix ms).
    topic = requester address.  ``complete``: the entries name every
    partition of the subject the sender holds (a store), so a partition left
    out had no record there; a producer's one entry is its own partition."""

    topic: str
    since: int
    subject: str
    address: str
    complete: bool
    entries: tuple[HeldAt, ...] = ()


NO_OFFSET = 2**64 - 1  # a GROUP-MEMBER entry of a partition with no committed offset
# The state of a partition in a GROUP-MEMBER entry: the member reads it, has just handed it over, or only
# knows of it (so that every member assigns the same partitions, also those it never met itself).
READING, RELEASED, KNOWN = 0, 1, 2


@dataclass(frozen=True, slots=True)
class GroupEntry:
    """One partition in a GROUP-MEMBER: its ``state`` (:data:`READING`,
    :data:`RELEASED` or :data:`KNOWN`), and ``offset``, the next offset to read
    as the group last committed it (:data:`NO_OFFSET`: never committed)."""

    subject: str
    address: str
    offset: int
    state: int = READING


@dataclass(frozen=True, slots=True)
class GroupMemberMsg:
    """GROUP-MEMBER (extension, rfc section 14): a consumer group member's
    heartbeat. topic = group name; address = the member's consumer address;
    ``subjects`` the topics it reads; ``leaving`` set in its last one."""

    topic: str
    address: str
    subjects: tuple[str, ...] = ()
    entries: tuple[GroupEntry, ...] = ()
    leaving: bool = False


@dataclass(frozen=True, slots=True)
class StoreMemberMsg:
    """STORE-MEMBER (extension, rfc section 16): a sharded store's heartbeat.
    address = its writer's address, ``store`` its persistent identity, ``reader``
    its reader's address; ``filling`` the partitions (subject, address) it owns
    and has not yet filled up to their heads; ``leaving`` set in its last one."""

    address: str
    store: str
    rack: str = ""
    replicas: int = 0
    reader: str = ""
    filling: tuple[tuple[str, str], ...] = ()
    leaving: bool = False
    topic: str = ""  # always empty: every store hears every store


@dataclass(frozen=True, slots=True)
class PeerInfoMsg:
    """PEER-INFO (extension, rfc section 17): what a dafka-py peer says of itself
    to a requester that subscribed ``I<requester>``.  topic = requester address;
    address = the sender's own address; ``role`` what it is ("producer",
    "consumer", "store-reader", "store-writer"); ``info`` a map of strings to
    plain values (numbers, strings, lists and maps of them), msgpack in frame 2."""

    topic: str
    address: str
    role: str
    info: dict[str, object]


Message = Union[
    RecordMsg,
    DirectRecordMsg,
    FetchMsg,
    AckMsg,
    HeadMsg,
    DirectHeadMsg,
    GetHeadsMsg,
    ConsumerHelloMsg,
    StoreHelloMsg,
    DirectTailMsg,
    DirectRecordsMsg,
    DirectPartitionsMsg,
    RecordsMsg,
    GroupMemberMsg,
    StoreMemberMsg,
    PeerInfoMsg,
    KeyedRecordsMsg,
    DirectKeyedRecordsMsg,
    DirectGapMsg,
    HeadsAtMsg,
]

MESSAGE_IDS: dict[type, bytes] = {
    RecordMsg: RECORD,
    DirectRecordMsg: DIRECT_RECORD,
    FetchMsg: FETCH,
    AckMsg: ACK,
    HeadMsg: HEAD,
    DirectHeadMsg: DIRECT_HEAD,
    GetHeadsMsg: GET_HEADS,
    ConsumerHelloMsg: CONSUMER_HELLO,
    StoreHelloMsg: STORE_HELLO,
    DirectTailMsg: DIRECT_TAIL,
    DirectRecordsMsg: DIRECT_RECORDS,
    DirectPartitionsMsg: DIRECT_PARTITIONS,
    RecordsMsg: RECORDS,
    GroupMemberMsg: GROUP_MEMBER,
    StoreMemberMsg: STORE_MEMBER,
    PeerInfoMsg: PEER_INFO,
    KeyedRecordsMsg: KEYED_RECORDS,
    DirectKeyedRecordsMsg: DIRECT_KEYED_RECORDS,
    DirectGapMsg: DIRECT_GAP,
    HeadsAtMsg: HEADS_AT,
}


# --------------------------------------------------------------------------
# Encoding
# --------------------------------------------------------------------------


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


def encode(msg: Message) -> list[bytes]:
    """Encode a message into its ZeroMQ frames (one, or two for records).

    Raises ``ValueError`` for values the wire cannot carry (strings over 255
    bytes, NUL in a topic, integers out of range)."""
    kind = type(msg)  # the message id (isinstance narrows the fields for type checkers)
    if isinstance(msg, (RecordMsg, DirectRecordMsg)):
        frame = (
            _header(MESSAGE_IDS[kind], msg.topic)
            + _string(msg.address, "address")
            + _string(msg.subject, "subject")
            + _u64(msg.sequence)
        )
        return [frame, bytes(msg.content)]
    if isinstance(msg, FetchMsg):
        return [
            _header(FETCH, msg.topic)
            + _string(msg.address, "address")
            + _string(msg.subject, "subject")
            + _u64(msg.sequence)
            + _u32(msg.count, "count")
        ]
    if isinstance(msg, AckMsg):
        return [_header(ACK, msg.topic) + _string(msg.subject, "subject") + _u64(msg.sequence)]
    if isinstance(msg, (HeadMsg, DirectHeadMsg, DirectTailMsg)):
        return [
            _header(MESSAGE_IDS[kind], msg.topic)
            + _string(msg.address, "address")
            + _string(msg.subject, "subject")
            + _u64(msg.sequence)
        ]
    if isinstance(msg, DirectGapMsg):
        if msg.end <= msg.sequence:
            raise ValueError(f"DIRECT-GAP of nothing: {msg.sequence}..{msg.end}")
        return [_header(DIRECT_GAP, msg.topic) + _string(msg.address, "address") + _string(msg.subject, "subject")
                + _u64(msg.sequence) + _u64(msg.end, "end")]
    if isinstance(msg, (GetHeadsMsg, StoreHelloMsg)):
        return [_header(MESSAGE_IDS[kind], msg.topic) + _string(msg.address, "address")]
    if isinstance(msg, ConsumerHelloMsg):
        return [_header(CONSUMER_HELLO, msg.topic) + _string(msg.address, "address") + _strings(msg.subjects)]
    if isinstance(msg, GroupMemberMsg):
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
    if isinstance(msg, StoreMemberMsg):
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
    if isinstance(msg, PeerInfoMsg):
        body = msgpack.packb(msg.info)
        if len(body) > MAX_PEER_INFO:
            raise ValueError(f"PEER-INFO body of {len(body)} bytes is over {MAX_PEER_INFO}")
        return [_header(PEER_INFO, msg.topic) + _string(msg.address, "address") + _string(msg.role, "role"), body]
    if isinstance(msg, DirectRecordsMsg):  # RecordsMsg too
        count = msg.count
        if count < 1 or len(msg.lengths) != 4 * count:
            raise ValueError("DIRECT-RECORDS needs at least one record, and 4 bytes of lengths per record")
        if msg.sequence + count - 1 > MAX_SEQUENCE:
            raise ValueError(f"records {msg.sequence}.. of {count} run past sequence 2^64-1")
        if sum(_lengths(msg.lengths)) != len(msg.contents):
            raise ValueError("DIRECT-RECORDS lengths do not add up to the contents")
        frame = (
            record_prefix(MESSAGE_IDS[kind], msg.topic, msg.address, msg.subject)
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
            raise ValueError(f"{_NAMES[MESSAGE_IDS[kind]]} carries no keys: send {_NAMES[MESSAGE_IDS[kind]][:-7]}"
                             "KEYED-RECORDS")
        return [frame, bytes(msg.lengths), bytes(msg.contents)]
    if isinstance(msg, DirectPartitionsMsg):
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
    if isinstance(msg, HeadsAtMsg):
        parts = [
            heads_at_prefix(msg.topic, msg.since, msg.subject),
            _string(msg.address, "address"),
            bytes((1 if msg.complete else 0,)),
            _u32(len(msg.entries), "entries count"),
        ]
        parts.extend(_string(entry.address, "address") + _u64(entry.sequence) for entry in msg.entries)
        return [b"".join(parts)]
    raise TypeError(f"not a Dafka message: {msg!r}")


def heads_at_prefix(requester: str, since: int, subject: str) -> bytes:
    """The start of a HEADS-AT's frame 1, and so the subscription that asks
    for it: ``A`` requester NUL 0x01 since(u64) subject."""
    return _header(HEADS_AT, requester) + _u64(since, "since") + _string(subject, "subject")


def decode_heads_at_request(sub: Subscription) -> tuple[str, int, str] | None:
    """(requester, since, subject) of a subscription that asks for HEADS-AT,
    or None if ``sub`` is not one (an unsubscription, another message, or a
    malformed request, which the caller counts)."""
    if not (sub.subscribe and sub.msg_id == HEADS_AT and sub.exact and sub.topic):
        return None
    r = _Reader(sub.rest, 0)
    try:
        (version,) = r.take(1, "version")
        since = r.u64("since")
        subject = r.string("subject")
        r.end()
    except MalformedMessage:
        return None
    return (sub.topic, since, subject) if version == VERSION else None


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


def split_keys(lengths: bytes, keys: bytes) -> list[bytes | None]:
    """The keys of a decoded keyed message (None: the record has none), from its frames 4 and 5 (not empty)."""
    sizes = _lengths(lengths)
    if NO_KEY not in sizes:
        return list(split_contents(lengths, keys))
    present = [size != NO_KEY for size in sizes]
    real = list(compress(sizes, present))
    found = iter(map(keys.__getitem__, map(slice, accumulate(real, initial=0), accumulate(real))))
    return [next(found) if has else None for has in present]


def _check_keys(lengths: bytes, keys: bytes, count: int, error: type[Exception]) -> None:
    if not lengths:
        if keys:
            raise error("keys without their lengths")
        return
    if len(lengths) != 4 * count:
        raise error(f"{count} records with {len(lengths)} bytes of key lengths")
    if sum(size for size in _lengths(lengths) if size != NO_KEY) != len(keys):
        raise error("key lengths do not add up to the keys")


# --------------------------------------------------------------------------
# Decoding
# --------------------------------------------------------------------------


class _Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes, pos: int) -> None:
        self.buf = buf
        self.pos = pos

    def take(self, n: int, what: str) -> bytes:
        end = self.pos + n
        if end > len(self.buf):
            raise MalformedMessage(f"frame truncated in {what}")
        out = self.buf[self.pos : end]
        self.pos = end
        return out

    def string(self, what: str) -> str:
        (n,) = self.take(1, what)
        return _s(self.take(n, what))

    def u64(self, what: str = "sequence") -> int:
        return int.from_bytes(self.take(8, what), "big")

    def u32(self, what: str) -> int:
        return int.from_bytes(self.take(4, what), "big")

    def strings(self, what: str) -> tuple[str, ...]:
        count = self.u32(what + " count")
        if count > len(self.buf) - self.pos:
            raise MalformedMessage(f"frame truncated in {what}: {count} entries announced")
        out = []
        for _ in range(count):
            n = self.u32(what + " length")
            if n > MAX_STRING:
                raise MalformedMessage(f"{what} entry length {n} is over {MAX_STRING}")
            out.append(_s(self.take(n, what)))
        return tuple(out)

    def end(self) -> None:
        if self.pos != len(self.buf):
            raise MalformedMessage(f"{len(self.buf) - self.pos} unexpected trailing bytes in frame 1")


_HEAD_LIKE: dict[bytes, type[HeadMsg | DirectHeadMsg | DirectTailMsg]] = {
    HEAD: HeadMsg, DIRECT_HEAD: DirectHeadMsg, DIRECT_TAIL: DirectTailMsg}
_TWO_FRAMES = frozenset((RECORD, DIRECT_RECORD))
KEYED_FRAMES = 8  # the frames of a KEYED-RECORDS or DIRECT-KEYED-RECORDS: records, keys, attributes (rfc 18)
_FRAMES = {RECORD: 2, DIRECT_RECORD: 2, DIRECT_RECORDS: 3, RECORDS: 3, PEER_INFO: 2, KEYED_RECORDS: KEYED_FRAMES,
           DIRECT_KEYED_RECORDS: KEYED_FRAMES}
_RECORDS_KINDS: dict[bytes, type[DirectRecordsMsg]] = {
    DIRECT_RECORDS: DirectRecordsMsg, RECORDS: RecordsMsg, KEYED_RECORDS: KeyedRecordsMsg,
    DIRECT_KEYED_RECORDS: DirectKeyedRecordsMsg}
_KNOWN_IDS = frozenset(MESSAGE_IDS.values())


def decode(frames: Sequence[bytes]) -> Message:
    """Decode the frames of one message received on a SUB socket."""
    if not frames:
        raise MalformedMessage("no frames")
    frame = frames[0]
    if not isinstance(frame, (bytes, bytearray, memoryview)):
        raise MalformedMessage("frame is not bytes")
    frame = bytes(frame)
    if not frame:
        raise MalformedMessage("empty frame 1")
    msg_id = frame[:1]
    if msg_id not in _KNOWN_IDS:
        raise MalformedMessage(f"unknown message id {msg_id!r}")
    expected = _FRAMES.get(msg_id, 1)
    if len(frames) != expected:
        raise MalformedMessage(f"{_NAMES[msg_id]} needs {expected} frame(s), got {len(frames)}")
    nul = frame.find(b"\0", 1)
    if nul < 0:
        raise MalformedMessage("no NUL after the topic")
    topic = _s(frame[1:nul])
    r = _Reader(frame, nul + 1)
    (version,) = r.take(1, "version")
    if version != VERSION:
        raise MalformedMessage(f"version {version}, expected {VERSION}")
    if msg_id in _TWO_FRAMES:
        address = r.string("address")
        subject = r.string("subject")
        seq = r.u64()
        r.end()
        content = frames[1]
        if not isinstance(content, bytes):
            try:
                content = bytes(content)
            except TypeError:
                raise MalformedMessage("content frame is not bytes") from None
        cls = RecordMsg if msg_id == RECORD else DirectRecordMsg
        return cls(topic, address, subject, seq, content)
    if msg_id in _RECORDS_KINDS:
        return _decode_records(_RECORDS_KINDS[msg_id], r, topic, frames)
    if msg_id == DIRECT_PARTITIONS:
        address = r.string("address")
        subject = r.string("subject")
        endpoint = r.string("endpoint")
        count = r.u32("partitions count")
        if count > (len(frame) - r.pos) // 18:  # each entry takes at least 2 + 8 + 8 bytes
            raise MalformedMessage(f"frame truncated in partitions: {count} entries announced")
        partitions = tuple(
            PartitionInfo(r.string("subject"), r.string("address"), r.u64("tail"), r.u64("head"))
            for _ in range(count)
        )
        r.end()
        return DirectPartitionsMsg(topic, address, subject, partitions, endpoint)
    if msg_id == FETCH:
        address = r.string("address")
        subject = r.string("subject")
        seq = r.u64()
        count = r.u32("count")
        r.end()
        return FetchMsg(topic, address, subject, seq, count)
    if msg_id == ACK:
        subject = r.string("subject")
        seq = r.u64()
        r.end()
        return AckMsg(topic, subject, seq)
    if msg_id == DIRECT_GAP:
        address = r.string("address")
        subject = r.string("subject")
        seq = r.u64()
        end = r.u64("end")
        r.end()
        if end <= seq:
            raise MalformedMessage(f"DIRECT-GAP of nothing: {seq}..{end}")
        return DirectGapMsg(topic, address, subject, seq, end)
    if msg_id in _HEAD_LIKE:
        address = r.string("address")
        subject = r.string("subject")
        seq = r.u64()
        r.end()
        return _HEAD_LIKE[msg_id](topic, address, subject, seq)
    if msg_id == CONSUMER_HELLO:
        address = r.string("address")
        subjects = r.strings("subjects")
        r.end()
        return ConsumerHelloMsg(topic, address, subjects)
    if msg_id == GROUP_MEMBER:
        return _decode_group_member(r, topic)
    if msg_id == STORE_MEMBER:
        return _decode_store_member(r, topic)
    if msg_id == PEER_INFO:
        return _decode_peer_info(r, topic, frames[1])
    if msg_id == HEADS_AT:
        return _decode_heads_at(r, topic)
    address = r.string("address")
    r.end()
    if msg_id == GET_HEADS:
        return GetHeadsMsg(topic, address)
    return StoreHelloMsg(topic, address)


def _decode_records(cls: type[DirectRecordsMsg], r: _Reader, topic: str, frames: Sequence[bytes]) -> DirectRecordsMsg:
    address = r.string("address")
    subject = r.string("subject")
    seq = r.u64()
    count = r.u32("count")
    n = r.u32("stamps count")
    if n > (len(r.buf) - r.pos) // 16:
        raise MalformedMessage(f"frame truncated in stamps: {n} entries announced")
    stamps = tuple((r.u64("stamp sequence"), r.u64("stamp time")) for _ in range(n))
    r.end()
    if count < 1:
        raise MalformedMessage("DIRECT-RECORDS with no record")
    if seq + count - 1 > MAX_SEQUENCE:
        raise MalformedMessage("DIRECT-RECORDS runs past sequence 2^64-1")
    if any(a[0] >= b[0] for a, b in zip(stamps, stamps[1:])):
        raise MalformedMessage("DIRECT-RECORDS stamps are not in ascending order")
    lengths, contents = frames[1], frames[2]
    if not (isinstance(lengths, bytes) and isinstance(contents, bytes)):
        try:
            lengths, contents = bytes(lengths), bytes(contents)
        except TypeError:
            raise MalformedMessage("DIRECT-RECORDS frame is not bytes") from None
    if len(lengths) != 4 * count:
        raise MalformedMessage(f"DIRECT-RECORDS of {count} records has {len(lengths)} bytes of lengths")
    if sum(_lengths(lengths)) != len(contents):
        raise MalformedMessage("DIRECT-RECORDS lengths do not add up to its contents")
    if not cls.keyed:
        return cls(topic, address, subject, seq, lengths, contents, stamps)
    extra = frames[3:]
    if not all(isinstance(f, bytes) for f in extra):
        try:
            extra = [bytes(f) for f in extra]
        except TypeError:
            raise MalformedMessage("KEYED-RECORDS frame is not bytes") from None
    key_lengths, keys, times, header_lengths, headers = extra
    _check_keys(key_lengths, keys, count, MalformedMessage)
    attributes.check(times, header_lengths, headers, count, MalformedMessage)
    return cls(topic, address, subject, seq, lengths, contents, stamps, key_lengths, keys, times, header_lengths,
               headers)


def _leaving_flag(r: _Reader, name: str) -> bool:
    """The flags octet of a heartbeat (GROUP-MEMBER, STORE-MEMBER): 1 in the sender's last one."""
    (flags,) = r.take(1, "flags")
    if flags > 1:
        raise MalformedMessage(f"{name} flags {flags}, expected 0 or 1")
    return bool(flags)


def _decode_group_member(r: _Reader, topic: str) -> GroupMemberMsg:
    address = r.string("address")
    leaving = _leaving_flag(r, "GROUP-MEMBER")
    subjects = r.strings("subjects")
    count = r.u32("entries count")
    if count > (len(r.buf) - r.pos) // 11:  # each entry takes at least 1 + 1 + 8 + 1 bytes
        raise MalformedMessage(f"frame truncated in entries: {count} entries announced")
    entries = []
    for _ in range(count):
        subject = r.string("subject")
        partition = r.string("address")
        offset = r.u64("offset")
        (state,) = r.take(1, "entry state")
        if state > KNOWN:
            raise MalformedMessage(f"GROUP-MEMBER entry state {state}, expected 0, 1 or 2")
        entries.append(GroupEntry(subject, partition, offset, state))
    r.end()
    return GroupMemberMsg(topic, address, subjects, tuple(entries), leaving)


def _decode_store_member(r: _Reader, topic: str) -> StoreMemberMsg:
    if topic:
        raise MalformedMessage("STORE-MEMBER with a topic")
    address = r.string("address")
    leaving = _leaving_flag(r, "STORE-MEMBER")
    store = r.string("store")
    rack = r.string("rack")
    (replicas,) = r.take(1, "replicas")
    reader = r.string("reader")
    count = r.u32("filling count")
    if count > (len(r.buf) - r.pos) // 2:  # each entry takes at least 1 + 1 bytes
        raise MalformedMessage(f"frame truncated in filling: {count} entries announced")
    filling = tuple((r.string("subject"), r.string("address")) for _ in range(count))
    r.end()
    return StoreMemberMsg(address, store, rack, replicas, reader, filling, leaving)


def _decode_heads_at(r: _Reader, topic: str) -> HeadsAtMsg:
    since = r.u64("since")
    subject = r.string("subject")
    address = r.string("address")
    (flags,) = r.take(1, "flags")
    if flags > 1:
        raise MalformedMessage(f"HEADS-AT flags {flags}, expected 0 or 1")
    count = r.u32("entries count")
    if count > (len(r.buf) - r.pos) // 9:  # each entry takes at least 1 + 8 bytes
        raise MalformedMessage(f"frame truncated in entries: {count} entries announced")
    entries = tuple(HeldAt(r.string("address"), r.u64()) for _ in range(count))
    r.end()
    return HeadsAtMsg(topic, since, subject, address, bool(flags), entries)


def _decode_peer_info(r: _Reader, topic: str, body: object) -> PeerInfoMsg:
    address = r.string("address")
    role = r.string("role")
    r.end()
    if not isinstance(body, (bytes, bytearray, memoryview)):
        raise MalformedMessage("PEER-INFO body is not bytes")
    if len(body) > MAX_PEER_INFO:
        raise MalformedMessage(f"PEER-INFO body of {len(body)} bytes is over {MAX_PEER_INFO}")
    try:
        info = msgpack.unpackb(bytes(body), raw=False, strict_map_key=True, max_ext_len=0, max_bin_len=0)
    except Exception as exc:  # msgpack raises several types (ValueError, ExtraData, FormatError, ...)
        raise MalformedMessage(f"PEER-INFO body is not msgpack: {exc}") from None
    if not isinstance(info, dict):
        raise MalformedMessage("PEER-INFO body is not a map")
    return PeerInfoMsg(topic, address, role, info)


_NAMES = {
    RECORD: "RECORD",
    DIRECT_RECORD: "DIRECT-RECORD",
    FETCH: "FETCH",
    ACK: "ACK",
    HEAD: "HEAD",
    DIRECT_HEAD: "DIRECT-HEAD",
    GET_HEADS: "GET-HEADS",
    CONSUMER_HELLO: "CONSUMER-HELLO",
    STORE_HELLO: "STORE-HELLO",
    DIRECT_TAIL: "DIRECT-TAIL",
    DIRECT_RECORDS: "DIRECT-RECORDS",
    DIRECT_PARTITIONS: "DIRECT-PARTITIONS",
    RECORDS: "RECORDS",
    GROUP_MEMBER: "GROUP-MEMBER",
    STORE_MEMBER: "STORE-MEMBER",
    PEER_INFO: "PEER-INFO",
    KEYED_RECORDS: "KEYED-RECORDS",
    DIRECT_KEYED_RECORDS: "DIRECT-KEYED-RECORDS",
    DIRECT_GAP: "DIRECT-GAP",
    HEADS_AT: "HEADS-AT",
}


def message_name(msg_id: bytes) -> str:
    """The RFC name of a message id, e.g. ``b"M"`` -> ``"RECORD"``."""
    return _NAMES.get(msg_id, repr(msg_id))


# --------------------------------------------------------------------------
# Subscriptions
# --------------------------------------------------------------------------


def subscription(msg_id: bytes, topic: str = "", exact: bool = False) -> bytes:
    """The SUB prefix for messages of ``msg_id`` whose topic starts with
    ``topic``; with ``exact`` the topic's NUL terminator is included so that
    only that exact topic matches (``hello`` no longer matches ``hello2``)."""
    raw = msg_id + _topic(topic)
    return raw + b"\0" if exact else raw


@dataclass(frozen=True, slots=True)
class Subscription:
    """A (un)subscription frame as seen on an XPUB socket."""

    subscribe: bool
    msg_id: bytes  # b"" when the whole stream was subscribed
    topic: str
    exact: bool = False  # the prefix went on past the topic's NUL...
    rest: bytes = b""  # ...with these bytes: a consumer group member's one partition (rfc 14.2)


def decode_subscription(frame: bytes) -> Subscription:
    """Decode ``0x01|0x00 id topic [NUL [rest]]`` as received by an XPUB socket
    (``rest``: the start of frame 1 after the topic, one partition's records)."""
    if not isinstance(frame, (bytes, bytearray, memoryview)):
        raise MalformedMessage("subscription frame is not bytes")
    frame = bytes(frame)
    if not frame:
        raise MalformedMessage("empty subscription frame")
    flag = frame[0]
    if flag not in (0, 1):
        raise MalformedMessage(f"subscription flag {flag} is neither 0 nor 1")
    msg_id = frame[1:2]
    topic, nul, rest = frame[2:].partition(b"\0")
    return Subscription(flag == 1, msg_id, _s(topic), bool(nul), rest)


def subscription_prefix(sub: Subscription) -> bytes:
    """The prefix ``sub`` subscribes: what a message must start with to reach the subscriber."""
    return sub.msg_id + _topic(sub.topic) + (b"\0" + sub.rest if sub.exact else b"")


def encode_subscription(sub: Subscription) -> bytes:
    """The frame an XPUB sees for ``sub`` (useful for tests and proxies)."""
    return (b"\x01" if sub.subscribe else b"\x00") + subscription_prefix(sub)


# --------------------------------------------------------------------------
# Tower and beacon frames
# --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Beacon:
    """Peer -> tower: ``"B", sender, host, port``; host may be empty."""

    sender: str
    host: str
    port: int


@dataclass(frozen=True, slots=True)
class TowerBeacon:
    """Tower -> peers: ``"B", sender, "tcp://host:port"``."""

    sender: str
    endpoint: str


def encode_beacon(beacon: Beacon) -> list[bytes]:
    if not 0 < beacon.port < 65536:
        raise ValueError(f"port {beacon.port} is outside 1..65535")
    return [BEACON, _b(beacon.sender), _b(beacon.host), str(beacon.port).encode()]


def decode_beacon(frames: Sequence[bytes]) -> Beacon:
    if len(frames) != 4:
        raise MalformedMessage(f"beacon needs 4 frames, got {len(frames)}")
    frames = [bytes(f) for f in frames]
    if frames[0] != BEACON:
        raise MalformedMessage(f"beacon starts with {frames[0]!r}, not 'B'")
    port_text = frames[3]
    if not port_text.isdigit() or len(port_text) > 5:
        raise MalformedMessage(f"beacon port {port_text!r} is not a decimal number")
    if len(port_text) > 1 and port_text[:1] == b"0":
        raise MalformedMessage(f"beacon port {port_text!r} has a leading zero")
    port = int(port_text)
    if not 0 < port < 65536:
        raise MalformedMessage(f"beacon port {port} is outside 1..65535")
    if not frames[1]:
        raise MalformedMessage("beacon has an empty sender")
    return Beacon(_s(frames[1]), _s(frames[2]), port)


def encode_tower_beacon(beacon: TowerBeacon) -> list[bytes]:
    return [BEACON, _b(beacon.sender), _b(beacon.endpoint)]


def decode_tower_beacon(frames: Sequence[bytes]) -> TowerBeacon:
    if len(frames) != 3:
        raise MalformedMessage(f"tower beacon needs 3 frames, got {len(frames)}")
    frames = [bytes(f) for f in frames]
    if frames[0] != BEACON and not (frames[0][:1] == SCOPE and frames[0][-1:] == b"\x00" or frames[0] == SCOPE_UNKNOWN):
        raise MalformedMessage(f"tower beacon starts with {frames[0]!r}, not 'B' or a scope (rfc 5.6)")
    if not _ENDPOINT.fullmatch(frames[2]) or int(frames[2].rsplit(b":", 1)[1]) > 65535:
        raise MalformedMessage(f"tower beacon endpoint {frames[2]!r} is not a tcp://host:port endpoint")
    if not frames[1]:
        raise MalformedMessage("tower beacon has an empty sender")
    try:
        sender = frames[1].decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedMessage("tower beacon sender is not UTF-8") from None
    return TowerBeacon(sender, frames[2].decode("ascii"))


def encode_profile(address: str, role: bytes, topic: str = "") -> bytes:
    """The subscription (without its leading 0x01) by which a peer tells a tower what it is (rfc 5.6)."""
    if role not in ROLES:
        raise ValueError(f"unknown discovery role {role!r}")
    if role == ROLE_STORE and topic:
        raise ValueError("a store's profile has no topic")
    sender, name = _b(address), _b(topic)
    if not sender or b"\x00" in sender or b"\x00" in name:
        raise ValueError("a profile's address must be non-empty, and neither it nor the topic may hold NUL")
    return PROFILE + sender + b"\x00" + role + name


def decode_profile(data: bytes) -> tuple[str, bytes, str]:
    """A profile subscription's body (after 0x01) -> (address, role, topic)."""
    data = bytes(data)
    if data[:1] != PROFILE:
        raise MalformedMessage(f"profile starts with {data[:1]!r}, not 'P'")
    sender, sep, rest = data[1:].partition(b"\x00")
    if not sep or not sender:
        raise MalformedMessage("profile has no address, or no NUL after it")
    role, name = rest[:1], rest[1:]
    if role not in ROLES:
        raise MalformedMessage(f"profile role {role!r} is not one of p, c, g, s")
    if b"\x00" in name or (role == ROLE_STORE and name):
        raise MalformedMessage("profile topic holds NUL, or a store's profile has a topic")
    try:
        return sender.decode("utf-8"), role, name.decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedMessage("profile address or topic is not UTF-8") from None


def scope_key(role: bytes, topic: str = "") -> bytes:
    """The first frame under which a dafka-py tower publishes the beacons of a peer with this profile."""
    return SCOPE + role + _b(topic) + b"\x00"


def scope_needs(role: bytes, topic: str = "") -> list[bytes]:
    """The scopes (subscription prefixes) a peer with this profile needs to hear (rfc 5.6): a producer the
    consumers and the producers of its topic and the stores; a consumer the producers of its topic and the
    stores; a group member the other members; a store everyone.  And every peer without a profile."""
    name = _b(topic) + b"\x00"
    if role == ROLE_PRODUCER:
        return [SCOPE + ROLE_CONSUMER + name, SCOPE + ROLE_PRODUCER + name, SCOPE + ROLE_STORE, SCOPE_UNKNOWN]
    if role == ROLE_CONSUMER:
        return [SCOPE + ROLE_PRODUCER + name, SCOPE + ROLE_STORE, SCOPE_UNKNOWN]
    if role == ROLE_GROUP:
        return [SCOPE + ROLE_GROUP + name, SCOPE_UNKNOWN]
    if role == ROLE_STORE:
        return [SCOPE]
    raise ValueError(f"unknown discovery role {role!r}")


# What a peer can connect to: tcp://, an IPv4/IPv6/DNS host, a decimal port.
_ENDPOINT = re.compile(rb"tcp://(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.\-]*[A-Za-z0-9])?):[1-9][0-9]{0,4}")
