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

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TYPE_CHECKING

import zmq

from . import net, proto

if TYPE_CHECKING:
    from .security import Curve

log = logging.getLogger(__name__)

CONNECT = b"CONNECT"
DISCONNECT = b"DISCONNECT"


class PeerEvent(NamedTuple):
    kind: bytes  # CONNECT or DISCONNECT
    endpoint: str
    sender: str


@dataclass
class _Peer:
    sender: str
    expires: float
    beats: int = 1  # beacons seen (twins only: a dead one may be replayed once, a live one beacons on)


_SELF = _Peer("", float("inf"))  # our own beacon, relayed back to us


@dataclass
class BeaconState:
    """Peer tracking, free of I/O: feed it tower frames and time."""

    sender: str
    interval: float
    timeout: float
    peers: dict[str, _Peer] = field(default_factory=dict)
    welcomed: bool = False
    replays: int = 0  # the towers that said their replay of the peers for us is over
    malformed: int = 0
    own_endpoint: str = ""  # where our own beacon points: a beacon of our address elsewhere is a twin
    # live peers that beacon our own address from another endpoint: endpoint -> expiry (see twins())
    twins: dict[str, "_Peer"] = field(default_factory=dict)
    # the frames (sender, endpoint) of a beacon already decoded -> its peer (_SELF: our own)
    _raw: dict[tuple[bytes, bytes], "_Peer"] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._replay_to = proto.REPLAY_END + self.sender.encode()

    def on_frames(self, frames: list[bytes], now: float) -> tuple[list[PeerEvent], bool]:
        """Handle one message from the tower; returns the events and whether
        our own beacon should go out at once (a peer we did not know)."""
        if frames == [proto.WELCOME]:
            self.welcomed = True
            return [], True
        if frames[0] == self._replay_to:
            if len(frames) == 1:
                self.welcomed = True
                self.replays += 1
                return [], False
            frames = [proto.BEACON, *frames[1:]]  # a beacon the tower replayed to us alone (rfc 5.5)
        if len(frames) == 3 and frames[0] == proto.BEACON:
            # Every peer's beacon comes every beacon/interval: a known one only refreshes.
            known = self._raw.get((frames[1], frames[2]))
            if known is not None:
                self.welcomed = True
                if known is not _SELF:
                    known.expires = now + self.timeout
                    known.beats += 1
                return [], False
        try:
            beacon = proto.decode_tower_beacon(frames)
        except proto.MalformedMessage as exc:
            self.malformed += 1
            log.debug("dropped malformed tower frame: %s", exc)
            return [], False
        self.welcomed = True
        if beacon.sender == self.sender:
            if self.own_endpoint and beacon.endpoint != self.own_endpoint:
                # Another process claims our address (a resumed producer's predecessor that has not
                # expired yet, or a second writer of the partition): tracked apart, never connected to.
                twin = self.twins[beacon.endpoint] = _Peer(beacon.sender, now + self.timeout)
                self._raw[(frames[1], frames[2])] = twin
                log.warning("peer %s: a beacon of our own address from %s", self.sender, beacon.endpoint)
            else:
                self._raw[(frames[1], frames[2])] = _SELF
            return [], False
        known = self.peers.get(beacon.endpoint)
        if known is not None and known.sender == beacon.sender:
            known.expires = now + self.timeout
            return [], False
        events = []
        if known is not None:
            events.append(PeerEvent(DISCONNECT, beacon.endpoint, known.sender))
            self._forget(beacon.endpoint)
        peer = self.peers[beacon.endpoint] = _Peer(beacon.sender, now + self.timeout)
        self._raw[(frames[1], frames[2])] = peer
        events.append(PeerEvent(CONNECT, beacon.endpoint, beacon.sender))
        return events, True

    def expire(self, now: float) -> list[PeerEvent]:
        gone = [ep for ep, peer in self.peers.items() if peer.expires <= now]
        events = [PeerEvent(DISCONNECT, ep, self.peers[ep].sender) for ep in gone]
        for ep in gone:
            self._forget(ep)
        for ep in [ep for ep, twin in self.twins.items() if twin.expires <= now]:
            twin = self.twins.pop(ep)
            for key in [k for k, v in self._raw.items() if v is twin]:
                del self._raw[key]
        return events

    def _forget(self, endpoint: str) -> None:
        peer = self.peers.pop(endpoint)
        for key in [k for k, v in self._raw.items() if v is peer]:
            del self._raw[key]

    def next_expiry(self) -> float | None:
        return min((p.expires for p in (*self.peers.values(), *self.twins.values())), default=None)


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
    ) -> None:
        self.sender = sender
        self._curve = curve
        self.host = host
        self.port = port
        self.name = name
        self._tower_sub = net.split_endpoints(tower_sub)
        self._tower_pub = net.split_endpoints(tower_pub)
        self._state = BeaconState(sender, interval_ms / 1000.0, timeout_ms / 1000.0,
                                  own_endpoint=f"tcp://{host}:{port}")
        self._frames = proto.encode_beacon(proto.Beacon(sender, host, port))
        self._ctx = ctx
        pipe_name = net.inproc_endpoint(f"beacon-{sender}")
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
        self._peers_snapshot: dict[str, str] = {}
        self._twins_snapshot: tuple[str, ...] = ()
        self._thread = threading.Thread(target=self._run, name=f"dafka-beacon-{name}", daemon=True)

    # -- API (any thread) ---------------------------------------------------

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
        out = ctx.socket(zmq.PAIR)
        out.linger = 0
        out.connect(self._pipe_name)
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
        subscriber.setsockopt(zmq.SUBSCRIBE, proto.BEACON)
        subscriber.setsockopt(zmq.SUBSCRIBE, proto.WELCOME)
        subscriber.setsockopt(zmq.SUBSCRIBE, proto.REPLAY_END + self.sender.encode())  # after B: rfc 5.5
        for endpoint in self._tower_pub:
            subscriber.connect(endpoint)
        self._ready.set()
        poller = zmq.Poller()
        for sock in (control, publisher, subscriber):
            poller.register(sock, zmq.POLLIN)
        state = self._state
        started = time.monotonic()
        next_beacon = started
        next_warning = started + 2.0
        try:
            while True:
                now = time.monotonic()
                if now >= next_beacon:
                    publisher.send_multipart(self._frames)
                    next_beacon = now + state.interval
                for event in state.expire(now):
                    self._emit(out, event)
                self._snapshot_twins()
                if not state.welcomed and now >= next_warning:
                    log.warning(
                        "%s %s: no tower answers at %s; still trying",
                        self.name, self.sender, ",".join(self._tower_pub),
                    )
                    next_warning = now + 10.0
                wake = [next_beacon]
                expiry = state.next_expiry()
                if expiry is not None:
                    wake.append(expiry)
                if not state.welcomed:
                    # libzmq does not wake poll() for the XPUB welcome message:
                    # look for it with a non-blocking read every 50 ms.
                    wake.append(now + 0.05)
                timeout_ms = max(0, int((min(wake) - now) * 1000) + 1)
                ready = dict(poller.poll(timeout_ms))
                if control in ready:
                    return
                if publisher in ready:
                    net.drain(publisher)
                    next_beacon = time.monotonic()
                    continue
                if self._drain_tower(subscriber, out):
                    next_beacon = time.monotonic()
        finally:
            for sock in (out, control, publisher, subscriber):
                sock.close(0)

    def _drain_tower(self, subscriber: zmq.Socket[Any], out: zmq.Socket[Any]) -> bool:
        """Read every pending tower message; True if we should beacon now."""
        state = self._state
        beacon_now = False
        while True:
            try:
                frames = subscriber.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            was_welcomed = state.welcomed
            events, urgent = state.on_frames(frames, time.monotonic())
            if state.welcomed and not was_welcomed:
                log.info("%s %s: tower reached", self.name, self.sender)
                self._connected.set()
            if state.replays >= len(self._tower_pub) and not self._replayed.is_set():
                self._replayed.set()
            for event in events:
                self._emit(out, event)
            self._snapshot_twins()
            beacon_now = beacon_now or urgent
        return beacon_now

    def _snapshot_twins(self) -> None:
        twins = self._state.twins
        if twins or self._twins_snapshot:
            self._twins_snapshot = tuple(ep for ep, twin in twins.items() if twin.beats > 1)

    def _emit(self, out: zmq.Socket[Any], event: PeerEvent) -> None:
        if event.kind == CONNECT:
            self._peers_snapshot[event.endpoint] = event.sender
            log.debug("%s %s: peer %s at %s", self.name, self.sender, event.sender, event.endpoint)
        else:
            self._peers_snapshot.pop(event.endpoint, None)
            log.debug("%s %s: peer %s at %s expired", self.name, self.sender, event.sender, event.endpoint)
        out.send_multipart([event.kind, event.endpoint.encode(), event.sender.encode()])
