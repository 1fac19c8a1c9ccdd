"""Golden-vector and error-case tests for the Dafka wire codec (dafka.protocol).

The expected bytes come only from the reference's golden vectors
(``tests/data/wire_vectors.txt``, made by the C reference encoder); the
expected *values* are the field values listed in that file's header.
"""

from __future__ import annotations

import pytest

from dafka import protocol as proto
from dafka.protocol import (
    AckMsg, Beacon, ConsumerHelloMsg, DirectHeadMsg, DirectRecordMsg, FetchMsg, GetHeadsMsg, HeadMsg, MalformedMessage,
    RecordMsg, StoreHelloMsg, Subscription, TowerBeacon,
)
from wire_vectors import load_vectors

VECTORS = load_vectors()

# Field values from the header of vectors.txt.
TOPIC = "hello"
PRODUCER = "producer-1"
CONSUMER = "consumer-1"
STORE = "store-1"
SEQ = 0x0102030405060708
COUNT = 3
SUBJECTS = ("hello", "world")
CONTENT = b"CONTENT"

MESSAGES: dict[str, proto.Message] = {
    "RECORD": RecordMsg(TOPIC, PRODUCER, TOPIC, SEQ, CONTENT),
    "DIRECT_RECORD": DirectRecordMsg(CONSUMER, PRODUCER, TOPIC, SEQ, CONTENT),
    "FETCH": FetchMsg(PRODUCER, CONSUMER, TOPIC, SEQ, COUNT),
    "ACK": AckMsg(PRODUCER, TOPIC, SEQ),
    "HEAD": HeadMsg(TOPIC, PRODUCER, TOPIC, SEQ),
    "DIRECT_HEAD": DirectHeadMsg(CONSUMER, PRODUCER, TOPIC, SEQ),
    "GET_HEADS": GetHeadsMsg(TOPIC, CONSUMER),
    "CONSUMER_HELLO": ConsumerHelloMsg(STORE, CONSUMER, SUBJECTS),
    "STORE_HELLO": StoreHelloMsg(CONSUMER, STORE),
    "CONSUMER_HELLO_EMPTY": ConsumerHelloMsg(STORE, CONSUMER),
    "RECORD_SEQ0_EMPTY": RecordMsg(TOPIC, PRODUCER, TOPIC, 0, b""),
}

SUBSCRIPTIONS: dict[str, Subscription] = {
    "XPUB_SUBSCRIBE_L_consumer-1": Subscription(True, proto.STORE_HELLO, CONSUMER),
    "XPUB_SUBSCRIBE_W_store-1": Subscription(True, proto.CONSUMER_HELLO, STORE),
    "XPUB_UNSUBSCRIBE_W_store-1": Subscription(False, proto.CONSUMER_HELLO, STORE),
}

BEACONS: dict[str, Beacon] = {
    "BEACON": Beacon(PRODUCER, "127.0.0.1", 41234),
    "BEACON_NOHOST": Beacon(PRODUCER, "", 41234),
}

TOWER_BEACONS: dict[str, TowerBeacon] = {
    "TOWER_BEACON": TowerBeacon(PRODUCER, "tcp://127.0.0.1:41234"),
}

# Vectors about other modules (the store's LevelDB layout) or checked separately.
OTHER_VECTORS = {"TOWER_WELCOME", "LEVELDB_RECORD_KEY", "LEVELDB_HEAD_KEY"}


def _frames(name: str) -> list[bytes]:
    assert name in VECTORS, f"vector {name} is missing from vectors.txt"
    return VECTORS[name]


def _malformed(frames, *reason_words: str) -> MalformedMessage:
    """Assert decode(frames) raises MalformedMessage (exactly that type) whose
    reason mentions every word in ``reason_words``."""
    with pytest.raises(MalformedMessage) as info:
        proto.decode(frames)
    exc = info.value
    assert isinstance(exc.reason, str) and exc.reason, "MalformedMessage without a reason"
    for word in reason_words:
        assert word.lower() in exc.reason.lower(), f"reason {exc.reason!r} does not mention {word!r}"
    return exc


# --------------------------------------------------------------------------
# Golden vectors
# --------------------------------------------------------------------------


def test_every_vector_in_the_shared_file_is_checked():
    covered = set(MESSAGES) | set(SUBSCRIPTIONS) | set(BEACONS) | set(TOWER_BEACONS) | OTHER_VECTORS
    assert set(VECTORS) == covered


@pytest.mark.parametrize("name", sorted(MESSAGES))
def test_encode_matches_golden_frames(name):
    assert proto.encode(MESSAGES[name]) == _frames(name)


