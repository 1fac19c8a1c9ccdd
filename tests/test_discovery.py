"""Tower and beacons on ephemeral loopback ports."""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import zmq

from helpers import loopback_config, wait_for
from dafka import protocol as proto
from dafka.discovery.beacon import CONNECT, DISCONNECT, Beacon, BeaconState
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
    endpoint = f"tcp://{expected}:41234".encode()
    # the RFC 46 beacon, and the same under the scope of peers without a profile (rfc 5.6)
    assert out == [[b"B", b"S", endpoint], [proto.SCOPE_UNKNOWN, b"S", endpoint]]


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
        "from dafka.discovery.beacon import Beacon\n"
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
    from dafka.core import sockets

    ctx = zmq.Context()
    pipes = [sockets.wake_pipe(ctx, "tower") for _ in range(50)]
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


_SCOPES = [b"S*", b"Sp\x00", b"Scorders\x00", b"Ss\x00"]  # rfc 5.6
_FIRST = st.sampled_from([b"B", b"W", b"Z" + b"ME" * 16, b"Z" + b"OT" * 16, b"Z", b"S", b"Sp", *_SCOPES]) \
    | st.binary(max_size=40)


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
        if frames in ([b"W"], [b"Z" + b"ME" * 16], [b"Z" + b"ME" * 16, b"S1"]):  # welcome, end of our replay
            assert state.malformed == before and not events
        elif not (len(frames) == 3 and frames[0] in (b"B", b"Z" + b"ME" * 16, *_SCOPES)):  # not a beacon: dropped
            assert state.malformed == before + 1 and not events


# -- scoped discovery (rfc 5.6) ---------------------------------------------


def scoped_beacon(tower_sub: str, tower_pub: str, sender: str, port: int, *profiles: tuple[bytes, str]) -> Beacon:
    beacon = Beacon(zmq.Context.instance(), sender, port, host="127.0.0.1", tower_sub=tower_sub, tower_pub=tower_pub,
                    name="test", scoped=True)
    for role, topic in profiles:
        beacon.add_profile(role, topic)
    return beacon.start()


class ReferenceTower:
    """The C reference's tower, as RFC 46 and REFERENCE.md section 3 describe it: XSUB in, XPUB out with
    the welcome W, subscriptions forwarded upstream but W's, each beacon relayed as B, sender, endpoint;
    no memory, no replay, nothing of rfc 5.5 or 5.6."""

    def __init__(self) -> None:
        ctx = zmq.Context.instance()
        self.xsub, self.xpub = ctx.socket(zmq.XSUB), ctx.socket(zmq.XPUB)
        for sock in (self.xsub, self.xpub):
            sock.linger = 0
        self.xpub.setsockopt(zmq.XPUB_WELCOME_MSG, b"W")
        self.xsub.bind("tcp://127.0.0.1:*")
        self.xpub.bind("tcp://127.0.0.1:*")
        self.sub_endpoint = self.xsub.last_endpoint.decode()
        self.pub_endpoint = self.xpub.last_endpoint.decode()
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.xsub, zmq.POLLIN)
        poller.register(self.xpub, zmq.POLLIN)
        while not self._stop:
            ready = dict(poller.poll(50))
            if self.xpub in ready:
                frame = self.xpub.recv()
                if frame[1:] != b"W":
                    self.xsub.send(frame)
            if self.xsub in ready:
                frames = self.xsub.recv_multipart()
                if len(frames) == 4 and frames[0] == b"B":
                    self.xpub.send_multipart([b"B", frames[1], b"tcp://%s:%s" % (frames[2] or b"127.0.0.1", frames[3])])

    def close(self) -> None:
        self._stop = True
        self._thread.join(2)
        self.xsub.close(0)
        self.xpub.close(0)


