"""The gateway's group coordinator and idempotent sequences, without sockets (kafka/groups.py, kafka/idempotence.py)."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from dafka.kafka import errors
from dafka.kafka.groups import COMPLETING, EMPTY, STABLE, Coordinator
from dafka.kafka.idempotence import APPEND, DUPLICATE, REFUSE, SEQUENCE_WRAP, Sequences

PROTOCOLS = [("range", b"meta")]


def SYNCED(assignment: bytes) -> dict:  # noqa: N802 - reads as a constant
    return {"throttle_time_ms": 0, "error_code": 0, "assignment": assignment}


def join(c: Coordinator, token, member="", now=0.0, protocols=PROTOCOLS, session=10.0, instance=None):
    return dict(c.join(token, "g", member, instance, "client", "", "consumer", protocols, session, session, now))


def two_members(c: Coordinator):
    first = join(c, "j1")["j1"]
    assert first["error_code"] == 0 and first["generation_id"] == 1 and first["leader"] == first["member_id"]
    a = first["member_id"]
    assert dict(c.sync("s1", "g", 1, a, None, {a: b"all"}, 0.1)) == {"s1": SYNCED(b"all")}
    assert c.groups["g"].state == STABLE
    # A second member: the first hears of the rebalance at its heartbeat and rejoins.
    assert join(c, "j2", now=0.2) == {}
    assert c.heartbeat("g", 1, a, None, 0.3) == errors.REBALANCE_IN_PROGRESS
    answers = join(c, "j1b", a, now=0.4)
    assert answers["j1b"]["generation_id"] == 2 and len(answers["j1b"]["members"]) == 2  # the leader's view
    b = answers["j2"]["member_id"]
    assert answers["j2"]["members"] == [] and answers["j2"]["leader"] == a
    return a, b


def test_a_group_of_two_joins_syncs_the_leaders_assignments_and_heartbeats():
    c = Coordinator()
    a, b = two_members(c)
    assert c.sync("sb", "g", 2, b, None, {}, 0.5) == []  # waits for the leader's assignments
    assert c.groups["g"].state == COMPLETING
    out = dict(c.sync("sa", "g", 2, a, None, {a: b"p0", b: b"p1"}, 0.6))
    assert out == {"sa": SYNCED(b"p0"), "sb": SYNCED(b"p1")}
    assert c.heartbeat("g", 2, b, None, 0.7) == 0
    assert c.heartbeat("g", 1, b, None, 0.7) == errors.ILLEGAL_GENERATION
    assert c.check_commit("g", 2, a, 0.8) == 0
    assert c.check_commit("g", 1, a, 0.8) == errors.ILLEGAL_GENERATION
    assert c.check_commit("g", 2, "stranger", 0.8) == errors.UNKNOWN_MEMBER_ID


def test_a_silent_member_is_removed_after_its_session_and_the_other_rejoins_alone():
    c = Coordinator()
    a, b = two_members(c)
    c.sync("sa", "g", 2, a, None, {a: b"p0", b: b"p1"}, 0.5)
    c.sync("sb", "g", 2, b, None, {}, 0.5)
    for t in (1.0, 5.0, 9.0):
        assert c.heartbeat("g", 2, a, None, t) == 0
    assert c.tick(11.0) == []  # b's session (10 s) lapsed: gone, and the group rebalances
    assert b not in c.groups["g"].members
    assert c.heartbeat("g", 2, a, None, 11.1) == errors.REBALANCE_IN_PROGRESS
    answer = join(c, "j", a, now=11.2)["j"]
    assert answer["generation_id"] == 3 and [m["member_id"] for m in answer["members"]] == [a]


def test_leave_group_rebalances_and_the_last_one_out_empties_the_group():
    c = Coordinator()
    a, b = two_members(c)
    codes, _ = c.leave("g", [(b, None)], 1.0)
    assert codes == [0] and b not in c.groups["g"].members
    codes, _ = c.leave("g", [(a, None)], 1.1)
    assert codes == [0] and c.groups["g"].state == EMPTY
    assert c.leave("g", [("nobody", None)], 1.2)[0] == [errors.UNKNOWN_MEMBER_ID]


def test_a_static_member_back_under_a_new_id_takes_its_place_without_a_rebalance():
    c = Coordinator()
    first = join(c, "j1", instance="i-1")["j1"]
    a = first["member_id"]
    c.sync("s", "g", 1, a, None, {a: b"x"}, 0.1)
    other = join(c, "j2", now=0.2, instance="i-2")
    assert other == {}
    answers = join(c, "j1b", a, now=0.3, instance="i-1")
    b = answers["j2"]["member_id"]
    c.sync("sb", "g", 2, b, "i-2", {}, 0.4)
    c.sync("sa", "g", 2, a, "i-1", {a: b"p0", b: b"p1"}, 0.4)
    back = join(c, "j2b", now=0.5, instance="i-2")["j2b"]  # i-2 restarted: a new member id, no rebalance
    assert back["error_code"] == 0 and back["generation_id"] == 2 and back["member_id"] != b
    assert b not in c.groups["g"].members and c.heartbeat("g", 2, b, "i-2", 0.6) != 0


def test_a_join_without_a_common_protocol_or_with_a_bad_session_is_refused():
    c = Coordinator()
    join(c, "j1")
    assert join(c, "j2", protocols=[("roundrobin", b"")])["j2"]["error_code"] == errors.INCONSISTENT_GROUP_PROTOCOL
    assert dict(c.join("j3", "", "", None, "c", "", "consumer", PROTOCOLS, 10, 10, 0))["j3"]["error_code"] == \
        errors.INVALID_GROUP_ID


def test_sequences_append_answer_retries_and_refuse_gaps_and_old_epochs():
    s = Sequences()
    key, pid = ("t", 0), s.new_id()
    assert s.check(key, pid, 0, 0, 3) == (APPEND, -1)
    s.record(key, pid, 0, 0, 3, 100)
    assert s.check(key, pid, 0, 0, 3) == (DUPLICATE, 100)
    assert s.check(key, pid, 0, 3, 2) == (APPEND, -1)
    s.record(key, pid, 0, 3, 2, 103)
    assert s.check(key, pid, 0, 0, 3) == (DUPLICATE, 100)  # still among the last 5
    assert s.check(key, pid, 0, 7, 1) == (REFUSE, errors.OUT_OF_ORDER_SEQUENCE_NUMBER)
    assert s.check(key, pid, 0, 1, 1) == (REFUSE, errors.DUPLICATE_SEQUENCE_NUMBER)
    s.record(key, pid, 1, 0, 1, 105)  # a bumped epoch starts again at 0
    assert s.check(key, pid, 0, 5, 1) == (REFUSE, errors.INVALID_PRODUCER_EPOCH)
    assert s.check(key, -1, -1, -1, 4) == (APPEND, -1)  # not idempotent: always appended
    assert s.new_id() != pid


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=1, max_size=40), st.integers(0, SEQUENCE_WRAP - 1),
       st.lists(st.integers(0, 39), max_size=20))
def test_fuzz_every_batch_is_appended_once_whatever_the_retries_and_across_the_wrap(sizes, start, retries):
    s, key, pid = Sequences(), ("t", 0), 7
    s.record(key, pid, 0, (start - 1) % SEQUENCE_WRAP, 1, 0)
    seq, offset, sent = start, 1, []
    for i, n in enumerate(sizes):
        assert s.check(key, pid, 0, seq, n) == (APPEND, -1)
        s.record(key, pid, 0, seq, n, offset)
        sent.append((seq, n, offset))
        for r in retries:
            if r == i:  # a retry of a batch among the last five answers its offset
                for back in sent[-5:]:
                    assert s.check(key, pid, 0, back[0], back[1]) == (DUPLICATE, back[2])
        seq, offset = (seq + n) % SEQUENCE_WRAP, offset + n


def test_noted_batches_read_back_answer_their_retries_unless_their_records_are_missing_or_voided():
    from dafka.kafka.idempotence import BatchEntry, decode_entry
    entries = [BatchEntry(0, 7, 0, 0, 3, 0), BatchEntry(0, 7, 0, 3, 2, 3), BatchEntry(1, 7, 0, 0, 4, 0),
               BatchEntry(0, 7, 0, 5, 2, 5),  # noted, then the gateway died: partition 0's head is 4
               BatchEntry(1, 8, 0, 0, 1, 4), BatchEntry(1, 8, 0, 0, -1, 4)]  # noted, then voided
    assert [decode_entry(e.encode()) for e in entries] == entries
    sequences = Sequences()
    assert sequences.restore("t", entries, {0: 4, 1: 9}) == 3
    assert sequences.check(("t", 0), 7, 0, 3, 2) == (DUPLICATE, 3)
    assert sequences.check(("t", 0), 7, 0, 0, 3) == (DUPLICATE, 0)
    assert sequences.check(("t", 0), 7, 0, 5, 2) == (APPEND, -1)  # its records are not there: appended
    assert sequences.check(("t", 1), 7, 0, 0, 4) == (DUPLICATE, 0)
    assert sequences.check(("t", 1), 8, 0, 0, 1) == (APPEND, -1)  # voided
    assert Sequences().restore("t", entries, {}) == 0  # (a partition not resumed: nothing of it)


def test_a_batch_partly_stored_when_its_gateway_died_appends_only_the_rest_on_its_retry():
    """A batch's records may leave in more than one message: the gateway died after offsets 5 and 6 of a
    noted batch of 4 were stored (head 6).  Appended whole again, its retry stored 5 and 6 twice (nemesis,
    seed 58: one record read twice); it appends the other two now, and answers with the batch's first
    offset."""
    from dafka.kafka.idempotence import PARTIAL, BatchEntry
    key, pid = ("t", 0), 7
    sequences = Sequences()
    assert sequences.restore("t", [BatchEntry(0, pid, 0, 0, 5, 0), BatchEntry(0, pid, 0, 5, 4, 5)], {0: 6}) == 2
    assert sequences.check(key, pid, 0, 0, 5) == (DUPLICATE, 0)
    assert sequences.check(key, pid, 0, 5, 4) == (PARTIAL, 2)
    assert sequences.check(key, pid, 1, 5, 4) == (REFUSE, errors.OUT_OF_ORDER_SEQUENCE_NUMBER)  # (another epoch)
    from dafka.kafka.batches import Batch
    retried = Batch(0, 0, 3, 0, 0, pid, 0, 5, [], count=4, values=[b"a", b"b", b"c", b"d"],
                    keys=[b"ka", None, b"kc", b"kd"], record_attributes=[None] * 4)
    offset, present, rest = sequences.take_partial(key, pid, retried)  # the retry appends the 2 not stored
    assert (offset, present) == (5, 2) and rest.values == [b"c", b"d"] and rest.keys == [b"kc", b"kd"]
    assert rest.count == 2 and rest.base_sequence == 7 and len(rest.record_attributes) == 2
    sequences.record(key, pid, 0, 5, 4, 5)  # the rest appended: the whole batch answers its retries again
    assert sequences.check(key, pid, 0, 5, 4) == (DUPLICATE, 5) and sequences.check(key, pid, 0, 9, 1) == (APPEND, -1)
    sequences.restore("t", [BatchEntry(0, pid, 0, 9, 3, 9)], {0: 10})
    sequences.forget(key)  # another gateway writes the partition now
    assert sequences.partials == {} and sequences.check(key, pid, 0, 9, 3) == (APPEND, -1)


@given(st.one_of(st.binary(max_size=80), st.lists(st.one_of(st.integers(-2 ** 64, 2 ** 64), st.booleans(),
                                                             st.none(), st.text(max_size=3)), max_size=7).map(
    lambda fields: __import__("json").dumps(fields).encode())))
def test_fuzz_the_batch_entry_decoder_raises_value_error_or_decodes(value):
    from dafka.kafka.idempotence import decode_entry
    try:
        entry = decode_entry(value)
    except ValueError:
        return
    assert decode_entry(entry.encode()) == entry and entry.count != 0
