"""The consumer group's state machine (dafka/groups/state.py), without sockets:
heartbeats and time go in, assignments and heartbeats come out."""

from __future__ import annotations

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st

from dafka.consumer import latest
from dafka import protocol as proto
from dafka.consumer.state import ConsumerState
from dafka.groups.state import GroupState, Member
from dafka.protocol.commits import decode_commits, encode_commits

GROUP = "billing"
TOPIC = "orders"
TIMEOUT = 5.0


def member(address: str, now: float = 0.0, topics=(TOPIC,)) -> GroupState:
    state = GroupState(GROUP, address, interval=1.0, timeout=TIMEOUT, join_wait=0.2, now=now)
    for topic in topics:
        state.subscribe(topic, now)
    return state


def join(state: GroupState, now: float = 0.0) -> float:
    """Tick until the state reads its share (the tower replayed, the offsets are loaded)."""
    state.tick(now, peers_replayed=True, offsets_loaded=True)
    now += 0.2
    state.tick(now, peers_replayed=True, offsets_loaded=True)
    assert state.ready
    return now


def heartbeat(state: GroupState) -> proto.GroupMemberMsg:
    return proto.decode(state.heartbeat())


def exchange(states: list[GroupState], now: float) -> None:
    """Every member hears every other's heartbeat."""
    for sender in states:
        msg = heartbeat(sender)
        for receiver in states:
            receiver.on_member(msg, now)


def settle(states: list[GroupState], now: float) -> None:
    """Run the members' handovers until nothing moves (the consumer's part: start and stop)."""
    for _ in range(10):
        exchange(states, now)
        moved = False
        for s in states:
            if s.revoked:
                keys, s.revoked = s.revoked, []
                s.released_by_us(keys, now)
                moved = True
            if s.assigned:
                s.assigned = []
                moved = True
        if not moved:
            exchange(states, now)
            return


def partitions(n: int) -> list[str]:
    return [f"P{i:02d}" for i in range(n)]


def settled_pair(n: int) -> tuple[GroupState, GroupState]:
    """Members A and B of a group that settled on ``n`` partitions."""
    a, b = member("A"), member("B")
    for s in (a, b):
        for p in partitions(n):
            s.meet(TOPIC, p, 0, 0.0)
        join(s)
    settle([a, b], 0.5)
    return a, b


def test_a_lone_member_waits_for_its_view_then_reads_every_partition():
    state = member("A")
    for p in partitions(4):
        state.meet(TOPIC, p, 9, 0.0)
    state.tick(0.1, peers_replayed=False, offsets_loaded=True)
    assert not state.ready and not state.assigned  # the tower has not told it of the live peers yet
    state.tick(0.2, peers_replayed=True, offsets_loaded=True)
    state.tick(0.3, peers_replayed=True, offsets_loaded=False)
    assert not state.ready  # join_wait has passed, but the stored commits are still being read
    state.tick(0.45, peers_replayed=True, offsets_loaded=True)
    assert state.ready and sorted(state.assigned) == [(TOPIC, p) for p in partitions(4)]


def test_the_offsets_topic_is_waited_for_at_most_the_timeout():
    state = member("A")
    state.tick(0.0, peers_replayed=True, offsets_loaded=False)
    state.tick(TIMEOUT - 0.1, peers_replayed=True, offsets_loaded=False)
    assert not state.ready
    state.tick(TIMEOUT, peers_replayed=True, offsets_loaded=False)
    assert state.ready


def test_a_joining_member_waits_for_the_heartbeat_of_a_member_that_subscribed_to_it():
    # Two members start together on a loaded machine: B's subscription to A's heartbeats reaches A within
    # join_wait, B's heartbeat only later.  A must not read every partition alone meanwhile.
    a, b = member("A"), member("B")
    for p in partitions(4):
        a.meet(TOPIC, p, 9, 0.0)
    a.tick(0.0, peers_replayed=True, offsets_loaded=True)
    a.on_subscription(0.05)  # B subscribed
    a.on_subscription(0.06, member=False)  # `dafka status --groups` too: not a member to wait for
    a.tick(0.3, peers_replayed=True, offsets_loaded=True)
    assert not a.ready and not a.assigned
    a.on_member(heartbeat(b), 0.5)
    a.tick(0.5, peers_replayed=True, offsets_loaded=True)
    assert a.ready and len(a.assigned) == 2  # its share of two members, not all four


def test_a_member_that_subscribed_and_stays_silent_is_waited_for_at_most_the_timeout():
    a = member("A")
    a.tick(0.0, peers_replayed=True, offsets_loaded=True)
    a.on_subscription(0.05)
    a.tick(TIMEOUT - 0.1, peers_replayed=True, offsets_loaded=True)
    assert not a.ready
    a.tick(TIMEOUT, peers_replayed=True, offsets_loaded=True)
    assert a.ready