class ReferenceBeacon:
    """A reference peer's beacon: ``B``, sender, empty host, port on its PUB to the tower, every 100 ms until
    closed, as a C peer beacons every ``beacon/interval``.  A peer that sent one only while it waited to
    hear the others lost it when the tower replayed them at once: its PUB drops what it sends before the
    tower's subscription has reached it (ZeroMQ's slow joiner), and it never beaconed again."""

    def __init__(self, tower_sub: str, sender: str, port: int) -> None:
        self.sock = zmq.Context.instance().socket(zmq.PUB)
        self.sock.linger = 0
        self.sock.connect(tower_sub)
        self.frames = [b"B", sender.encode(), b"", str(port).encode()]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sock.send_multipart(self.frames)
            self._stop.wait(0.1)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close(0)


def _peers_are(beacon: Beacon, wanted: set[str], what: str) -> None:
    wait_for(lambda: set(beacon.peers().values()) == wanted, 10, what=f"{what}: {wanted}, not {beacon.peers()}")


def test_scoped_peers_hear_what_they_need_and_reference_peers_only_rfc46_frames(tower):
    """A mixed cluster: dafka-py beacons that give profiles, and a raw reference peer (PUB beacon with an
    empty host, SUB to B and W).  The consumer of 'a' hears the producer of 'a', the stores and the
    reference peer, never the producer of 'b'; the producer of 'a' hears the consumer and the stores; the
    store hears everyone; the reference peer hears every beacon, as RFC 46 frames only."""
    ref_sub = zmq.Context.instance().socket(zmq.SUB)
    ref_sub.linger = 0
    ref_sub.setsockopt(zmq.SUBSCRIBE, b"B")
    ref_sub.setsockopt(zmq.SUBSCRIBE, b"W")
    ref_sub.connect(tower.pub_endpoint)
    ends = (tower.sub_endpoint, tower.pub_endpoint)
    p = proto
    beacons = {
        "PA" * 16: scoped_beacon(*ends, "PA" * 16, 42001, (p.ROLE_PRODUCER, "a")),
        "PB" * 16: scoped_beacon(*ends, "PB" * 16, 42002, (p.ROLE_PRODUCER, "b")),
        "CA" * 16: scoped_beacon(*ends, "CA" * 16, 42003, (p.ROLE_CONSUMER, "a")),
        "ST" * 16: scoped_beacon(*ends, "ST" * 16, 42004, (p.ROLE_STORE, "")),
    }
    ref = "RE" * 16
    ref_beacon = ReferenceBeacon(tower.sub_endpoint, ref, 42005)
    seen: list[list[bytes]] = []
    try:
        def reference_hears_all() -> bool:
            while ref_sub.poll(20):
                seen.append(ref_sub.recv_multipart())
            return {f[1].decode() for f in seen if len(f) == 3} >= set(beacons) | {ref}
        wait_for(reference_hears_all, 10, what="the reference peer to hear every beacon and its own")
        _peers_are(beacons["CA" * 16], {"PA" * 16, "ST" * 16, ref}, "the consumer of a")
        _peers_are(beacons["PA" * 16], {"CA" * 16, "ST" * 16, ref}, "the producer of a")
        _peers_are(beacons["PB" * 16], {"ST" * 16, ref}, "the producer of b")
        _peers_are(beacons["ST" * 16], {"PA" * 16, "PB" * 16, "CA" * 16, ref}, "the store")
        assert all(b.scoped for b in beacons.values()), "every beacon should be scoped (and never have listened to B)"
        time.sleep(1.5)  # more beacons: none of the producer of b's may reach the consumer of a
        assert set(beacons["CA" * 16].peers().values()) == {"PA" * 16, "ST" * 16, ref}
        while ref_sub.poll(20):
            seen.append(ref_sub.recv_multipart())
        assert all(f == [b"W"] or (len(f) == 3 and f[0] == b"B" and f[2].startswith(b"tcp://")) for f in seen), \
            [f for f in seen if f[0] not in (b"B", b"W")][:3]
    finally:
        for b in beacons.values():
            b.stop()
        ref_beacon.close()
        ref_sub.close()


