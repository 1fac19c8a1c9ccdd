"""The in-flight budget of FETCH answers (dafka.core.inflight), and the producer's
answers under it, without sockets."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dafka import protocol as proto
from dafka.core.inflight import MESSAGE_OVERHEAD, InflightLedger, fetch_window
from dafka.producer.state import ProducerState

P = "P" * 32
A = "A" * 32
B = "B" * 32


def listening(*requesters: str, limit: int = 1000) -> InflightLedger:
    ledger = InflightLedger(limit)
    for requester in requesters:
        ledger.listening(requester, True)
    return ledger


def test_room_shrinks_with_what_is_sent_and_grows_with_later_fetches():
    ledger = listening(A, B)
    assert ledger.room(A) == 1000
    ledger.sent(A, "t", 0, 10, 600)
    ledger.sent(A, "t", 10, 20, 600)  # contiguous: one run
    assert ledger.room(A) == -200 and ledger.room(B) == 1000
    ledger.received_below(A, "t", 10)  # it asks from 10: 0..9 arrived
    assert ledger.in_flight(A) == 600
    ledger.received_below(A, "t", 15)  # half of the second run
    assert ledger.in_flight(A) == 300
    ledger.received_below(A, "other", 100)  # another partition credits nothing
    assert ledger.in_flight(A) == 300
    ledger.received_below(A, "t", 20)
    assert ledger.in_flight(A) == 0 and ledger.total() == 0


def test_a_repeated_fetch_credits_nothing_and_resends_count_again():
    ledger = listening(A)
    ledger.sent(A, "t", 0, 10, 500)
    ledger.received_below(A, "t", 0)  # asks again from 0: nothing shown received
    ledger.sent(A, "t", 0, 10, 500)  # the answer starts over
    assert ledger.room(A) == 0
    ledger.received_below(A, "t", 10)  # both copies are behind it now
    assert ledger.in_flight(A) == 0


def test_a_gone_or_new_pipe_clears_what_its_requester_owed():
    ledger = listening(A, B)
    ledger.sent(A, "t", 0, 10, 900)
    ledger.sent(B, "t", 0, 10, 100)
    ledger.listening(A, False)  # unsubscribed: its pipe and its queue are gone
    assert ledger.total() == 100
    ledger.listening(B, True)  # subscribed again: a new pipe, empty
    assert ledger.total() == 0 and ledger.room(B) == 1000


def test_per_pipe_a_requester_listens_until_its_last_pipe_goes():
    """A producer's XPUB_VERBOSER shows each pipe's (un)subscription: a requester that reconnected before its old
    pipe went (a sharded store writer, here) has two, and the old one's going leaves it listening. With
    XPUB_VERBOSE (a store reader's), the one unsubscription means the last pipe went."""
    ledger = InflightLedger(1000, per_pipe=True)
    assert ledger.listening(A, True) and ledger.listening(A, True)
    assert ledger.listening(A, False) and ledger.listens(A)
    assert not ledger.listening(A, False) and not ledger.listens(A)
    assert not ledger.listening(A, False) and not ledger.listens(A)  # (one too many: still none, never below)
    assert ledger.listening(A, True) and ledger.listens(A)
    verbose = InflightLedger(1000)
    assert verbose.listening(A, True) and verbose.listening(A, True)
    assert not verbose.listening(A, False) and not verbose.listens(A)


def test_per_pipe_a_requester_reads_keys_until_its_last_pipe_goes():
    """The same for what a requester reads (bulk.Negotiated): the old pipe's unsubscription of V, coming after
    the new pipe's subscription, left a producer answering a store writer without keys (a compacted CDC topic
    whose store then never compacted those records)."""
    from dafka.protocol import bulk

    def sub(subscribe: bool) -> proto.Subscription:
        return proto.decode_subscription(bytes([subscribe]) + proto.subscription(proto.DIRECT_KEYED_RECORDS, A,
                                                                                 exact=True))

    negotiated = bulk.Negotiated(per_pipe=True)
    for subscribe in (True, True, False):
        negotiated.on_subscription(sub(subscribe))
    assert A in negotiated.keyed
    negotiated.on_subscription(sub(False))
    assert A not in negotiated.keyed
    verbose = bulk.Negotiated()
    for subscribe in (True, True, False):
        verbose.on_subscription(sub(subscribe))
    assert A not in verbose.keyed


def test_only_listeners_are_charged():
    """libzmq queues nothing for an address nobody subscribed: a FETCH that
    arrives before its requester's subscription, or one from an address
    nobody listens to, must leave nothing owed (and nothing to leak)."""
    ledger = listening()
    ledger.sent(A, "t", 0, 10, 5000)
    assert ledger.total() == 0 and ledger.room(A) > 1000
    ledger.listening(A, True)
    assert ledger.room(A) == 1000


def test_zero_limit_means_unlimited():
    ledger = listening(A, limit=0)
    ledger.sent(A, "t", 0, 10, 10**12)
    assert ledger.room(A) > 10**15


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["sent", "fetch"]), st.sampled_from([A, B]), st.sampled_from(["x", "y"]),
                          st.integers(0, 200), st.integers(1, 50), st.integers(0, 5000)), max_size=60))
