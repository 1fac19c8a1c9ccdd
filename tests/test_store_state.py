"""The store without sockets: key layout, the writer's state machine, retention planning."""

from __future__ import annotations

import msgpack
import plyvel
import pytest

from dafka import protocol as proto
from dafka.store import keys, retention
from dafka.store.writer_state import WriterState
from wire_vectors import load_vectors

W = "W" * 32  # the writer's address
P = "P" * 32  # a producer
Q = "Q" * 32  # another producer


def rec(seq: int, content: bytes | None = None, subject: str = "hello", address: str = P) -> tuple[bytes, bytes]:
    frames = proto.encode(proto.RecordMsg(subject, address, subject, seq, content if content is not None else b"c%d" % seq))
    return frames[0], frames[1]


def direct(seq: int, to: str = W, subject: str = "hello", address: str = P) -> tuple[bytes, bytes]:
    frames = proto.encode(proto.DirectRecordMsg(to, address, subject, seq, b"c%d" % seq))
    return frames[0], frames[1]


def head(seq: int, subject: str = "hello", address: str = P) -> list[bytes]:
    return proto.encode(proto.HeadMsg(subject, address, subject, seq))


def feed(state: WriterState, *seqs: int, **kw) -> None:
    for seq in seqs:
        state.on_record_frames(*rec(seq, **kw))


def decoded_out(state: WriterState) -> list:
    out = [proto.decode(frames) for frames in state.out]
    state.out.clear()
    return out


def record_seqs(batch, subject: str = "hello", address: str = P) -> list[int]:
    prefix = keys.partition_prefix(keys.RECORD, subject, address)
    return [keys.seq_of(k[-8:]) for k in batch.keys if k.startswith(prefix)]


def write(state: WriterState, unix_ms: int = 1_000):
    batch = state.take_batch(unix_ms)
    assert batch is not None
    state.batch_written(batch)
    return batch


# -- keys ---------------------------------------------------------------------


def test_keys_match_reference_vectors():
    v = load_vectors()
    assert keys.record_key("hello", "producer-1", 0x0102030405060708) == v["LEVELDB_RECORD_KEY"][0]
    assert keys.head_key("hello", "producer-1") == v["LEVELDB_HEAD_KEY"][0]
    assert keys.parse_key(v["LEVELDB_RECORD_KEY"][0]) == (b"M", "hello", "producer-1", 0x0102030405060708)
    assert keys.parse_key(v["LEVELDB_HEAD_KEY"][0]) == (b"H", "hello", "producer-1", None)


def test_writer_state_writes_the_reference_keys():
    """The keys the writer produces (not just the helpers) are the vectors' bytes."""
    v = load_vectors()
    state = WriterState(W)
    state.load("hello", "producer-1", 0x0102030405060707)
    state.on_record_frames(*rec(0x0102030405060708, b"CONTENT", address="producer-1"))
    batch = state.take_batch(5)
    assert batch.keys[0] == v["LEVELDB_RECORD_KEY"][0]
    assert batch.values[0] == b"CONTENT"
    assert batch.keys[1] == v["LEVELDB_HEAD_KEY"][0]
    assert batch.values[1] == (0x0102030405060708).to_bytes(8, "big")
    # the extra stamp entry lives under its own prefix and never under 'M'/'H'
    assert batch.keys[2] == b"thello\0producer-1\0" + (0x0102030405060708).to_bytes(8, "big")
    assert msgpack.unpackb(batch.values[2]) == [0x0102030405060708, 5, len(b"CONTENT")]
    assert len(batch) == 3


def test_parse_key_rejects_keys_outside_the_layout():
    for bad in (b"", b"X", b"Mhello\0p\0\x01", b"Hhello\0p", b"Ma\0b\0c\0" + bytes(8), b"Zab\0c\0"):
        with pytest.raises(ValueError):
            keys.parse_key(bad)


# -- the writer state -----------------------------------------------------------


def test_contiguous_records_are_batched_then_acked_once():
    state = WriterState(W)
    feed(state, 0, 1, 2, 3, 4)
    assert state.out == []  # nothing is ACKed before the write
    batch = state.take_batch(1_000)
    assert record_seqs(batch) == [0, 1, 2, 3, 4]
    assert batch.values[:5] == [b"c0", b"c1", b"c2", b"c3", b"c4"]
    assert state.out == []
    assert state.heads() == {}
    state.batch_written(batch)
    assert decoded_out(state) == [proto.AckMsg(P, "hello", 4)]
    assert state.heads() == {("hello", P): 4}
    assert state.records_written == 5
    assert state.take_batch(2_000) is None