def test_members_agree_and_no_member_reads_more_than_its_share():
    states = [member(a) for a in "ABC"]
    for s in states:
        for p in partitions(12):
            s.meet(TOPIC, p, 0, 0.0)
        join(s)
    settle(states, 1.0)
    owners = {}
    for s in states:
        for key in s.owned:
            assert key not in owners
            owners[key] = s.address
    assert len(owners) == 12
    assert sorted(len(s.owned) for s in states) == [4, 4, 4]
    assert all(s.owner(key) == owner for s in states for key, owner in owners.items())


def test_a_newcomer_waits_for_the_reader_to_release_and_resumes_at_its_final_commit():
    old, new = member("A"), member("B")
    for p in partitions(2):
        old.meet(TOPIC, p, 50, 0.0)
        new.meet(TOPIC, p, 50, 0.0)
    join(old)
    old.assigned.clear()
    assert old.owned == {(TOPIC, p) for p in partitions(2)}
    # B joins: it hears A's heartbeat (A reads both) before it reads its share.
    new.on_member(heartbeat(old), 1.0)
    join(new, 1.0)
    moving = {key for key in old.owned if new.owner(key) == "B"}
    assert moving and not new.assigned and set(new.waiting) == moving  # A still reads it: B waits
    # A hears B, is told to stop, commits, and releases.
    old.on_member(heartbeat(new), 1.3)
    assert set(old.revoked) == moving
    old.commit({key: 42 for key in moving}, 1.3)
    old.released_by_us(old.revoked, 1.3)
    old.revoked.clear()
    new.on_member(heartbeat(old), 1.31)
    assert set(new.assigned) == moving and not new.waiting
    assert all(new.committed[key] == 42 for key in moving)


def test_a_reader_that_never_releases_loses_the_partition_after_the_timeout():
    old, new = member("A"), member("B")
    for s in (old, new):
        for p in partitions(2):
            s.meet(TOPIC, p, 0, 0.0)
    join(old)
    new.on_member(heartbeat(old), 1.0)
    join(new, 1.0)
    moving = set(new.waiting)
    assert moving
    new.on_member(heartbeat(old), 3.0)  # still alive, still reading it
    new.tick(3.0, peers_replayed=True, offsets_loaded=True)
    assert not new.assigned
    assert new.next_due() <= 1.2 + TIMEOUT
    new.on_member(heartbeat(old), 1.2 + TIMEOUT)
    new.tick(1.2 + TIMEOUT, peers_replayed=True, offsets_loaded=True)
    assert set(new.assigned) == moving


def test_a_silent_member_expires_after_the_timeout_and_its_partitions_move():
    a, b = settled_pair(6)
    b.commit({key: 7 for key in b.owned}, 0.5)
    a.on_member(heartbeat(b), 0.6)  # B's last heartbeat, with its commits
    held_by_b = set(b.owned)
    for now in (1.6, 2.6, 3.6, 4.6, 0.6 + TIMEOUT - 0.01):  # A ticks at least every interval, as its consumer does
        a.tick(now, peers_replayed=True, offsets_loaded=True)
    assert not a.assigned
    a.tick(0.6 + TIMEOUT, peers_replayed=True, offsets_loaded=True)
    assert set(a.assigned) == held_by_b
    assert all(a.committed[key] == 7 for key in held_by_b)


def test_our_own_stall_is_not_the_others_silence():
    """A member whose loop stood still for more than half the timeout (its ticks came at least every
    interval before) does not take the others for dead on waking: their heartbeats may wait unread."""
    a, b = settled_pair(6)
    a.on_member(heartbeat(b), 0.6)
    a.tick(1.6, peers_replayed=True, offsets_loaded=True)
    a.tick(1.6 + TIMEOUT * 0.6, peers_replayed=True, offsets_loaded=True)  # stood still 3 s
    a.tick(0.6 + TIMEOUT + 0.1, peers_replayed=True, offsets_loaded=True)  # B silent for the timeout, A aside
    assert "B" in a.members and not a.assigned
    for now in (6.6, 7.6, 8.6, 0.6 + TIMEOUT + TIMEOUT * 0.6 + 0.01):  # ...and B silent that much longer: gone
        a.tick(now, peers_replayed=True, offsets_loaded=True)
    assert "B" not in a.members and a.assigned


def test_a_leaving_member_hands_over_at_once():
    a, b = settled_pair(6)
    held_by_b = set(b.owned)
    b.commit({key: 3 for key in held_by_b}, 0.6)
    a.on_member(proto.decode(b.leave()), 0.7)
    assert set(a.assigned) == held_by_b and "B" not in a.members
    assert all(a.committed[key] == 3 for key in held_by_b)


