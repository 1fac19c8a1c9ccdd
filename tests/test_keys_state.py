"""Keyed records (rfc section 18) in the sans-I/O states, without sockets: who gets which form of a
batch, the keys in a producer's FETCH answers, and a consumer delivering them with each record."""

from __future__ import annotations

import pickle

from dafka.protocol import attributes, batching, bulk
from dafka import protocol as proto
from dafka.consumer.state import ConsumerState
from dafka.producer.state import ProducerState
from dafka.records import deserialized
from dafka.store import keys
from dafka.store.writer_state import WriterState

P = "P" * 32
ME = "C" * 32


def sub(frame: bytes) -> proto.Subscription:
    return proto.decode_subscription(frame)


def decoded(messages: list[list[bytes]]) -> list:
    return [proto.decode(frames) for frames in messages]


def test_a_subscriber_of_each_form_gets_each_batch_once_in_its_form():
    audience = batching.Audience("t", P)
    # a dafka-py 0.3 consumer: RECORD and KEYED-RECORDS, exact
    audience.on_subscription(sub(b"\x01Mt\0"))
    audience.on_subscription(sub(b"\x01Qt\0"))
    assert audience.keyed and audience.batches and not audience.plain and not audience.records
    # a dafka-py 0.2 consumer: RECORD and RECORDS
    audience.on_subscription(sub(b"\x01Mt\0"))
    audience.on_subscription(sub(b"\x01St\0"))
    assert audience.keyed and audience.plain and not audience.records
    # a reference consumer: RECORD alone
    audience.on_subscription(sub(b"\x01Mt"))
    assert audience.records
    for frame in (b"\x00Mt", b"\x00Mt\0", b"\x00St\0"):
        audience.on_subscription(sub(frame))
    assert audience.keyed and not audience.plain and not audience.records
    # a store writer of each version
    for frame in (b"\x01M", b"\x01Q", b"\x01M", b"\x01S"):
        audience.on_subscription(sub(frame))
    assert audience.keyed and audience.plain and not audience.records


def test_a_batch_goes_keyed_to_who_reads_keys_and_plain_to_a_02_peer():
    state = ProducerState(P, "t", min_acks=0)
    for frame in (b"\x01Mt\0", b"\x01Qt\0"):
        state.on_subscription(sub(frame))
    state.publish(b"a", 1.0)  # no key: KEYED-RECORDS with no keys
    (only,) = decoded(state.take_batch())
    assert type(only) is proto.KeyedRecordsMsg and only.key_list() is None
    state.publish(b"b", 2.0)
    state.publish_keyed(b"c", b"k", 2.0 + 1e-6)
    state.publish_keyed(b"d", b"", 2.0 + 2e-6)
    (keyed,) = decoded(state.take_batch())
    assert (keyed.sequence, keyed.count, keyed.key_list()) == (1, 3, [None, b"k", b""])
    for frame in (b"\x01Mt\0", b"\x01St\0"):  # a 0.2 consumer joins
        state.on_subscription(sub(frame))
    state.publish_many([b"e", b"f"], 2 + 2, 3.0, keys=[b"k1", b"k2"])
    keyed, plain = decoded(state.take_batch())
    assert type(keyed) is proto.KeyedRecordsMsg and keyed.key_list() == [b"k1", b"k2"]
    assert type(plain) is proto.RecordsMsg and proto.split_contents(plain.lengths, plain.contents) == [b"e", b"f"]
    assert (plain.sequence, plain.count) == (keyed.sequence, keyed.count) == (4, 2)


def test_fetch_answers_carry_the_keys_to_who_reads_them_and_the_values_to_the_others():
    state = ProducerState(P, "t", min_acks=1)
    for s in range(6):
        if s % 2:
            state.publish(b"v%d" % s)
        else:
            state.publish_keyed(b"v%d" % s, b"k%d" % s)
    other = "O" * 32
    for prefix in bulk.subscriptions(ME, keys=True) + bulk.subscriptions(other):
        state.on_subscription(proto.decode_subscription(b"\x01" + prefix))
    state.on_fetch(proto.FetchMsg(P, ME, "t", 1, 5))
    state.on_fetch(proto.FetchMsg(P, other, "t", 1, 5))
    answers = {m.topic: m for m in decoded(list(state.fetch_answers(budget=10**9)))}
    assert type(answers[ME]) is proto.DirectKeyedRecordsMsg
    assert answers[ME].key_list() == [None, b"k2", None, b"k4", None]
    assert type(answers[other]) is proto.DirectRecordsMsg and answers[other].count == 5
    # acked records leave with their keys (and the bytes they held)
    held = state.buffered_bytes
    state.on_ack("store", proto.AckMsg(P, "t", 2))
    assert list(state.keys) == [4] and state.buffered_bytes == held - (3 * 2 + 2 * 2)