def test_staged_bytes_count_the_open_batch_contents_of_every_partition():
    """The writer stops draining at store/batch_bytes by this count."""
    state = WriterState(W)
    assert state.staged_bytes == 0
    feed(state, 0, 1)  # b"c0", b"c1"
    feed(state, 0, address=Q)
    state.on_record_frames(*rec(2, b"x" * 1000))
    feed(state, 5)  # out of order: kept aside, not in the batch
    assert state.staged_bytes == 2 + 2 + 2 + 1000
    state.batch_written(state.take_batch(1_000))
    assert state.staged_bytes == 0


def test_duplicates_are_dropped():
    state = WriterState(W)
    feed(state, 0, 1, 1, 0)
    write(state)
    feed(state, 1, 2)
    batch = write(state)
    assert record_seqs(batch) == [2]
    assert state.duplicates == 3


def test_gap_sends_fetch_and_buffers_the_out_of_order_records():
    state = WriterState(W)
    state.now = 10.0
    feed(state, 0, 3, 4)
    out = decoded_out(state)
    assert out == [proto.FetchMsg(P, W, "hello", 1, 2)]  # only one FETCH for the gap
    batch = write(state)
    assert record_seqs(batch) == [0]
    assert decoded_out(state) == [proto.AckMsg(P, "hello", 0)]
    assert state.buffered == 2
    state.on_record_frames(*direct(1))
    state.on_record_frames(*direct(2))
    batch = write(state)
    assert record_seqs(batch) == [1, 2, 3, 4]  # the buffered ones are flushed in order
    assert decoded_out(state) == [proto.AckMsg(P, "hello", 4)]
    assert state.buffered == 0


def test_unknown_partition_fetches_from_zero():
    state = WriterState(W)
    feed(state, 7)
    assert decoded_out(state) == [proto.FetchMsg(P, W, "hello", 0, 7)]  # up to the buffered one
    assert state.take_batch(1) is None


def test_out_of_order_buffer_is_bounded():
    state = WriterState(W, max_buffered=3)
    feed(state, 0)
    feed(state, 2, 3, 9, 4)  # only sequences up to head + 3 are kept
    assert state.buffered == 2
    assert state.dropped == 2
    feed(state, 1)
    batch = write(state)
    assert record_seqs(batch) == [0, 1, 2, 3]


def test_out_of_order_buffer_is_bounded_in_bytes_over_every_partition():
    from dafka.store.writer_state import PENDING_OVERHEAD

    cost = 100 + PENDING_OVERHEAD
    state = WriterState(W, max_pending_bytes=3 * cost)
    feed(state, 0)
    feed(state, 0, address=Q)
    feed(state, 2, 3, content=b"x" * 100)
    feed(state, 5, 6, content=b"x" * 100, address=Q)  # the third fits, the fourth does not
    feed(state, 2, content=b"x" * 100)  # one already buffered costs nothing more
    assert state.buffered == 3 and state.pending_bytes == 3 * cost
    assert state.dropped == 1 and state.duplicates == 1
    feed(state, 1, content=b"x" * 100)  # fills P's gap: its buffered records are written, their bytes freed
    assert state.pending_bytes == cost
    batch = write(state)
    assert record_seqs(batch) == [0, 1, 2, 3]
    state.on_frames(list(direct(1, address=Q)))
    feed(state, 2, 3, 4, address=Q)
    assert state.pending_bytes == 0 and state.buffered == 0
    batch = write(state)
    assert record_seqs(batch, address=Q) == [1, 2, 3, 4, 5]  # 6 was dropped: fetched again


def test_direct_records_for_another_writer_are_ignored():
    state = WriterState(W)
    state.on_record_frames(*direct(0, to="X" * 32))
    assert state.take_batch(1) is None
    state.on_record_frames(*direct(0))
    assert record_seqs(state.take_batch(1)) == [0]