@pytest.mark.parametrize("name", sorted(MESSAGES))
def test_decode_golden_frames(name):
    decoded = proto.decode(_frames(name))
    assert type(decoded) is type(MESSAGES[name])
    assert decoded == MESSAGES[name]


@pytest.mark.parametrize("name", sorted(MESSAGES))
def test_golden_frame_starts_with_id_and_topic_subscription(name):
    msg = MESSAGES[name]
    frame1 = _frames(name)[0]
    msg_id = proto.MESSAGE_IDS[type(msg)]
    assert frame1.startswith(proto.subscription(msg_id, msg.topic))
    assert frame1.startswith(proto.subscription(msg_id, msg.topic, exact=True))
    assert frame1.startswith(proto.subscription(msg_id))


@pytest.mark.parametrize("name", sorted(MESSAGES))
def test_decode_accepts_bytearray_and_memoryview_frames(name):
    frames = _frames(name)
    assert proto.decode([bytearray(f) for f in frames]) == MESSAGES[name]
    assert proto.decode([memoryview(f) for f in frames]) == MESSAGES[name]


@pytest.mark.parametrize("name", sorted(SUBSCRIPTIONS))
def test_xpub_subscription_vectors(name):
    (frame,) = _frames(name)
    sub = SUBSCRIPTIONS[name]
    assert proto.decode_subscription(frame) == sub
    assert proto.encode_subscription(sub) == frame
    # What the SUB side subscribed with is the frame minus the flag byte.
    assert proto.subscription(sub.msg_id, sub.topic) == frame[1:]


def test_exact_subscription_decodes_as_exact():
    frame = b"\x01" + proto.subscription(proto.RECORD, TOPIC, exact=True)
    sub = proto.decode_subscription(frame)
    assert sub == Subscription(True, proto.RECORD, TOPIC, exact=True)
    assert proto.encode_subscription(sub) == frame


def test_subscription_to_everything_has_empty_id():
    assert proto.decode_subscription(b"\x01") == Subscription(True, b"", "")


@pytest.mark.parametrize("name", sorted(BEACONS))
def test_beacon_vectors(name):
    frames = _frames(name)
    assert proto.encode_beacon(BEACONS[name]) == frames
    assert proto.decode_beacon(frames) == BEACONS[name]


@pytest.mark.parametrize("name", sorted(TOWER_BEACONS))
def test_tower_beacon_vectors(name):
    frames = _frames(name)
    assert proto.encode_tower_beacon(TOWER_BEACONS[name]) == frames
    assert proto.decode_tower_beacon(frames) == TOWER_BEACONS[name]


def test_tower_welcome_vector():
    assert _frames("TOWER_WELCOME") == [proto.WELCOME]


def test_message_names():
    assert proto.message_name(proto.RECORD) == "RECORD"
    assert proto.message_name(proto.DIRECT_HEAD) == "DIRECT-HEAD"
    assert proto.message_name(proto.CONSUMER_HELLO) == "CONSUMER-HELLO"


# --------------------------------------------------------------------------
# record_prefix and exact-match subscriptions
# --------------------------------------------------------------------------


@pytest.mark.parametrize("seq", [0, 1, SEQ, 2**64 - 1])
@pytest.mark.parametrize("cls", [RecordMsg, DirectRecordMsg])
def test_record_prefix_plus_sequence_is_frame1(cls, seq):
    msg = cls(TOPIC, PRODUCER, TOPIC, seq, CONTENT)
    msg_id = proto.MESSAGE_IDS[cls]
    prefix = proto.record_prefix(msg_id, TOPIC, PRODUCER, TOPIC)
    assert prefix + seq.to_bytes(8, "big") == proto.encode(msg)[0]


@pytest.mark.parametrize("cls", [HeadMsg, DirectHeadMsg])
def test_record_prefix_also_builds_heads(cls):
    msg = cls(CONSUMER, PRODUCER, TOPIC, SEQ)
    prefix = proto.record_prefix(proto.MESSAGE_IDS[cls], CONSUMER, PRODUCER, TOPIC)
    assert prefix + SEQ.to_bytes(8, "big") == proto.encode(msg)[0]


def test_record_prefix_matches_golden_record():
    prefix = proto.record_prefix(proto.RECORD, TOPIC, PRODUCER, TOPIC)
    assert prefix + SEQ.to_bytes(8, "big") == _frames("RECORD")[0]
    assert _frames("RECORD")[0][:-8] == prefix