def test_a_companion_is_announced_by_its_beacons_thread_and_heard_by_the_peers_that_need_it(tower):
    """A store's reader rides on its writer's beacon (Beacon.add_companion): a scoped consumer hears both
    addresses (the tower knows the companion's profile), both owners get the consumer's events, and the
    two are not each other's peers."""
    ends = (tower.sub_endpoint, tower.pub_endpoint)
    writer = Beacon(zmq.Context.instance(), "SW" * 16, 42011, host="127.0.0.1", tower_sub=ends[0],
                    tower_pub=ends[1], name="test", scoped=True)
    writer.add_profile(proto.ROLE_STORE, "")
    reader = writer.add_companion("SR" * 16, 42012)
    writer.start()
    assert reader.start() is reader
    with pytest.raises(RuntimeError, match="before the beacon starts"):
        writer.add_companion("SX" * 16, 42013)
    consumer = scoped_beacon(*ends, "CA" * 16, 42014, (proto.ROLE_CONSUMER, "a"))
    try:
        _peers_are(consumer, {"SW" * 16, "SR" * 16}, "the consumer")
        assert consumer.peers() == {"tcp://127.0.0.1:42011": "SW" * 16, "tcp://127.0.0.1:42012": "SR" * 16}
        _peers_are(writer, {"CA" * 16}, "the store")
        got_writer, got_reader = [], []
        wait_for(lambda: collect(writer, got_writer) and reader.events.poll(50) and
                 got_reader.extend(Beacon.read_events(reader.events)) is None and got_reader, 5,
                 what="both owners' events")
        assert got_writer == got_reader == [(CONNECT, "tcp://127.0.0.1:42014", "CA" * 16)]
        assert reader.connected and reader.peers() == writer.peers() and reader.twins() == []
        with pytest.raises(TypeError):
            reader.add_profile(proto.ROLE_STORE, "")
        consumer.stop()
        wait_for(lambda: reader.events.poll(100) and any(
            e.kind == DISCONNECT for e in Beacon.read_events(reader.events)), 10, what="the reader hears it go")
    finally:
        consumer.stop()
        writer.stop()
        reader.stop()


def test_a_scoped_peer_whose_needs_grow_finds_the_new_peers(tower):
    """A consumer that subscribes to a second topic meets that topic's producer at once (the tower
    replays to it what its new profile needs); a store that joins later is met by everyone."""
    ends = (tower.sub_endpoint, tower.pub_endpoint)
    p = proto
    consumer = scoped_beacon(*ends, "CA" * 16, 42011, (p.ROLE_CONSUMER, "a"))
    producer_b = scoped_beacon(*ends, "PB" * 16, 42012, (p.ROLE_PRODUCER, "b"))
    beacons = [consumer, producer_b]
    try:
        wait_for(lambda: consumer.scoped and producer_b.scoped, 10, what="scoped discovery")
        time.sleep(0.5)
        assert consumer.peers() == {}
        subscribed = time.monotonic()
        consumer.add_profile(p.ROLE_CONSUMER, "b")
        _peers_are(consumer, {"PB" * 16}, "the consumer, now of b too")
        assert time.monotonic() - subscribed < 0.5, "the tower should replay at once, not wait for a beacon"
        store = scoped_beacon(*ends, "ST" * 16, 42013, (p.ROLE_STORE, ""))
        beacons.append(store)
        _peers_are(consumer, {"PB" * 16, "ST" * 16}, "the consumer, after the store joined")
        _peers_are(producer_b, {"CA" * 16, "ST" * 16}, "the producer of b, after the store joined")
        _peers_are(store, {"CA" * 16, "PB" * 16}, "the store")
    finally:
        for b in beacons:
            b.stop()


def test_towers_of_mixed_kinds_keep_scoped_peers_hearing_everything(tower):
    """Behind a reference tower, or a dafka-py tower and a reference one, no tower's replay says it
    scoped, so a scoped beacon keeps B and hears every peer, as today."""
    ref_tower = ReferenceTower()
    p = proto
    beacons = []
    try:
        for sub, pub, tag, port in [(ref_tower.sub_endpoint, ref_tower.pub_endpoint, "R", 42021),
                                    (f"{tower.sub_endpoint},{ref_tower.sub_endpoint}",
                                     f"{tower.pub_endpoint},{ref_tower.pub_endpoint}", "M", 42023)]:
            consumer = scoped_beacon(sub, pub, f"C{tag}" * 16, port, (p.ROLE_CONSUMER, "a"))
            beacons.append(consumer)
            other = scoped_beacon(sub, pub, f"P{tag}" * 16, port + 1, (p.ROLE_PRODUCER, "b"))
            beacons.append(other)
            # everyone, the first round's peers (which beacon to the reference tower) included
            wanted = {"PR" * 16} if tag == "R" else {"PR" * 16, "CR" * 16, "PM" * 16}
            _peers_are(consumer, wanted, f"towers {tag}: the consumer of a")
            time.sleep(0.3)
            assert not consumer.scoped
    finally:
        for b in beacons:
            b.stop()
        ref_tower.close()