def test_a_consumer_delivers_each_record_with_its_key_in_order_across_a_gap():
    consumer = ConsumerState(ME, reset="earliest")
    assert proto.subscription(proto.KEYED_RECORDS, "t", exact=True) in consumer.subscribe("t")
    assert proto.subscription(proto.DIRECT_KEYED_RECORDS, ME, exact=True) in consumer.own_subscriptions()

    def keyed(seq: int, values: list[bytes], keys: list[bytes | None], direct: bool = False) -> list[bytes]:
        cls = proto.DirectKeyedRecordsMsg if direct else proto.KeyedRecordsMsg
        return proto.encode(cls(ME if direct else "t", P, "t", seq, *proto.pack_contents(values),
                                (), *proto.pack_keys(keys)))

    consumer.on_frames(keyed(0, [b"a", b"b"], [b"ka", None]))
    consumer.on_frames(keyed(4, [b"e"], [b"ke"]))  # ahead of a gap: kept with its key
    consumer.on_frames(keyed(2, [b"c", b"d"], [None, b"kd"], direct=True))
    got = list(consumer.ready)
    assert [(r.offset, r.value, r.key) for r in got] == [
        (0, b"a", b"ka"), (1, b"b", None), (2, b"c", None), (3, b"d", b"kd"), (4, b"e", b"ke")]
    topic, partition, offset, value = got[0]  # a keyed record still unpacks as four
    assert (topic, partition, offset, value) == ("t", P, 0, b"a")


def test_a_prefix_needs_records_only_once_it_stayed_alone_for_a_moment():
    """A dafka-py consumer's M<topic> reaches the producer just before its Q<topic> (subscriptions come sorted):
    in between it is not taken for a reference peer, which would get RECORDs without keys first."""
    audience = batching.Audience("t", P)
    audience.on_subscription(sub(b"\x01Mt\0"), now=10.0)
    assert audience.records and audience.records_after == 10.0 + batching.SETTLE
    audience.on_subscription(sub(b"\x01Qt\0"), now=10.001)
    assert not audience.records
    audience.on_subscription(sub(b"\x01Mt"), now=20.0)  # a reference consumer: RECORDs from 20.1 on
    assert audience.records and audience.records_after == 20.0 + batching.SETTLE
    audience.on_subscription(sub(b"\x01Mt"), now=25.0)  # a second one: the first needs them already
    assert audience.records_after == 20.0 + batching.SETTLE


def test_a_producer_answers_a_fetch_once_its_requesters_subscriptions_settled():
    """Subscriptions come sorted (D before R and V): a FETCH that came with D alone would be answered in the
    form without keys. It waits until the requester's first subscription is batching.SETTLE old."""
    state = ProducerState(P, "t", min_acks=1)
    state.publish_keyed(b"v", b"k")
    state.on_subscription(sub(b"\x01D" + ME.encode() + b"\0"), now=5.0)
    state.on_fetch(proto.FetchMsg(P, ME, "t", 0, 1), now=5.01)
    state.settle(5.05)
    assert not state.answering and state.settling.next_due() == 5.0 + batching.SETTLE
    for prefix in bulk.subscriptions(ME, keys=True):  # the rest of its subscriptions, V (keys) the last
        state.on_subscription(proto.decode_subscription(b"\x01" + prefix), now=5.02)
    state.settle(5.02)  # its last subscription came: nothing more will, the FETCH need not wait out SETTLE
    assert state.settling.next_due() is None and state.answering
    (answer,) = decoded(list(state.fetch_answers()))
    assert type(answer) is proto.DirectKeyedRecordsMsg and answer.key_list() == [b"k"]
    state.on_fetch(proto.FetchMsg(P, ME, "t", 0, 1), now=5.03)  # and its next FETCH is answered at once
    assert state.answering and not state.settling.waiting


def test_a_requester_that_reads_no_keys_still_waits_out_settle():
    """Without V (a dafka-py 0.2 peer, a requester without keys, a reference peer) nothing says that its
    subscriptions are all here: its FETCH waits SETTLE after its first one."""
    state = ProducerState(P, "t", min_acks=1)
    state.publish(b"v")
    state.on_subscription(sub(b"\x01D" + ME.encode() + b"\0"), now=5.0)
    for prefix in bulk.subscriptions(ME, keys=False):
        state.on_subscription(proto.decode_subscription(b"\x01" + prefix), now=5.01)
    state.on_fetch(proto.FetchMsg(P, ME, "t", 0, 1), now=5.02)
    state.settle(5.05)
    assert not state.answering and state.settling.next_due() == 5.0 + batching.SETTLE
    state.settle(5.0 + batching.SETTLE)
    assert state.answering
    (answer,) = decoded(list(state.fetch_answers()))
    assert type(answer) is proto.DirectRecordsMsg