def test_exact_subscription_matches_only_the_exact_topic():
    exact = proto.subscription(b"M", "hello", exact=True)
    loose = proto.subscription(b"M", "hello")
    hello = proto.encode(RecordMsg("hello", PRODUCER, "hello", SEQ, CONTENT))[0]
    hello2 = proto.encode(RecordMsg("hello2", PRODUCER, "hello2", SEQ, CONTENT))[0]
    assert hello.startswith(exact)
    assert not hello2.startswith(exact)
    # The plain prefix (what the reference uses) matches both.
    assert hello.startswith(loose) and hello2.startswith(loose)


def test_subscription_rejects_nul_in_topic():
    with pytest.raises(ValueError):
        proto.subscription(b"M", "hel\0lo")


# --------------------------------------------------------------------------
# Malformed input
# --------------------------------------------------------------------------


def _with_frame1(name: str, frame1: bytes) -> list[bytes]:
    return [frame1, *_frames(name)[1:]]


def _version_offset(frame1: bytes) -> int:
    return frame1.index(b"\0", 1) + 1


@pytest.mark.parametrize("version", [0, 2, 0xFF])
@pytest.mark.parametrize("name", sorted(MESSAGES))
def test_wrong_version_byte(name, version):
    frame1 = bytearray(_frames(name)[0])
    offset = _version_offset(bytes(frame1))
    assert frame1[offset] == 1
    frame1[offset] = version
    _malformed(_with_frame1(name, bytes(frame1)), "version")


@pytest.mark.parametrize("name", sorted(MESSAGES))
def test_every_truncation_of_frame1(name):
    frame1 = _frames(name)[0]
    for length in range(len(frame1)):
        try:
            _malformed(_with_frame1(name, frame1[:length]))
        except AssertionError as exc:
            raise AssertionError(f"{name} truncated to {length} bytes: {exc}") from None


@pytest.mark.parametrize("name", ["RECORD", "DIRECT_RECORD", "RECORD_SEQ0_EMPTY"])
def test_record_without_content_frame(name):
    _malformed(_frames(name)[:1], "frame")


@pytest.mark.parametrize("name", ["RECORD", "DIRECT_RECORD"])
def test_record_with_three_frames(name):
    _malformed([*_frames(name), b"extra"], "frame")


@pytest.mark.parametrize(
    "name", ["FETCH", "ACK", "HEAD", "DIRECT_HEAD", "GET_HEADS", "CONSUMER_HELLO", "STORE_HELLO"]
)
def test_single_frame_type_with_extra_frame(name):
    _malformed([*_frames(name), CONTENT], "frame")
    _malformed([*_frames(name), b""], "frame")


def test_zero_frames():
    _malformed([], "frame")


def test_empty_frame1():
    _malformed([b""], "empty")
    _malformed([b"", CONTENT], "empty")


@pytest.mark.parametrize("msg_id", [b"C", b"B", b"m", b"\x00", b"\xff", proto.WELCOME.lower()])
def test_unknown_message_id(msg_id):
    frame1 = msg_id + _frames("HEAD")[0][1:]
    _malformed([frame1], "unknown")


def test_welcome_frame_is_not_a_consumer_hello():
    # The tower's bare "W" shares its id with CONSUMER-HELLO but has no topic.
    _malformed([proto.WELCOME], "NUL")


def test_no_nul_after_topic():
    _malformed([b"Mhello", CONTENT], "NUL")
    _malformed([b"Fproducer-1"], "NUL")
    _malformed([b"Lconsumer-1\x01\x07store-1"], "NUL")


@pytest.mark.parametrize("name", sorted(MESSAGES))
def test_trailing_byte_in_frame1(name):
    frame1 = _frames(name)[0]
    _malformed(_with_frame1(name, frame1 + b"\x00"), "trailing")
    _malformed(_with_frame1(name, frame1 + b"junk"), "trailing")


def test_consumer_hello_subject_over_255_bytes():
    frame1 = (
        proto.encode(ConsumerHelloMsg(STORE, CONSUMER))[0][:-4]
        + (1).to_bytes(4, "big")
        + (256).to_bytes(4, "big")
        + b"x" * 256
    )
    _malformed([frame1], "255")


def test_consumer_hello_subject_of_255_bytes_is_accepted():
    frame1 = (
        proto.encode(ConsumerHelloMsg(STORE, CONSUMER))[0][:-4]
        + (1).to_bytes(4, "big")
        + (255).to_bytes(4, "big")
        + b"x" * 255
    )
    assert proto.decode([frame1]) == ConsumerHelloMsg(STORE, CONSUMER, ("x" * 255,))


