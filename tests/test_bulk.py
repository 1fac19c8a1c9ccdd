"""Bulk answers and live batches between dafka-py peers (rfc/dafka.md
sections 12 and 13): the DIRECT-RECORDS, DIRECT-PARTITIONS and RECORDS codec,
their negotiation, and how the sans-I/O states of the consumer, the store
writer and the producer use them."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dafka.protocol import batching, bulk
from dafka import protocol as proto
from dafka.consumer.state import ConsumerState
from dafka.core.inflight import FILTER_BLOCK, REFERENCE_CAP, InflightLedger
from dafka.producer.state import ProducerState
from dafka.store import keys
from dafka.store.writer_state import WriterState

P = "P" * 32
ME = "C" * 32
W = "W" * 32


def records_msg(first: int, values: list[bytes], to: str = ME, topic: str = "t",
                stamps: tuple = ()) -> proto.DirectRecordsMsg:
    lengths, contents = proto.pack_contents(values)
    return proto.DirectRecordsMsg(to, P, topic, first, lengths, contents, stamps)


def values(first: int, end: int) -> list[bytes]:
    return [b"v%d" % s for s in range(first, end)]


# -- codec -----------------------------------------------------------------


def test_direct_records_layout():
    msg = records_msg(7, [b"ab", b"", b"cde"], stamps=((5, 1_000), (8, proto.UNKNOWN_TIME)))
    frame1, lengths, contents = proto.encode(msg)
    assert frame1 == (b"R" + ME.encode() + b"\0\x01" + b"\x20" + P.encode() + b"\x01t"
                      + (7).to_bytes(8, "big") + (3).to_bytes(4, "big")
                      + (2).to_bytes(4, "big") + (5).to_bytes(8, "big") + (1_000).to_bytes(8, "big")
                      + (8).to_bytes(8, "big") + b"\xff" * 8)
    assert lengths == b"\x02\x00\x00\x00" + b"\x00\x00\x00\x00" + b"\x03\x00\x00\x00"  # u32 little-endian
    assert contents == b"abcde"
    decoded = proto.decode([frame1, lengths, contents])
    assert decoded == msg and decoded.count == 3
    assert proto.split_contents(decoded.lengths, decoded.contents) == [b"ab", b"", b"cde"]


def test_direct_partitions_layout():
    msg = proto.DirectPartitionsMsg(ME, "R" * 32, "t", (proto.PartitionInfo("t", P, 3, 9),), "tcp://h:1")
    [frame] = proto.encode(msg)
    assert frame == (b"P" + ME.encode() + b"\0\x01" + b"\x20" + b"R" * 32 + b"\x01t" + b"\x09tcp://h:1"
                     + (1).to_bytes(4, "big")
                     + b"\x01t" + b"\x20" + P.encode() + (3).to_bytes(8, "big") + (9).to_bytes(8, "big"))
    assert proto.decode([frame]) == msg
    assert proto.decode(proto.encode(proto.DirectPartitionsMsg(ME, "R", ""))) == proto.DirectPartitionsMsg(ME, "R", "")


@pytest.mark.parametrize("frames,why", [
    (lambda f: f[:2], "needs 3 frame"),
    (lambda f: f + [b""], "needs 3 frame"),
    (lambda f: [f[0], f[1][:-1], f[2]], "bytes of lengths"),
    (lambda f: [f[0], f[1], f[2] + b"x"], "do not add up"),
    (lambda f: [f[0], f[1], f[2][:-1]], "do not add up"),
    (lambda f: [f[0][:-1], f[1], f[2]], "truncated"),
    (lambda f: [f[0] + b"\0", f[1], f[2]], "trailing"),
])
def test_malformed_direct_records_are_refused(frames, why):
    good = proto.encode(records_msg(0, [b"a", b"bc"]))
    with pytest.raises(proto.MalformedMessage, match=why):
        proto.decode(frames(good))


def test_direct_records_field_limits():
    head = proto.record_prefix(proto.DIRECT_RECORDS, ME, P, "t")
    with pytest.raises(proto.MalformedMessage, match="no record"):
        proto.decode([head + bytes(8) + bytes(4) + bytes(4), b"", b""])
    with pytest.raises(proto.MalformedMessage, match="past sequence"):
        proto.decode([head + b"\xff" * 8 + (2).to_bytes(4, "big") + bytes(4), bytes(8), b""])
    unordered = proto.encode_stamps(((5, 1), (5, 2)))
    with pytest.raises(proto.MalformedMessage, match="ascending"):
        proto.decode([head + bytes(8) + (1).to_bytes(4, "big") + unordered, bytes(4), b""])
    with pytest.raises(ValueError):
        proto.encode(records_msg(0, []))


def test_reference_subscriptions_never_match_bulk_answers():
    """A reference consumer subscribes D, E, L + its address (no NUL) and
    M, H + topics: neither new message can ever reach it."""
    frames = [proto.encode(records_msg(0, [b"x"]))[0],
              proto.encode(proto.DirectPartitionsMsg(ME, "R" * 32, "t"))[0]]
    reference = [b"D" + ME.encode(), b"E" + ME.encode(), b"L" + ME.encode(), b"Mt", b"Ht", b"F", b"G", b"W"]
    assert not any(f.startswith(p) for f in frames for p in reference)


def test_negotiation_follows_the_subscriptions():
    negotiated = bulk.Negotiated()
    for prefix in bulk.subscriptions(ME):
        assert negotiated.on_subscription(proto.decode_subscription(b"\x01" + prefix))
    assert negotiated.records == {ME} and negotiated.partitions == {ME}
    assert not negotiated.on_subscription(proto.decode_subscription(b"\x01D" + ME.encode() + b"\0"))
    negotiated.on_subscription(proto.decode_subscription(b"\x00R" + ME.encode() + b"\0"))
    assert negotiated.records == set() and negotiated.partitions == {ME}


def test_message_sizes_follow_the_byte_bound():
    assert bulk.next_count(100, 100 * 100) == bulk.MAX_BYTES // 100
    assert bulk.next_count(1, 2 * bulk.MAX_BYTES) == 1  # a big record travels alone
    assert bulk.next_count(10, 0) == bulk.MAX_COUNT  # empty records


@settings(max_examples=100, deadline=None)
@given(st.lists(st.binary(max_size=300), min_size=1, max_size=50), st.integers(0, 2**64 - 51),
       st.lists(st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1)), max_size=5, unique_by=lambda t: t[0]))
def test_direct_records_round_trip(contents, first, stamps):
    msg = records_msg(first, contents, stamps=tuple(sorted(stamps)))
    frames = proto.encode(msg)
    assert proto.decode(frames) == msg
    assert proto.split_contents(frames[1], frames[2]) == contents


# -- the in-flight budget of a reference requester ------------------------------


def test_a_reference_requester_pauses_at_the_end_of_a_block_within_four_budgets():
    ledger = InflightLedger(1_000)
    ledger.listening(ME, True)
    ledger.sent(ME, "p", 0, 10, 1_000)
    assert ledger.room_at(ME, 10, bulk=True) == (0, None)  # bulk requesters: the budget, strictly
    assert ledger.room_at(ME, 10, bulk=False) == ((REFERENCE_CAP - 1) * 1_000, FILTER_BLOCK)
    ledger.sent(ME, "p", 10, FILTER_BLOCK, 3_000)
    assert ledger.room_at(ME, FILTER_BLOCK, bulk=False) == (-3_000, None)  # at a block's end: pause
    assert ledger.room_at(ME, FILTER_BLOCK + 5, bulk=False)[0] <= 0  # four budgets spent: pause anywhere


# -- consumer ---------------------------------------------------------------


def consumer(**kw) -> ConsumerState:
    state = ConsumerState(ME, reset="earliest", **kw)
    state.subscribe("t")
    state.on_frames(proto.encode(proto.HeadMsg("t", P, "t", 99)))
    state.out.clear()
    return state


def delivered(state) -> list[tuple[int, bytes]]:
    out = [(r.offset, r.value) for r in state.ready]
    state.ready.clear()
    return out


def test_consumer_announces_bulk_answers_unless_told_not_to():
    assert set(bulk.subscriptions(ME)) <= set(ConsumerState(ME).own_subscriptions())
    assert not set(bulk.subscriptions(ME)) & set(ConsumerState(ME, bulk=False).own_subscriptions())


def test_consumer_delivers_direct_records_in_order_once():
    state = consumer()
    state.on_frames(proto.encode(records_msg(0, values(0, 10))))
    state.on_frames(proto.encode(records_msg(5, values(5, 20))))  # overlaps: only 10..19 are new
    state.on_frames(proto.encode(records_msg(0, values(0, 20))))  # all duplicates
    assert delivered(state) == [(s, b"v%d" % s) for s in range(20)]
    assert state.partitions[("t", P)].next == 20


def test_consumer_keeps_direct_records_ahead_of_a_gap_and_fetches_the_gap():
    state = consumer()
    state.on_frames(proto.encode(records_msg(10, values(10, 20))))
    assert delivered(state) == [] and state.out == []  # the FETCH of 0..99 still covers the gap
    state.tick(10.0)  # ...until its retry
    assert proto.decode(state.out[-1]).sequence == 0
    state.on_frames(proto.encode(records_msg(0, values(0, 15))))  # covers the gap and part of what is kept
    state.on_frames(proto.encode(records_msg(20, values(20, 30))))
    assert delivered(state) == [(s, b"v%d" % s) for s in range(30)]
    assert state.partitions[("t", P)].pending == {}


def test_consumer_mixes_direct_record_and_direct_records():
    state = consumer()
    state.on_frames(proto.encode(proto.DirectRecordMsg(ME, P, "t", 0, b"v0")))
    state.on_frames(proto.encode(records_msg(1, values(1, 5))))
    state.on_frames(proto.encode(proto.DirectRecordMsg(ME, P, "t", 5, b"v5")))
    assert [o for o, _ in delivered(state)] == list(range(6))


def test_consumer_asks_the_next_window_when_a_direct_records_completes_one():
    state = ConsumerState(ME, reset="earliest", fetch_max_bytes=20_000)
    state.subscribe("t")
    state.on_frames(proto.encode(proto.HeadMsg("t", P, "t", 10_000)))
    first = proto.decode(state.out[-1])
    assert first.count < 10_000
    state.out.clear()
    state.on_frames(proto.encode(records_msg(0, values(0, first.count))))
    [again] = [proto.decode(f) for f in state.out]
    assert again.sequence == first.count


def test_consumer_takes_heads_from_direct_partitions():
    state = ConsumerState(ME, reset="earliest")
    state.subscribe("t")
    state.out.clear()
    state.on_frames(proto.encode(proto.DirectPartitionsMsg(ME, "R" * 32, "t", (
        proto.PartitionInfo("t", P, 0, 41), proto.PartitionInfo("other", "Q" * 32, 0, 5)))))
    [fetch] = [proto.decode(f) for f in state.out]
    assert (fetch.topic, fetch.sequence, fetch.count) == (P, 0, 42)
    latest = ConsumerState(ME)  # a latest consumer never met P: not its to start
    latest.subscribe("t")
    latest.on_frames(proto.encode(proto.DirectPartitionsMsg(ME, "R" * 32, "t", (proto.PartitionInfo("t", P, 0, 41),))))
    assert latest.partitions == {}


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 59), st.integers(1, 20)), min_size=1, max_size=30))
def test_consumer_delivers_any_mix_of_answers_once_in_order(answers):
    state = consumer(max_buffered=1_000)
    for first, n in answers + [(0, 60)]:
        state.on_frames(proto.encode(records_msg(first, values(first, first + n))))
    got = delivered(state)
    assert [o for o, _ in got] == list(range(len(got))) and len(got) >= 60
    assert all(v == b"v%d" % o for o, v in got)


# -- store writer ----------------------------------------------------------------


def test_writer_stages_a_direct_records_with_the_reference_keys():
    state = WriterState(W)
    state.on_frames(proto.encode(proto.HeadMsg("t", P, "t", 9)))
    state.out.clear()
    state.on_frames(proto.encode(records_msg(0, values(0, 6), to=W)))
    state.on_frames(proto.encode(records_msg(4, values(4, 10), to=W)))  # 4 and 5 again
    batch = state.take_batch(1_000)
    records = [(k, v) for k, v in zip(batch.keys, batch.values) if k[:1] == keys.RECORD]
    assert records == [(keys.record_key("t", P, s), b"v%d" % s) for s in range(10)]
    assert state.duplicates == 2
    state.batch_written(batch)
    acks = [proto.decode(f) for f in state.out if f[0][:1] == proto.ACK]
    assert [a.sequence for a in acks] == [9]


def test_writer_ignores_direct_records_for_another_writer_and_buffers_ahead_of_a_gap():
    state = WriterState(W)
    state.on_frames(proto.encode(records_msg(0, values(0, 5), to="X" * 32)))
    assert state.take_batch(1_000) is None
    state.on_frames(proto.encode(records_msg(3, values(3, 6), to=W)))
    assert state.take_batch(1_000) is None  # ahead of a gap: kept, 0..2 fetched
    state.on_frames(proto.encode(records_msg(0, values(0, 3), to=W)))
    batch = state.take_batch(1_000)
    assert [k for k in batch.keys if k[:1] == keys.RECORD] == [keys.record_key("t", P, s) for s in range(6)]


# -- producer ---------------------------------------------------------------


def producer_answers(state: ProducerState, **kw) -> list:
    return [proto.decode(frames) for frames in state.fetch_answers(**kw)]


def test_producer_answers_a_requester_that_announced_bulk_with_direct_records():
    state = ProducerState(P, "t", min_acks=0)
    for s in range(1_000):
        state.publish(b"v%d" % s)
    for prefix in bulk.subscriptions(ME) + [b"D" + ME.encode() + b"\0"]:
        state.on_subscription(proto.decode_subscription(b"\x01" + prefix))
    state.on_fetch(proto.FetchMsg(P, ME, "t", 10, 500))
    answers = producer_answers(state, budget=10**9)
    assert {type(m) for m in answers} == {proto.DirectRecordsMsg}
    got = [(m.sequence + i, v) for m in answers for i, v in enumerate(proto.split_contents(m.lengths, m.contents))]
    assert got == [(s, b"v%d" % s) for s in range(10, 510)]
    assert all(m.stamps == () for m in answers)  # a producer does not know when stores received them
    # And a requester that did not announce it gets DIRECT-RECORDs, as a reference consumer expects.
    state.on_fetch(proto.FetchMsg(P, "X" * 32, "t", 0, 3))
    assert producer_answers(state) == [proto.DirectRecordMsg("X" * 32, P, "t", s, b"v%d" % s) for s in range(3)]


def test_producer_bulk_answers_respect_the_in_flight_budget():
    state = ProducerState(P, "t", min_acks=0, fetch_inflight_bytes=50_000)
    for s in range(10_000):
        state.publish(b"x" * 100)
    for prefix in bulk.subscriptions(ME) + [b"D" + ME.encode() + b"\0"]:
        state.on_subscription(proto.decode_subscription(b"\x01" + prefix))
    state.on_fetch(proto.FetchMsg(P, ME, "t", 0, 10_000))
    first = producer_answers(state, budget=10**9)
    sent = sum(m.count for m in first)
    assert 0 < sent * 100 <= 50_000 + bulk.MAX_BYTES and sent < 10_000
    assert producer_answers(state, budget=10**9) == []  # paused until the next FETCH shows progress
    state.on_fetch(proto.FetchMsg(P, ME, "t", sent, 10_000 - sent))
    assert producer_answers(state, budget=10**9)[0].sequence == sent


# -- live batches (RECORDS) ------------------------------------------------------


def sub(frame: bytes) -> proto.Subscription:
    return proto.decode_subscription(frame)


def test_audience_counts_who_reads_records_and_who_batches():
    audience = batching.Audience("t", P)
    assert not audience.records and not audience.batches
    # a dafka-py consumer: both forms, exact
    assert audience.on_subscription(sub(b"\x01Mt\0")) and audience.on_subscription(sub(b"\x01St\0"))
    assert audience.batches and not audience.records
    # a dafka-py store writer: every topic, both forms
    audience.on_subscription(sub(b"\x01M"))
    audience.on_subscription(sub(b"\x01S"))
    assert audience.batches and not audience.records
    # a reference consumer (prefix, no batches): RECORDs again
    audience.on_subscription(sub(b"\x01Mt"))
    assert audience.records
    audience.on_subscription(sub(b"\x00Mt"))
    assert not audience.records
    # a second dafka-py consumer that reads no batches (consumer/batches = 0)
    audience.on_subscription(sub(b"\x01Mt\0"))
    assert audience.records
    audience.on_subscription(sub(b"\x00Mt\0"))
    assert not audience.records
    # an observer of everything gets RECORDs; other topics and ids do not count
    audience.on_subscription(sub(b"\x01"))
    assert audience.records
    assert not audience.on_subscription(sub(b"\x01Mother\0")) and not audience.on_subscription(sub(b"\x01Ht\0"))
    audience.on_subscription(sub(b"\x00"))
    for frame in (b"\x00Mt\0", b"\x00St\0", b"\x00M", b"\x00S"):
        audience.on_subscription(sub(frame))
    assert not audience.records and not audience.batches


def test_producer_batches_bursts_and_sends_lone_records_at_once():
    state = ProducerState(P, "t", min_acks=0)
    state.on_subscription(sub(b"\x01St\0"))
    state.publish(b"a", 10.0)
    assert state.batch_due  # alone: out at once
    assert [proto.decode(m) for m in state.take_batch()] == [
        proto.RecordsMsg("t", P, "t", 0, *proto.pack_contents([b"a"]))]
    for i in range(1, 4):
        state.publish(b"v%d" % i, 10.0 + i * 1e-6)
        assert not state.batch_due  # a burst: waits
    (frames,) = state.take_batch()
    msg = proto.decode(frames)
    assert type(msg) is proto.RecordsMsg and (msg.topic, msg.sequence, msg.count) == ("t", 1, 3)
    assert proto.split_contents(msg.lengths, msg.contents) == [b"v1", b"v2", b"v3"]
    assert state.take_batch() == [] and state.batches_sent == 2
    for i in range(4, 4 + batching.MAX_RECORDS):  # full: out without waiting
        state.publish(b"x", 20.0 + i * 1e-6)
    assert state.batch_due and proto.decode(state.take_batch()[0]).count == batching.MAX_RECORDS


def test_consumer_and_writer_read_live_batches():
    consumer = ConsumerState(ME, reset="earliest")
    assert batching.consumer_subscriptions("t")[0] in consumer.subscribe("t")
    assert batching.consumer_subscriptions("t")[0] not in ConsumerState(ME, batches=False).subscribe("t")
    lengths, contents = proto.pack_contents(values(0, 5))
    live = proto.encode(proto.RecordsMsg("t", P, "t", 0, lengths, contents))
    consumer.on_frames(live)
    consumer.on_frames(proto.encode(proto.RecordMsg("t", P, "t", 3, b"v3")))  # the same record as a RECORD
    assert delivered(consumer) == [(s, b"v%d" % s) for s in range(5)]
    writer = WriterState(W)
    writer.on_frames(live)
    assert [k for k in writer.take_batch(1).keys if k[:1] == keys.RECORD] == [keys.record_key("t", P, s)
                                                                              for s in range(5)]
