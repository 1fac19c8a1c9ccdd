"""A sharded store writer's protocol logic (store/sharding.py, rfc 16), without sockets."""

from __future__ import annotations

from dafka import protocol as proto
from dafka.discovery.placement import Placement, place
from dafka.store.sharding import ShardedWriterState

ME, OTHER, THIRD = "A" * 32, "B" * 32, "C" * 32  # store identities
W = "W" * 32  # this store's writer
TOPIC = "orders"
PARTITIONS = [f"{n:032X}" for n in range(100, 140)]


def state(replicas: int = 1, settle: float = 1.0, handoff: float = 2.0) -> ShardedWriterState:
    placement = Placement(ME, "", replicas, dead_after=10, handoff=handoff, alive_after=4)
    return ShardedWriterState(W, placement, reader="R" * 32, settle=settle, started=0.0, batches=True)


def member(store: str, writer: str, heard_filling=(), leaving: bool = False) -> list[bytes]:
    return proto.encode(proto.StoreMemberMsg(writer, store, "", 1, "R" + writer[1:], tuple(heard_filling), leaving))


def head(partition: str, seq: int) -> list[bytes]:
    return proto.encode(proto.HeadMsg(TOPIC, partition, TOPIC, seq))


def record(partition: str, seq: int) -> list[bytes]:
    return proto.encode(proto.RecordMsg(TOPIC, partition, TOPIC, seq, b"r%d" % seq))


def owned_by(store: str, stores: dict[str, str]) -> list[str]:
    return [p for p in PARTITIONS if place(TOPIC, p, stores, 1) == [store]]


def sent(s: ShardedWriterState) -> list:
    out = [proto.decode(frames) for frames in s.out]
    s.out.clear()
    return out


def test_before_it_settles_a_store_holds_nothing_new_then_takes_up_what_it_owns():
    s = state()
    s.on_frames(member(OTHER, "X" * 32))
    for p in PARTITIONS:
        s.on_frames(head(p, 9))
    assert s.partitions == {} and len(s.elsewhere) == len(PARTITIONS)  # before settling: heard, not held
    s.place(0.5)
    assert s.partitions == {}
    s.place(1.0)
    mine = owned_by(ME, {ME: "", OTHER: ""})
    assert sorted(p for _, p in s.partitions) == sorted(mine) and 0 < len(mine) < len(PARTITIONS)
    fetches = [m for m in sent(s) if type(m) is proto.FetchMsg]
    assert sorted(f.topic for f in fetches) == sorted(mine)  # refilled from whoever holds them
    assert all(f.sequence == 0 and f.count == 10 for f in fetches)
    # it subscribes to the live records (RECORD and KEYED-RECORDS) of the partitions it holds, and to no others
    assert sorted(prefix for on, prefix in s.sub_changes if on) == sorted(
        proto.record_prefix(kind, TOPIC, p, TOPIC) for p in mine for kind in (proto.RECORD, proto.KEYED_RECORDS))
    assert set(s.filling_now()) == {(TOPIC, p) for p in mine}


def test_records_of_a_partition_held_elsewhere_are_dropped():
    s = state(settle=0)
    s.on_frames(member(OTHER, "X" * 32))
    s.place(0.0)
    theirs = owned_by(OTHER, {ME: "", OTHER: ""})[0]
    s.on_frames(record(theirs, 0))
    assert (TOPIC, theirs) not in s.partitions and s.take_batch(0) is None
    mine = owned_by(ME, {ME: "", OTHER: ""})[0]
    s.on_frames(record(mine, 0))
    assert (TOPIC, mine) in s.partitions and s.take_batch(0).records == 1


def test_a_partition_no_longer_owned_is_kept_until_its_owner_holds_it_then_released():
    s = state(settle=0, handoff=2.0)
    for p in PARTITIONS:
        s.load(TOPIC, p, 49)  # alone before: it held everything
    s.sub_changes.clear()
    s.place(0.0)
    assert not s.placement.handoffs
    s.on_frames(member(OTHER, "X" * 32))
    s.place(1.0)
    theirs = owned_by(OTHER, {ME: "", OTHER: ""})
    assert sorted(p for _, p in s.placement.handoffs) == sorted(theirs)
    assert any(type(m) is proto.GetHeadsMsg for m in sent(s))  # asks the owners how far they are
    answer = proto.DirectPartitionsMsg(W, "R" + "X" * 31, "", tuple(
        proto.PartitionInfo(TOPIC, p, 0, 30) for p in theirs))
    s.on_frames(proto.encode(answer))
    s.place(5.0)
    assert s.released == [] and len(s.partitions) == len(PARTITIONS)  # the owner holds 30 of 49: kept
    s.on_frames(proto.encode(proto.DirectPartitionsMsg(W, "R" + "X" * 31, "", tuple(
        proto.PartitionInfo(TOPIC, p, 0, 49) for p in theirs))))
    s.place(6.0)
    assert s.released == []  # whole now, but store/handoff_ms is not over
    s.place(8.0)
    assert sorted(p.address for p in s.released) == sorted(theirs)
    assert sorted(p for _, p in s.partitions) == sorted(set(PARTITIONS) - set(theirs))
    assert sorted(prefix for on, prefix in s.sub_changes if not on) == sorted(
        proto.record_prefix(kind, TOPIC, p, TOPIC) for p in theirs for kind in (proto.RECORD, proto.KEYED_RECORDS))
    assert all(s.elsewhere[(TOPIC, p)] == 49 for p in theirs)


def test_a_dead_store_s_partitions_are_taken_up_after_dead_ms_not_before():
    s = state(settle=0)
    s.on_frames(member(OTHER, "X" * 32))
    s.place(0.0)
    theirs = owned_by(OTHER, {ME: "", OTHER: ""})
    for p in theirs:
        s.on_frames(head(p, 5))
    for now in range(1, 10):  # a beat a second, as the writer places at each
        s.now = float(now)
        s.place(float(now))
    assert not any((TOPIC, p) in s.partitions for p in theirs)
    s.place(10.5)  # not heard for store/dead_ms (10 s)
    assert all((TOPIC, p) in s.partitions for p in theirs)
    assert s.moves_in == len(theirs)


def test_the_heartbeat_says_what_the_store_still_fills():
    s = state(settle=0)
    s.place(0.0)
    s.on_frames(head(PARTITIONS[0], 3))
    sent(s)
    s.heartbeat()
    (beat,) = [m for m in sent(s) if type(m) is proto.StoreMemberMsg]
    assert beat.store == ME and beat.replicas == 1 and beat.reader == "R" * 32
    assert beat.filling == ((TOPIC, PARTITIONS[0]),)
    for seq in range(4):
        s.on_frames(record(PARTITIONS[0], seq))
    s.batch_written(s.take_batch(0))
    s.heartbeat()
    (beat,) = [m for m in sent(s) if type(m) is proto.StoreMemberMsg]
    assert beat.filling == ()


def test_under_replicated_counts_partitions_known_only_from_heads():
    s = state(replicas=2, settle=0)
    s.place(0.0)
    s.on_frames(head(PARTITIONS[0], 3))
    assert s.under_replicated(0.0) == [(TOPIC, PARTITIONS[0])]  # one store: one copy of two


def test_a_partition_name_the_layout_cannot_hold_is_refused_even_when_held_elsewhere():
    s = state(settle=0)
    s.on_frames(member(OTHER, "X" * 32))
    s.place(0.0)
    s.on_frames(proto.encode(proto.HeadMsg(TOPIC, PARTITIONS[0], "bad\0subject", 3)))  # a NUL in a key
    assert s.malformed == 1 and not s.elsewhere and not s.partitions