@pytest.mark.parametrize("count", [3, 1000, 2**31, 2**32 - 1])
def test_consumer_hello_huge_subjects_count_with_short_frame(count):
    golden = _frames("CONSUMER_HELLO")[0]
    count_offset = golden.index(b"\x00\x00\x00\x02")
    frame1 = golden[:count_offset] + count.to_bytes(4, "big") + golden[count_offset + 4 :]
    _malformed([frame1], "truncated")


def test_consumer_hello_subject_length_past_end_of_frame():
    golden = _frames("CONSUMER_HELLO")[0]
    frame1 = golden[:-9] + (200).to_bytes(4, "big") + b"world"
    _malformed([frame1], "truncated")


def test_string_length_past_end_of_frame():
    # GET-HEADS whose address claims 0xff bytes but carries 10.
    golden = _frames("GET_HEADS")[0]
    frame1 = golden[: _version_offset(golden) + 1] + b"\xff" + golden[_version_offset(golden) + 2 :]
    _malformed([frame1], "truncated", "address")


def test_malformed_message_is_a_value_error_with_reason():
    exc = _malformed([b"Z\x00\x01"])
    assert isinstance(exc, ValueError)
    assert str(exc) == exc.reason


# --------------------------------------------------------------------------
# Encoder errors
# --------------------------------------------------------------------------

S255 = "x" * 255
S256 = "x" * 256
# 128 two-byte characters: 128 characters but 256 bytes.
U256 = "é" * 128


@pytest.mark.parametrize(
    "build",
    [
        lambda s: RecordMsg(TOPIC, s, TOPIC, 0, b""),
        lambda s: RecordMsg(TOPIC, PRODUCER, s, 0, b""),
        lambda s: DirectRecordMsg(CONSUMER, s, TOPIC, 0, b""),
        lambda s: FetchMsg(PRODUCER, s, TOPIC, 0, 1),
        lambda s: FetchMsg(PRODUCER, CONSUMER, s, 0, 1),
        lambda s: AckMsg(PRODUCER, s, 0),
        lambda s: HeadMsg(TOPIC, s, TOPIC, 0),
        lambda s: DirectHeadMsg(CONSUMER, PRODUCER, s, 0),
        lambda s: GetHeadsMsg(TOPIC, s),
        lambda s: ConsumerHelloMsg(STORE, s),
        lambda s: ConsumerHelloMsg(STORE, CONSUMER, ("ok", s)),
        lambda s: StoreHelloMsg(CONSUMER, s),
    ],
    ids=[
        "record-address",
        "record-subject",
        "direct-record-address",
        "fetch-address",
        "fetch-subject",
        "ack-subject",
        "head-address",
        "direct-head-subject",
        "get-heads-address",
        "consumer-hello-address",
        "consumer-hello-subjects",
        "store-hello-address",
    ],
)
def test_string_length_limit(build):
    for too_long in (S256, U256):
        with pytest.raises(ValueError):
            proto.encode(build(too_long))
    msg = build(S255)
    frames = proto.encode(msg)
    assert proto.decode(frames) == msg


def test_record_prefix_rejects_long_strings():
    with pytest.raises(ValueError):
        proto.record_prefix(proto.RECORD, TOPIC, S256, TOPIC)
    with pytest.raises(ValueError):
        proto.record_prefix(proto.RECORD, TOPIC, PRODUCER, S256)


@pytest.mark.parametrize(
    "msg",
    [
        RecordMsg("hel\0lo", PRODUCER, TOPIC, 0, b""),
        FetchMsg("\0", CONSUMER, TOPIC, 0, 1),
        StoreHelloMsg("consumer\0", STORE),
    ],
    ids=["record", "fetch", "store-hello"],
)
def test_nul_in_topic_is_rejected(msg):
    with pytest.raises(ValueError):
        proto.encode(msg)


def test_long_topic_is_not_length_limited():
    # The topic is NUL-terminated, not length-prefixed.
    msg = HeadMsg("t" * 1000, PRODUCER, TOPIC, 7)
    assert proto.decode(proto.encode(msg)) == msg


@pytest.mark.parametrize("seq", [-1, 2**64, 2**70])
@pytest.mark.parametrize(
    "build",
    [
        lambda q: RecordMsg(TOPIC, PRODUCER, TOPIC, q, b""),
        lambda q: DirectRecordMsg(CONSUMER, PRODUCER, TOPIC, q, b""),
        lambda q: FetchMsg(PRODUCER, CONSUMER, TOPIC, q, 1),
        lambda q: AckMsg(PRODUCER, TOPIC, q),
        lambda q: HeadMsg(TOPIC, PRODUCER, TOPIC, q),
        lambda q: DirectHeadMsg(CONSUMER, PRODUCER, TOPIC, q),
    ],
    ids=["record", "direct-record", "fetch", "ack", "head", "direct-head"],
)
def test_sequence_out_of_range(build, seq):
    with pytest.raises(ValueError):
        proto.encode(build(seq))


