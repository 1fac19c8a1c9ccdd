"""Placement of partitions on sharded stores (dafka/discovery/placement.py, rfc 16), without sockets."""

from __future__ import annotations

import collections

from hypothesis import given, settings, strategies as st

from dafka.discovery.placement import Placement, StoreMember, place, weight

STORES = [f"{n:032X}" for n in range(1, 9)]
KEYS = [("orders", f"{n:032X}") for n in range(1000, 1400)]


def member(store: str, heard: float = 0.0, rack: str = "", replicas: int = 2, **kw) -> StoreMember:
    return StoreMember(store, rack, replicas, writer="W" + store[1:], reader="R" + store[1:], heard=heard, **kw)


def test_weights_are_stable_and_spread():
    assert weight("orders", KEYS[0][1], STORES[0]) == weight("orders", KEYS[0][1], STORES[0])
    assert weight("orders", KEYS[0][1], STORES[0]) != weight("orders", KEYS[0][1], STORES[1])
    first = collections.Counter(place(t, p, dict.fromkeys(STORES, ""), 1)[0] for t, p in KEYS)
    assert set(first) == set(STORES) and max(first.values()) < 2 * len(KEYS) / len(STORES)


def test_replicas_zero_or_above_the_stores_places_everything_everywhere():
    racks = dict.fromkeys(STORES[:3], "")
    assert sorted(place("t", "p", racks, 0)) == sorted(racks)
    assert sorted(place("t", "p", racks, 5)) == sorted(racks)


def test_a_joining_store_takes_about_its_share_and_moves_nothing_else():
    four = dict.fromkeys(STORES[:4], "")
    five = dict.fromkeys(STORES[:5], "")
    moved = 0
    for topic, partition in KEYS:
        before, after = set(place(topic, partition, four, 2)), set(place(topic, partition, five, 2))
        assert len(after) == 2 and len(before - after) <= 1
        assert after - before <= {STORES[4]}  # only the newcomer gains partitions
        moved += before != after
    assert 0.25 * len(KEYS) < moved < 0.55 * len(KEYS)  # R/5 = 40 % of them ideally


def test_racks_spread_replicas_when_there_are_enough():
    racks = {s: "a" if n < 4 else "b" for n, s in enumerate(STORES)}
    for topic, partition in KEYS:
        owners = place(topic, partition, racks, 2)
        assert {racks[s] for s in owners} == {"a", "b"}
    one_rack = dict.fromkeys(STORES[:4], "a")
    assert all(len(place(t, p, one_rack, 2)) == 2 for t, p in KEYS)  # fewer racks than replicas: the best of the rest
    mixed = {STORES[0]: "a", STORES[1]: "a", STORES[2]: "", STORES[3]: ""}  # no rack: a rack of its own
    for topic, partition in KEYS:
        owners = place(topic, partition, mixed, 3)
        assert sum(mixed[s] == "a" for s in owners) == 1


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 8), st.integers(1, 4), st.lists(st.sampled_from("abc"), min_size=8, max_size=8))
def test_every_store_with_the_same_view_computes_the_same_owners(n, replicas, rack_names):
    stores = STORES[:n]
    racks = {s: rack_names[i] for i, s in enumerate(stores)}
    views = []
    for me in stores:
        placement = Placement(me, racks[me], replicas, dead_after=10, handoff=1, alive_after=4)
        for other in stores:
            placement.on_member(member(other, rack=racks[other], replicas=replicas))
        views.append([placement.owners(key) for key in KEYS[:20]])
    assert all(v == views[0] for v in views)
    for owners in views[0]:
        assert len(owners) == min(replicas, n) and len(set(owners)) == len(owners)


def test_a_store_heard_within_dead_after_stays_in_the_view():
    placement = Placement(STORES[0], "", 2, dead_after=10, handoff=1, alive_after=4)
    placement.on_member(member(STORES[1], heard=0))
    placement.on_member(member(STORES[2], heard=0))
    assert placement.expire(9.0) == [] and len(placement.view()) == 3
    placement.on_member(member(STORES[2], heard=9.0))
    assert placement.expire(10.5) == [STORES[1]] and sorted(placement.view()) == [STORES[0], STORES[2]]


