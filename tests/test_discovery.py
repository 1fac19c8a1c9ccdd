"""Tower and beacons on ephemeral loopback ports."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import zmq

from helpers import loopback_config, wait_for
from dafka import proto
from dafka.beacon import CONNECT, DISCONNECT, Beacon, BeaconState
from dafka.towerd.tower import Tower, TowerState


def make_beacon(tower: Tower, sender: str, port: int, interval_ms: int = 1000, timeout_ms: int = 4000) -> Beacon:
    return Beacon(
        zmq.Context.instance(), sender, port,
        host="127.0.0.1", tower_sub=tower.sub_endpoint, tower_pub=tower.pub_endpoint,
        interval_ms=interval_ms, timeout_ms=timeout_ms, name="test",
    ).start()


def collect(beacon: Beacon, events: list, timeout: float = 0.05) -> list:
    if beacon.events.poll(int(timeout * 1000)):
        events.extend(Beacon.read_events(beacon.events))
    return events


def test_two_beacons_find_each_other(tower):
    a = make_beacon(tower, "A" * 32, 40001)
    b = make_beacon(tower, "B" * 32, 40002)
    try:
        got_a, got_b = [], []
        wait_for(lambda: any(e.sender == "B" * 32 for e in collect(a, got_a)), 5, what="A sees B")
        wait_for(lambda: any(e.sender == "A" * 32 for e in collect(b, got_b)), 5, what="B sees A")
        assert (CONNECT, "tcp://127.0.0.1:40002", "B" * 32) in got_a
        assert (CONNECT, "tcp://127.0.0.1:40001", "A" * 32) in got_b
        assert a.connected and b.connected
        assert tower.peers() == {"A" * 32: "tcp://127.0.0.1:40001", "B" * 32: "tcp://127.0.0.1:40002"}
    finally:
        a.stop()
        b.stop()


def test_late_peer_sees_existing_peer_well_under_one_interval(tower):
    a = make_beacon(tower, "A" * 32, 40001)
    try:
        wait_for(lambda: tower.peers(), 5, what="tower learns A")
        started = time.monotonic()
        b = make_beacon(tower, "B" * 32, 40002)
        try:
            got = []
            wait_for(lambda: collect(b, got, 0.005), 2, interval=0.001, what="B sees A")
            elapsed = time.monotonic() - started
            assert got[0] == (CONNECT, "tcp://127.0.0.1:40001", "A" * 32)
            assert elapsed < 0.5, f"took {elapsed:.3f}s"
        finally:
            b.stop()
    finally:
        a.stop()


def test_stopped_peer_expires_after_timeout(tower):
    a = make_beacon(tower, "A" * 32, 40001, interval_ms=100, timeout_ms=600)
    b = make_beacon(tower, "B" * 32, 40002, interval_ms=100, timeout_ms=600)
    try:
        got = []
        wait_for(lambda: any(e.kind == CONNECT for e in collect(a, got)), 5, what="A sees B")
        b.stop()
        stopped = time.monotonic()
        wait_for(lambda: any(e.kind == DISCONNECT for e in collect(a, got)), 5, what="B expires")
        elapsed = time.monotonic() - stopped
        assert (DISCONNECT, "tcp://127.0.0.1:40002", "B" * 32) in got
        assert 0.4 < elapsed < 2.0, elapsed
        assert a.peers() == {}
    finally:
        a.stop()
        b.stop()


def test_beacon_without_tower_does_not_block_and_reports_state():
    ctx = zmq.Context.instance()
    dead = ctx.socket(zmq.XSUB)
    dead.bind("tcp://127.0.0.1:*")
    endpoint = dead.last_endpoint.decode()
    dead.close(0)  # a port nobody listens on any more
    started = time.monotonic()
    a = Beacon(ctx, "A" * 32, 40001, host="127.0.0.1", tower_sub=endpoint, tower_pub=endpoint).start()
    try:
        assert time.monotonic() - started < 1.0
        assert not a.connected
        assert not a.wait_connected(0.3)
    finally:
        a.stop()


def test_beacon_state_ignores_itself_and_counts_malformed():
    state = BeaconState("ME", 1.0, 4.0)
    events, urgent = state.on_frames([b"B", b"ME", b"tcp://127.0.0.1:1"], 0.0)
    assert events == [] and not urgent
    events, urgent = state.on_frames([b"B", b"X"], 0.0)
    assert events == [] and state.malformed == 1
    events, urgent = state.on_frames([b"B", b"P", b"tcp://127.0.0.1:2"], 0.0)
    assert events == [(CONNECT, "tcp://127.0.0.1:2", "P")] and urgent
    events, urgent = state.on_frames([b"B", b"P", b"tcp://127.0.0.1:2"], 1.0)
    assert events == [] and not urgent
    assert state.expire(4.9) == []
    assert state.expire(5.0) == [(DISCONNECT, "tcp://127.0.0.1:2", "P")]


@pytest.mark.parametrize(
    "loopback_only,lan,host,peer,expected",
    [
        (True, None, "", "127.0.0.1", "127.0.0.1"),
        (False, "10.1.2.3", "", "127.0.0.1", "10.1.2.3"),  # the reference's rule
        (False, "10.1.2.3", "", None, "10.1.2.3"),
        (False, "10.1.2.3", "", "192.168.0.9", "192.168.0.9"),
        (True, None, "somehost", "127.0.0.1", "somehost"),
    ],
)
def test_tower_endpoint_rules(loopback_only, lan, host, peer, expected):
    state = TowerState(loopback_only, 4.0, lan)
    out = state.on_beacon(proto.encode_beacon(proto.Beacon("S", host, 41234)), peer, 0.0)
    assert out == [b"B", b"S", f"tcp://{expected}:41234".encode()]


def test_tower_relays_reference_beacon_frames_and_drops_malformed(tower):
    """A raw reference-style peer: PUB beacon with empty host, SUB for B."""
    ctx = zmq.Context.instance()
    pub = ctx.socket(zmq.PUB)
    sub = ctx.socket(zmq.SUB)
    for s in (pub, sub):
        s.linger = 0
    sub.setsockopt(zmq.SUBSCRIBE, b"B")
    sub.connect(tower.pub_endpoint)
    pub.connect(tower.sub_endpoint)
    try:
        def relayed():
            pub.send_multipart([b"B", b"X"])  # malformed: dropped and counted
            pub.send_multipart([b"B", b"producer-1", b"", b"41234"])
            if sub.poll(50):
                return sub.recv_multipart()
        frames = wait_for(relayed, 5, what="relay")
        assert frames == [b"B", b"producer-1", b"tcp://127.0.0.1:41234"]
        assert tower.state.malformed >= 1
    finally:
        pub.close()
        sub.close()


def test_sigkilled_peer_process_disappears_after_beacon_timeout(tower, processes):
    """A real process with a beacon, killed with SIGKILL, expires from the others' view."""
    code = (
        "import sys, time, zmq\n"
        "from dafka.beacon import Beacon\n"
        "b = Beacon(zmq.Context.instance(), 'K' * 32, 40009, host='127.0.0.1',\n"
        "           tower_sub=sys.argv[1], tower_pub=sys.argv[2], interval_ms=100, timeout_ms=800).start()\n"
        "print('up', flush=True)\n"
        "time.sleep(60)\n"
    )
    child = processes.python(code, tower.sub_endpoint, tower.pub_endpoint)
    assert child.stdout.readline().strip() == b"up"
    a = make_beacon(tower, "A" * 32, 40001, interval_ms=100, timeout_ms=800)
    try:
        got = []
        wait_for(lambda: any(e.sender == "K" * 32 for e in collect(a, got)), 5, what="A sees the child")
        child.kill()
        killed = time.monotonic()
        wait_for(lambda: any(e.kind == DISCONNECT for e in collect(a, got)), 5, what="child expires")
        assert (DISCONNECT, "tcp://127.0.0.1:40009", "K" * 32) in got
        assert 0.5 < time.monotonic() - killed < 3.0
    finally:
        a.stop()