@pytest.mark.parametrize("seq", [0, 2**64 - 1])
def test_sequence_bounds_are_accepted(seq):
    msg = AckMsg(PRODUCER, TOPIC, seq)
    frame1 = proto.encode(msg)[0]
    assert frame1[-8:] == seq.to_bytes(8, "big")
    assert proto.decode([frame1]) == msg


@pytest.mark.parametrize("count", [-1, 2**32])
def test_count_out_of_range(count):
    with pytest.raises(ValueError):
        proto.encode(FetchMsg(PRODUCER, CONSUMER, TOPIC, 0, count))


@pytest.mark.parametrize("count", [0, 2**32 - 1])
def test_count_bounds_are_accepted(count):
    msg = FetchMsg(PRODUCER, CONSUMER, TOPIC, 0, count)
    frame1 = proto.encode(msg)[0]
    assert frame1[-4:] == count.to_bytes(4, "big")
    assert proto.decode([frame1]) == msg


def test_encode_rejects_non_messages():
    with pytest.raises(TypeError):
        proto.encode(Beacon(PRODUCER, "", 1))


@pytest.mark.parametrize("port", [0, -1, 65536])
def test_beacon_port_out_of_range_is_rejected(port):
    with pytest.raises(ValueError):
        proto.encode_beacon(Beacon(PRODUCER, "", port))


# --------------------------------------------------------------------------
# Malformed subscription and beacon frames
# --------------------------------------------------------------------------


def test_a_subscription_to_one_partition_keeps_what_follows_the_topic():
    prefix = proto.record_prefix(proto.RECORDS, TOPIC, PRODUCER, TOPIC)
    sub = proto.decode_subscription(b"\x01" + prefix)
    assert (sub.msg_id, sub.topic, sub.exact) == (proto.RECORDS, TOPIC, True)
    assert sub.rest == prefix[len(TOPIC) + 2:] and proto.encode_subscription(sub) == b"\x01" + prefix


@pytest.mark.parametrize(
    "frame, word",
    [
        (b"", "empty"),
        (b"\x02Mhello", "flag"),
        (b"\xffMhello", "flag"),
    ],
)
def test_malformed_subscription(frame, word):
    with pytest.raises(MalformedMessage) as info:
        proto.decode_subscription(frame)
    assert word.lower() in info.value.reason.lower()


def _replace(frames: list[bytes], index: int, value: bytes) -> list[bytes]:
    out = list(frames)
    out[index] = value
    return out


@pytest.mark.parametrize(
    "mutate",
    [
        lambda f: f[:3],
        lambda f: [*f, b""],
        lambda f: _replace(f, 0, b"W"),
        lambda f: _replace(f, 1, b""),
        lambda f: _replace(f, 3, b""),
        lambda f: _replace(f, 3, b"0"),
        lambda f: _replace(f, 3, b"65536"),
        lambda f: _replace(f, 3, b"-1"),
        lambda f: _replace(f, 3, b"4123x"),
        lambda f: _replace(f, 3, b"\xd9\xa1"),  # Arabic-Indic digit one
        lambda f: _replace(f, 3, b"412340"),
        lambda f: _replace(f, 3, b"01234"),
    ],
    ids=[
        "3-frames",
        "5-frames",
        "not-B",
        "empty-sender",
        "empty-port",
        "port-0",
        "port-65536",
        "negative-port",
        "port-not-decimal",
        "port-unicode-digit",
        "port-too-long",
        "port-leading-zero",
    ],
)
def test_malformed_beacon(mutate):
    with pytest.raises(MalformedMessage) as info:
        proto.decode_beacon(mutate(_frames("BEACON")))
    assert info.value.reason


@pytest.mark.parametrize(
    "mutate",
    [
        lambda f: f[:2],
        lambda f: [*f, b""],
        lambda f: _replace(f, 0, b"W"),
        lambda f: _replace(f, 1, b""),
        lambda f: _replace(f, 2, b"127.0.0.1:41234"),
        lambda f: _replace(f, 2, b""),
    ],
    ids=["2-frames", "4-frames", "not-B", "empty-sender", "no-scheme", "empty-endpoint"],
)
def test_malformed_tower_beacon(mutate):
    with pytest.raises(MalformedMessage) as info:
        proto.decode_tower_beacon(mutate(_frames("TOWER_BEACON")))
    assert info.value.reason
