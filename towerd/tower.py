"""The tower: relays beacons so peers find each other; no record passes through it.

Beacons come in on an XSUB (``tower/sub_address``, default ``tcp://*:5556``)
and go out re-written as ``"B", sender, "tcp://host:port"`` on an XPUB
(``tower/pub_address``, default ``tcp://*:5557``) that greets every new
subscriber with the single frame ``"W"``.  Subscriptions seen on the XPUB are
forwarded to the XSUB (except the welcome ones), so beacon publishers only
transmit while someone listens.

Beyond the reference: the tower remembers the latest beacon of every live peer
and replays them the moment a new subscriber arrives, so a new peer finds the
others at once instead of after a beacon interval; and a tower bound only to
loopback advertises loopback endpoints.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import zmq

from dafka.core import endpoints
from dafka.core import sockets
from dafka import protocol as proto
from dafka.config import Config
from dafka.core.security import Curve, acquire_authenticator, release_authenticator

log = logging.getLogger(__name__)

# While beacons come more often than this (seconds), each read of them waits this long after the
# last: P peers' beacons come spread over beacon/interval, and a batch of them pays one wake-up.  A
# small cluster's beacons are relayed as they come.  Listeners (and so replays) are served at once.
_READ_EVERY = 0.05
_SAME_BURST = 0.005  # two reads this close found parts of the same burst, not beacons that come often
# A peer whose beacons come this much faster than the tower's slot (its beacon/interval) has each one
# relayed as it comes: held for the slot, its beacons would reach the others less often than it sends them.
_FAST = 0.9


@dataclass(eq=False)
class _Known:
    sender: str
    frames: list[bytes]  # the relayed beacon: B, sender, endpoint
    scopes: list[bytes]  # the scopes it is also published under (rfc 5.6)
    expires: float
    key: tuple[bytes | str | None, ...]  # its entry in TowerState._relay
    out: list[list[bytes]] = field(default_factory=list)  # what each of its beacons is published as
    hold: float = 0.0  # how long its repeated beacons are held, so as to go out at a slot (rfc 5.3)
    held: bool = False  # one of its beacons waits in TowerState._held

    def rescope(self, scopes: list[bytes]) -> None:
        self.scopes = scopes
        self.out = [self.frames, *([scope, *self.frames[1:]] for scope in scopes)]


class TowerState:
    """Endpoint rules, beacon memory and the peers' profiles, free of I/O.

    A beacon heard before is relayed from a cache of its raw frames: no
    decode, no encode, one lookup.  The dead are swept once per ``timeout``
    (and whenever a replay or :meth:`peers` looks), so neither the memory
    nor the cache grows with the peers that ever came and went."""

    def __init__(self, loopback_only: bool, timeout: float, lan_address: str | None, slot: float = 0.0) -> None:
        self.loopback_only = loopback_only
        self.timeout = timeout
        self.lan_address = lan_address
        # Repeated beacons go out together once per slot (seconds; 0: each as it comes): see _hold.
        self.slot = slot
        self._held: list[tuple[float, int, _Known]] = []  # (when it goes out, n, peer)
        self._holds = 0
        self.known: dict[str, _Known] = {}
        # (sender, host, port[, remote address when host is empty]) frames -> what they were relayed as
        self._relay: dict[tuple[bytes | str | None, ...], _Known] = {}
        self.profiles: dict[str, set[tuple[bytes, str]]] = {}  # address -> its (role, topic) profiles
        self.relayed = 0
        self.malformed = 0
        self._next_sweep = 0.0

    def endpoint_host(self, beacon_host: str, peer_address: str | None) -> str:
        if beacon_host:
            return beacon_host
        if peer_address and not endpoints.is_loopback(peer_address):
            return peer_address
        if self.loopback_only or self.lan_address is None:
            return "127.0.0.1"
        return self.lan_address

    def on_beacon(self, frames: list[bytes], peer_address: str | None, now: float) -> list[list[bytes]]:
        """A beacon from a peer -> the messages to publish (none if malformed): the RFC 46
        relayed beacon, and the same under each scope of the sender's profiles."""
        key: tuple[bytes | str | None, ...] = (*frames[1:], peer_address) if len(frames) == 4 and not frames[2] \
            else tuple(frames[1:])
        known = self._relay.get(key)
        repeated = known is not None and len(frames) == 4 and frames[0] == proto.BEACON
        if not repeated:
            known = self._learn(frames, key, peer_address, now)
            if known is None:
                return []
        assert known is not None
        period = now - (known.expires - self.timeout)  # since its previous beacon
        known.expires = now + self.timeout
        self.relayed += 1
        if now >= self._next_sweep:
            self.sweep(now)
        if not repeated or not self.slot:
            return known.out
        if known.held:
            return []  # the one held goes out with the same frames
        hold = self._hold(known, period, now)
        if hold <= 0.0:
            return known.out
        known.held = True
        self._holds += 1
        heapq.heappush(self._held, (now + hold, self._holds, known))
        return []

    def _hold(self, known: _Known, period: float, now: float) -> float:
        """How long to hold a repeated beacon of ``known``, which came ``period`` after its previous one.

        Repeated beacons go out at slot boundaries (multiples of ``slot`` on the monotonic clock), so that
        a listener gets every peer's in one burst, one wake-up a slot, instead of one wake-up each.  Each
        peer's hold is what separates its beacons' arrival from the next boundary: constant while the
        peer beacons at its pace, so its beacons go out as often as it sends them.  The hold grows by at
        most a quarter of the peer's period from one beacon to the next (the only time a listener waits
        longer than a period between two of them, by that quarter at most); it shrinks at once."""
        if period < _FAST * self.slot:
            known.hold = 0.0
            return 0.0
        target = -now % self.slot
        known.hold = min(target, known.hold + period / 4)
        return known.hold

    def release(self, now: float) -> list[list[bytes]]:
        """The held beacons whose time has come, as messages to publish."""
        out: list[list[bytes]] = []
        held = self._held
        while held and held[0][0] <= now:
            _, _, known = heapq.heappop(held)
            known.held = False
            if self.known.get(known.sender) is known:  # not replaced by a new beacon of the sender, nor gone
                out.extend(known.out)
        return out

    def next_release(self) -> float | None:
        """When :meth:`release` next has something to send."""
        return self._held[0][0] if self._held else None

    def _learn(self, frames: list[bytes], key: tuple[bytes | str | None, ...], peer_address: str | None,
               now: float) -> _Known | None:
        try:
            beacon = proto.decode_beacon(frames)
        except proto.MalformedMessage as exc:
            self.malformed += 1
            log.debug("dropped malformed beacon: %s", exc)
            return None
        host = self.endpoint_host(beacon.host, peer_address)
        out = proto.encode_tower_beacon(proto.TowerBeacon(beacon.sender, f"tcp://{host}:{beacon.port}"))
        old = self.known.get(beacon.sender)
        if old is not None:
            self._relay.pop(old.key, None)
        known = self.known[beacon.sender] = _Known(beacon.sender, out, [], now, key)
        known.rescope(self._scopes(beacon.sender))
        self._relay[key] = known
        return known

    def _scopes(self, sender: str) -> list[bytes]:
        profiles = self.profiles.get(sender)
        if not profiles:
            return [proto.SCOPE_UNKNOWN]
        return sorted({proto.scope_key(role, topic) for role, topic in profiles})

    def on_profile(self, data: bytes, subscribed: bool) -> str | None:
        """A profile (un)subscription (rfc 5.6) -> its address; None if malformed.  The peer's next
        beacon goes out under its new scopes (its last one is not published again: the replay of a dead
        peer's beacon must reach a resumed twin once, section 15)."""
        try:
            sender, role, topic = proto.decode_profile(data)
        except proto.MalformedMessage as exc:
            self.malformed += 1
            log.debug("dropped malformed profile: %s", exc)
            return None
        profiles = self.profiles.setdefault(sender, set())
        if subscribed:
            profiles.add((role, topic))
        else:
            profiles.discard((role, topic))
            if not profiles:
                del self.profiles[sender]
        known = self.known.get(sender)
        if known is not None:
            known.rescope(self._scopes(sender))
        return sender

    def needs(self, address: str) -> list[bytes] | None:
        """The scopes a profiled peer needs to hear; None for a peer without a profile (it hears all)."""
        profiles = self.profiles.get(address)
        if not profiles:
            return None
        return sorted({need for role, topic in profiles for need in proto.scope_needs(role, topic)})

    def live(self, now: float, needs: list[bytes] | None = None) -> list[list[bytes]]:
        """The latest beacon of every peer that has not expired (of those in one of ``needs``, if given)."""
        self.sweep(now)
        if needs is None:
            return [k.frames for k in self.known.values()]
        wanted = tuple(needs)
        return [k.frames for k in self.known.values() if any(scope.startswith(wanted) for scope in k.scopes)]

    def sweep(self, now: float) -> None:
        """Forget the peers whose beacons stopped ``timeout`` ago."""
        for sender in [s for s, k in self.known.items() if k.expires <= now]:
            self._relay.pop(self.known.pop(sender).key, None)
        self._next_sweep = now + self.timeout

    def peers(self, now: float) -> dict[str, str]:
        """sender -> endpoint of every live peer."""
        return {k.frames[1].decode(errors="replace"): k.frames[2].decode(errors="replace")
                for k in self.known.values() if k.expires > now}


