"""The producer's and consumer's protocol logic, without sockets."""

from __future__ import annotations

import pytest

from hypothesis import given, settings
from hypothesis import strategies as st

from dafka.consumer import latest
from dafka import protocol as proto
from dafka.consumer.state import FETCH_CHUNK, ConsumerState
from dafka.core.inflight import fetch_window
from dafka.producer.state import ProducerState

P = "P" * 32
ME = "C" * 32
SINCE = 1_700_000_000_000  # a subscription's time, unix ms


def ack(seq, topic="t"):
    return proto.AckMsg(P, topic, seq)


# -- producer ---------------------------------------------------------------


def test_producer_frames_are_reference_records():
    state = ProducerState(P, "t")
    seq = state.publish(b"x")
    assert seq == state.next_seq - 1 == 0
    assert [state.record_frame(seq), b"x"] == proto.encode(proto.RecordMsg("t", P, "t", 0, b"x"))
    assert state.head_frame() == proto.encode(proto.HeadMsg("t", P, "t", 0))[0]


def test_min_acks_counts_distinct_stores():
    state = ProducerState(P, "t", min_acks=2)
    for _ in range(10):
        state.publish(b"x")
    assert not state.on_ack("s1", ack(9))
    assert not state.on_ack("s1", ack(9))
    assert state.released == -1
    assert state.on_ack("s2", ack(4))
    assert state.released == 4 and state.base == 5 and len(state.buffer) == 5
    assert state.on_ack("s2", ack(9))
    assert state.released == 9 and not state.buffer


def test_acks_for_other_topics_or_unpublished_records_are_ignored():
    state = ProducerState(P, "t")
    state.publish(b"x")
    assert not state.on_ack("s", ack(0, topic="other"))
    assert not state.on_ack("s", ack(5))
    assert state.malformed == 1 and state.released == -1


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 600), st.integers(0, 700), st.integers(0, 700), st.integers(0, 20_000))
def test_fetch_answers_are_exact_after_partial_acks(published, acked, start, count):
    state = ProducerState(P, "t")
    for i in range(published):
        state.publish(b"v%d" % i)
    if acked < published:
        state.on_ack("s", ack(acked))
    state.on_fetch(proto.FetchMsg(P, ME, "t", start, count))
    answers = []
    while state.answering:
        answers.extend(state.fetch_answers(budget=97))
    low = max(start, state.base)
    high = min(start + count, published)
    expected = list(range(low, high)) if low < high else []
    assert [int.from_bytes(f[-8:], "big") for f, _ in answers] == expected
    assert all(c == b"v%d" % int.from_bytes(f[-8:], "big") for f, c in answers)
    assert all(proto.decode([f, c]).topic == ME for f, c in answers[:3])


def test_head_on_matching_subscription_only():
    state = ProducerState(P, "hello")
    sub = proto.decode_subscription(b"\x01Mhello")
    assert not state.wants_head_for(sub)  # nothing published yet
    state.publish(b"x")
    assert state.wants_head_for(sub)
    assert state.wants_head_for(proto.decode_subscription(b"\x01Hhello\x00"))
    assert state.wants_head_for(proto.decode_subscription(b"\x01Mhel"))  # a reference prefix
    assert not state.wants_head_for(proto.decode_subscription(b"\x01Mhello2"))
    assert not state.wants_head_for(proto.decode_subscription(b"\x00Mhello"))


def test_no_store_mode_keeps_a_ring():
    state = ProducerState(P, "t", min_acks=0, max_unacked=3)
    for i in range(5):
        assert state.has_room(1)
        state.publish(b"%d" % i)
    assert state.released == 4 and state.base == 2 and list(state.buffer) == [b"2", b"3", b"4"]


def answers(state):
    return [proto.decode(frames) for frames in state.fetch_answers()]


