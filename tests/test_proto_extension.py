"""DIRECT-TAIL, this project's retention signal (rfc/dafka.md): framed like
DIRECT-HEAD with id 'T', never subscribed to by reference consumers."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dafka import protocol as proto
from wire_vectors import load_vectors


def test_direct_tail_is_a_direct_head_with_another_id():
    direct_head = load_vectors()["DIRECT_HEAD"][0]
    tail = proto.DirectTailMsg("consumer-1", "producer-1", "hello", 0x0102030405060708)
    assert proto.encode(tail) == [b"T" + direct_head[1:]]
    assert proto.decode([b"T" + direct_head[1:]]) == tail


def test_reference_consumer_subscriptions_never_match_direct_tail():
    frame = proto.encode(proto.DirectTailMsg("consumer-1", "producer-1", "hello", 1))[0]
    reference_prefixes = [b"D" + b"consumer-1", b"E" + b"consumer-1", b"L" + b"consumer-1", b"Mhello", b"Hhello"]
    assert not any(frame.startswith(p) for p in reference_prefixes)


@given(st.text(max_size=60).filter(lambda s: "\0" not in s), st.integers(0, 2**64 - 1))
def test_direct_tail_round_trip(topic, seq):
    msg = proto.DirectTailMsg(topic, "P" * 32, "subject", seq)
    assert proto.decode(proto.encode(msg)) == msg


def test_direct_tail_malformed():
    with pytest.raises(proto.MalformedMessage):
        proto.decode([b"Tc\x00\x01\x01P\x01s"])