def test_one_ack_per_partition_per_batch():
    state = WriterState(W)
    for seq in range(3):
        feed(state, seq)
        feed(state, seq, address=Q)
        feed(state, seq, subject="other")
    state.take_batch(1)
    batch = state.take_batch(1)
    assert batch is None
    feed(state, 3)
    feed(state, 3, address=Q)
    batch = state.take_batch(1)
    assert state.out == []
    state.batch_written(batch)
    assert sorted(decoded_out(state), key=repr) == sorted(
        [proto.AckMsg(P, "hello", 3), proto.AckMsg(Q, "hello", 3)], key=repr
    )


def test_head_fetches_what_is_missing():
    state = WriterState(W)
    state.now = 1.0
    state.on_frames(head(9))
    assert decoded_out(state) == [proto.FetchMsg(P, W, "hello", 0, 10)]
    feed(state, *range(5))
    write(state)
    decoded_out(state)
    state.now = 5.0  # the first FETCH is stale by now
    state.on_frames(head(9))
    out = decoded_out(state)
    assert proto.FetchMsg(P, W, "hello", 5, 5) in out
    assert proto.AckMsg(P, "hello", 4) in out  # a HEAD repeats the ACK of what is written
    feed(state, *range(5, 10))
    write(state)
    decoded_out(state)
    state.on_frames(head(9))
    assert decoded_out(state) == [proto.AckMsg(P, "hello", 9)]  # nothing to fetch


def test_an_idle_partitions_heads_are_re_acked_less_and_less_often():
    """A HEAD re-ACKs what is written (an ACK lost would never be repeated otherwise): at once when there
    is something new, then after 2, 4, ... up to REACK_EVERY HEADs of the same, so that an idle
    producer is not woken each HEAD to hear what it knows."""
    from dafka.store.writer_state import REACK_EVERY

    state = WriterState(W)
    feed(state, *range(10))
    write(state)
    decoded_out(state)
    acked_at = []
    for n in range(200):
        state.on_frames(head(9))
        if decoded_out(state) == [proto.AckMsg(P, "hello", 9)]:
            acked_at.append(n)
    assert acked_at[:6] == [0, 2, 6, 14, 30, 62]
    assert all(b - a == REACK_EVERY for a, b in zip(acked_at[5:], acked_at[6:]))
    feed(state, 10)
    write(state)
    decoded_out(state)
    state.on_frames(head(10))
    assert decoded_out(state) == [proto.AckMsg(P, "hello", 10)], "something new: re-ACKed at the first HEAD"


def test_fetch_is_repeated_only_without_progress():
    state = WriterState(W, fetch_retry=1.0)
    state.tick(0.0)
    feed(state, 0)
    feed(state, 100)
    assert decoded_out(state) == [proto.FetchMsg(P, W, "hello", 1, 99)]  # 100 is buffered
    state.tick(0.5)
    feed(state, 101)  # another gap record while the FETCH is in flight: no new FETCH
    assert decoded_out(state) == []
    state.tick(1.6)  # no progress for over a second (record 0 was seen at 0.5): asked again
    assert decoded_out(state) == [proto.FetchMsg(P, W, "hello", 1, 99)]
    state.on_record_frames(*direct(1))
    state.on_record_frames(*direct(2))
    state.tick(2.0)  # progress seen: no repeat
    state.tick(2.9)
    assert decoded_out(state) == []
    state.tick(3.1)  # stalled again for over a second
    assert decoded_out(state) == [proto.FetchMsg(P, W, "hello", 3, 97)]


def test_next_window_is_fetched_when_the_current_one_is_done():
    state = WriterState(W, fetch_chunk=10)
    feed(state, 0)
    feed(state, 25)
    assert decoded_out(state) == [proto.FetchMsg(P, W, "hello", 1, 10)]
    for seq in range(1, 11):
        state.on_record_frames(*direct(seq))
    assert decoded_out(state) == [proto.FetchMsg(P, W, "hello", 11, 10)]


def test_write_failure_acks_nothing_until_the_retry_succeeds():
    state = WriterState(W)
    state.now = 1.0
    feed(state, 0, 1, 2)
    batch = state.take_batch(1)
    state.batch_failed(batch)
    assert state.out == []
    assert state.heads() == {}
    feed(state, 3, 4)  # refused while the database fails: the producer keeps them
    assert state.dropped == 2
    assert state.take_batch(2) is None
    state.tick(5.0)
    assert state.out == []  # no FETCH while failing
    again = state.retry_batch()
    assert again is batch
    state.batch_failed(again)  # still failing
    assert state.out == []
    state.batch_written(state.retry_batch())
    assert decoded_out(state) == [proto.AckMsg(P, "hello", 2)]
    assert state.retry_batch() is None
    state.tick(10.0)  # after recovery, the records refused meanwhile are fetched
    assert decoded_out(state) == [proto.FetchMsg(P, W, "hello", 3, 2)]
    feed(state, 3, 4)
    assert record_seqs(write(state)) == [3, 4]