def test_a_member_that_was_stopped_gives_everything_up_and_joins_again():
    a = member("A")
    a.meet(TOPIC, "P1", 0, 0.0)
    join(a)
    a.assigned.clear()
    a.tick(1.0, peers_replayed=True, offsets_loaded=True)
    a.tick(1.0 + TIMEOUT + 1, peers_replayed=True, offsets_loaded=True)  # SIGSTOP, then SIGCONT
    assert a.revoked == [(TOPIC, "P1")] and not a.ready
    a.released_by_us(a.revoked, 7.0)
    a.revoked.clear()
    a.tick(7.2, peers_replayed=True, offsets_loaded=True)
    assert a.ready and a.assigned == [(TOPIC, "P1")]


def test_members_agree_on_partitions_only_one_of_them_met():
    a, b = member("A"), member("B")
    for p in partitions(7):
        a.meet(TOPIC, p, 0, 0.0)
        b.meet(TOPIC, p, 0, 0.0)
    a.meet(TOPIC, "P99", 0, 0.0)  # B missed it (its producer may be gone): A's heartbeat names it
    join(a)
    join(b)
    exchange([a, b], 0.5)
    assert b.known[(TOPIC, "P99")] == -1
    assert all(a.owner(key) == b.owner(key) for key in a.known)
    (entry,) = [e for e in heartbeat(b).entries if e.address == "P99"]
    assert entry.state in (proto.READING, proto.KNOWN)


def test_members_of_other_groups_and_topics_do_not_count():
    a = member("A")
    a.meet(TOPIC, "P1", 0, 0.0)
    a.on_member(proto.GroupMemberMsg("other", "X", (TOPIC,)), 0.0)
    a.on_member(proto.GroupMemberMsg(GROUP, "Y", ("weather",)), 0.0)
    join(a)
    assert a.owner((TOPIC, "P1")) == "A" and "X" not in a.members


def test_commits_only_go_forward_and_only_for_what_we_read():
    a = member("A")
    a.meet(TOPIC, "P1", 0, 0.0)
    join(a)
    assert a.commit({(TOPIC, "P1"): 10, (TOPIC, "P2"): 5}, 1.0) == {(TOPIC, "P1"): 10}
    assert a.commit({(TOPIC, "P1"): 4}, 1.0) == {}
    assert a.heartbeat_due == 1.0  # commits are heartbeated at once
    entry = heartbeat(a).entries[0]
    assert (entry.address, entry.offset, entry.state) == ("P1", 10, proto.READING)


def test_the_offsets_topic_records_round_trip_and_bad_ones_are_counted():
    offsets = {(TOPIC, "P1"): 5, ("weather", "P2"): 0}
    assert decode_commits(encode_commits("A", offsets)) == ("A", offsets)
    a = member("A")
    a.on_offsets([encode_commits("B", {(TOPIC, "P1"): 9}), b"junk", msgpack.packb(["A", [[TOPIC, "P1", -1]]]),
                  msgpack.packb([1, []]), encode_commits("C", {(TOPIC, "P1"): 3})])
    assert a.committed == {(TOPIC, "P1"): 9} and a.malformed == 3


@settings(max_examples=200, deadline=None)
@given(st.sets(st.text(alphabet="ABCDEF0123456789", min_size=1, max_size=8), min_size=1, max_size=6),
       st.sets(st.text(alphabet="0123456789ABCDEF", min_size=1, max_size=32), min_size=0, max_size=40))