def test_a_producer_holds_a_fetch_until_its_requester_listens_and_drops_it_if_it_never_does():
    """A FETCH may overtake its requester's subscriptions (another connection), or come from a requester that
    left or never was: it waits bulk.UNHEARD_WAIT for the subscription, then is dropped unanswered, so that a
    flood of phantom requesters costs nothing and queues no answer before a real requester's (rfc 6.7)."""
    state = ProducerState(P, "t", min_acks=1)
    state.publish(b"v")
    phantom = "F" * 32
    state.on_fetch(proto.FetchMsg(P, phantom, "t", 0, 1), now=1.0)
    state.on_fetch(proto.FetchMsg(P, ME, "t", 0, 1), now=1.0)
    assert not state.answering and len(state.settling.unheard) == 2
    state.on_subscription(sub(b"\x01D" + ME.encode() + b"\0"), now=1.5)  # a reference requester: D only
    state.settle(1.5 + bulk.SETTLE)
    assert state.answering
    (answer,) = decoded(list(state.fetch_answers()))
    assert type(answer) is proto.DirectRecordMsg and answer.topic == ME  # (the requester travels as its topic)
    state.on_fetch(proto.FetchMsg(P, ME, "t", 1, 1), now=1.0 + bulk.UNHEARD_WAIT + 0.1)  # drops the phantom's
    assert not state.settling.unheard and state.settling.unheard_dropped == 1 and not state.answering


# -- attributes (rfc 18.4) ------------------------------------------------------------------------------------

STAMPED = attributes.record_attributes([("trace", b"t1"), ("empty", b""), ("null", None)], 1_700_000_000_123)
TIMED = attributes.record_attributes(None, -5)  # (Kafka allows timestamps before 1970)


def test_a_batch_and_a_fetch_answer_carry_each_records_attributes_to_who_reads_keys():
    state = ProducerState(P, "t", min_acks=1)
    for prefix in (b"\x01Qt\0", b"\x01" + bulk.subscriptions(ME, keys=True)[-1]):
        state.on_subscription(proto.decode_subscription(prefix))
    for prefix in bulk.subscriptions(ME, keys=True):
        state.on_subscription(proto.decode_subscription(b"\x01" + prefix))
    held = state.buffered_bytes
    state.publish_many([b"a", b"b", b"c"], 3 + 2 + 2 * 8 + len(STAMPED.headers), 0.0, [None, b"kb", None],
                       [STAMPED, None, TIMED])
    state.publish_keyed(b"d", None, 1.0, STAMPED)  # attributes without a key
    (live,) = decoded(state.take_batch())
    assert type(live) is proto.KeyedRecordsMsg and live.count == 4
    assert live.attribute_list() == [STAMPED, attributes.NONE, TIMED, STAMPED]
    assert live.key_list() == [None, b"kb", None, None]
    state.on_fetch(proto.FetchMsg(P, ME, "t", 1, 3))
    (answer,) = decoded(list(state.fetch_answers(budget=10**9)))
    assert type(answer) is proto.DirectKeyedRecordsMsg and answer.attribute_list() == [attributes.NONE, TIMED, STAMPED]
    # acked records leave with their attributes and the bytes they held
    assert state.buffered_bytes == held + 4 + 2 + 3 * 8 + 2 * len(STAMPED.headers)
    state.on_ack("store", proto.AckMsg(P, "t", 2))
    assert list(state.attributes) == [3] and state.buffered_bytes == held + 1 + 8 + len(STAMPED.headers)


def test_a_consumer_delivers_each_records_timestamp_and_headers_across_a_gap():
    consumer = ConsumerState(ME, reset="earliest")
    consumer.subscribe("t")

    def keyed(seq: int, values: list[bytes], held: list, direct: bool = False) -> list[bytes]:
        cls = proto.DirectKeyedRecordsMsg if direct else proto.KeyedRecordsMsg
        return proto.encode(cls(ME if direct else "t", P, "t", seq, *proto.pack_contents(values), (),
                                *proto.pack_keys([b"k"] + [None] * (len(values) - 1)), *attributes.pack(held)))

    consumer.on_frames(keyed(0, [b"a", b"b"], [STAMPED, None]))
    consumer.on_frames(keyed(3, [b"d"], [TIMED]))  # ahead of a gap: kept with its attributes
    consumer.on_frames(keyed(2, [b"c"], [None], direct=True))
    got = list(consumer.ready)
    assert [(r.offset, r.key, r.timestamp, r.headers) for r in got] == [
        (0, b"k", STAMPED.timestamp, (("trace", b"t1"), ("empty", b""), ("null", None))),
        (1, None, None, ()), (2, b"k", None, ()), (3, b"k", -5, ())]
    assert pickle.loads(pickle.dumps(got[0])) == got[0] and pickle.loads(pickle.dumps(got[0])).headers == got[0].headers
    assert deserialized(got[0], bytes.upper, bytes.decode).headers == got[0].headers
    assert "timestamp=1700000000123" in repr(got[0]) and "timestamp" not in repr(got[2])


