"""Offsets topics stay bounded (issue 24, rfc 14.6): the commit records, and
the store's compaction of them, on a real LevelDB without sockets."""

from __future__ import annotations

import msgpack
import plyvel
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dafka import protocol as proto
from dafka.protocol.commits import decode_commits, encode_commits, is_snapshot, offsets_topic
from dafka.store import compaction, keys
from dafka.store.writer_state import WriterState
from test_store_state import _apply as apply

W = "W" * 32
A = "A" * 32
B = "B" * 32
TOPIC = offsets_topic("billing")


def record(subject: str, address: str, seq: int, value: bytes) -> tuple[bytes, bytes]:
    frames = proto.encode(proto.RecordMsg(subject, address, subject, seq, value))
    return frames[0], frames[1]


def commits(member: str, offset: int, snapshot: bool = True) -> bytes:
    return encode_commits(member, {("orders", "P1"): offset, ("orders", "P2"): offset // 2}, snapshot=snapshot)


def write(db, state: WriterState, now_ms: int, *records: tuple[str, str, int, bytes]) -> None:
    for subject, address, seq, value in records:
        state.on_record_frames(*record(subject, address, seq, value))
    batch = state.take_batch(now_ms)
    with db.write_batch() as wb:
        for key, value in zip(batch.keys, batch.values):
            wb.put(key, value)
    state.batch_written(batch)


def stored(db, subject: str, address: str) -> list[int]:
    prefix = keys.partition_prefix(keys.RECORD, subject, address)
    return [keys.seq_of(k[-8:]) for k in db.iterator(prefix=prefix, include_value=False)]


@pytest.fixture
def db(tmp_path):
    d = plyvel.DB(str(tmp_path / "db"), create_if_missing=True)
    yield d
    d.close()


def test_a_snapshot_says_so_and_decodes_like_an_old_commit_record():
    snap = commits(A, 10)
    old = commits(A, 10, snapshot=False)
    assert msgpack.unpackb(old) == [A, [["orders", "P1", 10], ["orders", "P2", 5]]]  # 0.1's format, unchanged
    assert decode_commits(snap) == decode_commits(old) == (A, {("orders", "P1"): 10, ("orders", "P2"): 5})
    assert is_snapshot(snap) and not is_snapshot(old)
    assert not is_snapshot(b"\xc1") and not is_snapshot(msgpack.packb([A, [], 2]))
    with pytest.raises(ValueError):
        decode_commits(msgpack.packb([A, [], 1, 1]))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_commit_decoders_take_any_bytes(value):
    try:
        decode_commits(value)
    except ValueError:
        pass
    assert is_snapshot(value) in (True, False)


def test_only_the_newest_snapshot_of_each_offsets_partition_stays(db):
    state = WriterState(W)
    write(db, state, 1_000, *[(TOPIC, A, seq, commits(A, seq)) for seq in range(50)],
          *[("orders", A, seq, b"data") for seq in range(50)])
    apply(db, compaction.plan(db, state.partitions.values(), 2_000))
    assert stored(db, TOPIC, A) == [49]
    assert stored(db, "orders", A) == list(range(50))  # other topics are not touched
    # later commits: compacted again, once
    write(db, state, 3_000, *[(TOPIC, A, seq, commits(A, seq)) for seq in range(50, 60)])
    cuts = compaction.plan(db, state.partitions.values(), 4_000)
    assert [c.deleted for c in cuts] == [10]
    apply(db, cuts)
    assert stored(db, TOPIC, A) == [59]
    assert compaction.plan(db, state.partitions.values(), 5_000) == []  # nothing new: no work


def test_records_of_old_members_are_not_compacted(db):
    """A 0.1 member writes only what moved: each record is needed."""
    state = WriterState(W)
    write(db, state, 1_000, *[(TOPIC, A, seq, commits(A, seq, snapshot=False)) for seq in range(5)])
    assert compaction.plan(db, state.partitions.values(), 2_000) == []
    assert stored(db, TOPIC, A) == [0, 1, 2, 3, 4]


def test_silent_members_expire_but_the_newest_partition_stays(db):
    state = WriterState(W)
    retention = 10_000
    write(db, state, 1_000, (TOPIC, A, 0, commits(A, 5)))
    write(db, state, 20_000, (TOPIC, B, 0, commits(B, 7)))
    parts = list(state.partitions.values())
    # A's newest record is older than the retention, B's is newer: A goes, B, the topic's newest, stays.
    assert compaction.expired(db, parts, 25_000, retention, now=100.0) == [state.partitions[(TOPIC, A)]]
    # Later still, B is old too, but it is the newest: it stays.
    gone = compaction.expired(db, parts, 1_000_000, retention, now=100.0)
    assert gone == [state.partitions[(TOPIC, A)]]
    # A live member (its HEAD heard within the retention) never expires.
    state.now = 95.0
    state.on_frames(proto.encode(proto.HeadMsg(TOPIC, A, TOPIC, 0)))
    assert compaction.expired(db, parts, 25_000, retention, now=100.0) == []
    assert compaction.expired(db, parts, 25_000, -1, now=200.0) == []  # -1: never


def test_an_expired_partition_is_forgotten_with_every_key(db):
    state = WriterState(W)
    write(db, state, 1_000, *[(TOPIC, A, seq, commits(A, seq)) for seq in range(3)])
    db.put(keys.head_key(TOPIC, A), (2).to_bytes(8, "big"))
    p = state.partitions[(TOPIC, A)]
    doomed = compaction.partition_keys(db, p)
    assert len([k for k in doomed if k.startswith(keys.RECORD)]) == 3 and p.head_key in doomed
    with db.write_batch() as wb:
        for key in doomed:
            wb.delete(key)
    state.forget(p)
    assert list(db.iterator()) == []
    assert (TOPIC, A) not in state.partitions and p not in state.record_prefixes.values()
    # It comes back as a new partition if its member writes again.
    write(db, state, 2_000, (TOPIC, A, 0, commits(A, 9)))
    assert stored(db, TOPIC, A) == [0]