def test_any_agreed_view_gives_every_partition_one_owner_within_its_share(members, names):
    states = [member(a) for a in sorted(members)]
    for s in states:
        for p in names:
            s.meet(TOPIC, p, 0, 0.0)
        join(s)
    exchange(states, 0.5)
    plans = [{(TOPIC, p): s.owner((TOPIC, p)) for p in names} for s in states]
    assert all(plan == plans[0] for plan in plans)
    share = -(-len(names) // len(states))
    loads = {s.address: sum(1 for o in plans[0].values() if o == s.address) for s in states}
    assert set(plans[0].values()) <= set(members) and max(loads.values(), default=0) <= share


@given(st.lists(st.binary(max_size=64), max_size=8))
def test_any_offsets_record_is_taken_or_counted(values):
    a = member("A")
    a.on_offsets(values)
    assert a.malformed <= len(values)
    assert all(isinstance(o, int) and o >= 0 for o in a.committed.values())


def test_the_consumer_opens_an_assigned_partition_at_the_groups_commit_whoever_comes_first():
    group = member("A")
    join(group)
    group.committed[(TOPIC, "P1")] = 3
    cs = ConsumerState("A", reset="earliest", group=group)
    # A member's topic subscription is its HEADs alone: the records of a partition once it is ours.
    assert cs.subscribe(TOPIC) == [proto.subscription(proto.HEAD, TOPIC, exact=True)]
    cs.out.clear()
    cs.on_frames(proto.encode(proto.RecordMsg(TOPIC, "P1", TOPIC, 5, b"x")))  # met, assigned, opened at once
    live = [proto.record_prefix(msg_id, TOPIC, "P1", TOPIC) for msg_id in (proto.RECORD, proto.KEYED_RECORDS)]
    assert cs.sub_changes == [(True, prefix) for prefix in live]
    assert group.assigned == [(TOPIC, "P1")] and group.known[(TOPIC, "P1")] == 5
    p = cs.partitions[(TOPIC, "P1")]
    assert (p.next, p.head, p.pending) == (3, 5, {5: b"x"})  # from the commit, not from 0 (reset)
    assert [proto.decode(f) for f in cs.out] == [proto.FetchMsg("P1", "A", TOPIC, 3, 3)]
    cs.start(TOPIC, "P1", 3, 5)  # the consumer's own start finds it open
    assert cs.partitions[(TOPIC, "P1")] is p
    cs.on_frames(proto.encode(proto.HeadMsg(TOPIC, "P1", TOPIC, 40)))
    cs.stop(TOPIC, "P1")
    assert (TOPIC, "P1") not in cs.partitions and not cs.record_prefixes
    assert cs.sub_changes[2:] == [(False, prefix) for prefix in live]
    assert group.known[(TOPIC, "P1")] == 40  # what it learnt while reading, should P1 come back to it
    # With another member, only the partitions the group gives us open.
    group.members["B"] = Member(frozenset({TOPIC}), 0.0)
    for i in range(10):
        cs.on_frames(proto.encode(proto.RecordMsg(TOPIC, f"Q{i}", TOPIC, 0, b"y")))
    ours = {key for key in group.known if group.owner(key) == "A"}
    assert set(cs.partitions) <= ours and len(ours) < len(group.known)
    assert all(r.partition in {p for _, p in ours} for r in cs.ready)


def test_with_latest_a_partition_of_unknown_head_opens_when_first_met():
    group = member("A")
    join(group)
    cs = ConsumerState("A", reset="latest", group=group)
    cs.subscribe(TOPIC)
    cs.start(TOPIC, "P2", None, -1)  # known only from another member's heartbeat
    assert (TOPIC, "P2") not in cs.partitions
    cs.on_frames(proto.encode(proto.RecordMsg(TOPIC, "P2", TOPIC, 9, b"y")))
    cs.tick(cs.now + latest.WAIT)  # no peer said what it held at the subscription: the first record seen
    assert [(r.partition, r.offset) for r in cs.ready] == [("P2", 9)]


_PARTS = st.sampled_from([f"P{i}" for i in range(6)])
_SEQS = st.integers(0, 20)
_ENTRIES = st.lists(st.builds(proto.GroupEntry, st.just(TOPIC), _PARTS,
                              st.one_of(_SEQS, st.just(proto.NO_OFFSET)), st.sampled_from([0, 1, 2])),
                     max_size=4).map(tuple)
_TRAFFIC = st.one_of(
    st.builds(lambda p, seq: proto.RecordMsg(TOPIC, p, TOPIC, seq, b"v"), _PARTS, _SEQS),
    st.builds(lambda p, seq: proto.HeadMsg(TOPIC, p, TOPIC, seq), _PARTS, _SEQS),
    st.builds(lambda m, entries, leaving: proto.GroupMemberMsg(GROUP, m, (TOPIC,), entries, leaving),
              st.sampled_from(["B", "C"]), _ENTRIES, st.booleans()),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(_TRAFFIC, st.floats(0, 3)), max_size=60))
def test_a_members_consumer_takes_any_traffic_and_reads_only_what_the_group_gives_it(steps):
    """Records, HEADs and other members' heartbeats in any order and timing, with the
    membership's part (start what is assigned, stop what is revoked) done after each: the
    consumer never raises, reads only partitions the group gave it, and delivers each in order."""
    group = member("A")
    join(group)
    cs = ConsumerState("A", reset="earliest", group=group)
    cs.subscribe(TOPIC)
    now = 1.0
    for msg, dt in steps:
        now += dt
        cs.now = now
        cs.on_frames(proto.encode(msg))
        group.tick(now, peers_replayed=True, offsets_loaded=True)
        for key in group.assigned:
            cs.start(*key, group.committed.get(key), group.known.get(key, -1))
        group.assigned.clear()
        if group.revoked:
            keys, group.revoked = group.revoked, []
            for key in keys:
                cs.stop(*key)
            group.released_by_us(keys, now)
        assert set(cs.partitions) <= group.owned
        last: dict[str, int] = {}
        for r in cs.ready:
            assert (r.topic, r.partition) in cs.partitions
            assert r.offset > last.get(r.partition, -1)
            last[r.partition] = r.offset