def test_peer_without_beacon_address_advertises_its_route_to_a_loopback_tower(tower):
    """No beacon/address, no bind address: everything stays on 127.0.0.1."""
    from dafka import Producer
    config = loopback_config(tower, beacon__address="", beacon__bind_address="", producer__min_acks=0)
    with Producer("route", config) as producer:
        assert producer.endpoint.startswith("tcp://127.0.0.1:")
        wait_for(lambda: producer.address in tower.peers(), 5, what="tower learns the producer")
        assert tower.peers()[producer.address] == producer.endpoint


@pytest.mark.parametrize("frames", [
    [b"B", b"P", b"tcp://bad host:1"],  # libzmq would refuse to connect
    [b"B", b"P", b"tcp://h:70000"],
    [b"B", b"P", b"ipc:///tmp/x"],
    [b"B", b"\xff\xfe", b"tcp://127.0.0.1:2"],  # sender not UTF-8
    [b"B", b"P", b"tcp://h\xff:2"],
])
def test_beacon_state_drops_endpoints_a_peer_could_not_use(frames):
    state = BeaconState("ME", 1.0, 4.0)
    events, urgent = state.on_frames(frames, 0.0)
    assert events == [] and not urgent and state.malformed == 1


def test_wake_pipes_of_one_process_never_share_a_name():
    """Names built from id() collided once an owner was collected while its
    pipe was still bound; every pipe now gets a name of its own."""
    from dafka import net

    ctx = zmq.Context()
    pipes = [net.wake_pipe(ctx, "tower") for _ in range(50)]
    try:
        for wake, waker in pipes:
            waker.send(b"x")
        for wake, _ in pipes:
            assert wake.poll(1000) and wake.recv() == b"x"
            assert not wake.poll(0)  # each waker reaches its own pipe only
    finally:
        for wake, waker in pipes:
            wake.close(0)
            waker.close(0)
        ctx.term()