def test_a_no_store_producer_says_direct_tail_for_records_it_let_go_and_no_store_held():
    state = ProducerState(P, "t", min_acks=0, max_unacked=3)
    for i in range(5):
        state.publish(b"%d" % i)
    state.on_fetch(proto.FetchMsg(P, ME, "t", 0, 5))
    tail, *records = answers(state)
    assert tail == proto.DirectTailMsg(ME, P, "t", 2) and state.tails_sent == 1
    assert [(m.sequence, m.content) for m in records] == [(2, b"2"), (3, b"3"), (4, b"4")]
    state.on_fetch(proto.FetchMsg(P, ME, "t", 3, 5))  # what it holds: no tail
    assert [type(m) for m in answers(state)] == [proto.DirectRecordMsg, proto.DirectRecordMsg]


def test_a_no_store_producer_is_quiet_about_what_a_store_acked():
    """A store that ACKed a sequence holds every record up to it, and its reader answers for them: the
    producer says nothing of them, even after the store left (it may come back)."""
    state = ProducerState(P, "t", min_acks=0, max_unacked=3)
    for i in range(8):
        state.publish(b"%d" % i)
    assert not state.on_ack("s1", ack(3))  # min_acks 0: nothing to release...
    state.forget_store("s1")
    state.on_fetch(proto.FetchMsg(P, ME, "t", 1, 2))  # ...but the store holds 0..3
    assert answers(state) == []
    state.on_fetch(proto.FetchMsg(P, ME, "t", 4, 1))  # 4 was let go and no store held it
    assert answers(state) == [proto.DirectTailMsg(ME, P, "t", 5)]


def test_a_producer_with_stores_never_says_direct_tail():
    state = ProducerState(P, "t", min_acks=1)
    for i in range(5):
        state.publish(b"%d" % i)
    state.on_ack("s1", ack(3))  # released 0..3: a store holds them
    state.on_fetch(proto.FetchMsg(P, ME, "t", 0, 5))
    assert [m.sequence for m in answers(state)] == [4] and state.tails_sent == 0


def test_has_room_bounds_records_and_bytes():
    state = ProducerState(P, "t", max_unacked=2, max_unacked_bytes=10)
    state.publish(b"12345")
    assert state.has_room(5) and not state.has_room(6)
    state.publish(b"1")
    assert not state.has_room(1)
    assert state.publish(b"1") == -1, "a full buffer takes nothing"
    assert state.next_seq == 2 and len(state.buffer) == 2 and state.buffered_bytes == 6


def test_a_full_buffer_refuses_by_bytes_too():
    state = ProducerState(P, "t", max_unacked=100, max_unacked_bytes=10)
    assert state.publish(b"123456") == 0
    assert state.publish(b"12345") == -1 and state.next_seq == 1
    state.on_ack("s", ack(0))
    assert state.publish(b"12345") == 1 and state.next_seq == 2


def test_publish_many_takes_a_burst_whole_or_not_at_all():
    state = ProducerState(P, "t", max_unacked=5, max_unacked_bytes=100)
    assert state.publish_many([b"a", b"b", b"c"], 3) == 0
    assert state.publish_many([b"d", b"e", b"f"], 3) == -1, "no room for all three: nothing taken"
    assert (state.next_seq, len(state.buffer), state.buffered_bytes) == (3, 3, 3)
    state.on_ack("s", ack(2))
    assert state.publish_many([b"d", b"e", b"f"], 3) == 3 and list(state.buffer) == [b"d", b"e", b"f"]
    # The same frames as record by record.
    one = ProducerState(P, "t")
    for value in (b"a", b"b", b"c", b"d", b"e", b"f"):
        one.publish(value)
    assert state.record_frame(5) == one.record_frame(5) and state.head_frame() == one.head_frame()


def test_publish_many_joins_the_live_batch_and_keeps_the_ring_with_no_acks():
    state = ProducerState(P, "t", min_acks=0, max_unacked=4)
    state.audience.batches = state.audience.plain = True
    assert state.publish_many([b"%d" % i for i in range(6)], 6) == 0
    assert state.released == 5 and state.base == 2 and list(state.buffer) == [b"2", b"3", b"4", b"5"]
    assert state.batch_first == 0 and len(state.batch) == 6 and state.batch_due
    (frames,) = state.take_batch()
    msg = proto.decode(frames)
    assert (msg.sequence, msg.count) == (0, 6)


