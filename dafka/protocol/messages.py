"""The Dafka messages as values: RFC 46's and this project's extensions, their ids and limits, and the
error every decoder raises.  Byte layout: rfc/dafka.md; encoding: :mod:`.encoding`; decoding: :mod:`.decoding`.

Strings travel as bytes; they map to ``str`` with UTF-8 and ``surrogateescape``, so that any byte string
from a peer round-trips exactly."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate, compress
from typing import ClassVar, Union

from ..records import PartitionKey
from . import attributes
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
    filling: tuple[PartitionKey, ...] = ()
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

def split_keys(lengths: bytes, keys: bytes) -> list[bytes | None]:
    """The keys of a decoded keyed message (None: the record has none), from its frames 4 and 5 (not empty)."""
    sizes = _lengths(lengths)
    if NO_KEY not in sizes:
        return list(split_contents(lengths, keys))
    present = [size != NO_KEY for size in sizes]
    real = list(compress(sizes, present))
    found = iter(map(keys.__getitem__, map(slice, accumulate(real, initial=0), accumulate(real))))
    return [next(found) if has else None for has in present]