class Tower:
    """Run a tower in a background thread (``start``/``stop``) or in the
    calling thread (``run``)."""

    def __init__(self, config: Config | None = None, ctx: zmq.Context[Any] | None = None) -> None:
        self.config = config or Config.load()
        self._ctx = ctx or zmq.Context.instance()
        self._sub_addresses = endpoints.split_endpoints(self.config["tower/sub_address"])
        self._pub_addresses = endpoints.split_endpoints(self.config["tower/pub_address"])
        loopback_only = all(_is_loopback_endpoint(a) for a in self._sub_addresses + self._pub_addresses)
        self.state = TowerState(
            loopback_only,
            self.config["beacon/timeout"] / 1000.0,
            None if loopback_only else endpoints.first_non_loopback_ipv4(),
            slot=self.config["beacon/interval"] / 1000.0,
        )
        self._xsub = self._ctx.socket(zmq.XSUB)
        self._xpub = self._ctx.socket(zmq.XPUB)
        for sock in (self._xsub, self._xpub):
            sock.linger = 0
        self._curve = Curve.from_config(self.config)
        if self._curve is not None:
            acquire_authenticator(self._ctx, self._curve)
            self._curve.serve(self._xsub)
            self._curve.serve(self._xpub)
        self._xpub.setsockopt(zmq.XPUB_VERBOSE, 1)
        self._xpub.setsockopt(zmq.XPUB_WELCOME_MSG, proto.WELCOME)
        for address in self._sub_addresses:
            self._xsub.bind(address)
        for address in self._pub_addresses:
            self._xpub.bind(address)
        # Beacons reach the tower whether or not anybody listens for B: it keeps every live peer's for
        # replay, and scoped listeners (rfc 5.6) do not listen for B at all.
        self._xsub.send(b"\x01" + proto.BEACON)
        self.sub_endpoint = self._xsub.last_endpoint.decode()
        self.pub_endpoint = self._xpub.last_endpoint.decode()
        self._stop = threading.Event()
        # stop() wakes the loop through this pipe: the loop waits on its sockets with no timeout
        self._wake, self._waker = sockets.wake_pipe(self._ctx, "tower")
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        log.info("tower: beacons in on %s, out on %s", self.sub_endpoint, self.pub_endpoint)

    def start(self) -> "Tower":
        """Run the tower in a background thread; returns the tower."""
        self._thread = threading.Thread(target=self.run, name="dafka-tower", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 2.0) -> None:
        """Stop the tower and wait up to ``timeout`` seconds for its thread."""
        self._stop.set()
        with self._lock:
            if not self._waker.closed:
                try:
                    self._waker.send(b"", zmq.NOBLOCK)
                except zmq.ZMQError:
                    pass  # the loop has ended and closed its end
        if self._thread is not None:
            self._thread.join(timeout)
        else:
            self._close()
        with self._lock:
            self._waker.close(0)

    def peers(self) -> dict[str, str]:
        """The live peers the tower has heard beacon, by sender address: their endpoints."""
        with self._lock:
            return self.state.peers(time.monotonic())

    def __enter__(self) -> "Tower":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def run(self) -> None:
        """Relay beacons in the calling thread until :meth:`stop`."""
        everything = zmq.Poller()
        everything.register(self._xsub, zmq.POLLIN)
        everything.register(self._xpub, zmq.POLLIN)
        everything.register(self._wake, zmq.POLLIN)
        # While a batch of beacons gathers (_READ_EVERY), only the listeners' side is watched.
        listeners = zmq.Poller()
        listeners.register(self._xpub, zmq.POLLIN)
        listeners.register(self._wake, zmq.POLLIN)
        next_read = 0.0
        last_found = float("-inf")  # the last read that found beacons
        state = self.state
        try:
            while not self._stop.is_set():
                # See _READ_EVERY: listeners are served meanwhile; otherwise the socket wakes the loop.
                now = time.monotonic()
                wait = next_read - now
                release = state.next_release()
                until_release = None if release is None else max(0, int((release - now) * 1000) + 1)
                if wait > 0:
                    timeout = int(wait * 1000) + 1
                    ready = dict(listeners.poll(timeout if until_release is None else min(timeout, until_release)))
                else:
                    ready = dict(everything.poll(until_release))
                if self._xpub in ready:
                    self._on_subscriptions()
                if self._xsub in ready or (wait > 0 and time.monotonic() >= next_read):
                    if self._on_beacons():
                        now = time.monotonic()
                        if _SAME_BURST < now - last_found < _READ_EVERY:
                            next_read = now + _READ_EVERY  # beacons come faster than that: batch them
                        last_found = now
                if release is not None and time.monotonic() >= release:
                    self._release()
        finally:
            self._close()

    def _release(self) -> None:
        """Publish the held beacons whose slot has come (rfc 5.3)."""
        send = self._xpub.send
        with self._lock:
            for out in self.state.release(time.monotonic()):
                send(out[0], zmq.SNDMORE)
                send(out[1], zmq.SNDMORE)
                send(out[2])

    def _on_subscriptions(self) -> None:
        """New listeners get the live peers' beacons at once (rfc 5.5).  A
        dafka-py peer subscribes to B and then to Z<its address>, which
        arrive together: it gets the replay addressed to it alone, then the
        end marker.  Any other new listener of B (a reference peer) makes a
        replay to every listener, as a plain beacon would go.  A peer that
        gave its profile (rfc 5.6) gets only the beacons its profile needs,
        and the end marker says so; a peer that adds a profile later (a
        consumer that subscribes to another topic) subscribes to its
        Z<address> again, and gets the same replay for its new needs."""
        listeners = 0
        newcomers: list[bytes] = []  # Z<address> of the dafka-py peers that subscribed
        while True:
            try:
                frame = self._xpub.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            kind = frame[1:2]
            if kind == proto.WELCOME or kind == proto.SCOPE:
                continue  # the welcome, and scopes (rfc 5.6): for this tower, never for the beacon publishers
            if kind == proto.PROFILE:
                with self._lock:
                    self.state.on_profile(frame[1:], subscribed=frame[:1] == b"\x01")
                continue
            if len(frame) > 2 and kind == proto.REPLAY_END:
                if frame[:1] == b"\x01":
                    newcomers.append(frame[1:])
                continue
            if frame != b"\x00" + proto.BEACON:  # this tower's own subscription to B stays (see __init__)
                self._xsub.send(frame)
            if frame[:1] == b"\x01" and kind in (b"", proto.BEACON):
                listeners += 1
        if not listeners and not newcomers:
            return
        send = self._xpub.send_multipart
        now = time.monotonic()
        with self._lock:
            replay = self.state.live(now)
            needs = {marker: self.state.needs(marker[1:].decode(errors="replace")) for marker in newcomers}
            scoped = {marker: self.state.live(now, need) for marker, need in needs.items() if need is not None}
        broadcast = listeners > len(newcomers)
        if broadcast:
            for frames in replay:
                send(frames)
        for marker in newcomers:
            if marker in scoped:
                for frames in scoped[marker]:
                    send([marker, *frames[1:]])
                send([marker, proto.SCOPED_REPLAY_END])  # the end of a scoped replay (rfc 5.6)
                continue
            if not broadcast:
                for frames in replay:
                    send([marker, *frames[1:]])
            self._xpub.send(marker)  # after its replay: the end of it

    def _on_beacons(self) -> int:
        """Relay every beacon waiting; returns how many."""
        xsub = self._xsub
        send = self._xpub.send
        on_beacon = self.state.on_beacon
        now = time.monotonic()
        relayed = 0
        with self._lock:
            while True:
                message = sockets.recv_message(xsub)
                if message is None:
                    return relayed
                relayed += 1
                frames, frame = message
                # the remote address, wanted only when the beacon gives no host (rfc 5.2)
                address = frame.get("Peer-Address") if len(frames) == 4 and not frames[2] else None
                peer_address = address if isinstance(address, str) else None
                for out in on_beacon(frames, peer_address, now):
                    send(out[0], zmq.SNDMORE)
                    send(out[1], zmq.SNDMORE)
                    send(out[2])

    def _close(self) -> None:
        self._xsub.close(0)
        self._xpub.close(0)
        self._wake.close(0)
        release_authenticator(self._ctx, self._curve)


def _is_loopback_endpoint(endpoint: str) -> bool:
    try:
        host, _ = endpoints.parse_tcp_endpoint(endpoint)
    except ValueError:
        return endpoint.startswith(("inproc://", "ipc://"))
    return endpoints.is_loopback(host)