# -- consumer ---------------------------------------------------------------


def record(seq, content=None, topic="t", direct=False):
    msg = (proto.DirectRecordMsg(ME, P, topic, seq, content or b"%d" % seq) if direct
           else proto.RecordMsg(topic, P, topic, seq, content or b"%d" % seq))
    return proto.encode(msg)


def fetches(state):
    out = [proto.decode(f) for f in state.out]
    state.out.clear()
    return [m for m in out if type(m) is proto.FetchMsg]


def delivered(state):
    out = [(r.offset, r.value) for r in state.ready]
    state.ready.clear()
    return out


def test_earliest_gap_fetches_then_delivers_in_order():
    state = ConsumerState(ME, reset="earliest")
    state.subscribe("t")
    state.out.clear()
    state.on_record_frames(*record(3))
    assert delivered(state) == []
    [fetch] = fetches(state)
    assert (fetch.topic, fetch.address, fetch.sequence, fetch.count) == (P, ME, 0, 4)
    state.on_record_frames(*record(4))
    assert fetches(state) == []  # the same gap is not requested again
    for seq in (0, 1, 2, 3):
        state.on_record_frames(*record(seq, direct=True))
    assert [o for o, _ in delivered(state)] == [0, 1, 2, 3, 4]
    state.on_record_frames(*record(2))
    assert delivered(state) == []  # duplicate


def test_latest_without_any_answer_starts_at_the_first_record_seen():
    """No dafka-py peer says what it held at the subscription (reference peers only): once the wait for
    their HEADS-AT is over, the reference's rule (rfc 8.1), and the record that came meanwhile is kept."""
    state = ConsumerState(ME, reset="latest")
    state.subscribe("t")
    state.on_record_frames(*record(7))
    assert delivered(state) == []  # waiting for the answers
    state.tick(latest.WAIT)
    assert delivered(state) == [(7, b"7")]
    assert fetches(state) == []


def test_latest_without_any_answer_starts_past_the_first_head():
    state = ConsumerState(ME, reset="latest")
    state.subscribe("t")
    state.on_frames(proto.encode(proto.HeadMsg("t", P, "t", 5)))
    state.tick(latest.WAIT)
    assert fetches(state) == [] and state.partitions[("t", P)].next == 6
    state.on_record_frames(*record(6))
    assert delivered(state) == [(6, b"6")]


def test_unanswered_fetch_is_retried():
    state = ConsumerState(ME, reset="earliest", fetch_retry=1.0)
    state.subscribe("t")
    state.tick(10.0)
    state.on_frames(proto.encode(proto.HeadMsg("t", P, "t", 2)))
    assert len(fetches(state)) == 1
    state.tick(10.5)
    assert fetches(state) == []
    state.tick(11.1)
    [again] = fetches(state)
    assert again.sequence == 0


def test_a_gap_that_later_records_wait_behind_is_asked_again_sooner():
    state = ConsumerState(ME, reset="earliest", fetch_retry=1.0)
    state.subscribe("t")
    state.tick(10.0)
    state.on_frames(proto.encode(proto.HeadMsg("t", P, "t", 0)))
    [first] = fetches(state)
    assert (first.sequence, first.count) == (0, 1)
    state.on_frames(record(1))  # live, behind the gap: its answer is overdue sooner
    state.on_frames(record(2))
    fetches(state)
    state.tick(10.1)
    assert fetches(state) == []
    state.tick(10.25)
    [again] = fetches(state)
    assert (again.sequence, again.count) == (0, 3)


def test_big_gap_is_fetched_in_chunks():
    state = ConsumerState(ME, reset="earliest", fetch_max_bytes=1 << 40)
    state.subscribe("t")
    state.out.clear()
    state.on_frames(proto.encode(proto.HeadMsg("t", P, "t", FETCH_CHUNK + 10)))
    [first] = fetches(state)
    assert (first.sequence, first.count) == (0, FETCH_CHUNK)
    for seq in range(FETCH_CHUNK):
        state.on_record_frames(*record(seq, b"x", direct=True))
    [second] = fetches(state)
    assert (second.sequence, second.count) == (FETCH_CHUNK, 11)