def test_tower_replays_to_a_dafka_py_newcomer_alone_and_says_when_it_is_over(tower):
    """rfc 5.5: a dafka-py peer subscribes to B, W and Z<address> together;
    the tower replays the live peers' beacons to it alone (as Z<address>
    messages), then sends the end marker.  A reference peer, which only
    subscribes to B, still gets the replay as plain beacons, sent to every
    listener, and never anything addressed to another peer."""
    ctx = zmq.Context.instance()
    peers = [make_beacon(tower, f"{i:032X}", 41000 + i, interval_ms=60_000) for i in range(5)]
    newcomer, reference = ctx.socket(zmq.SUB), ctx.socket(zmq.SUB)
    expected = {f"{i:032X}".encode() for i in range(5)}
    try:
        wait_for(lambda: len(tower.peers()) == 5, 5, what="five peers at the tower")
        # A peer beacons at once when it meets a peer it did not know: wait until each knows the four
        # others, and for their last such beacons to pass the tower, or one reaches the reference
        # listener after its replay and looks like the newcomer's replay (1 run in 7 failed so).
        wait_for(lambda: all(len(p.peers()) == 4 for p in peers), 5, what="every peer to know the others")
        time.sleep(0.2)
        reference.setsockopt(zmq.SUBSCRIBE, b"B")
        reference.setsockopt(zmq.SUBSCRIBE, b"W")
        reference.connect(tower.pub_endpoint)
        replayed = set()
        while replayed != expected:
            assert reference.poll(5000), f"the reference listener's replay is incomplete: {replayed}"
            frames = reference.recv_multipart()
            if frames[0] == b"B":
                replayed.add(frames[1])
        marker = b"Z" + b"N" * 32
        newcomer.setsockopt(zmq.SUBSCRIBE, b"B")
        newcomer.setsockopt(zmq.SUBSCRIBE, b"W")
        newcomer.setsockopt(zmq.SUBSCRIBE, marker)
        newcomer.connect(tower.pub_endpoint)
        seen = set()
        while True:
            assert newcomer.poll(5000), "no end-of-replay marker"
            frames = newcomer.recv_multipart()
            if frames == [marker]:
                break
            if len(frames) == 3 and frames[0] in (b"B", marker):
                seen.add(frames[1])
        assert seen == expected, "the marker came before the replay"
        time.sleep(0.3)
        others = []
        while reference.poll(0):
            others.append(reference.recv_multipart())
        assert others == [], "the newcomer's replay went to every listener"
    finally:
        newcomer.close(0)
        reference.close(0)
        for p in peers:
            p.stop()


def test_beacon_knows_when_the_towers_replay_is_over(tower):
    beacon = make_beacon(tower, "R" * 32, 41999)
    try:
        wait_for(lambda: beacon.replayed, 5, what="end of replay")
    finally:
        beacon.stop()
    state = BeaconState("S" * 32, 1.0, 4.0)
    assert state.on_frames([b"Z" + b"T" * 32], 0.0) == ([], False) and state.replays == 0
    assert state.malformed == 1, "another peer's marker never reaches us: malformed"
    assert state.on_frames([b"Z" + b"S" * 32], 0.0) == ([], False) and state.replays == 1 and state.welcomed


_FIRST = st.sampled_from([b"B", b"W", b"Z" + b"ME" * 16, b"Z" + b"OT" * 16, b"Z"]) | st.binary(max_size=40)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(_FIRST, st.lists(st.binary(max_size=40), max_size=4)), min_size=1, max_size=6))
def test_beacon_state_takes_any_frames_from_a_tower(messages):
    """Fuzz: relayed beacons, replays addressed to us (rfc 5.5) and anything
    else; the state never raises, reports only usable endpoints, and counts
    what it drops."""
    state = BeaconState("ME" * 16, 1.0, 4.0)
    for first, rest in messages:
        frames = [first, *rest]
        before = state.malformed
        events, _ = state.on_frames(frames, 0.0)
        for event in events:
            assert event.kind in (CONNECT, DISCONNECT) and event.endpoint.startswith("tcp://")
        if frames in ([b"W"], [b"Z" + b"ME" * 16]):  # the welcome, the end of our replay
            assert state.malformed == before and not events
        elif not (len(frames) == 3 and frames[0] in (b"B", b"Z" + b"ME" * 16)):  # not a beacon: dropped, counted
            assert state.malformed == before + 1 and not events
