"""The Kafka numbers of the partitions dafka producers write (kafka/numbering.py), and how the mapping treats
a topic that has them, without sockets."""

from __future__ import annotations

import json

from hypothesis import given, strategies as st
from test_kafka_protocol import _decode, request_frame

from dafka.kafka import batches, errors
from dafka.kafka.mapping import Appends, Mapping, TopicView, address_of
from dafka.kafka.messages import PRODUCE, read_request
from dafka.kafka.numbering import Entry, Numbers, decode_entry

A, B, C, D = ("A" * 32, "B" * 32, "C" * 32, "D" * 32)


def test_foreign_partitions_take_the_next_free_numbers_in_address_order_after_the_gateways_and_keep_them():
    numbers = Numbers()
    entries = numbers.assign("t", [C, A], first=2)
    assert entries == [Entry("t", A, 2), Entry("t", C, 3)]
    assert numbers.number("t", A) is None  # (given only once written: the server takes them once acked)
    for entry in entries:
        assert numbers.take(entry)
    assert numbers.assign("t", [A, C], first=2) == []
    assert numbers.assign("t", [B, A, D], first=2) == [Entry("t", B, 4), Entry("t", D, 5)]  # never renumbered
    assert numbers.assign("other", [B], first=0) == [Entry("other", B, 0)]
    gateway = [address_of("t", 0), address_of("t", 1)]
    assert numbers.slots("t", gateway) == [*gateway, A, C]
    numbers.take(Entry("t", D, 5))  # 4 was given to a partition that is gone: an empty slot, never reused
    assert numbers.slots("t", gateway) == [*gateway, A, C, None, D]
    assert numbers.assign("t", [B], first=2) == [Entry("t", B, 6)]


def test_the_first_entry_read_back_for_an_address_or_a_number_wins():
    numbers = Numbers()
    assert numbers.take(Entry("t", A, 0))
    assert not numbers.take(Entry("t", A, 1))  # (a second entry for A)
    assert not numbers.take(Entry("t", B, 0))  # (a second partition at 0)
    assert numbers.number("t", A) == 0 and numbers.number("t", B) is None


def test_an_entry_round_trips_and_its_key_is_one_a_partition():
    entry = Entry("orders", A, 7)
    assert decode_entry(entry.encode()) == entry
    assert entry.key == b"orders/" + A.encode() != Entry("orders", B, 7).key


_ANY = st.one_of(st.integers(), st.text(max_size=8), st.booleans(), st.none(), st.floats(allow_nan=False))


@given(st.one_of(st.binary(max_size=200),
                 st.dictionaries(st.text(max_size=8), _ANY, max_size=4).map(lambda d: json.dumps(d).encode()),
                 st.fixed_dictionaries({"topic": _ANY, "address": _ANY, "number": _ANY}).map(
                     lambda d: json.dumps(d).encode())))
def test_fuzz_the_entry_decoder_raises_value_error_or_decodes(value):
    try:
        entry = decode_entry(value)
    except ValueError:
        return
    assert decode_entry(entry.encode()) == entry and 0 <= entry.number < 2 ** 31


def test_a_kafka_producer_is_refused_a_topic_with_foreign_partitions_whole_and_told_why():
    batch = batches.write_batch(0, [(0, 5, None, b"v")])
    body = {"transactional_id": None, "acks": -1, "timeout_ms": 1000, "topic_data": [
        {"name": "t", "partition_data": [{"index": 0, "records": batch}, {"index": 1, "records": batch}]}]}
    request = read_request(request_frame(PRODUCE, 9, body))
    mixed = TopicView("t", [3, 8], addresses=[address_of("t", 0), A], writable=1)
    assert mixed.foreign and mixed.address(1) == A
    outcome = Mapping("h", 1).handle(request, {"t": mixed})
    assert isinstance(outcome, Appends) and outcome.appends == []
    assert outcome.refused == {("t", 0): errors.INVALID_TOPIC_EXCEPTION, ("t", 1): errors.INVALID_TOPIC_EXCEPTION}
    answer = _decode(PRODUCE, 9, Mapping("h", 1).produce_response(
        request, {key: (code, -1) for key, code in outcome.refused.items()}, outcome.messages))
    parts = answer["responses"][0]["partition_responses"]
    assert [p["error_code"] for p in parts] == [errors.INVALID_TOPIC_EXCEPTION] * 2
    assert all("dafka producers write" in p["error_message"] for p in parts)
    plain = Mapping("h", 1).handle(request, {"t": TopicView("t", [3, 8])})
    assert isinstance(plain, Appends) and len(plain.appends) == 2 and not TopicView("t", [3]).foreign