def test_tower_state_scopes_beacons_by_profile_and_replays_what_a_profile_needs():
    state = TowerState(True, 4.0, None)
    p = proto
    assert state.on_profile(p.encode_profile("PA", p.ROLE_PRODUCER, "a"), True) == "PA"
    out = state.on_beacon(p.encode_beacon(p.Beacon("PA", "127.0.0.1", 1)), None, 0.0)
    assert out == [[b"B", b"PA", b"tcp://127.0.0.1:1"], [b"Spa\x00", b"PA", b"tcp://127.0.0.1:1"]]
    assert state.on_beacon(p.encode_beacon(p.Beacon("PA", "127.0.0.1", 1)), None, 0.5) is out, "cached"
    state.on_beacon(p.encode_beacon(p.Beacon("XX", "", 2)), "10.0.0.9", 0.5)  # a reference peer: no profile
    state.on_profile(p.encode_profile("PB", p.ROLE_PRODUCER, "b"), True)
    state.on_beacon(p.encode_beacon(p.Beacon("PB", "127.0.0.1", 3)), None, 0.5)
    state.on_profile(p.encode_profile("CA", p.ROLE_CONSUMER, "a"), True)
    assert {f[1] for f in state.live(1.0, state.needs("CA"))} == {b"PA", b"XX"}
    assert state.needs("nobody") is None and len(state.live(1.0)) == 3
    # a profile gained later: the peer's next beacon goes out under the new scope too
    assert state.on_profile(p.encode_profile("PA", p.ROLE_PRODUCER, "c"), True) == "PA"
    assert state.on_beacon(p.encode_beacon(p.Beacon("PA", "127.0.0.1", 1)), None, 1.0)[1:] == [
        [b"Spa\x00", b"PA", b"tcp://127.0.0.1:1"], [b"Spc\x00", b"PA", b"tcp://127.0.0.1:1"]]
    assert state.on_profile(b"P\x00\x00", True) is None and state.malformed == 1
    # the dead are swept: memory and cache do not grow with the peers that came and went
    for i in range(1000):
        state.on_beacon(p.encode_beacon(p.Beacon(f"GONE{i}", "127.0.0.1", 1000 + i)), None, 2.0 + i / 1000)
    state.on_beacon(p.encode_beacon(p.Beacon("PA", "127.0.0.1", 1)), None, 10.0)
    assert set(state.known) == {"PA"} and len(state._relay) == 1


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=60) | st.builds(lambda a, r, t: b"P" + a + b"\x00" + r + t, st.binary(max_size=8),
                                          st.sampled_from([b"p", b"c", b"g", b"s", b"x", b""]), st.binary(max_size=8)))
def test_profiles_decode_or_are_refused_cleanly(data):
    """Fuzz: a profile subscription decodes into a valid (address, role, topic) that encodes back to the
    same bytes, or is refused with MalformedMessage, which the tower counts."""
    try:
        address, role, topic = proto.decode_profile(data)
    except proto.MalformedMessage:
        state = TowerState(True, 4.0, None)
        assert state.on_profile(data, True) is None and state.malformed == 1
        return
    assert proto.encode_profile(address, role, topic) == data


def _beacon_of(sender: str, port: int) -> list[bytes]:
    return proto.encode_beacon(proto.Beacon(sender, "127.0.0.1", port))