@pytest.mark.parametrize("bulk,per_record", [(True, 4), (False, 256)])
def test_fetch_windows_are_sized_in_bytes_from_the_records_seen(bulk, per_record):
    """A FETCH asks for about consumer/fetch_max_bytes as the answering peers
    charge it (a DIRECT-RECORD per record costs 256 bytes more than its
    content, a record in a DIRECT-RECORDS 4): sized with a guess first, then
    with the size of the records received."""
    budget = 1_000_000
    state = ConsumerState(ME, reset="earliest", fetch_max_bytes=budget, bulk=bulk)
    state.subscribe("t")
    state.out.clear()
    state.on_frames(proto.encode(proto.HeadMsg("t", P, "t", 50_000)))
    [first] = fetches(state)
    assert (first.sequence, first.count) == (0, fetch_window(budget, -1, bulk))
    for seq in range(first.count):
        state.on_record_frames(*record(seq, b"x" * 5000, direct=True))
    [second] = fetches(state)
    assert (second.sequence, second.count) == (first.count, fetch_window(budget, 5000, bulk))
    assert second.count * (5000 + per_record) <= budget < (second.count + 1) * (5000 + per_record)


def test_direct_tail_skips_deleted_records():
    state = ConsumerState(ME, reset="earliest")
    state.subscribe("t")
    state.on_frames(proto.encode(proto.HeadMsg("t", P, "t", 9)))
    state.on_frames(proto.encode(proto.DirectTailMsg(ME, P, "t", 5)))
    assert state.records_lost == 5
    for seq in range(5, 10):
        state.on_record_frames(*record(seq, direct=True))
    assert [o for o, _ in delivered(state)] == [5, 6, 7, 8, 9]


def test_a_full_queue_makes_caught_up_partitions_ask_past_their_head_once_records_stop():
    """When the receive queue overflowed at the end of a burst, nothing later shows the gap: the
    consumer asks past its position once a tick passed without a record, and again while the windows
    come back full."""
    state = ConsumerState(ME, reset="earliest", fetch_max_bytes=100 * (100 + 4))  # windows of 100 records
    state.subscribe("t")
    for seq in range(10):
        state.on_record_frames(*record(seq, b"x" * 100))
    delivered(state)
    fetches(state)
    state.now = 1.0
    state.probe()
    state.on_record_frames(*record(10, b"x" * 100))
    state.tick(1.1)
    assert fetches(state) == []  # records still come: a later one shows any gap
    state.tick(1.2)
    [probe] = fetches(state)  # a tick without a record: the stream paused or ended
    assert (probe.topic, probe.sequence, probe.count) == (P, 11, 100) and state.probes == 1
    state.probe()
    state.tick(1.3)
    assert fetches(state) == []  # at most once per GAP_RETRY
    lengths, contents = proto.pack_contents([b"x" * 100] * 100)
    state.on_frames(proto.encode(proto.DirectRecordsMsg(ME, P, "t", 11, lengths, contents)))
    [again] = fetches(state)  # a full window: there may be more
    assert (again.sequence, again.count) == (111, 100)
    lengths, contents = proto.pack_contents([b"x" * 100] * 30)
    state.on_frames(proto.encode(proto.DirectRecordsMsg(ME, P, "t", 111, lengths, contents)))
    assert fetches(state) == [] and len(delivered(state)) == 131  # a short one: that was all


def test_a_full_queue_makes_a_partition_behind_ask_past_its_head_once_caught_up():
    state = ConsumerState(ME, reset="earliest", fetch_max_bytes=1000 * (1 + 4))
    state.subscribe("t")
    state.on_record_frames(*record(5))  # a gap: 0..4 are fetched
    fetches(state)
    state.now = 1.0
    state.probe()
    assert fetches(state) == []  # it knows it is behind; it asks past its head once caught up
    for seq in range(5):
        state.on_record_frames(*record(seq, direct=True))
    [probe] = fetches(state)
    assert probe.sequence == 6 and len(delivered(state)) == 6


