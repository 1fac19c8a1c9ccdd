"""Property-based tests for the Dafka wire codec (dafka.protocol).

* Round trips: ``decode(encode(m)) == m`` for every message type over the full
  field ranges (0..255-byte strings, unicode and arbitrary bytes carried with
  surrogateescape, 64-bit sequences, 32-bit counts, contents up to 1 MiB).
* Fuzzing: any input to a decoder either decodes to a value that re-encodes to
  exactly the same frames, or raises ``MalformedMessage``; never anything else.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dafka.protocol import attributes
from dafka import protocol as proto
from dafka.protocol import (
    AckMsg, Beacon, ConsumerHelloMsg, DirectHeadMsg, DirectPartitionsMsg, DirectRecordMsg, DirectRecordsMsg, FetchMsg,
    GetHeadsMsg, HeadMsg, MalformedMessage, PartitionInfo, RecordMsg, StoreHelloMsg, Subscription, TowerBeacon,
)
from wire_vectors import load_vectors

VECTORS = load_vectors()
MESSAGE_VECTORS = [
    "RECORD",
    "DIRECT_RECORD",
    "FETCH",
    "ACK",
    "HEAD",
    "DIRECT_HEAD",
    "GET_HEADS",
    "CONSUMER_HELLO",
    "STORE_HELLO",
    "CONSUMER_HELLO_EMPTY",
    "RECORD_SEQ0_EMPTY",
]
SUBSCRIPTION_VECTORS = [name for name in VECTORS if name.startswith("XPUB_")]

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ROUND_TRIP = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

MAX_SEQ = 2**64 - 1
MAX_COUNT = 2**32 - 1
MIB = 1024 * 1024
ALL_IDS = [proto.MESSAGE_IDS[cls] for cls in proto.MESSAGE_IDS]

# --------------------------------------------------------------------------
# Strategies
# --------------------------------------------------------------------------


def _fit(text: str, limit: int = proto.MAX_STRING) -> str:
    """Cut ``text`` to at most ``limit`` UTF-8 bytes on a character boundary."""
    raw = text.encode("utf-8", "surrogateescape")
    if len(raw) <= limit:
        return text
    return raw[:limit].decode("utf-8", "ignore")


def _wire_strings(max_bytes: int, allow_nul: bool = True) -> st.SearchStrategy[str]:
    """Strings whose encoding is 0..max_bytes bytes: unicode text, and arbitrary
    bytes carried through surrogateescape (as the decoder produces them)."""
    exclude = "" if allow_nul else "\0"
    text = st.text(
        alphabet=st.characters(codec="utf-8", exclude_characters=exclude), max_size=max_bytes
    ).map(lambda t: _fit(t, max_bytes))
    raw = st.binary(max_size=max_bytes)
    if not allow_nul:
        raw = raw.map(lambda b: b.replace(b"\0", b""))
    escaped = raw.map(lambda b: b.decode("utf-8", "surrogateescape"))
    full = st.one_of(
        st.text(alphabet="ab", min_size=max_bytes, max_size=max_bytes),
        st.text(alphabet="é", min_size=max_bytes // 2, max_size=max_bytes // 2),
    )
    return st.one_of(text, escaped, full)


strings = _wire_strings(proto.MAX_STRING)
# The topic is NUL-terminated rather than length-prefixed: no NUL, and it may be long.
topics = _wire_strings(400, allow_nul=False)
sequences = st.one_of(
    st.integers(0, MAX_SEQ), st.sampled_from([0, 1, 2**32, 2**63, MAX_SEQ - 1, MAX_SEQ])
)
counts = st.one_of(st.integers(0, MAX_COUNT), st.sampled_from([0, 1, 100_000, MAX_COUNT]))
contents = st.binary(max_size=512)
subject_lists = st.lists(strings, max_size=10).map(tuple)

# --------------------------------------------------------------------------
# Round trips of every message type
# --------------------------------------------------------------------------


def _round_trip(msg: proto.Message) -> None:
    frames = proto.encode(msg)
    assert all(isinstance(f, bytes) for f in frames)
    assert len(frames) == (2 if isinstance(msg, (RecordMsg, DirectRecordMsg, proto.PeerInfoMsg))
                           else 8 if isinstance(msg, DirectRecordsMsg) and msg.keyed
                           else 3 if isinstance(msg, DirectRecordsMsg) else 1)
    assert frames[0][:1] == proto.MESSAGE_IDS[type(msg)]
    decoded = proto.decode(frames)
    assert type(decoded) is type(msg)
    assert decoded == msg
    assert proto.encode(decoded) == frames


@ROUND_TRIP
@given(st.builds(RecordMsg, topics, strings, strings, sequences, contents))
@example(RecordMsg("", "", "", 0, b""))
@example(RecordMsg("hello", "producer-1", "hello", MAX_SEQ, b"\x00" * 8))
@example(RecordMsg("t" * 300, "a" * 255, "é" * 127 + "s", MAX_SEQ, bytes(range(256)) * (MIB // 256)))
def test_record_round_trip(msg):
    _round_trip(msg)


@ROUND_TRIP
@given(st.builds(DirectRecordMsg, topics, strings, strings, sequences, contents))
@example(DirectRecordMsg("", "", "", 0, b""))
@example(DirectRecordMsg("consumer-1", "\udcff\udc80", "x" * 255, MAX_SEQ, b"\xff" * MIB))
def test_direct_record_round_trip(msg):
    _round_trip(msg)


@ROUND_TRIP
@given(st.builds(FetchMsg, topics, strings, strings, sequences, counts))
@example(FetchMsg("", "", "", 0, 0))
@example(FetchMsg("producer-1", "consumer-1", "hello", MAX_SEQ, MAX_COUNT))
def test_fetch_round_trip(msg):
    _round_trip(msg)


@ROUND_TRIP
@given(st.builds(AckMsg, topics, strings, sequences))
@example(AckMsg("", "", 0))
@example(AckMsg("producer-1", "hello", MAX_SEQ))
def test_ack_round_trip(msg):
    _round_trip(msg)


@ROUND_TRIP
@given(st.builds(HeadMsg, topics, strings, strings, sequences))
@example(HeadMsg("", "", "", 0))
@example(HeadMsg("hello", "producer-1", "hello", MAX_SEQ))
def test_head_round_trip(msg):
    _round_trip(msg)


@ROUND_TRIP
@given(st.builds(DirectHeadMsg, topics, strings, strings, sequences))
@example(DirectHeadMsg("", "", "", 0))
@example(DirectHeadMsg("consumer-1", "producer-1", "hello", MAX_SEQ))
def test_direct_head_round_trip(msg):
    _round_trip(msg)


@ROUND_TRIP
@given(st.builds(GetHeadsMsg, topics, strings))
@example(GetHeadsMsg("", ""))
def test_get_heads_round_trip(msg):
    _round_trip(msg)


@ROUND_TRIP
@given(st.builds(ConsumerHelloMsg, topics, strings, subject_lists))
@example(ConsumerHelloMsg("", "", ()))
@example(ConsumerHelloMsg("store-1", "consumer-1", ("",) * 10))
@example(ConsumerHelloMsg("store-1", "consumer-1", ("s" * 255,) * 10))
def test_consumer_hello_round_trip(msg):
    _round_trip(msg)


@ROUND_TRIP
@given(st.builds(StoreHelloMsg, topics, strings))
@example(StoreHelloMsg("", ""))
def test_store_hello_round_trip(msg):
    _round_trip(msg)


group_entries = st.lists(
    st.builds(proto.GroupEntry, strings, strings, sequences, st.sampled_from([0, 1, 2])), max_size=8).map(tuple)


@ROUND_TRIP
@given(st.builds(proto.GroupMemberMsg, topics, strings, subject_lists, group_entries, st.booleans()))
@example(proto.GroupMemberMsg("", ""))
@example(proto.GroupMemberMsg("billing", "c-1", ("orders",),
                              (proto.GroupEntry("orders", "p-1", proto.NO_OFFSET, proto.RELEASED),), leaving=True))
def test_group_member_round_trip(msg):
    _round_trip(msg)


@given(st.builds(proto.GroupMemberMsg, topics, strings, subject_lists, group_entries, st.booleans()),
       st.integers(0, 400), st.binary(min_size=1, max_size=4))
def test_decode_damaged_group_member(msg, at, garbage):
    """A GROUP-MEMBER cut short, grown or overwritten decodes to a message or
    raises MalformedMessage, nothing else."""
    _decodes_or_is_malformed_when_damaged(msg, at, garbage)


def _decodes_or_is_malformed_when_damaged(msg, at: int, garbage: bytes) -> None:
    """A one-frame message cut at ``at``, grown by ``garbage``, or overwritten with it there."""
    frame = proto.encode(msg)[0]
    at = min(at, len(frame))
    for damaged in (frame[:at], frame + garbage, frame[:at] + garbage + frame[at + len(garbage):]):
        try:
            assert isinstance(proto.decode([damaged]), proto.Message.__args__)
        except proto.MalformedMessage:
            pass


store_members = st.builds(proto.StoreMemberMsg, strings, strings, strings, st.integers(0, 255), strings,
                          st.lists(st.tuples(strings, strings), max_size=8).map(tuple), st.booleans())


@ROUND_TRIP
@given(store_members)
@example(proto.StoreMemberMsg("", ""))
@example(proto.StoreMemberMsg("W" * 32, "S" * 32, "rack-a", 2, "R" * 32, (("orders", "P" * 32),), leaving=True))
def test_store_member_round_trip(msg):
    _round_trip(msg)


@given(store_members, st.integers(0, 400), st.binary(min_size=1, max_size=4))
def test_decode_damaged_store_member(msg, at, garbage):
    """A STORE-MEMBER cut short, grown or overwritten decodes to a message or raises MalformedMessage."""
    _decodes_or_is_malformed_when_damaged(msg, at, garbage)


def test_store_member_has_no_topic():
    with pytest.raises(ValueError, match="empty topic"):
        proto.encode(proto.StoreMemberMsg("w", "s", topic="orders"))
    frame = proto.encode(proto.StoreMemberMsg("w", "s"))[0]
    with pytest.raises(proto.MalformedMessage, match="with a topic"):
        proto.decode([b"Yx" + frame[1:]])


# PEER-INFO's body (rfc 17): a map of strings to what msgpack carries, nested
info_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12)
peer_infos = st.builds(proto.PeerInfoMsg, topics, strings, strings,
                       st.dictionaries(st.text(max_size=20), info_values, max_size=8))


@ROUND_TRIP
@given(peer_infos)
@example(proto.PeerInfoMsg("", "", "", {}))
@example(proto.PeerInfoMsg("C" * 32, "P" * 32, "store-reader", {"rss": 2**40, "details": {"disk": 12, "x": [1.5]}}))
def test_peer_info_round_trip(msg):
    _round_trip(msg)


@given(peer_infos, st.integers(0, 400), st.binary(min_size=1, max_size=4), st.binary(max_size=64))
def test_decode_damaged_peer_info(msg, at, garbage, body):
    """A PEER-INFO whose frame 1 is damaged, or whose body is any bytes, decodes or raises MalformedMessage."""
    frames = proto.encode(msg)
    at = min(at, len(frames[0]))
    for head in (frames[0][:at], frames[0] + garbage, frames[0][:at] + garbage + frames[0][at + len(garbage):]):
        try:
            assert isinstance(proto.decode([head, frames[1]]), proto.Message.__args__)
        except proto.MalformedMessage:
            pass
    try:
        decoded = proto.decode([frames[0], body])
        assert isinstance(decoded, proto.PeerInfoMsg) and isinstance(decoded.info, dict)
    except proto.MalformedMessage:
        pass


def test_peer_info_refuses_what_is_not_a_small_map():
    frame = proto.encode(proto.PeerInfoMsg("c", "p", "producer", {}))[0]
    import msgpack
    for body, reason in ((msgpack.packb([1, 2]), "not a map"), (b"\xc1", "not msgpack"),
                         (msgpack.packb({1: 2}), "not msgpack"), (b"\x80" + b"x", "not msgpack"),
                         (msgpack.packb({"a": "x" * proto.MAX_PEER_INFO}), "over")):
        with pytest.raises(proto.MalformedMessage, match=reason):
            proto.decode([frame, body])
    with pytest.raises(ValueError, match="over"):
        proto.encode(proto.PeerInfoMsg("c", "p", "producer", {"a": "x" * proto.MAX_PEER_INFO}))


@st.composite
def direct_records(draw):
    """A DIRECT-RECORDS of 1..40 records (extension), with stamps in ascending order."""
    values = draw(st.lists(st.binary(max_size=64), min_size=1, max_size=40))
    first = draw(st.one_of(st.integers(0, MAX_SEQ - len(values) + 1), st.just(MAX_SEQ - len(values) + 1)))
    firsts = sorted(draw(st.sets(sequences, max_size=6)))
    stamps = tuple((f, draw(st.integers(0, MAX_SEQ))) for f in firsts)
    lengths, contents = proto.pack_contents(values)
    return DirectRecordsMsg(draw(topics), draw(strings), draw(strings), first, lengths, contents, stamps)


@ROUND_TRIP
@given(direct_records())
def test_direct_records_round_trip(msg):
    _round_trip(msg)


header_lists = st.lists(st.tuples(_wire_strings(40), st.one_of(st.none(), st.binary(max_size=16))),
                        max_size=4).map(tuple)
record_attributes = st.one_of(
    st.none(),
    st.builds(lambda ts, headers: attributes.Attributes(ts, attributes.encode_headers(headers)),
              st.one_of(st.just(attributes.NO_TIME), st.integers(-2**63, 2**63 - 1)), header_lists))


@st.composite
def keyed_records(draw):
    """A KEYED-RECORDS or DIRECT-KEYED-RECORDS (rfc 18) of 1..40 records, each with a key, an empty key or
    none (and sometimes no key at all: empty frames 4 and 5), and attributes or none (rfc 18.4: sometimes
    none at all, empty frames 6 to 8)."""
    plain = draw(direct_records())
    keys = draw(st.lists(st.one_of(st.none(), st.binary(max_size=24)), min_size=plain.count, max_size=plain.count))
    key_lengths, packed = proto.pack_keys(keys)
    held = draw(st.lists(record_attributes, min_size=plain.count, max_size=plain.count))
    cls = draw(st.sampled_from([proto.KeyedRecordsMsg, proto.DirectKeyedRecordsMsg]))
    return cls(plain.topic, plain.address, plain.subject, plain.sequence, plain.lengths, plain.contents,
               plain.stamps if cls is proto.DirectKeyedRecordsMsg else (), key_lengths, packed,
               *attributes.pack(held))


@ROUND_TRIP
@given(keyed_records())
def test_keyed_records_round_trip(msg):
    _round_trip(msg)
    keys = msg.key_list()
    assert keys is None or len(keys) == msg.count
    assert proto.pack_keys(keys or [None] * msg.count) == (msg.key_lengths, msg.keys)
    held = msg.attribute_list()
    assert held is None or len(held) == msg.count
    assert attributes.pack(held or [None] * msg.count) in ((msg.times, msg.header_lengths, msg.headers),
                                                          (b"", b"", b""))
    for a in held or ():
        assert attributes.encode_headers(attributes.decode_headers(a[1])) == a[1]


@FUZZ
@given(st.binary(max_size=300))
def test_decode_headers_of_any_bytes_is_exact_or_a_value_error(blob):
    try:
        headers = attributes.decode_headers(blob)
    except ValueError:
        return
    assert attributes.encode_headers(headers) == blob


@ROUND_TRIP
@given(header_lists)
def test_headers_round_trip(headers):
    assert attributes.decode_headers(attributes.encode_headers(headers)) == headers


@FUZZ
@given(keyed_records(), st.integers(0, 7), st.integers(0, 200), st.binary(min_size=1, max_size=4))
def test_decode_damaged_keyed_records(msg, which, at, garbage):
    """Any frame of a keyed message cut, grown or overwritten: decoded exactly, or refused as malformed."""
    frames = [bytearray(f) for f in proto.encode(msg)]
    frame = frames[which]
    at = min(at, len(frame))
    frame[at:at + len(garbage)] = garbage
    _decodes_canonically_or_is_malformed([bytes(f) for f in frames])


def test_keys_travel_only_in_the_keyed_kinds():
    lengths, contents = proto.pack_contents([b"v"])
    key_lengths, keys = proto.pack_keys([b"k"])
    with pytest.raises(ValueError, match="send KEYED-RECORDS"):
        proto.encode(proto.RecordsMsg("t", "p", "t", 0, lengths, contents, (), key_lengths, keys))
    with pytest.raises(ValueError, match="send DIRECT-KEYED-RECORDS"):
        proto.encode(DirectRecordsMsg("c", "p", "t", 0, lengths, contents, (), key_lengths, keys))
    frames = proto.encode(proto.KeyedRecordsMsg("t", "p", "t", 0, lengths, contents, (), key_lengths, keys))
    with pytest.raises(MalformedMessage, match="8 frame"):
        proto.decode(frames[:3])  # a keyed message cut to a RECORDS' frames is refused, not read without keys
    with pytest.raises(MalformedMessage, match="8 frame"):
        proto.decode(frames[:5])  # ... and one cut to its keys, not read without its records' attributes
    times, header_lengths, headers = attributes.pack([attributes.Attributes(1, b"")])
    with pytest.raises(ValueError, match="send KEYED-RECORDS"):
        proto.encode(proto.RecordsMsg("t", "p", "t", 0, lengths, contents, (), b"", b"", times, header_lengths,
                                      headers))


@st.composite
def direct_gaps(draw):
    first = draw(st.integers(0, MAX_SEQ - 1))
    return proto.DirectGapMsg(draw(topics), draw(strings), draw(strings), first, draw(st.integers(first + 1, MAX_SEQ)))


@ROUND_TRIP
@given(direct_gaps())
@example(proto.DirectGapMsg("", "", "", 0, 1))
@example(proto.DirectGapMsg("c", "p", "t", MAX_SEQ - 1, MAX_SEQ))
def test_direct_gap_round_trip(msg):
    _round_trip(msg)


@FUZZ
@given(direct_gaps(), st.integers(0, 120), st.binary(min_size=1, max_size=4))
def test_decode_damaged_direct_gap(msg, at, garbage):
    frame = bytearray(proto.encode(msg)[0])
    at = min(at, len(frame))
    frame[at:at + len(garbage)] = garbage
    _decodes_canonically_or_is_malformed([bytes(frame)])


def test_a_direct_gap_covers_at_least_one_record():
    with pytest.raises(ValueError, match="of nothing"):
        proto.encode(proto.DirectGapMsg("c", "p", "t", 5, 5))
    frame = proto.encode(proto.DirectGapMsg("c", "p", "t", 5, 6))[0]
    with pytest.raises(MalformedMessage, match="of nothing"):
        proto.decode([frame[:-8] + (5).to_bytes(8, "big")])


@ROUND_TRIP
@given(st.builds(DirectPartitionsMsg, topics, strings, strings,
                 st.lists(st.builds(PartitionInfo, strings, strings, sequences, sequences), max_size=8).map(tuple),
                 strings))
@example(DirectPartitionsMsg("", "", ""))
def test_direct_partitions_round_trip(msg):
    _round_trip(msg)


@FUZZ
@given(direct_records(), st.integers(0, 2), st.integers(0, 200), st.binary(min_size=1, max_size=4))
def test_decode_damaged_direct_records(msg, which, at, garbage):
    """Any frame of a DIRECT-RECORDS cut, grown or overwritten: decoded
    exactly, or refused as malformed."""
    frames = [bytearray(f) for f in proto.encode(msg)]
    frame = frames[which]
    at = min(at, len(frame))
    frame[at:at + len(garbage)] = garbage
    _decodes_canonically_or_is_malformed([bytes(f) for f in frames])


@ROUND_TRIP
@given(
    st.builds(
        Subscription,
        st.booleans(),
        st.binary(min_size=1, max_size=1),
        _wire_strings(300, allow_nul=False),
        st.booleans(),
    )
)
@example(Subscription(True, b"M", "", exact=True))
@example(Subscription(False, b"\x00", "", exact=False))
def test_subscription_round_trip(sub):
    frame = proto.encode_subscription(sub)
    assert frame[1:] == proto.subscription(sub.msg_id, sub.topic, exact=sub.exact)
    assert proto.decode_subscription(frame) == sub


@ROUND_TRIP
@given(st.builds(Beacon, strings.filter(bool), strings, st.integers(1, 65535)))
@example(Beacon("x", "", 1))
@example(Beacon("x", "127.0.0.1", 65535))
def test_beacon_round_trip(beacon):
    assert proto.decode_beacon(proto.encode_beacon(beacon)) == beacon


_hosts = st.one_of(
    st.ip_addresses(v=4).map(str),
    st.ip_addresses(v=6).map(lambda a: f"[{a}]"),
    st.from_regex(r"[A-Za-z0-9]([A-Za-z0-9.\-]{0,30}[A-Za-z0-9])?", fullmatch=True),
)


@ROUND_TRIP
@given(
    st.builds(
        TowerBeacon,
        st.text(min_size=1, max_size=64),  # a sender is UTF-8 text
        st.builds(lambda host, port: f"tcp://{host}:{port}", _hosts, st.integers(1, 65535)),
    )
)
def test_tower_beacon_round_trip(beacon):
    assert proto.decode_tower_beacon(proto.encode_tower_beacon(beacon)) == beacon


# --------------------------------------------------------------------------
# Fuzzing the decoders
# --------------------------------------------------------------------------


def _decodes_canonically_or_is_malformed(frames: list[bytes]) -> None:
    """decode either rejects ``frames`` with MalformedMessage or returns a
    message that encodes back to exactly ``frames``."""
    try:
        msg = proto.decode(frames)
    except MalformedMessage as exc:
        assert exc.reason
        return
    assert proto.encode(msg) == frames


_golden_frame1 = st.sampled_from([VECTORS[name][0] for name in MESSAGE_VECTORS])
_id_led_frame = st.builds(lambda i, rest: i + rest, st.sampled_from(ALL_IDS), st.binary(max_size=64))
_header_led_frame = st.builds(
    lambda i, topic, version, rest: i + topic + b"\0" + bytes([version]) + rest,
    st.sampled_from(ALL_IDS),
    st.binary(max_size=12).map(lambda b: b.replace(b"\0", b"")),
    st.sampled_from([0, 1, 1, 1, 2]),
    st.binary(max_size=48),
)
any_frame = st.one_of(st.binary(max_size=64), _id_led_frame, _header_led_frame, _golden_frame1)


@FUZZ
@given(st.lists(any_frame, max_size=4))
@example([])
@example([b""])
@example([VECTORS["RECORD"][0]])
@example(VECTORS["RECORD"] + [b""])
def test_decode_arbitrary_frames(frames):
    _decodes_canonically_or_is_malformed(frames)


@st.composite
def mutated_golden(draw):
    """A golden message vector with frame 1 damaged by flips, inserts and deletes."""
    name = draw(st.sampled_from(MESSAGE_VECTORS))
    frames = list(VECTORS[name])
    frame1 = bytearray(frames[0])
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "insert", "delete", "set"]))
        if op == "insert" or not frame1:
            at = draw(st.integers(0, len(frame1)))
            frame1[at:at] = draw(st.binary(min_size=1, max_size=4))
            continue
        at = draw(st.integers(0, len(frame1) - 1))
        if op == "flip":
            frame1[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "set":
            frame1[at] = draw(st.sampled_from([0, 1, 2, 0x7F, 0x80, 0xFF]))
        else:
            del frame1[at : at + draw(st.integers(1, 4))]
    frames[0] = bytes(frame1)
    return frames


@FUZZ
@given(mutated_golden())
def test_decode_mutated_golden_frames(frames):
    _decodes_canonically_or_is_malformed(frames)


def _subscription_canonical_or_malformed(frame: bytes) -> None:
    try:
        sub = proto.decode_subscription(frame)
    except MalformedMessage as exc:
        assert exc.reason
        return
    assert proto.encode_subscription(sub) == frame


@FUZZ
@given(
    st.one_of(
        st.binary(max_size=40),
        st.builds(
            lambda flag, i, rest: bytes([flag]) + i + rest,
            st.sampled_from([0, 1, 2, 0xFF]),
            st.sampled_from(ALL_IDS + [b"", b"\x00"]),
            st.binary(max_size=32),
        ),
        st.sampled_from([VECTORS[name][0] for name in SUBSCRIPTION_VECTORS]),
    )
)
@example(b"")
@example(b"\x01")
@example(b"\x00\x00")
@example(b"\x01M\x00")
@example(b"\x01M\x00\x00")
def test_decode_subscription_arbitrary_frames(frame):
    _subscription_canonical_or_malformed(frame)


def _port_texts() -> st.SearchStrategy[bytes]:
    return st.one_of(
        st.binary(max_size=7),
        st.integers(-10, 99999).map(lambda n: str(n).encode()),
        st.builds(lambda zeros, n: b"0" * zeros + str(n).encode(), st.integers(0, 3), st.integers(0, 70000)),
        st.sampled_from([b"41234", b"65535", b"65536", b"0", b"+80", b" 80", b"\xd9\xa1"]),
    )


_short_frames = st.one_of(st.binary(max_size=24), st.sampled_from([b"B", b"", b"W"]))


@FUZZ
@given(
    st.one_of(
        st.lists(_short_frames, max_size=5),
        st.builds(
            lambda head, sender, host, port: [head, sender, host, port],
            st.sampled_from([b"B", b"B", b"W", b""]),
            st.binary(max_size=12),
            st.binary(max_size=12),
            _port_texts(),
        ),
    )
)
@example(load_vectors()["BEACON"])
@example(load_vectors()["BEACON_NOHOST"])
@example([b"B", b"x", b"", b"01234"])
def test_decode_beacon_arbitrary_frames(frames):
    try:
        beacon = proto.decode_beacon(frames)
    except MalformedMessage as exc:
        assert exc.reason
        return
    assert proto.encode_beacon(beacon) == frames


@FUZZ
@given(
    st.one_of(
        st.lists(_short_frames, max_size=4),
        st.builds(
            lambda head, sender, endpoint: [head, sender, endpoint],
            st.sampled_from([b"B", b"B", b"W", b""]),
            st.binary(max_size=12),
            st.one_of(
                st.binary(max_size=24),
                st.builds(lambda b: b"tcp://" + b, st.binary(max_size=20)),
            ),
        ),
    )
)
@example(load_vectors()["TOWER_BEACON"])
def test_decode_tower_beacon_arbitrary_frames(frames):
    try:
        beacon = proto.decode_tower_beacon(frames)
    except MalformedMessage as exc:
        assert exc.reason
        return
    assert proto.encode_tower_beacon(beacon) == frames


heads_ats = st.builds(proto.HeadsAtMsg, topics, sequences, strings, strings, st.booleans(),
                      st.lists(st.builds(proto.HeldAt, strings, sequences), max_size=8).map(tuple))


@ROUND_TRIP
@given(heads_ats)
@example(proto.HeadsAtMsg("", 0, "", "", False))
@example(proto.HeadsAtMsg("C" * 32, MAX_SEQ, "t" * 255, "P" * 32, True,
                          (proto.HeldAt("P" * 32, proto.NOTHING_HELD), proto.HeldAt("Q" * 32, proto.NOT_KNOWN))))
def test_heads_at_round_trip(msg):
    _round_trip(msg)


@FUZZ
@given(heads_ats, st.integers(0, 400), st.binary(min_size=1, max_size=4))
def test_decode_damaged_heads_at(msg, at, garbage):
    """A HEADS-AT cut short, grown or overwritten decodes to a message that re-encodes to the same bytes, or
    raises MalformedMessage."""
    frame = bytearray(proto.encode(msg)[0])
    at = min(at, len(frame))
    frame[at:at + len(garbage)] = garbage
    _decodes_canonically_or_is_malformed([bytes(frame)])


@given(st.binary(max_size=80))
def test_a_heads_at_request_is_decoded_or_refused(rest):
    """Any subscription of id A: a (requester, since, subject) that encodes back to it, or None."""
    sub = proto.decode_subscription(b"\x01A" + rest)
    request = proto.decode_heads_at_request(sub)
    if request is not None:
        requester, since, subject = request
        assert proto.heads_at_prefix(requester, since, subject) == b"A" + rest


def test_heads_at_flags_above_one_are_malformed():
    frame = proto.encode(proto.HeadsAtMsg("c", 5, "t", "p", True))[0]
    flags_at = len(proto.heads_at_prefix("c", 5, "t")) + 2  # after the sender's string ("p": 1 + 1 bytes)
    assert frame[flags_at] == 1
    with pytest.raises(MalformedMessage, match="flags 2"):
        proto.decode([frame[:flags_at] + b"\x02" + frame[flags_at + 1:]])