def test_ledger_never_goes_negative_and_a_fetch_past_everything_clears_it(ops):
    ledger = listening(A, B, limit=10_000)
    for op, requester, partition, seq, span, nbytes in ops:
        if op == "sent":
            ledger.sent(requester, partition, seq, seq + span, nbytes)
        else:
            ledger.received_below(requester, partition, seq)
        assert ledger.in_flight(requester) >= 0
        assert ledger.total() == ledger.in_flight(A) + ledger.in_flight(B)
    for requester in (A, B):
        for partition in ("x", "y"):
            ledger.received_below(requester, partition, 10**6)
    assert ledger.total() == 0


def test_fetch_window_keeps_an_answer_within_the_byte_budget():
    for size in (0, 10, 100, 1000, 100_000, 1 << 20):
        count = fetch_window(8 << 20, size)
        assert count >= 1
        assert count == 1 or count * (size + MESSAGE_OVERHEAD) <= 8 << 20
        # DIRECT-RECORDS charge each record its content and a 4-byte length, each message its frames
        # and MESSAGE_OVERHEAD: a bulk window of 8 MiB is charged at most 8 MiB and a few messages.
        bulk = fetch_window(8 << 20, size, bulk=True)
        assert bulk >= count
        assert bulk == 1 or bulk * (size + 4) <= 8 << 20


# -- the producer's answers -------------------------------------------------------


def fetch(requester, seq, count):
    return proto.FetchMsg(P, requester, "t", seq, count)


def subscription(requester: str, subscribe: bool = True) -> proto.Subscription:
    flag = b"\x01" if subscribe else b"\x00"
    return proto.decode_subscription(flag + proto.subscription(proto.DIRECT_RECORD, requester, exact=True))


def producer(records: int, budget: int) -> ProducerState:
    state = ProducerState(P, "t", min_acks=0, max_unacked=records, fetch_inflight_bytes=budget)
    for i in range(records):
        state.publish(b"%06d" % i)
    for requester in (A, B):
        state.on_subscription(subscription(requester))
    return state


def answered(state: ProducerState) -> list[tuple[str, int]]:
    """(requester, sequence) of every DIRECT-RECORD the state sends now."""
    out = []
    for frame, _ in state.fetch_answers(budget=10**9):
        msg = proto.decode([frame, b""])
        out.append((msg.topic, msg.sequence))
    return out


def test_an_idle_requester_gets_one_budget_however_often_it_asks():
    state = producer(1000, budget=20 * (100 + MESSAGE_OVERHEAD))
    state.on_fetch(fetch(A, 0, proto.MAX_COUNT))
    first = answered(state)
    assert 15 <= len(first) <= 25 and [s for _, s in first] == list(range(len(first)))
    for _ in range(5):  # asks again and again, never showing progress
        state.on_fetch(fetch(A, 0, proto.MAX_COUNT))
        assert answered(state) == [], "repeated FETCHes must not multiply what is queued"
    assert state.ledger.in_flight(A) < state.ledger.limit + 100 + MESSAGE_OVERHEAD + 64


def test_a_fetch_that_shows_progress_frees_room_for_the_rest():
    state = producer(100, budget=10 * (100 + MESSAGE_OVERHEAD))
    state.on_fetch(fetch(A, 0, 100))
    got = [s for _, s in answered(state)]
    assert answered(state) == [], "paused until the requester shows what arrived"
    while got[-1] < 99:
        state.on_fetch(fetch(A, got[-1] + 1, 100 - got[-1] - 1))
        more = [s for _, s in answered(state)]
        assert more and more[0] == got[-1] + 1
        got += more
    assert got == list(range(100)) and not state.answering


def test_a_paused_requester_does_not_hold_others_back():
    state = producer(100, budget=10 * (100 + MESSAGE_OVERHEAD))
    state.on_fetch(fetch(A, 0, 100))
    answered(state)
    state.on_fetch(fetch(B, 50, 5))
    assert answered(state) == [(B, s) for s in range(50, 55)]


def test_an_unsubscribed_requester_is_forgotten():
    state = producer(100, budget=10 * (100 + MESSAGE_OVERHEAD))
    state.on_fetch(fetch(A, 0, 100))
    answered(state)
    assert not state.on_subscription(subscription(A, subscribe=False))
    assert state.ledger.in_flight(A) == 0 and not state.answering
