"""The console's live tail starts (ui/live.py), without sockets: every record produced after the tail
opened, in order per partition, the newest when there are too many, none from before."""

from __future__ import annotations

from dafka.consumer import latest
from dafka import protocol as proto
from dafka.ui.live import FETCH_MOST, Fetching, LiveStarts

ME = "C" * 32
OLD, NEW = "A" * 32, "B" * 32
STORE = "5" * 32
SINCE = 1_800_000_000_000


def shown(live: LiveStarts) -> list[tuple[str, int, bytes]]:
    out = [(p.partition, o, v) for p in live.passed for o, v, _ in p.entries]
    live.passed.clear()
    return out


def answer(sender: str, entries: list[tuple[str, int]], complete: bool = False) -> proto.HeadsAtMsg:
    return proto.HeadsAtMsg(ME, SINCE, "t", sender, complete,
                            tuple(proto.HeldAt(p, proto.NOTHING_HELD if s < 0 else s) for p, s in entries))


def serve(live: LiveStarts, records: dict[str, list[bytes]], missing: set[int] = frozenset()) -> list[Fetching]:
    asked = list(live.fetches)
    live.fetches.clear()
    for f in asked:
        live.fetched(f, {o: (records[f.partition][o], None) for o in range(f.start, f.end + 1)
                         if o < len(records[f.partition]) and o not in missing})
    return asked


def test_a_one_shot_partition_heard_of_by_its_head_is_fetched_from_zero():
    live = LiveStarts()
    live.follow("t", SINCE)
    assert live.subscriptions(ME) == {proto.heads_at_prefix(ME, SINCE, "t")}
    live.on_answer(answer(NEW, [(NEW, -1)]))  # its producer: nothing held at the subscription
    live.head("t", NEW, 5, now=1.0)
    records = {NEW: [b"v%d" % i for i in range(6)]}
    assert [(f.start, f.end) for f in serve(live, records)] == [(0, 5)]
    assert shown(live) == [(NEW, i, b"v%d" % i) for i in range(6)]


def test_an_old_partition_goes_on_after_its_last_record_and_live_records_wait_for_the_gap():
    live = LiveStarts()
    live.follow("t", SINCE)
    records = {OLD: [b"o%d" % i for i in range(10)]}
    live.on_answer(answer(STORE, [(OLD, 6)], complete=True))  # the store held 0..6 at the subscription
    live.live("t", OLD, 9, [(9, b"o9", None)], now=1.0)  # 7 and 8 went by before the SUB connected
    assert live.due() == 1.0 + latest.WAIT
    live.tick(1.0 + latest.WAIT)
    assert [(f.start, f.end) for f in serve(live, records)] == [(7, 9)]
    assert shown(live) == [(OLD, 7, b"o7"), (OLD, 8, b"o8"), (OLD, 9, b"o9")]  # 9 once
    assert live.follows_on("t", OLD, 10, 2)  # then live records go straight through
    assert not live.follows_on("t", OLD, 13, 1)  # a gap does not
    live.live("t", OLD, 13, [(13, b"o13", None)], now=2.0)
    records[OLD] += [b"o10", b"o11", b"o12", b"o13"]
    assert [(f.start, f.end) for f in serve(live, records)] == [(12, 12)]
    assert shown(live) == [(OLD, 12, b"o12"), (OLD, 13, b"o13")]


def test_too_many_to_catch_up_shows_the_newest_and_counts_the_rest():
    live = LiveStarts()
    live.follow("t", SINCE)
    live.on_answer(answer(NEW, [(NEW, -1)]))
    live.head("t", NEW, 999, now=1.0)
    (fetch,) = live.fetches
    assert (fetch.start, fetch.end) == (1000 - FETCH_MOST, 999)
    assert live.passed[0].skipped == 1000 - FETCH_MOST
    live.passed.clear()
    serve(live, {NEW: [b"%d" % i for i in range(1000)]}, missing={999})
    (passed,) = live.passed
    assert [o for o, _, _ in passed.entries] == list(range(1000 - FETCH_MOST, 999))
    assert passed.skipped == 1  # the fetch did not find 999


def test_unfollow_forgets_and_a_new_tail_starts_from_its_own_moment():
    live = LiveStarts()
    live.follow("t", SINCE)
    live.on_answer(answer(NEW, [(NEW, 3)]))
    live.unfollow("t")
    assert live.subscriptions(ME) == set() and not live.partitions
    live.follow("t", SINCE + 5_000)
    assert live.subscriptions(ME) == {proto.heads_at_prefix(ME, SINCE + 5_000, "t")}
    live.on_answer(answer(NEW, [(NEW, 3)]))  # an answer to the first tail's request: stale
    live.head("t", NEW, 3, now=1.0)
    assert not live.fetches and live.latest.stale == 1
