"""A producer that keeps its partition across restarts (dafka.producer.resume, rfc section 15):
the sans-I/O rules, then real stores, a raw-frame reference store and consumer,
and a predecessor killed with SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import zmq

from dafka import Consumer, PartitionClaimed, Producer, ResumeError, partition_address, protocol as proto
from dafka.core.addresses import is_tagged_producer
from dafka.producer.resume import ANSWER_WAIT, NO_HEAD, SETTLE, ResumeState
from dafka.store import Store
from helpers import loopback_config, wait_for
from rawpeer import RawPeer
from dafkabench.refconsumer import RefConsumer

ME = partition_address("resume-test")
REQ = "E" * 32  # the temporary address a resuming producer asks under


def state(**kw) -> ResumeState:
    return ResumeState(ME, "orders", requester=REQ, min_stores=kw.pop("min_stores", 1), started=0.0,
                       timeout=kw.pop("timeout", 10.0), settle=kw.pop("settle", SETTLE))


def partitions(reader: str, *entries: tuple[str, str, int], to: str = REQ) -> proto.DirectPartitionsMsg:
    return proto.DirectPartitionsMsg(to, reader, "orders", tuple(proto.PartitionInfo(s, a, 0, h) for s, a, h in entries),
                                     "")


# -- the rules, without sockets ------------------------------------------------


def test_partition_address_is_stable_tagged_and_distinct():
    assert partition_address("a") == partition_address("a") != partition_address("b")
    assert is_tagged_producer(partition_address("a"))
    with pytest.raises(ValueError):
        partition_address("")


def test_waits_for_the_replay_then_resumes_once_every_dafka_store_answered():
    s = state()
    assert s.decide(0.1, peers=2, replayed=False, twins=[]) is None
    s.on_connection()
    s.on_connection()
    frames = s.on_store_reader(0.2)
    assert proto.decode(frames) == proto.GetHeadsMsg("orders", REQ)
    s.on_store_reader(0.2)
    s.on_message(partitions("R1", ("orders", ME, 41), ("orders", "X" * 32, 900)))
    assert s.decide(0.25, peers=2, replayed=True, twins=[]) is None  # R2 has not answered
    s.on_message(partitions("R2"))  # holds nothing of the topic: still a whole answer
    assert s.decide(0.26, peers=2, replayed=True, twins=[]) == 41


def test_head_is_the_highest_any_store_holds_and_other_partitions_and_topics_do_not_count():
    s = state()
    s.on_connection()
    s.on_store_reader(0.0)
    s.on_message(proto.DirectHeadMsg(REQ, ME, "orders", 7))
    s.on_message(proto.DirectHeadMsg(REQ, ME, "orders", 12))
    s.on_message(proto.DirectHeadMsg(REQ, ME, "orders2", 99))  # a reference store matches prefixes
    s.on_message(proto.DirectHeadMsg(REQ, "Y" * 32, "orders", 99))
    s.on_message(proto.DirectHeadMsg("Z" * 32, ME, "orders", 99))  # addressed to someone else
    s.on_message(partitions("R9", ("orders", ME, 99), to="Z" * 32))
    assert s.decide(0.1, peers=1, replayed=True, twins=[]) is None  # reference answers have no end
    assert s.decide(ANSWER_WAIT, peers=1, replayed=True, twins=[]) == 12


def test_a_partition_no_store_holds_starts_at_zero():
    s = state()
    s.on_connection()
    s.on_store_reader(0.0)
    s.on_message(partitions("R1"))
    assert s.decide(0.01, peers=1, replayed=True, twins=[]) == NO_HEAD


def test_waits_for_every_reported_peer_to_connect_or_settle():
    s = state()
    s.on_connection()
    s.on_store_reader(0.0)
    s.on_message(partitions("R1", ("orders", ME, 3)))
    assert s.decide(0.1, peers=3, replayed=True, twins=[]) is None  # two peers may be stores still connecting
    assert s.decide(0.1 + SETTLE, peers=3, replayed=True, twins=[]) == 3


def test_a_store_slow_to_connect_is_waited_for_until_beacon_timeout_and_its_higher_head_counts():
    """Under load a store reader can take more than a second to connect: resuming without its head would give
    the offsets only it holds a second content (a CDC consumer then dropped changes as already applied)."""
    s = state(min_stores=2, settle=4.0)  # the producer gives beacon/timeout
    s.on_connection()
    s.on_connection()
    s.on_store_reader(0.0)
    s.on_store_reader(0.0)
    s.on_message(partitions("R1", ("orders", ME, 3)))
    s.on_message(partitions("R2", ("orders", ME, 5)))
    assert s.decide(0.1 + SETTLE, peers=3, replayed=True, twins=[]) is None  # the third peer is still coming
    s.on_connection()  # it was a store, with the highest head
    s.on_store_reader(2.0)
    assert s.decide(2.1, peers=3, replayed=True, twins=[]) is None  # asked: its answer is awaited
    s.on_message(partitions("R3", ("orders", ME, 9)))
    assert s.decide(2.2, peers=3, replayed=True, twins=[]) == 9
    dead = state(settle=4.0)  # a reported peer that never connects (dead, not expired yet): up to settle
    dead.on_connection()
    dead.on_store_reader(0.0)
    dead.on_message(partitions("R1", ("orders", ME, 3)))
    assert dead.decide(0.1, peers=2, replayed=True, twins=[]) is None  # (the replay, at 0.1)
    assert dead.decide(0.1 + SETTLE, peers=2, replayed=True, twins=[]) is None
    assert dead.decide(0.1 + 4.0, peers=2, replayed=True, twins=[]) == 3


def test_too_few_stores_is_an_error_that_names_the_settings():
    s = state(min_stores=2, timeout=5.0)
    s.on_connection()
    s.on_store_reader(0.0)
    s.on_message(partitions("R1", ("orders", ME, 3)))
    assert s.decide(2.0, peers=1, replayed=True, twins=[]) is None
    with pytest.raises(ResumeError, match=r"1 store\(s\) answered.*2 needed.*producer/min_acks"):
        s.decide(5.0, peers=1, replayed=True, twins=[])


def test_no_tower_is_an_error():
    with pytest.raises(ResumeError, match="no tower"):
        state(timeout=1.0).decide(1.0, peers=0, replayed=False, twins=[])


def test_nothing_is_decided_before_a_live_twin_would_have_beaconed():
    s = ResumeState(ME, "orders", requester=REQ, min_stores=1, started=0.0, timeout=10.0, twin_wait=1.5)
    s.on_connection()
    s.on_store_reader(0.0)
    s.on_message(partitions("R1", ("orders", ME, 3)))
    assert s.decide(1.0, peers=1, replayed=True, twins=[]) is None  # the replay may have missed a live twin
    assert s.decide(1.6, peers=1, replayed=True, twins=[]) == 3


def test_a_twin_that_expires_is_a_dead_predecessor_one_that_stays_claims_the_partition():
    s = state(timeout=5.0)
    s.on_connection()
    s.on_store_reader(0.0)
    s.on_message(partitions("R1", ("orders", ME, 3)))
    assert s.decide(1.0, peers=1, replayed=True, twins=["tcp://127.0.0.1:9"]) is None
    # gone: the stores are asked again, since it may have written after their answers (a gateway that let go
    # of the partition wrote until it stopped: resuming at 3 gave its last records' offsets a second content)
    assert s.decide(2.0, peers=1, replayed=True, twins=[]) is None and s.asks_due
    s.asks_due = False
    s.ask(2.0)
    assert s.decide(2.1, peers=1, replayed=True, twins=[]) is None  # R1's new answer is awaited
    s.on_message(partitions("R1", ("orders", ME, 7)))
    assert s.decide(2.1, peers=1, replayed=True, twins=[]) == 7 and not s.asks_due
    # gone, and no store answers the new asks (lost answers, reference stores that say nothing): silence is
    # no head for a partition a live twin had; a dafka-py store's whole answer is one, even without it
    s = state(timeout=5.0)
    s.on_connection()
    s.on_store_reader(0.0)
    assert s.decide(1.0, peers=1, replayed=True, twins=["tcp://127.0.0.1:9"]) is None
    assert s.decide(2.0, peers=1, replayed=True, twins=[]) is None and s.asks_due
    s.ask(2.0)
    assert s.decide(2.1, peers=1, replayed=True, twins=[]) is None
    assert s.decide(4.0, peers=1, replayed=True, twins=[]) is None  # (ANSWER_WAIT long past)
    s.on_message(partitions("R1"))  # the twin never wrote: the store holds nothing of it
    assert s.decide(4.1, peers=1, replayed=True, twins=[]) == NO_HEAD
    # gone, and one of the three stores found is killed before it answers: the two others' whole answers,
    # without the partition, say it has no record (min_acks 2); before, the resume waited for the dead one
    s = ResumeState(ME, "orders", requester=REQ, min_stores=2, started=0.0, timeout=5.0)
    for _ in range(3):
        s.on_connection()
        s.on_store_reader(0.0)
    assert s.decide(1.0, peers=3, replayed=True, twins=["tcp://127.0.0.1:9"]) is None
    assert s.decide(2.0, peers=3, replayed=True, twins=[]) is None and s.asks_due
    s.ask(2.0)
    s.on_message(partitions("R1"))
    assert s.decide(4.0, peers=3, replayed=True, twins=[]) is None  # one whole answer of the two needed
    s.on_message(partitions("R2", ("other", "P", 5)))
    assert s.decide(4.1, peers=3, replayed=True, twins=[]) == NO_HEAD
    s = ResumeState(ME, "orders", requester=REQ, min_stores=2, started=0.0, timeout=5.0)
    for _ in range(3):
        s.on_connection()
        s.on_store_reader(0.0)
    s.decide(1.0, peers=3, replayed=True, twins=["tcp://127.0.0.1:9"])
    s.decide(2.0, peers=3, replayed=True, twins=[])
    s.ask(2.0)
    s.on_message(partitions("R1"))
    with pytest.raises(ResumeError, match=r"no store named the partition and 1 of 3 store\(s\) found gave a whole"):
        s.decide(5.0, peers=3, replayed=True, twins=[])
    s = state(timeout=5.0)
    with pytest.raises(PartitionClaimed, match="tcp://127.0.0.1:9"):
        s.decide(5.0, peers=1, replayed=True, twins=["tcp://127.0.0.1:9"])


def test_resume_needs_an_address(tower):
    with pytest.raises(ValueError, match="address="):
        Producer("orders", loopback_config(tower), resume=True)


# -- real peers ----------------------------------------------------------------


@pytest.fixture
def store(tower, tmp_path):
    s = Store(loopback_config(tower), db=str(tmp_path / "db")).start()
    yield s
    s.stop()


def _send(producer: Producer, values: list[bytes]) -> list[int]:
    handles = [producer.send(v) for v in values]
    producer.flush(timeout=10)
    return [h.offset for h in handles]


def _read_all(tower, n: int, topic: str = "orders") -> list[tuple[int, bytes]]:
    got = []
    with Consumer(topic, config=loopback_config(tower, consumer__offset__reset="earliest")) as consumer:
        deadline = time.monotonic() + 15
        while len(got) < n and time.monotonic() < deadline:
            got += [(r.offset, r.value) for r in consumer.consume(1000, timeout=0.2)]
    return got


def test_a_restarted_producer_continues_its_partition(tower, store):
    with Producer("orders", loopback_config(tower), address=ME, resume=True) as first:
        assert _send(first, [b"a%d" % i for i in range(10)]) == list(range(10))
    with Producer("orders", loopback_config(tower), address=ME, resume=True) as second:
        assert second.stats()["acked"] == 10  # everything before it counts as acked
        assert _send(second, [b"b%d" % i for i in range(5)]) == list(range(10, 15))
    got = _read_all(tower, 15)
    assert got == [(i, b"a%d" % i) for i in range(10)] + [(10 + i, b"b%d" % i) for i in range(5)]
    assert store.heads() == {("orders", ME): 14}


def test_a_finished_probe_does_not_hold_up_the_next_resume(tower, store):
    """A resume's probe asks under a temporary address, tagged as a producer's: once it is done, the next resume
    (a mirror's next partition, in the same process or another) neither counts it among the peers that will
    connect nor waits for it to expire.  Untagged, it was waited for until beacon/timeout: the mirror met a new
    partition 4 s late, and here, with beacon/timeout 30 s, the second resume ran out of its 10 s."""
    config = loopback_config(tower, beacon__timeout=30_000, producer__resume_timeout=10_000)
    with Producer("first", config, address=partition_address("probe-first"), resume=True) as first:
        assert is_tagged_producer(first._requester) and first._requester != first.address
    started = time.monotonic()
    with Producer("second", config, address=partition_address("probe-second"), resume=True) as second:
        assert _send(second, [b"x"]) == [0]
    assert time.monotonic() - started < 8


def test_without_a_store_resume_fails_and_sends_nothing(tower):
    started = time.monotonic()
    with pytest.raises(ResumeError, match=r"0 store\(s\) answered.*producer/resume_timeout \(1500 ms\)"):
        Producer("orders", loopback_config(tower, producer__resume_timeout=1500), address=ME, resume=True)
    assert time.monotonic() - started < 5


def test_a_live_producer_with_the_same_address_is_never_joined_by_a_second(tower, store):
    with Producer("orders", loopback_config(tower), address=ME, resume=True) as first:
        _send(first, [b"x"])
        with pytest.raises(PartitionClaimed, match="claimed by a live producer"):
            Producer("orders", loopback_config(tower, producer__resume_timeout=1500), address=ME, resume=True)
        assert _send(first, [b"y"]) == [1]  # the first one keeps writing


def test_a_resume_that_waits_a_live_producer_out_continues_after_its_last_record(tower, store):
    """The live producer writes on while the newcomer waits for it to go (as a Kafka gateway writes a
    partition until it lets go of it to the gateway that leads it now): the newcomer resumes after the last
    record, not at the head the stores answered when it started."""
    import threading

    first = Producer("orders", loopback_config(tower), address=ME, resume=True)
    second: list = []
    try:
        _send(first, [b"a0"])
        thread = threading.Thread(target=lambda: second.append(
            Producer("orders", loopback_config(tower, producer__resume_timeout=20_000), address=ME, resume=True)))
        thread.start()
        time.sleep(1.0)  # its probe has asked the stores, and waits for the twin to go
        assert _send(first, [b"a%d" % i for i in range(1, 200)])[-1] == 199
        first.close()
        thread.join(30)
        assert second, "the second producer did not resume"
        assert _send(second[0], [b"b"]) == [200]
    finally:
        first.close()
        for producer in second:
            producer.close()
    assert [v for _, v in _read_all(tower, 201)] == [b"a%d" % i for i in range(200)] + [b"b"]


def test_a_running_producer_that_sees_a_twin_stops_writing(tower, store):
    with Producer("orders", loopback_config(tower), address=ME, resume=True) as first:
        _send(first, [b"x"])
        # A second process that does not resume (no probe) with the same address: both must stop.
        intruder = Producer("orders", loopback_config(tower, producer__head_interval=100), address=ME)
        try:
            wait_for(lambda: first.stats()["claimed"], timeout=5, what="the first producer to see the twin")
            with pytest.raises(PartitionClaimed, match="one writer"):
                first.send(b"z")
        finally:
            intruder.close(timeout=1)


_KILLED_PRODUCER = r"""
import sys, time
from dafka import Producer
config = {"beacon/address": "127.0.0.1", "beacon/bind_address": "127.0.0.1", "beacon/sub_address": sys.argv[1],
          "beacon/pub_address": sys.argv[2], "beacon/timeout": 1500}
p = Producer("orders", config, address=sys.argv[3], resume=True)
for i in range(1000):
    p.send(b"old%d" % i)
p.flush(timeout=10)
p.send(b"unacked?")  # may or may not reach the store before the kill
print("ready", flush=True)
time.sleep(60)
"""


def test_after_sigkill_a_new_process_waits_out_the_old_beacon_and_continues(tower, store):
    env = dict(os.environ, PYTHONSAFEPATH="1")
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_PRODUCER, tower.sub_endpoint, tower.pub_endpoint, ME],
                            stdout=subprocess.PIPE, env=env)
    try:
        assert proc.stdout.readline().strip() == b"ready"
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        config = loopback_config(tower, beacon__timeout=1500)
        started = time.monotonic()
        with Producer("orders", config, address=ME, resume=True) as again:
            waited = time.monotonic() - started
            head = store.heads()[("orders", ME)]
            assert head in (999, 1000)
            assert _send(again, [b"new"]) == [head + 1]
        assert waited < 5, waited  # the tower still relayed the dead one's beacon until it expired
        got = _read_all(tower, head + 2)
        assert [o for o, _ in got] == list(range(head + 2))
        assert got[-1] == (head + 1, b"new")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()


class _ReferenceStore:
    """A raw-frame store reader as the reference's: subscribes GET-HEADS on every
    peer and answers with one DIRECT-HEAD per partition it holds, never a
    DIRECT-PARTITIONS (it does not know the extension)."""

    def __init__(self, tower, heads: dict[tuple[str, str], int]) -> None:
        self.heads = heads
        self.peer = RawPeer(tower, "C" * 32, [proto.GET_HEADS])
        self.asked = 0

    def pump(self) -> None:
        self.peer.pump()
        while self.peer.sub.poll(0):
            msg = proto.decode(self.peer.sub.recv_multipart())
            if type(msg) is proto.GetHeadsMsg:
                self.asked += 1
                for (subject, address), head in self.heads.items():
                    if subject.startswith(msg.topic):  # the reference matches prefixes
                        self.peer.send(proto.DirectHeadMsg(msg.address, address, subject, head))


def test_a_reference_store_alone_gives_the_head_with_direct_heads(tower):
    ref = _ReferenceStore(tower, {("orders", ME): 41, ("orders2", ME): 500})
    import threading

    stop = threading.Event()
    pump = threading.Thread(target=lambda: [ref.pump() or time.sleep(0.002) for _ in iter(stop.is_set, True)],
                            name="ref-store-pump")
    pump.start()
    try:
        seen = []
        # min_acks 0: nobody acks in this test; resume still needs one store's answer
        with Producer("orders", loopback_config(tower, producer__min_acks=0), address=ME, resume=True) as p:
            seen.append(p.send(b"next").offset)
        assert seen == [42]
        assert ref.asked >= 1
    finally:
        stop.set()
        pump.join(5)
        ref.peer.close()


def test_a_reference_consumer_sees_an_ordinary_partition_that_paused(tower, store):
    with Producer("orders", loopback_config(tower), address=ME, resume=True) as first:
        _send(first, [b"a%d" % i for i in range(20)])
    ref = RefConsumer(tower.sub_endpoint, tower.pub_endpoint, "F" * 32, earliest=True, keep=True)
    try:
        ref.subscribe("orders")
        assert ref.run(lambda: ref.total() >= 20, timeout=10)
        with Producer("orders", loopback_config(tower), address=ME, resume=True) as second:
            _send(second, [b"b%d" % i for i in range(20)])
            assert ref.run(lambda: ref.total() >= 40, timeout=10)
        assert ref.foreign == 0
        assert ref.last[(b"orders", ME.encode())] == 39
        assert ref.contents[("orders", ME)] == [b"a%d" % i for i in range(20)] + [b"b%d" % i for i in range(20)]
    finally:
        ref.close()


def test_async_producer_resumes_too(tower, store):
    import asyncio

    from dafka.aio import AsyncProducer

    async def main() -> list[int]:
        offsets = []
        for _ in range(2):
            async with AsyncProducer("orders", loopback_config(tower), address=ME, resume=True) as p:
                offsets.append((await p.send_and_wait(b"v")).offset)
        return offsets

    assert asyncio.run(main()) == [0, 1]


def test_zmq_context_is_left_clean_after_a_failed_resume(tower):
    ctx = zmq.Context()
    try:
        with pytest.raises(ResumeError):
            Producer("orders", loopback_config(tower, producer__resume_timeout=300), address=ME, resume=True, ctx=ctx)
    finally:
        ctx.term()  # hangs if the failed producer left a socket open


def test_send_many_with_an_offset_sends_only_at_that_offset(tower, store):
    with Producer("orders", loopback_config(tower), address=ME, resume=True) as p:
        assert p.send_many([b"a", b"b"], offset=0) == 0
        with pytest.raises(ValueError, match="at offset 2, not 5: nothing was sent"):
            p.send_many([b"c"], offset=5)
        with pytest.raises(ValueError, match="not 1"):
            p.send_many([b"c"], offset=1)
        assert p.send_many([b"c"], offset=2) == 2
        p.flush(10)
        assert p.stats()["sent"] == 3