def test_exact_topics_and_own_address_only():
    state = ConsumerState(ME, reset="latest")
    state.subscribe("t")
    state.on_frames(record(0, topic="t2"))
    state.on_frames(proto.encode(proto.DirectRecordMsg("OTHER", P, "t", 0, b"x")))
    assert delivered(state) == []


def test_hellos():
    state = ConsumerState(ME, reset="earliest")
    state.subscribe("a")
    state.subscribe("b")
    state.out.clear()
    state.on_subscription(b"\x01WREADER")
    state.on_frames(proto.encode(proto.StoreHelloMsg(ME, "READER2")))
    hellos = [proto.decode(f) for f in state.out]
    assert hellos == [proto.ConsumerHelloMsg("READER", ME, ("a", "b")),
                      proto.ConsumerHelloMsg("READER2", ME, ("a", "b"))]


def test_malformed_is_counted():
    state = ConsumerState(ME)
    state.on_frames([b"M\x00"])
    state.on_subscription(b"\x05junk")
    assert state.malformed == 2


@settings(max_examples=150, deadline=None)
@given(st.permutations(list(range(40))), st.lists(st.integers(0, 39), max_size=20))
def test_any_arrival_order_delivers_each_record_once_in_order(order, dups):
    state = ConsumerState(ME, reset="earliest", max_buffered=1000)
    state.subscribe("t")
    for seq in list(order) + dups:
        state.on_record_frames(*record(seq, direct=True))
    assert [o for o, _ in delivered(state)] == list(range(40))


def test_records_ahead_of_a_gap_are_kept_within_the_byte_bound_and_the_rest_come_from_a_fetch():
    """A live producer running ahead of a gap: 1000-byte records beyond consumer/max_buffered_bytes are
    dropped (and fetched again), not kept up to consumer/max_buffered."""
    state = ConsumerState(ME, reset="earliest", max_buffered=100_000, max_buffered_bytes=10_000)
    state.subscribe("t")
    value = b"x" * 1000
    for seq in range(1, 50):  # 0 is missing
        state.on_record_frames(*record(seq, value, direct=True))
    [p] = state.partitions.values()
    assert sorted(p.pending) == list(range(1, 10))  # within 10 of the next record expected
    assert fetches(state)[0].sequence == 0
    for seq in range(50):
        state.on_record_frames(*record(seq, value, direct=True))  # the fetch's answers, and the rest again
    assert [o for o, _ in delivered(state)] == list(range(50))


def test_fetch_is_sent_again_when_the_producer_connects():
    state = ConsumerState(ME, reset="earliest", fetch_retry=1000.0)
    state.subscribe("t")
    state.on_frames(proto.encode(proto.HeadMsg("t", P, "t", 3)))
    assert len(fetches(state)) == 1
    state.on_subscription(b"\x01F" + b"OTHER" + b"\x00")
    assert fetches(state) == []
    state.on_subscription(b"\x01F" + P.encode() + b"\x00")  # the producer's SUB arrives
    [again] = fetches(state)
    assert (again.sequence, again.count) == (0, 4)
    state.on_subscription(b"\x01F")  # a store reader subscribes to every FETCH
    assert len(fetches(state)) == 1


def test_a_head_during_catch_up_does_not_request_the_same_range_again():
    state = ConsumerState(ME, reset="earliest")
    state.subscribe("t")
    state.on_frames(proto.encode(proto.HeadMsg("t", P, "t", 999)))
    assert len(fetches(state)) == 1
    for seq in range(10):
        state.on_record_frames(*record(seq, direct=True))
    state.on_frames(proto.encode(proto.HeadMsg("t", P, "t", 1500)))
    assert fetches(state) == []  # [0, 1000) is still being answered


def test_retry_waits_while_answers_make_progress():
    state = ConsumerState(ME, reset="earliest", fetch_retry=1.0)
    state.subscribe("t")
    state.tick(0.0)
    state.on_frames(proto.encode(proto.HeadMsg("t", P, "t", 99)))
    fetches(state)
    for step in range(1, 6):  # an answer trickles in every 0.5 s
        state.on_record_frames(*record(step - 1, direct=True))
        state.tick(step * 0.5)
        assert fetches(state) == []
    state.tick(5.0)  # nothing for 2.5 s
    [again] = fetches(state)
    assert again.sequence == 5