def test_malformed_frames_are_counted():
    state = WriterState(W)
    state.on_frames([b"M"])
    state.on_frames([b"Mhello\0\x02junk", b"x"])
    state.on_record_frames(b"Mhello\0\x01\x01", b"x")
    state.on_frames([b"Hhello\0\x01"])
    state.on_frames([b"?"])
    assert state.malformed == 5
    assert state.take_batch(1) is None


def test_names_with_nul_are_refused():
    state = WriterState(W)
    state.on_frames(list(proto.encode(proto.RecordMsg("a", "P\0X", "a", 0, b"x"))))
    assert state.take_batch(1) is None
    assert state.malformed == 1


def test_direct_tail_skips_records_nobody_keeps():
    state = WriterState(W, fetch_retry=1.0)
    state.tick(0.0)
    state.on_frames(head(50))
    assert decoded_out(state) == [proto.FetchMsg(P, W, "hello", 0, 51)]
    state.on_frames(proto.encode(proto.DirectTailMsg(W, P, "hello", 40)))
    state.tick(0.5)
    assert state.take_batch(1) is None  # not yet: the producer might still answer
    state.tick(1.5)
    out = decoded_out(state)
    assert out == [proto.FetchMsg(P, W, "hello", 40, 11)]
    assert state.skipped == 40
    for seq in range(40, 51):
        state.on_record_frames(*direct(seq))
    assert record_seqs(write(state)) == list(range(40, 51))


def test_stamps_extend_within_the_span_then_start_anew():
    state = WriterState(W, stamp_span_ms=100)
    feed(state, 0, 1)
    b1 = write(state, 1_000)
    feed(state, 2)
    b2 = write(state, 1_050)
    feed(state, 3)
    b3 = write(state, 1_200)
    stamp = keys.partition_prefix(keys.STAMP, "hello", P)

    def stamps(batch):
        return [(keys.seq_of(k[-8:]), msgpack.unpackb(v)) for k, v in zip(batch.keys, batch.values) if k.startswith(stamp)]

    assert stamps(b1) == [(0, [1, 1_000, 4])]
    assert stamps(b2) == [(0, [2, 1_050, 6])]  # the same entry, extended
    assert stamps(b3) == [(3, [3, 1_200, 2])]  # a new one


# -- retention planning on a real LevelDB -------------------------------------------


def _filled(tmp_path, batches):
    """A database written through the writer state: ``batches`` is a list of (unix_ms, seqs, size)."""
    db = plyvel.DB(str(tmp_path / "db"), create_if_missing=True)
    state = WriterState(W, stamp_span_ms=0)
    for unix_ms, seqs, size in batches:
        for seq in seqs:
            state.on_record_frames(*rec(seq, bytes([seq % 256]) * size))
        batch = state.take_batch(unix_ms)
        with db.write_batch() as wb:
            for k, v in zip(batch.keys, batch.values):
                wb.put(k, v)
        state.batch_written(batch)
    return db, state


def _apply(db, cuts):
    with db.write_batch() as wb:
        for cut in cuts:
            for k in cut.deletes:
                wb.delete(k)
            for k, v in cut.puts:
                wb.put(k, v)
    for cut in cuts:
        retention.applied(cut)


def _stored(db):
    return [keys.seq_of(k[-8:]) for k, _ in db.iterator(prefix=b"M")]


def _stamps(db):
    return [keys.decode_stamp(k, v) for k, v in db.iterator(prefix=b"t")]


