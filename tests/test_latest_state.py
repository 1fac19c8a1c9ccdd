"""``latest`` without sockets (rfc 8.1): dafka/consumer/latest.py, dafka/producer/publish_times.py, the producer's HEADS-AT
and the consumer's start of every partition, with a model of a cluster that hypothesis drives through any
interleaving of subscription, records, HEADs, the stores' heads and the HEADS-AT answers."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dafka.consumer import latest
from dafka import protocol as proto
from dafka.consumer.state import ConsumerState
from dafka.consumer.latest import LatestStarts
from dafka.producer.state import ProducerState
from dafka.producer.publish_times import RING, STEP, PublishTimes

ME = "C" * 32
STORE = "S" * 32
SINCE = 1_700_000_000_000


def answer(sender, entries, complete=False, since=SINCE, topic="t"):
    return proto.HeadsAtMsg(ME, since, topic, sender, complete,
                            tuple(proto.HeldAt(p, proto.NOTHING_HELD if s < 0 else s) for p, s in entries))


# -- LatestStarts ---------------------------------------------------------------------------------------


def test_a_producers_answer_decides_at_once_before_or_after_the_partition_is_met():
    starts = LatestStarts()
    starts.subscribe("t", SINCE)
    assert starts.on_answer(answer("P1", [("P1", 4)])) == []  # not met yet
    assert starts.meet("t", "P1", 9, 9, 0.0) == ("t", "P1", 5, 9)
    assert starts.meet("t", "P2", 3, 2, 0.0) is None
    assert starts.on_answer(answer("P2", [("P2", -1)])) == [("t", "P2", 0, 2)]  # born after: from 0


def test_stores_answers_are_lower_bounds_and_the_highest_wins_at_the_deadline():
    starts = LatestStarts()
    starts.subscribe("t", SINCE)
    starts.meet("t", "P", 20, 19, 1.0)
    starts.on_answer(answer("S1", [("P", 7)], complete=True))
    starts.on_answer(answer("S2", [("P", 9)], complete=True))
    starts.on_answer(answer("S3", [("P", 3)], complete=True))
    assert starts.tick(1.0 + latest.WAIT / 2) == []
    assert starts.tick(1.0 + latest.WAIT) == [("t", "P", 10, 19)]


def test_a_partition_a_store_did_not_list_was_born_after_the_subscription():
    starts = LatestStarts()
    starts.subscribe("t", SINCE)
    starts.on_answer(answer("S1", [("OLD", 50)], complete=True))
    starts.meet("t", "NEW", 6, 5, 0.0)  # through the store's heads later: its producer is gone
    assert starts.tick(latest.WAIT) == [("t", "NEW", 0, 5)]


def test_without_any_answer_the_reference_rule_and_the_partition_is_marked_guessed():
    starts = LatestStarts()
    starts.subscribe("t", SINCE)
    starts.meet("t", "P", 8, 7, 0.0)  # a HEAD 7
    assert starts.tick(latest.WAIT) == [("t", "P", 8, 7)]
    assert ("t", "P") in starts.guessed


def test_an_answer_for_another_subscription_or_that_cannot_tell_is_not_taken():
    starts = LatestStarts()
    starts.subscribe("t", SINCE)
    starts.meet("t", "P", 8, 7, 0.0)
    assert starts.on_answer(answer("P", [("P", 3)], since=SINCE - 1)) == []
    unknown = proto.HeadsAtMsg(ME, SINCE, "t", "P", False, (proto.HeldAt("P", proto.NOT_KNOWN),))
    assert starts.on_answer(unknown) == [] and starts.stale == 1
    assert starts.tick(latest.WAIT) == [("t", "P", 8, 7)]


def test_the_subscription_is_the_answers_prefix():
    starts = LatestStarts()
    starts.subscribe("t", SINCE)
    prefix = starts.subscription("t", ME)
    assert proto.encode(answer("P", [("P", 1)]))[0].startswith(prefix)
    assert not proto.encode(answer("P", [("P", 1)], topic="t2"))[0].startswith(prefix)
    assert proto.decode_heads_at_request(proto.decode_subscription(b"\x01" + prefix)) == (ME, SINCE, "t")


# -- PublishTimes and the producer's answer ---------------------------------------------------------------


def test_publish_times_are_exact_but_within_a_step_after_a_note():
    times = PublishTimes(10.0)
    times.note(0, 10.5)  # records 0..4 within STEP of 10.5
    times.note(5, 12.0)
    assert times.held_at(9.0, 8) == -1  # before the start
    assert times.held_at(10.2, 8) == -1
    assert times.held_at(10.5, 8) == 0  # within the step: a lower bound
    assert times.held_at(10.5 + STEP, 8) == 4
    assert times.held_at(11.9, 8) == 4
    assert times.held_at(12.0 + STEP, 8) == 7  # the newest: up to the next sequence


def test_publish_times_of_a_resumed_partition_cannot_tell_before_its_start():
    times = PublishTimes(10.0, before=99)
    assert times.held_at(9.0, 100) is None
    assert times.held_at(10.0, 100) == 99


def test_publish_times_past_the_ring_stay_lower_bounds():
    times = PublishTimes(0.0)
    for i in range(RING + 10):
        times.note(i * 10, 1.0 + i)
    assert times.floor == (10.0, 90)
    assert times.held_at(10.5, 10 * (RING + 10)) == 99  # the floor and the first kept note
    assert times.held_at(2.5, 10 * (RING + 10)) == -1  # forgotten: nothing can be said but the start's


def test_a_producer_answers_the_subscription_with_its_head_at_that_moment():
    state = ProducerState("P" * 32, "t", started=100.0)
    for i in range(5):
        state.publish(b"x", 100.0 + i)  # one a second
    wall = 2_000.0  # unix time at now = 104.0
    since_ms = int((wall - 4.0 + 2.5) * 1000)  # 102.5 on the producer's clock: records 0..2 before it
    sub = proto.decode_subscription(b"\x01" + proto.heads_at_prefix(ME, since_ms, "t"))
    assert state.on_subscription(sub, 104.0) is False
    [frames] = state.heads_at_out
    msg = proto.decode(state.heads_at(ME, since_ms, 104.0, wall))
    assert msg.entries == (proto.HeldAt("P" * 32, 2),) and not msg.complete and msg.address == "P" * 32
    assert proto.decode(frames).topic == ME
    other = proto.decode_subscription(b"\x01" + proto.heads_at_prefix(ME, since_ms, "other-topic"))
    state.on_subscription(other, 104.0)
    assert len(state.heads_at_out) == 1  # not its topic


# -- the model ------------------------------------------------------------------------------------------

PARTITIONS = ["P0", "P1", "P2"]
REFERENCE = {"P2"}  # a reference producer: never answers HEADS-AT

_STEPS = st.lists(st.one_of(
    st.tuples(st.just("produce"), st.sampled_from(PARTITIONS)),
    st.tuples(st.just("store_receive"), st.sampled_from(PARTITIONS)),
    st.tuples(st.just("live"), st.sampled_from(PARTITIONS)),
    st.tuples(st.just("head"), st.sampled_from(PARTITIONS)),
    st.tuples(st.just("producer_answer"), st.sampled_from(PARTITIONS)),
    st.tuples(st.just("store_answer"), st.just("")),
    st.tuples(st.just("store_heads"), st.just("")),
    st.tuples(st.just("tick"), st.integers(1, 400)),
), max_size=50)


class _Cluster:
    """Producers that publish at model times (ms), a store that receives their records later, and what
    each would answer: the truth the consumer's start is checked against."""

    def __init__(self) -> None:
        self.ms = SINCE - 5_000
        self.produced: dict[str, list[int]] = {p: [] for p in PARTITIONS}  # produce time of each sequence
        self.received: dict[str, list[int]] = {p: [] for p in PARTITIONS}  # store receive time of each
        self.subscribed_at: int | None = None
        self.answered: dict[str, int] = {}  # who answered (a partition's producer, "store"): when
        self.met: dict[str, int] = {}  # when the consumer first heard of each partition after subscribing

    def meet(self, partition: str) -> None:
        self.met.setdefault(partition, self.ms)

    def counted(self, who: str, partition: str) -> bool:
        """Whether ``who``'s answer came in time to decide ``partition``'s start: before the partition's
        wait (latest.WAIT from when it was met) ran out."""
        at = self.answered.get(who)
        met = self.met.get(partition)
        return at is not None and (met is None or at < met + int(latest.WAIT * 1000))

    def last_before(self, times: list[int], moment: int) -> int:
        return max((seq for seq, t in enumerate(times) if t <= moment), default=-1)


