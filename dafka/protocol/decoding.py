"""Decoding the frames of one Dafka message (RFC 46 and the extensions) received on a SUB socket.

Anything that is not a valid message raises :class:`~.messages.MalformedMessage`, and nothing else."""

from __future__ import annotations

from typing import Sequence

import msgpack

from . import attributes
from .encoding import _check_keys
from .messages import (
    _NAMES,
    ACK,
    CONSUMER_HELLO,
    DIRECT_GAP,
    DIRECT_HEAD,
    DIRECT_KEYED_RECORDS,
    DIRECT_PARTITIONS,
    DIRECT_RECORD,
    DIRECT_RECORDS,
    DIRECT_TAIL,
    FETCH,
    GET_HEADS,
    GROUP_MEMBER,
    HEAD,
    HEADS_AT,
    KEYED_RECORDS,
    KNOWN,
    MAX_PEER_INFO,
    MAX_SEQUENCE,
    MAX_STRING,
    MESSAGE_IDS,
    PEER_INFO,
    RECORD,
    RECORDS,
    STORE_MEMBER,
    VERSION,
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
    GroupEntry,
    GroupMemberMsg,
    HeadMsg,
    HeadsAtMsg,
    HeldAt,
    KeyedRecordsMsg,
    MalformedMessage,
    Message,
    PartitionInfo,
    PeerInfoMsg,
    RecordMsg,
    RecordsMsg,
    StoreHelloMsg,
    StoreMemberMsg,
    _s,
)
from .packing import lengths_of as _lengths


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