def test_retention_by_age_deletes_old_batches_but_never_the_head(tmp_path):
    db, state = _filled(tmp_path, [(1_000, range(0, 10), 10), (2_000, range(10, 20), 10), (3_000, range(20, 25), 10)])
    try:
        parts = list(state.partitions.values())
        assert retention.plan(db, parts, 3_500, 5_000, -1) == []
        cuts = retention.plan(db, parts, 3_500, 1_000, -1)  # batches of 1000 and 2000 are too old
        assert [c.deleted for c in cuts] == [20]
        _apply(db, cuts)
        assert _stored(db) == list(range(20, 25))
        assert [s.first for s in _stamps(db)] == [20]
        _apply(db, retention.plan(db, parts, 60_000, 1_000, -1))  # everything is old now
        assert _stored(db) == [24]  # the head record stays
        assert _stamps(db) == [keys.Stamp(24, 24, 3_000, 10)]
        assert retention.plan(db, parts, 60_000, 1_000, -1) == []
    finally:
        db.close()


def test_retention_by_bytes_is_record_precise(tmp_path):
    db, state = _filled(tmp_path, [(1_000, range(0, 10), 10), (2_000, range(10, 20), 10)])
    try:
        parts = list(state.partitions.values())
        assert parts[0].total_bytes == 200
        cuts = retention.plan(db, parts, 2_000, -1, 75)
        _apply(db, cuts)
        assert _stored(db) == list(range(13, 20))  # 70 bytes kept
        assert parts[0].total_bytes == 70
        assert _stamps(db) == [keys.Stamp(13, 19, 2_000, 70)]
        assert retention.plan(db, parts, 2_000, -1, 75) == []
    finally:
        db.close()


def test_retention_budget_spreads_a_backlog_over_passes(tmp_path):
    db, state = _filled(tmp_path, [(1_000, range(0, 100), 1)])
    try:
        parts = list(state.partitions.values())
        for expected_tail in (30, 60, 90, 99):
            _apply(db, retention.plan(db, parts, 9_999, 0, -1, budget=30))
            assert _stored(db)[0] == expected_tail
        assert _stamps(db) == [keys.Stamp(99, 99, 1_000, 1)]
    finally:
        db.close()


class _Seeks:
    """A database that records where each of its iterators starts."""

    def __init__(self, db) -> None:
        self.db = db
        self.starts: list[bytes] = []

    def iterator(self, **kwargs):
        self.starts.append(kwargs.get("start", kwargs.get("prefix")))
        return self.db.iterator(**kwargs)


def test_retention_seeks_from_the_floor_not_over_what_it_deleted(tmp_path):
    """A deleted key stays in LevelDB as a tombstone until a compaction reaches it, and a seek from the
    partition's first key steps over each one (about 1 s a million): in the 60-minute soak, the stores'
    retention passes and readers spent most of their time there. After a cut, the next pass of that
    partition starts its seeks at the new tail."""
    db, state = _filled(tmp_path, [(1_000, range(0, 100), 1)])
    try:
        p = next(iter(state.partitions.values()))
        assert p.floor == 0
        _apply(db, retention.plan(db, [p], 9_999, 0, -1, budget=30))
        assert p.floor == 30
        seeks = _Seeks(db)
        _apply(db, retention.plan(seeks, [p], 9_999, 0, -1, budget=30))
        assert _stored(db)[0] == 60 and p.floor == 60  # the same cut as from the first key
        assert seeks.starts and set(seeks.starts) <= {p.key_prefix + keys.seq_bytes(30),
                                                      p.record_keys_prefix + keys.seq_bytes(30),
                                                      p.record_attributes_prefix + keys.seq_bytes(30),
                                                      p.stamp_prefix + keys.seq_bytes(30)}, seeks.starts
    finally:
        db.close()


def test_an_emptied_out_of_order_buffer_gives_its_memory_back():
    """A dict keeps the table of its largest size when emptied: after a burst that buffered 100,000
    records, the store held 2.5 MiB for an empty buffer (found with tracemalloc, issue 26)."""
    import sys

    empty = sys.getsizeof({})
    for fill in ("records", "direct records", "skip"):
        state = WriterState(W)
        feed(state, 0)
        feed(state, *range(2, 20_002))
        assert state.buffered == 20_000
        p = next(iter(state.partitions.values()))
        if fill == "records":
            state.on_record_frames(*direct(1))
        elif fill == "direct records":  # one DIRECT-RECORDS that covers the whole buffer
            state.on_frames(proto.encode(proto.DirectRecordsMsg(W, P, "hello", 1, *proto.pack_contents(
                [b"c%d" % seq for seq in range(1, 20_002)]))))
        else:
            state._skip_to(p, 30_000)
        assert state.buffered == 0, fill
        assert sys.getsizeof(p.pending) == empty, fill