@settings(max_examples=400, deadline=None)
@given(before=_STEPS, after=_STEPS)
def test_latest_delivers_every_record_produced_after_the_subscription_and_none_from_before(before, after):
    """Any interleaving: nothing produced after the subscription is skipped, nothing is delivered twice,
    and nothing from before it is delivered, but records that no peer which answered in time (within
    latest.WAIT of the partition being met) held at the
    subscription (the ambiguous case of rfc 8.1); a partition that no dafka-py peer dated keeps the
    reference's rule and is only checked for order."""
    world = _Cluster()
    state = ConsumerState(ME, reset="latest")

    def now() -> float:
        return world.ms / 1000

    def step(kind: str, arg: object) -> None:
        p = str(arg)
        world.ms += 1
        state.now = now()
        if kind == "produce":
            world.produced[p].append(world.ms)
        elif kind == "store_receive":
            if len(world.received[p]) < len(world.produced[p]):
                world.received[p].append(world.ms)
        elif kind == "tick":
            world.ms += int(arg)  # type: ignore[call-overload]
            state.tick(now())
        elif world.subscribed_at is None:
            return  # nothing reaches a consumer that has not subscribed
        elif kind == "live" and world.produced[p]:
            world.meet(p)
            seq = len(world.produced[p]) - 1
            state.on_frames(proto.encode(proto.RecordMsg("t", p, "t", seq, b"%d" % seq)))
        elif kind == "head" and world.produced[p]:
            world.meet(p)
            state.on_frames(proto.encode(proto.HeadMsg("t", p, "t", len(world.produced[p]) - 1)))
        elif kind == "producer_answer" and p not in REFERENCE and p not in world.answered:
            world.answered[p] = world.ms
            held = world.last_before(world.produced[p], world.subscribed_at)
            state.on_frames(proto.encode(answer(p, [(p, held)], since=world.subscribed_at)))
        elif kind == "store_answer" and "store" not in world.answered:
            world.answered["store"] = world.ms
            entries = [(q, world.last_before(world.received[q], world.subscribed_at))
                       for q in PARTITIONS if world.received[q]]
            state.on_frames(proto.encode(answer(STORE, entries, complete=True, since=world.subscribed_at)))
        elif kind == "store_heads":
            for q in PARTITIONS:
                if world.received[q]:
                    world.meet(q)
            infos = tuple(proto.PartitionInfo("t", q, 0, len(world.received[q]) - 1)
                          for q in PARTITIONS if world.received[q])
            state.on_frames(proto.encode(proto.DirectPartitionsMsg(ME, STORE, "t", infos)))
        serve_fetches()

    def serve_fetches() -> None:
        for frames in list(state.out):
            state.out.remove(frames)
            msg = proto.decode(frames)
            if type(msg) is proto.FetchMsg and msg.topic in world.produced:
                for seq in range(msg.sequence, min(msg.sequence + msg.count, len(world.produced[msg.topic]))):
                    state.on_frames(proto.encode(proto.DirectRecordMsg(ME, msg.topic, "t", seq, b"%d" % seq)))

    for kind, arg in before:
        step(kind, arg)
    world.ms += 1
    world.subscribed_at = world.ms
    state.subscribe("t", since_ms=world.ms)
    state.out.clear()
    for kind, arg in after:
        step(kind, arg)
    for p in PARTITIONS:  # in the end every live producer's HEAD comes, and the waits end
        step("head", p)
    for _ in range(3):
        step("tick", int(latest.WAIT * 1000) + 1)
    for p in PARTITIONS:
        step("head", p)

    got: dict[str, list[int]] = {p: [] for p in PARTITIONS}
    for r in state.ready:
        got[r.partition].append(r.offset)
    for p in PARTITIONS:
        offsets = got[p]
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets))) if offsets else True, (p, offsets)
        if ("t", p) in state.latest.guessed:
            continue
        after_sub = [seq for seq, t in enumerate(world.produced[p]) if t > world.subscribed_at]
        assert set(after_sub) <= set(offsets), (p, offsets, after_sub)
        held = max(world.last_before(world.produced[p], world.subscribed_at) if world.counted(p, p) else -1,
                   world.last_before(world.received[p], world.subscribed_at) if world.counted("store", p) else -1)
        early = [seq for seq in offsets if world.produced[p][seq] <= world.subscribed_at]
        assert all(seq > held for seq in early), (p, early, held)