def test_a_store_keeps_attributes_beside_the_records_and_only_for_those_that_have_some():
    state = WriterState("W" * 32)
    state.on_frames(proto.encode(proto.KeyedRecordsMsg("t", P, "t", 0, *proto.pack_contents([b"a", b"b", b"c"]), (),
                                                       b"", b"", *attributes.pack([STAMPED, None, TIMED]))))
    batch = state.take_batch(1_000)
    entries = {k: v for k, v in zip(batch.keys, batch.values) if k[:1] == keys.RECORD_ATTRIBUTES}
    prefix = keys.partition_prefix(keys.RECORD_ATTRIBUTES, "t", P)
    assert entries == {prefix + keys.seq_bytes(0): keys.attributes_entry_value(*STAMPED),
                       prefix + keys.seq_bytes(2): keys.attributes_entry_value(*TIMED)}
    assert attributes.Attributes(*keys.attributes_of_entry(entries[prefix + keys.seq_bytes(2)])) == TIMED
    assert keys.parse_key(prefix + keys.seq_bytes(2)).seq == 2


def test_store_times_give_a_record_without_a_timestamp_its_stores_and_keep_a_records_own():
    """consumer/store_times (the Kafka gateway's reads): the stamp at or below each record's sequence."""
    consumer = ConsumerState(ME, reset="earliest", store_times=True)
    consumer.subscribe("t")
    values = [b"a", b"b", b"c", b"d"]
    consumer.on_frames(proto.encode(proto.DirectKeyedRecordsMsg(
        ME, P, "t", 0, *proto.pack_contents(values), ((1, 5_000), (3, 6_000)), b"", b"",
        *attributes.pack([None, None, TIMED, None]))))
    consumer.on_frames(proto.encode(proto.DirectRecordsMsg(ME, P, "t", 4, *proto.pack_contents([b"e"]),
                                                           ((0, 7_000),))))
    consumer.on_frames(proto.encode(proto.RecordsMsg("t", P, "t", 5, *proto.pack_contents([b"f"]))))  # live
    assert [(r.offset, r.timestamp) for r in consumer.ready] == [(0, None), (1, 5_000), (2, -5), (3, 6_000),
                                                                 (4, 7_000), (5, None)]
    plain = ConsumerState(ME, reset="earliest")
    plain.subscribe("t")
    plain.on_frames(proto.encode(proto.DirectRecordsMsg(ME, P, "t", 0, *proto.pack_contents([b"e"]), ((0, 7_000),))))
    assert [r.timestamp for r in plain.ready] == [None]


class FrameBox:
    """A FrameSink: what the consumer put, as the Kafka gateway's reader takes it."""

    def __init__(self) -> None:
        self.frames: list[tuple[str, int, int]] = []
        self.records: list = []

    def add_frames(self, partition: str, msg: proto.DirectRecordsMsg, skip: int) -> None:
        self.frames.append((partition, msg.sequence, skip))

    def append(self, record) -> None:
        self.records.append(record)

    def extend(self, records) -> None:
        self.records.extend(records)


def test_a_frame_sink_gets_each_message_as_it_came_from_the_next_record_on_and_single_records_as_records():
    consumer = ConsumerState(ME, reset="earliest", store_times=True)
    box = FrameBox()
    consumer.subscribe("t", sink=box)

    def direct(seq: int, values: list[bytes]) -> list[bytes]:
        return proto.encode(proto.DirectKeyedRecordsMsg(ME, P, "t", seq, *proto.pack_contents(values), ((seq, 9),),
                                                        *proto.pack_keys([b"k"] * len(values))))

    consumer.on_frames(direct(0, [b"a", b"b", b"c"]))
    consumer.on_frames(direct(1, [b"b", b"c", b"d"]))  # 1 and 2 again: from its third record on
    consumer.on_frames(direct(6, [b"g"]))  # ahead of a gap: held as a record until the gap comes
    consumer.on_frames(proto.encode(proto.RecordMsg("t", P, "t", 4, b"e")))
    consumer.on_frames(proto.encode(proto.RecordMsg("t", P, "t", 5, b"f")))
    assert box.frames == [(P, 0, 0), (P, 1, 2)]
    assert [(r.offset, r.value, r.key, r.timestamp) for r in box.records] == [
        (4, b"e", None, None), (5, b"f", None, None), (6, b"g", b"k", 9)]
    assert not consumer.ready and consumer.positions()[("t", P)] == 7