def test_tower_state_relays_repeated_beacons_together_once_a_slot():
    """rfc 5.3: a new beacon goes out at once; a peer's repeated beacons are held up to the next slot
    boundary (multiples of 1 s here), the hold growing by at most a quarter of its period a beacon, so
    that each listener gets every peer's in one burst while each peer is still relayed once a period."""
    state = TowerState(True, 4.0, None, slot=1.0)
    senders = {"A" * 32: 0.10, "B" * 32: 0.35, "C" * 32: 0.80}  # each beacons every second at this phase
    for n, (sender, phase) in enumerate(senders.items()):
        assert state.on_beacon(_beacon_of(sender, n + 1), None, 10 + phase), "a new beacon goes out at once"
    relayed: dict[str, list[float]] = {s: [] for s in senders}
    releases = []
    for second in range(11, 20):
        events = sorted([(second + phase, sender) for sender, phase in senders.items()])
        for now, sender in events:
            for due in iter(lambda: state.next_release(), None):
                if due > now:
                    break
                releases.append(due)
                for frames in state.release(due):
                    if frames[0] == b"B":  # (each also goes out under its scope, rfc 5.6)
                        relayed[frames[1].decode()].append(due)
            for frames in state.on_beacon(_beacon_of(sender, list(senders).index(sender) + 1), None, now):
                if frames[0] == b"B":
                    relayed[frames[1].decode()].append(now)  # not held: out as it came
    for sender, times in relayed.items():
        gaps = [b - a for a, b in zip(times, times[1:])]
        assert max(gaps) <= 1.25 + 1e-9, (sender, gaps)  # a quarter of a period longer, at most, once
        assert len(times) >= 8, "a peer is relayed as often as it beacons"
    # after the holds have grown, every repeated beacon goes out at a slot: one burst a second
    late = [t for ts in relayed.values() for t in ts if t >= 15]
    assert all(abs(t - round(t)) < 1e-9 for t in late), late
    assert len(set(round(t, 6) for t in late)) == len(late) // 3


def test_tower_state_relays_a_fast_peer_and_a_new_endpoint_at_once():
    """A peer that beacons faster than the slot is relayed as it comes (held, it would reach the others
    less often than it beacons); a beacon from a new endpoint is never held behind its old one."""
    state = TowerState(True, 4.0, None, slot=1.0)
    fast = _beacon_of("F" * 32, 1)
    for i in range(10):
        assert state.on_beacon(fast, None, 5.0 + i * 0.2), "fast peers are not held"
    assert state.next_release() is None
    state.on_beacon(_beacon_of("S" * 32, 2), None, 7.1)
    assert state.on_beacon(_beacon_of("S" * 32, 2), None, 8.1) == [] and state.next_release() is not None
    moved = state.on_beacon(_beacon_of("S" * 32, 3), None, 8.2)  # restarted elsewhere: out at once
    assert moved and moved[0][2] == b"tcp://127.0.0.1:3"
    assert state.release(10.0) == [], "the held beacon of the old endpoint is dropped"


def test_beacon_state_queues_refreshed_peers_ahead_and_never_expires_one_early():
    """expire(now, ahead): a peer whose deadline is within ``ahead`` and that beaconed since is queued
    at its new deadline now (no wake-up a few ms later only to find it refreshed); one that did not
    beacon stays until its own deadline, and goes then."""
    state = BeaconState("ME", 1.0, 4.0)
    frames = {name: [b"B", name.encode(), f"tcp://127.0.0.1:{port}".encode()]
              for name, port in (("A", 1), ("B", 2))}
    for name, f in frames.items():
        state.on_frames(f, 0.0)
    state.on_frames(frames["A"], 3.0)  # A beacons on; B is silent from 0.0
    assert state.next_expiry() == 4.0
    assert state.expire(3.97, ahead=0.05) == [] and set(state.peers) == {"tcp://127.0.0.1:1", "tcp://127.0.0.1:2"}
    assert state.next_expiry() == 4.0, "B's own deadline stays the next wake-up"
    assert sorted(deadline for deadline, _, _ in state._timers) == [4.0, 7.0], "A queued again, ahead"
    gone = state.expire(4.0, ahead=0.05)
    assert [(e.kind, e.sender) for e in gone] == [(b"DISCONNECT", "B")]
    assert state.next_expiry() == 7.0, "A was queued again at its new deadline"