def get_heads(state):
    out = [proto.decode(f) for f in state.out]
    state.out.clear()
    return [m.topic for m in out if type(m) is proto.GetHeadsMsg]


def heads_at(sender, seq, of=P, complete=False, since=None):
    """A HEADS-AT from ``sender``: it held ``of`` up to ``seq`` (-1: nothing) at the subscription."""
    held = proto.NOTHING_HELD if seq < 0 else seq
    return proto.encode(proto.HeadsAtMsg(ME, SINCE if since is None else since, "t", sender, complete,
                                         (proto.HeldAt(of, held),)))


def direct_head(seq, address=P):
    return proto.encode(proto.DirectHeadMsg(ME, address, "t", seq))


def test_a_peer_leaving_makes_the_consumer_ask_the_stores_for_heads():
    """A producer's last records and HEADs can all be lost; once it has gone
    nothing it sends will show the gap, but a store may hold the records."""
    state = ConsumerState(ME, reset="latest")
    state.subscribe("t", since_ms=SINCE)
    assert get_heads(state) == ["t"]  # latest too: a partition born since may be known to the stores alone
    state.on_peers(set(), 1, 0.0)
    assert get_heads(state) == ["t"]
    state.on_peers({P}, 0, 0.0)
    state.on_frames(heads_at(P, 4, of=P))  # the producer's own answer: 0..4 came before the subscription
    state.on_record_frames(*record(5))  # meets the partition live
    assert delivered(state) == [(5, b"5")]
    state.on_peers(set(), 1, 0.0)
    assert get_heads(state) == ["t"]
    state.on_frames(direct_head(9))  # the store holds 6..9 that never arrived here
    [fetch] = fetches(state)
    assert (fetch.sequence, fetch.count) == (6, 4)


def test_a_latest_consumer_starts_a_stored_partition_past_what_the_store_held_at_the_subscription():
    state = ConsumerState(ME, reset="latest")
    state.subscribe("t", since_ms=SINCE)
    state.on_frames(heads_at("R" * 32, 9, of="Q" * 32, complete=True))
    state.on_frames(direct_head(9, address="Q" * 32))
    state.tick(latest.WAIT)
    assert state.partitions[("t", "Q" * 32)].next == 10 and fetches(state) == []


def test_a_latest_consumer_with_saved_positions_asks_the_stores_for_heads():
    """Its producers may be gone: only stores can tell it what came after
    the position it saved."""
    state = ConsumerState(ME, reset="latest", positions={("t", P): 3})
    state.subscribe("t")
    assert get_heads(state) == ["t"]
    state.on_frames(direct_head(9))
    [fetch] = fetches(state)
    assert (fetch.sequence, fetch.count) == (3, 7)
    state.on_frames(proto.encode(proto.StoreHelloMsg(ME, "R" * 32)))
    [hello] = [proto.decode(f) for f in state.out]
    assert hello.subjects == ("t",)


def test_a_stalled_window_is_asked_again_with_the_size_of_what_it_brought():
    """Records grew from 100 bytes to 100 kB in the middle of a window: the
    retry asks for a window that fits fetch_max_bytes at the new size."""
    budget = 1_000_000
    state = ConsumerState(ME, reset="earliest", fetch_max_bytes=budget, fetch_retry=1.0)
    state.subscribe("t")
    state.out.clear()
    state.on_frames(proto.encode(proto.HeadMsg("t", P, "t", 10_000)))
    [first] = fetches(state)
    for seq in range(100):
        state.on_record_frames(*record(seq, b"s" * 100, direct=True))
    for seq in range(100, 110):
        state.on_record_frames(*record(seq, b"L" * 100_000, direct=True))
    state.tick(0.5)
    state.tick(2.0)  # no progress for fetch_retry: asked again
    [again] = fetches(state)
    average = (100 * 100 + 10 * 100_000) // 110
    assert again.sequence == 110 and again.count == fetch_window(budget, average, bulk=True) < first.count // 5