def test_a_stall_of_its_own_loop_is_nobodys_silence():
    """Beats every second, dead_after 10: a look 12 s after the last means this store stood still (the others'
    heartbeats wait unread in its socket); nobody is dead for it, and a store that stays silent afterwards is,
    dead_after later."""
    placement = Placement(STORES[0], "", 2, dead_after=10, handoff=1, alive_after=4)
    placement.on_member(member(STORES[1], heard=0))
    placement.on_member(member(STORES[2], heard=0))
    assert placement.expire(1.0) == []
    assert placement.expire(13.0) == [] and len(placement.view()) == 3  # a 12 s stall of its own
    placement.on_member(member(STORES[2], heard=13.5))  # the queued heartbeats, read at last
    for now in range(14, 23):
        assert placement.expire(float(now)) == []
    assert placement.expire(23.5) == [STORES[1]]  # silent 10.5 s since the stall ended


def test_a_leaving_store_is_out_of_the_view_at_once():
    placement = Placement(STORES[0], "", 2, dead_after=10, handoff=1, alive_after=4)
    placement.on_member(member(STORES[1]))
    placement.on_member(member(STORES[1], leaving=True))
    assert list(placement.view()) == [STORES[0]]


def test_a_disagreement_on_replicas_is_reported_once():
    placement = Placement(STORES[0], "", 2, dead_after=10, handoff=1, alive_after=4)
    line = placement.on_member(member(STORES[1], replicas=3))
    assert line is not None and "store/replicas 3" in line
    assert placement.on_member(member(STORES[1], replicas=3, heard=1)) is None


def test_a_store_that_stops_owning_keeps_the_partition_until_the_owners_hold_it():
    me = STORES[0]
    placement = Placement(me, "", 1, dead_after=10, handoff=2.0, alive_after=4)
    key = next(k for k in KEYS if place(*k, {me: "", STORES[1]: ""}, 1) == [STORES[1]])
    assert placement.holds(key, 0.0, head=99)  # alone: it owns everything
    placement.on_member(member(STORES[1], heard=0.0))
    assert not placement.owns(key)
    assert placement.holds(key, 1.0, head=99)  # the new owner holds nothing yet
    placement.on_head("R" + STORES[1][1:], key, 50)
    assert placement.holds(key, 2.0, head=99)  # half of it
    placement.on_head("R" + STORES[1][1:], key, 99)
    assert placement.holds(key, 3.0, head=99)  # all of it, handoff_ms not over
    assert placement.holds(key, 4.9, head=99)
    assert not placement.holds(key, 5.0, head=99)  # 2 s after the owner held it whole
    assert not placement.holds(("orders", "never"), 5.0, head=-1)  # nothing held: nothing to hand over


def test_owning_again_cancels_a_handoff():
    me = STORES[0]
    placement = Placement(me, "", 1, dead_after=10, handoff=0.0, alive_after=4)
    key = next(k for k in KEYS if place(*k, {me: "", STORES[1]: ""}, 1) == [STORES[1]])
    placement.on_member(member(STORES[1], heard=0.0))
    assert placement.holds(key, 0.0, head=10)
    placement.forget(STORES[1])
    assert placement.holds(key, 1.0, head=10) and key not in placement.handoffs


def test_under_replicated_counts_live_owners_that_are_not_filling():
    me = STORES[0]
    placement = Placement(me, "", 2, dead_after=10, handoff=1, alive_after=4)
    keys = KEYS[:50]
    assert placement.under_replicated(keys, 0.0) == keys  # alone: one copy of each
    placement.on_member(member(STORES[1], heard=0.0))
    assert placement.under_replicated(keys, 1.0) == []
    filling = keys[:3]
    placement.on_member(member(STORES[1], heard=1.0, filling=frozenset(filling)))
    assert placement.under_replicated(keys, 1.5) == filling
    assert placement.under_replicated(keys, 1.5, filling=keys[3:4]) == keys[:4]
    # not heard for beacon/timeout: in the view still (no move before dead_ms), but not a live copy
    assert placement.under_replicated(keys, 6.0) == keys
    assert Placement(me, "", 0, 10, 1, 4).under_replicated(keys, 0.0) == []
