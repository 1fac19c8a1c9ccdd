"""The mirror's decisions (dafka.mirror.state) and its provenance records, without sockets."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dafka.mirror.provenance import MalformedProvenance, Provenance, mirror_address
from dafka.mirror.state import PROVENANCE_TOPIC, MirrorState, Phase, Selection
from dafka.core.addresses import is_tagged_producer

P = "A" * 32
KEY = ("orders", P)


def copying(state: MirrorState, head: int = -1, now: float = 0.0) -> None:
    if head >= 0:
        state.on_own_provenance(KEY)
    state.on_records("orders", P, 0, [b"x"], now)
    assert [p.key for p in state.take_resumes()] == [KEY]
    resumed = state.on_resumed(KEY, head, now)
    assert resumed.seek == head + 1


def test_selection_by_name_prefix_or_all_never_the_provenance_topic():
    with pytest.raises(ValueError, match="choose what to mirror"):
        Selection()
    assert Selection(topics=("orders",)).wants("orders") and not Selection(topics=("orders",)).wants("order")
    by_prefix = Selection(prefixes=("shop.", "__dafka_offsets."))
    assert by_prefix.wants("shop.orders") and by_prefix.wants("__dafka_offsets.billing")
    assert not by_prefix.wants("shopping")
    assert Selection(every=True).wants("__dafka_offsets.g")
    assert not Selection(every=True).wants(PROVENANCE_TOPIC)


def test_a_new_partition_resumes_first_then_copies_each_record_at_its_own_offset():
    state = MirrorState(Selection(topics=("orders",)))
    assert state.on_records("orders", P, 0, [b"a", b"b"], 0.0) is None  # waits for the target's head
    assert state.on_records("other", P, 0, [b"a"], 0.0) is None and ("other", P) not in state.partitions
    assert state.dropped == 2
    (p,) = state.take_resumes()
    resumed = state.on_resumed(KEY, 4, 1.0)
    assert resumed.seek is None and not resumed.claim  # the target holds 0..4, and not from this mirror
    assert p.phase is Phase.SKIPPED

    state = MirrorState(Selection(topics=("orders",)))
    copying(state)
    assert state.partitions[KEY].phase is Phase.COPYING
    copy = state.on_records("orders", P, 0, [b"a", b"b", b"c"], 1.0)
    assert (copy.first, list(copy.values)) == (0, [b"a", b"b", b"c"])
    # Met again after the seek: only what is new is copied; what was copied already, never.
    copy = state.on_records("orders", P, 1, [b"b", b"c", b"d"], 1.0)
    assert (copy.first, list(copy.values)) == (3, [b"d"])
    assert state.on_records("orders", P, 0, [b"a"], 1.0) is None


def test_an_owned_partition_continues_after_the_target_head():
    state = MirrorState(Selection(topics=("orders",)))
    state.on_own_provenance(KEY)
    state.on_records("orders", P, 0, [b"a"], 0.0)
    state.take_resumes()
    resumed = state.on_resumed(KEY, 99, 0.0)
    assert (resumed.seek, resumed.claim) == (100, False)
    assert state.on_records("orders", P, 99, [b"old"], 0.0) is None
    copy = state.on_records("orders", P, 100, [b"new"], 0.0)
    assert copy.first == 100


def test_an_empty_target_partition_is_claimed_before_anything_is_copied():
    state = MirrorState(Selection(topics=("orders",)))
    state.on_records("orders", P, 0, [b"a"], 0.0)
    state.take_resumes()
    assert state.on_resumed(KEY, -1, 0.0).claim


def test_a_gap_in_the_source_stops_the_partition():
    state = MirrorState(Selection(topics=("orders",)))
    copying(state, head=9)
    assert state.on_records("orders", P, 15, [b"x"], 0.0) is None
    assert state.partitions[KEY].phase is Phase.GAP and state.gaps == 1
    assert "retention" in state.partitions[KEY].reason


def test_a_partition_held_by_another_writer_is_a_loop_when_the_source_says_it_is_a_copy():
    state = MirrorState(Selection(topics=("orders",)), conflict_grace=5.0)
    state.on_records("orders", P, 0, [b"a"], 0.0)
    state.take_resumes()
    state.on_resumed(KEY, 10, 0.0)
    assert state.partitions[KEY].phase is Phase.SKIPPED
    assert state.tick(4.9) == []
    state.on_source_provenance(KEY, "site-b", 4.9)  # (late: the source's provenance came after the records)
    assert state.partitions[KEY].phase is Phase.LOOPED
    assert state.tick(100.0) == [] and state.conflicts == 0


def test_a_partition_held_by_another_writer_and_no_copy_is_a_conflict_after_the_grace():
    state = MirrorState(Selection(topics=("orders",)), conflict_grace=5.0)
    state.on_records("orders", P, 0, [b"a"], 0.0)
    state.take_resumes()
    state.on_resumed(KEY, 10, 0.0)
    (conflict,) = state.tick(5.0)
    assert conflict.partition.phase is Phase.CONFLICT and state.conflicts == 1
    assert "0..10" in conflict.reason
    assert state.on_records("orders", P, 11, [b"b"], 6.0) is None  # never copied


def test_a_live_writer_in_the_target_is_a_conflict_unless_the_partition_is_a_copy_from_there():
    state = MirrorState(Selection(topics=("orders",)))
    copying(state)
    assert state.on_claimed(KEY, "beaconed by tcp://x:1").partition.phase is Phase.CONFLICT
    state = MirrorState(Selection(topics=("orders",)))
    state.on_source_provenance(KEY, "site-b", 0.0)
    state.on_records("orders", P, 0, [b"a"], 0.0)
    state.take_resumes()
    assert state.on_claimed(KEY, "its own producer") is None
    assert state.partitions[KEY].phase is Phase.LOOPED and state.conflicts == 0


def test_a_target_that_does_not_answer_is_tried_again():
    state = MirrorState(Selection(topics=("orders",)))
    state.on_records("orders", P, 0, [b"a"], 0.0)
    state.take_resumes()
    state.on_resume_failed(KEY)
    assert [p.key for p in state.take_resumes()] == [KEY]


def test_lag_in_records_and_seconds_follows_the_acks():
    state = MirrorState(Selection(topics=("orders",)))
    copying(state, now=0.0)
    p = state.partitions[KEY]
    state.on_records("orders", P, 0, [b"a"] * 10, 1.0)
    state.on_source_head(KEY, 19, 2.0)
    assert p.lag() == 20 and state.lag_seconds(p, 3.0) == pytest.approx(3.0)
    state.on_acked(KEY, 9)
    assert p.lag() == 10 and state.lag_seconds(p, 3.0) == pytest.approx(1.0)  # the oldest left: seen at 2.0
    state.on_acked(KEY, 19)
    assert p.lag() == 0 and state.lag_seconds(p, 3.0) == 0.0
    assert state.copied == 20
    assert state.phases()["copying"] == 1


def test_provenance_records_round_trip_and_bad_ones_are_named():
    record = Provenance("orders", P, "site-a", "a-to-b")
    assert Provenance.decode(record.encode()) == record
    assert Provenance.decode(b'{"v":2,"topic":"t","partition":"p","source":"s","mirror":"m","new":1}').topic == "t"
    for bad, words in ((b"nope", "not JSON"), (b"[]", "no version"), (b'{"v":1,"topic":"t"}', "partition")):
        with pytest.raises(MalformedProvenance, match=words):
            Provenance.decode(bad)
    address = mirror_address("a-to-b")
    assert address == mirror_address("a-to-b") != mirror_address("b-to-a") and is_tagged_producer(address)


@given(st.binary(max_size=300))
def test_the_provenance_decoder_takes_any_bytes(value):
    try:
        record = Provenance.decode(value)
    except MalformedProvenance:
        return
    assert all(isinstance(v, str) and v for v in (record.topic, record.partition, record.source, record.mirror))


@given(st.dictionaries(st.sampled_from(["v", "topic", "partition", "source", "mirror"]),
                       st.one_of(st.integers(), st.text(max_size=5), st.none(), st.lists(st.integers(), max_size=2))))
def test_the_provenance_decoder_takes_any_json_object(doc):
    import json

    try:
        Provenance.decode(json.dumps(doc).encode())
    except MalformedProvenance:
        pass


def test_owned_partitions_are_resumed_before_their_records_come():
    state = MirrorState(Selection(topics=("orders",)))
    state.on_own_provenance(KEY)
    state.on_own_provenance(("elsewhere", P))  # owned, but no longer selected
    assert [p.key for p in state.resume_owned()] == [KEY]
    state.take_resumes()
    assert state.on_resumed(KEY, 41, 0.0).seek == 42
    assert state.on_records("orders", P, 0, [b"old"], 0.0) is None and state.dropped == 0


def test_a_partition_rewinds_to_what_the_target_producer_took():
    state = MirrorState(Selection(topics=("orders",)))
    copying(state)
    state.on_records("orders", P, 0, [b"a"] * 10, 0.0)
    state.rewind(KEY, 6)  # its buffer took 0..5 only
    copy = state.on_records("orders", P, 6, [b"b"] * 4, 0.0)
    assert (copy.first, len(copy.values)) == (6, 4)