def test_tail_watch_asks_again_while_the_producer_is_gone_with_backoff():
    """rfc 8.5, the tail watch.  The exact loss pattern of the flaky test:
    the producer left, every HEAD after its last records was lost, and so was
    the answer to the GET-HEADS sent when it left.  The consumer asks again
    at 1, 2, 4 ... s (capped), until a store's answer shows the tail."""
    state = ConsumerState(ME, reset="earliest", heads_interval=1.0)
    state.subscribe("t")
    get_heads(state)
    state.on_peers({P}, 0, 0.0)
    for seq in range(5):
        state.on_record_frames(*record(seq))  # records 5..9 and every HEAD after them: lost
    assert [s for s, _ in delivered(state)] == [0, 1, 2, 3, 4]
    state.on_peers(set(), 1, 10.0)  # the producer's beacon expired
    assert get_heads(state) == ["t"]  # ... and this GET-HEADS (or its answer) is lost too
    asked = []
    for now in [10.0 + i * 0.25 for i in range(1, 200)]:
        state.tick(now)
        if get_heads(state):
            asked.append(now - 10.0)
    # the first round sees the records that came since the watch began: 1 s, then doubling waits 1, 2, 4, 8 s
    assert asked[:5] == [1.0, 2.0, 4.0, 8.0, 16.0]
    assert state.heads_asked == len(asked)
    state.on_frames(direct_head(9))  # one answer gets through: the store holds 5..9
    [fetch] = fetches(state)
    assert (fetch.sequence, fetch.count) == (5, 5)
    for seq in range(5, 10):
        state.on_frames(proto.encode(proto.DirectRecordMsg(ME, P, "t", seq, b"%d" % seq)))
    assert [s for s, _ in delivered(state)] == [5, 6, 7, 8, 9]


def test_tail_watch_waits_at_most_64_intervals_and_stops_when_the_producer_is_back():
    state = ConsumerState(ME, reset="earliest", heads_interval=0.5)
    state.subscribe("t")
    state.on_frames(direct_head(3))  # a partition met through a store: its producer is not connected
    get_heads(state)
    fetches(state)
    assert state.heads_due == 0.5
    now, waits, last = 0.0, [], 0.0
    while len(waits) < 10:
        now += 0.5
        state.tick(now)
        if get_heads(state):
            waits.append(now - last)
            last = now
    assert waits == [0.5, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 32.0, 32.0]  # doubling, capped at 64 x 0.5 s
    state.on_peers({P}, 0, now)  # the producer is live again: its HEADs will tell
    assert state.heads_due is None
    state.tick(now + 1000)
    assert get_heads(state) == []
    state.on_peers(set(), 1, now + 1000)  # gone again: ask at once, then from the first interval
    assert get_heads(state) == ["t"] and state.heads_due == now + 1000.5


def test_no_tail_watch_while_every_producer_is_live():
    state = ConsumerState(ME, reset="earliest")
    state.subscribe("t")
    state.on_peers({P}, 0, 0.0)
    state.on_record_frames(*record(0))
    assert state.heads_due is None and not state.awaiting  # nothing needs the clock: idle at zero


def test_tail_watch_asks_every_interval_while_records_still_come():
    """Silence is what the watch waits out: while a gone producer's partition
    still gets records (fetched from the stores), each round comes one
    interval after the last; the doubling starts once they stop."""
    state = ConsumerState(ME, reset="earliest", heads_interval=1.0)
    state.subscribe("t")
    state.on_frames(direct_head(100))  # met through a store
    get_heads(state)
    fetches(state)
    asked, seq = [], 0
    for step in range(1, 41):
        now = step * 0.25
        if now <= 5.0:  # records keep arriving for 5 s
            state.on_frames(proto.encode(proto.DirectRecordMsg(ME, P, "t", seq, b"x")))
            seq += 1
        state.tick(now)
        if get_heads(state):
            asked.append(now)
    assert asked == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0]  # silent from 5 s on: 1 s, then 2 s
