"""Discovery through towers: every peer runs a :class:`Beacon`.

A beacon announces the peer's bound data endpoint to the tower(s) and reports
the other peers the tower relays, as CONNECT/DISCONNECT events.  The logic is
the sans-I/O :class:`BeaconState`; :class:`Beacon` is the thread that owns the
two tower sockets and drives it, like the reference's beacon actor.

Differences from the reference (all invisible on the wire):

* the publishing socket is an XPUB, so the beacon sees the tower's
  subscription arrive and announces itself at that moment instead of losing
  its first beacon to a connection not yet made;
* a peer that is waiting for a tower says so in the log and in
  :attr:`Beacon.connected`, and keeps retrying: it never blocks its owner.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import zmq

from .. import protocol as proto
from ..core import endpoints, sockets
from .schedule import BeaconSchedule

if TYPE_CHECKING:
    from ..core.security import Curve

log = logging.getLogger(__name__)

CONNECT = b"CONNECT"
DISCONNECT = b"DISCONNECT"
class PeerEvent(NamedTuple):
    kind: bytes  # CONNECT or DISCONNECT
    endpoint: str
    sender: str


@dataclass(eq=False)
class _Peer:
    sender: str
    expires: float
    beats: int = 1  # beacons seen (twins only: a dead one may be replayed once, a live one beacons on)
    endpoint: str = ""



@dataclass
class BeaconState:
    """Peer tracking, free of I/O: feed it tower frames and time.

    A repeated beacon costs one dictionary lookup on its raw frames and one
    attribute store: no decode, no allocation.  Expiry needs no scan either:
    a heap holds each peer once, at the deadline it had when it was queued;
    when that deadline comes, a peer that beaconed since is queued again at
    its new one (once per ``timeout``, not once per beacon), and one that did
    not is gone."""

    sender: str
    interval: float
    timeout: float
    peers: dict[str, _Peer] = field(default_factory=dict)
    welcomed: bool = False
    replays: int = 0  # the towers that said their replay of the peers for us is over
    scoped_replays: int = 0  # ... of which replays scoped to our profile (rfc 5.6)
    welcomed_at: float | None = None  # when a tower first answered
    welcomes: int = 0  # the towers' welcome messages (one from each tower that answered our connection)
    last_welcome: float | None = None  # ... the latest
    malformed: int = 0
    own_endpoint: str = ""  # where our own beacon points: a beacon of our address elsewhere is a twin
    # the other addresses this beacon announces (Beacon.add_companion): ours too, never reported as peers
    companions: set[str] = field(default_factory=set)
    # live peers that beacon our own address from another endpoint: endpoint -> expiry (see twins())
    twins: dict[str, "_Peer"] = field(default_factory=dict)
    # the frames (sender, endpoint) of a beacon already decoded -> its peer (_self: our own)
    _raw: dict[tuple[bytes, bytes], "_Peer"] = field(default_factory=dict, repr=False)
    # (deadline, n, peer): every tracked peer and twin once, at a deadline no later than its expiry
    _timers: list[tuple[float, int, "_Peer"]] = field(default_factory=list, repr=False)
    _queued: int = field(default=0, repr=False)

    def __post_init__(self) -> None:
        self._replay_to = proto.REPLAY_END + self.sender.encode()
        # our own beacon, relayed back to us: refreshed like a peer's, never expired (not in _timers)
        self._self = _Peer(self.sender, float("inf"))

    def on_frames(self, frames: list[bytes], now: float) -> tuple[list[PeerEvent], bool]:
        """Handle one message from the tower; returns the events and whether
        our own beacon should go out at once (a peer we did not know)."""
        if len(frames) == 3:
            # Every peer's beacon comes every beacon/interval: a known one only refreshes.
            known = self._raw.get((frames[1], frames[2]))
            first = frames[0]
            if known is not None and (first == proto.BEACON or first == self._replay_to or (
                    first[:1] == proto.SCOPE and (first[-1:] == b"\x00" or first == proto.SCOPE_UNKNOWN))):
                known.expires = now + self.timeout
                known.beats += 1
                return [], False
        if frames == [proto.WELCOME]:
            self.welcomed = True
            self.welcomes += 1
            self.last_welcome = now
            return [], True
        if frames[0] == self._replay_to:
            if len(frames) == 1 or frames[1:] == [proto.SCOPED_REPLAY_END]:
                self.welcomed = True
                self.replays += 1
                self.scoped_replays += len(frames) - 1
                return [], False
            frames = [proto.BEACON, *frames[1:]]  # a beacon the tower replayed to us alone (rfc 5.5)
        try:
            beacon = proto.decode_tower_beacon(frames)
        except proto.MalformedMessage as exc:
            self.malformed += 1
            log.debug("dropped malformed tower frame: %s", exc)
            return [], False
        self.welcomed = True
        if beacon.sender in self.companions:
            self._raw[(frames[1], frames[2])] = self._self
            return [], False
        if beacon.sender == self.sender:
            if self.own_endpoint and beacon.endpoint != self.own_endpoint:
                # Another process claims our address (a resumed producer's predecessor that has not
                # expired yet, or a second writer of the partition): tracked apart, never connected to.
                twin = self.twins[beacon.endpoint] = self._track(beacon.sender, beacon.endpoint, now)
                self._raw[(frames[1], frames[2])] = twin
                log.warning("peer %s: a beacon of our own address from %s", self.sender, beacon.endpoint)
            else:
                self._raw[(frames[1], frames[2])] = self._self
            return [], False
        events = []
        known = self.peers.get(beacon.endpoint)
        if known is not None:  # the same endpoint, another sender: a peer restarted on the same port
            events.append(PeerEvent(DISCONNECT, beacon.endpoint, known.sender))
            self._forget(known)
        peer = self.peers[beacon.endpoint] = self._track(beacon.sender, beacon.endpoint, now)
        self._raw[(frames[1], frames[2])] = peer
        events.append(PeerEvent(CONNECT, beacon.endpoint, beacon.sender))
        return events, True

    def _track(self, sender: str, endpoint: str, now: float) -> _Peer:
        peer = _Peer(sender, now + self.timeout, endpoint=endpoint)
        self._queue(peer)
        return peer

    def _queue(self, peer: _Peer) -> None:
        self._queued += 1
        heapq.heappush(self._timers, (peer.expires, self._queued, peer))

    def expire(self, now: float, ahead: float = 0.0) -> list[PeerEvent]:
        """The peers gone by ``now``.  Peers queued for a deadline within ``ahead`` seconds that have
        beaconed since are queued again now: a beacon that has just read a burst of beacons is not
        woken again a few milliseconds later only to find them refreshed."""
        events: list[PeerEvent] = []
        timers = self._timers
        limit = now + ahead
        while timers and timers[0][0] <= limit:
            deadline, _, peer = timers[0]
            if self.peers.get(peer.endpoint) is not peer and self.twins.get(peer.endpoint) is not peer:
                heapq.heappop(timers)
                continue  # forgotten already (replaced by another sender)
            if peer.expires > deadline:
                heapq.heappop(timers)
                self._queue(peer)  # it beaconed since it was queued
                continue
            if peer.expires > now:
                break  # not refreshed, and not due yet: its deadline wakes us
            heapq.heappop(timers)
            if self.twins.get(peer.endpoint) is peer:
                del self.twins[peer.endpoint]
                self._forget_raw(peer)
            else:
                events.append(PeerEvent(DISCONNECT, peer.endpoint, peer.sender))
                self._forget(peer)
        return events

    def _forget(self, peer: _Peer) -> None:
        del self.peers[peer.endpoint]
        self._forget_raw(peer)

    def _forget_raw(self, peer: _Peer) -> None:
        for key in [k for k, v in self._raw.items() if v is peer]:
            del self._raw[key]

    def next_expiry(self) -> float | None:
        """When :meth:`expire` next has something to do (it may find the peer refreshed)."""
        return self._timers[0][0] if self._timers else None


class Beacon:
    """The discovery thread of one peer.

    ``events`` is the peer's end of an inproc PAIR pipe: poll it in the peer's
    loop and pass it to :meth:`read_events`."""

    def __init__(
        self,
        ctx: zmq.Context[Any],
        sender: str,
        port: int,
        *,
        host: str,
        tower_sub: str,
        tower_pub: str,
        interval_ms: int = 1000,
        timeout_ms: int = 4000,
        name: str = "peer",
        curve: "Curve | None" = None,
        scoped: bool = False,
    ) -> None:
        self.sender = sender
        # rfc 5.6: with scoped, the peer hears only what its profiles need once every tower scopes
        self._scoped = scoped
        self._profiles: list[tuple[bytes, str]] = []
        self._curve = curve
        self.host = host
        self.port = port
        self.name = name
        self._tower_sub = endpoints.split_endpoints(tower_sub)
        self._tower_pub = endpoints.split_endpoints(tower_pub)
        self._state = BeaconState(sender, interval_ms / 1000.0, timeout_ms / 1000.0,
                                  own_endpoint=f"tcp://{host}:{port}")
        self._frames = proto.encode_beacon(proto.Beacon(sender, host, port))
        self._ctx = ctx
        pipe_name = sockets.inproc_endpoint(f"beacon-{sender}")
        self.events = ctx.socket(zmq.PAIR)
        self.events.linger = 0
        self.events.bind(pipe_name)
        self._pipe_name = pipe_name
        self._control = ctx.socket(zmq.PAIR)
        self._control.linger = 0
        self._control.bind(pipe_name + "-ctl")
        self._control_lock = threading.Lock()
        self._ready = threading.Event()
        self._connected = threading.Event()
        self._replayed = threading.Event()
        self._scoped_now = threading.Event()
        self._peers_snapshot: dict[str, str] = {}
        self._twins_snapshot: tuple[str, ...] = ()
        self._companions: list[Companion] = []
        self._outs: list[zmq.Socket[Any]] = []  # the thread's ends of every events pipe
        self._thread = threading.Thread(target=self._run, name=f"dafka-beacon-{name}", daemon=True)

    # -- API (any thread) ---------------------------------------------------

    def add_companion(self, sender: str, port: int) -> "Companion":
        """Announce another bound socket of this process (a store's reader beside its writer) from this
        beacon's thread, before :meth:`start`: its beacon goes out with ours, and its owner reads the same
        peer events from :attr:`Companion.events`.  One thread and one pair of tower connections instead of
        two, each woken by the same bursts of beacons (two threads also fought for the GIL at each).  The
        two are not each other's peers."""
        if self._thread.is_alive():
            raise RuntimeError("add a companion before the beacon starts")
        companion = Companion(self, sender, proto.encode_beacon(proto.Beacon(sender, self.host, port)))
        self._companions.append(companion)
        self._state.companions.add(sender)
        return companion

    @property
    def connected(self) -> bool:
        """True once a tower has answered (welcome or a relayed beacon)."""
        return self._connected.is_set()

    def wait_connected(self, timeout: float | None = None) -> bool:
        return self._connected.wait(timeout)

    @property
    def replayed(self) -> bool:
        """True once every tower said it has replayed the live peers' beacons
        to us (dafka-py towers do; a reference tower never says)."""
        return self._replayed.is_set()

    def peers(self) -> dict[str, str]:
        """Live peers: endpoint -> sender address."""
        return dict(self._peers_snapshot)

    def twins(self) -> list[str]:
        """The endpoints of live peers that beacon our own address from
        elsewhere (another process with the same address), sorted.  Only
        those heard twice: a tower replays the last beacon of a peer it has
        not yet expired, so a killed predecessor shows up once."""
        return sorted(self._twins_snapshot)

    def add_profile(self, role: bytes, topic: str = "") -> None:
        """Say what this peer is (rfc 5.6: ``proto.ROLE_*`` and its topic, or
        its group for ``ROLE_GROUP``): a scoped beacon then hears the peers
        this profile needs, and the peers that need it hear it.  Before
        :meth:`start`, or any time after (a consumer subscribing to another
        topic).  Does nothing unless the beacon was made ``scoped``."""
        proto.encode_profile(self.sender, role, topic)  # a bad one fails here, in the caller
        if not self._scoped or (role, topic) in self._profiles:
            return
        with self._control_lock:
            self._profiles.append((role, topic))
            if self._thread.is_alive():
                self._control.send_multipart([b"PROFILE", role, topic.encode()])

    @property
    def scoped(self) -> bool:
        """True once every tower scopes what it sends us to our profiles (rfc 5.6)."""
        return self._scoped_now.is_set()

    def start(self) -> "Beacon":
        self._thread.start()
        self._ready.wait()
        return self

    def stop(self, timeout: float = 2.0) -> None:
        if self._thread.is_alive():
            with self._control_lock:
                try:
                    self._control.send(b"$TERM", zmq.NOBLOCK)  # a thread that died has no end to read it
                except zmq.Again:
                    pass
            self._thread.join(timeout)
        self._control.close()
        self.events.close()

    @staticmethod
    def read_events(pipe: zmq.Socket[Any]) -> list[PeerEvent]:
        events: list[PeerEvent] = []
        while True:
            try:
                kind, endpoint, sender = pipe.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return events
            events.append(PeerEvent(kind, endpoint.decode(), sender.decode()))

    # -- the thread ---------------------------------------------------------

    def _run(self) -> None:
        ctx = self._ctx
        self._outs = []
        for pipe_name in [self._pipe_name, *(c.pipe_name for c in self._companions)]:
            out = ctx.socket(zmq.PAIR)
            out.linger = 0
            out.connect(pipe_name)
            self._outs.append(out)
        beacons = [self._frames, *(c.frames for c in self._companions)]
        control = ctx.socket(zmq.PAIR)
        control.linger = 0
        control.connect(self._pipe_name + "-ctl")
        publisher = ctx.socket(zmq.XPUB)
        publisher.linger = 0
        subscriber = ctx.socket(zmq.SUB)
        subscriber.linger = 0
        if self._curve is not None:
            self._curve.client(publisher)
            self._curve.client(subscriber)
        for endpoint in self._tower_sub:
            publisher.connect(endpoint)
        # A scoped peer listens for B (every beacon) only once it knows that a tower does not scope: a
        # newcomer that heard every beacon until its marker came would take P beacons a second into a
        # queue of 1,000 (the tower's send HWM), which can drop the marker itself.
        listens_to_all = not (self._scoped and self._profiles)
        if listens_to_all:
            subscriber.setsockopt(zmq.SUBSCRIBE, proto.BEACON)
        subscriber.setsockopt(zmq.SUBSCRIBE, proto.WELCOME)
        with self._control_lock:
            for role, topic in self._profiles:
                self._profile(subscriber, role, topic)
        subscriber.setsockopt(zmq.SUBSCRIBE, proto.REPLAY_END + self.sender.encode())  # after B: rfc 5.5
        for endpoint in self._tower_pub:
            subscriber.connect(endpoint)
        self._ready.set()
        everything = zmq.Poller()
        for sock in (control, publisher, subscriber):
            everything.register(sock, zmq.POLLIN)
        # While a batch of beacons gathers, the tower's socket is left alone (see schedule.READ_EVERY).
        own_sockets = zmq.Poller()
        for sock in (control, publisher):
            own_sockets.register(sock, zmq.POLLIN)
        state = self._state
        schedule = BeaconSchedule(time.monotonic(), state.interval)
        try:
            while True:
                now = time.monotonic()
                if schedule.read_due(now):
                    found, urgent = self._drain_tower(subscriber)
                    if not listens_to_all:
                        listens_to_all = self._listen_to_all_unless_scoped(subscriber, now)
                    schedule.on_read(now, found, urgent, self._replayed.is_set(), state.welcomed)
                    for event in state.expire(now, schedule.expire_ahead()):
                        self._emit(event)
                    self._snapshot_twins()
                if schedule.beacon_due(now, self._replayed.is_set()):
                    for frames in beacons:
                        publisher.send_multipart(frames)
                if schedule.warning_due(now, state.welcomed):
                    log.warning(
                        "%s %s: no tower answers at %s; still trying",
                        self.name, self.sender, ",".join(self._tower_pub),
                    )
                wake, tower_wakes = schedule.wake(now, state.next_expiry(), state.welcomed)
                poller = everything if tower_wakes else own_sockets  # (own: while a batch of beacons gathers)
                timeout_ms = max(0, int((wake - now) * 1000) + 1)
                ready = dict(poller.poll(timeout_ms))
                if control in ready:
                    command = control.recv_multipart()
                    if command[0] != b"PROFILE":
                        return  # $TERM
                    self._profile(subscriber, command[1], command[2].decode())
                    # Z<address> again: a dafka-py tower replays what the new profile needs (rfc 5.6)
                    subscriber.setsockopt(zmq.SUBSCRIBE, proto.REPLAY_END + self.sender.encode())
                    schedule.read_now(time.monotonic())
                if publisher in ready:
                    sockets.drain(publisher)
                    schedule.beacon_now(time.monotonic())
        finally:
            for sock in (*self._outs, control, publisher, subscriber):
                sock.close(0)

    def _drain_tower(self, subscriber: zmq.Socket[Any]) -> tuple[int, bool]:
        """Read every pending tower message; returns how many, and whether we should beacon now."""
        state = self._state
        beacon_now = False
        was_welcomed = state.welcomed
        now = time.monotonic()
        on_frames = state.on_frames
        found = 0
        while True:
            message = sockets.recv_message(subscriber)
            if message is None:
                break
            found += 1
            events, urgent = on_frames(message[0], now)
            if state.welcomed and not was_welcomed:
                # before the peers this message brought are told: whoever sees one sees us connected
                was_welcomed = True
                state.welcomed_at = now
                log.info("%s %s: tower reached", self.name, self.sender)
                self._connected.set()
            for event in events:
                self._emit(event)
            beacon_now = beacon_now or urgent
        if state.replays >= len(self._tower_pub) and not self._replayed.is_set():
            self._replayed.set()
        return found, beacon_now

    def _listen_to_all_unless_scoped(self, subscriber: zmq.Socket[Any], now: float) -> bool:
        """A scoped peer subscribes to B after all, and returns True, once a tower shows that it does
        not scope (rfc 5.6): a 0.2.0 tower ends its replay with the one-frame marker, a reference tower
        never ends one (it has welcomed us a beacon interval ago and sent no marker).  The towers counted
        are those that welcomed us: a tower of the list that is down (rfc 5.2, more than one tower) does
        not keep the others' peers unscoped, and one that comes up later is waited for in its turn."""
        state = self._state
        if state.scoped_replays >= max(1, state.welcomes):
            self._scoped_now.set()
            return False
        if state.replays > state.scoped_replays:
            why = "a tower that does not scope (0.2.0)"
        elif state.welcomed_at is not None and now >= (state.last_welcome or state.welcomed_at) + state.interval:
            why = "a tower that has not answered our profile (a reference tower)"
        else:
            return False
        self._scoped_now.clear()
        subscriber.setsockopt(zmq.SUBSCRIBE, proto.BEACON)
        log.info("%s %s: listening to every peer: %s", self.name, self.sender, why)
        return True

    def _profile(self, subscriber: zmq.Socket[Any], role: bytes, topic: str) -> None:
        """Subscribe to the scopes a profile needs, then give the profile (rfc 5.6)."""
        for need in proto.scope_needs(role, topic):
            subscriber.setsockopt(zmq.SUBSCRIBE, need)
        for sender in [self.sender, *(c.sender for c in self._companions)]:  # a companion is what we are
            subscriber.setsockopt(zmq.SUBSCRIBE, proto.encode_profile(sender, role, topic))

    def _snapshot_twins(self) -> None:
        twins = self._state.twins
        if twins or self._twins_snapshot:
            self._twins_snapshot = tuple(ep for ep, twin in twins.items() if twin.beats > 1)

    def _emit(self, event: PeerEvent) -> None:
        if event.kind == CONNECT:
            self._peers_snapshot[event.endpoint] = event.sender
            log.debug("%s %s: peer %s at %s", self.name, self.sender, event.sender, event.endpoint)
        else:
            self._peers_snapshot.pop(event.endpoint, None)
            log.debug("%s %s: peer %s at %s expired", self.name, self.sender, event.sender, event.endpoint)
        frames = [event.kind, event.endpoint.encode(), event.sender.encode()]
        for out in self._outs:
            out.send_multipart(frames)


class Companion:
    """Another socket of the process that a :class:`Beacon` announces (:meth:`Beacon.add_companion`): the
    owner's view of it, in the shape its loop reads a beacon (``events``, :meth:`Beacon.read_events`)."""

    def __init__(self, beacon: Beacon, sender: str, frames: list[bytes]) -> None:
        self.sender = sender
        self.frames = frames
        self._beacon = beacon
        self.pipe_name = sockets.inproc_endpoint(f"beacon-{sender}")
        self.events = beacon._ctx.socket(zmq.PAIR)
        self.events.linger = 0
        self.events.bind(self.pipe_name)

    def start(self) -> "Companion":
        """Nothing to start: the beacon it goes with does the work."""
        return self

    def stop(self) -> None:
        """Close the owner's end of the events (once the owner's loop no longer reads it)."""
        self.events.close()

    @property
    def connected(self) -> bool:
        return self._beacon.connected

    def wait_connected(self, timeout: float | None = None) -> bool:
        return self._beacon.wait_connected(timeout)

    @property
    def replayed(self) -> bool:
        return self._beacon.replayed

    def peers(self) -> dict[str, str]:
        return self._beacon.peers()

    def twins(self) -> list[str]:
        """None: the beacon's own owner watches for twins of the process."""
        return []

    def add_profile(self, role: bytes, topic: str = "") -> None:
        raise TypeError("a companion is what the beacon it goes with is: add the profile there")
