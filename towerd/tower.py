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

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

import zmq

from dafka import net, proto
from dafka.config import Config
from dafka.security import Curve, acquire_authenticator, release_authenticator

log = logging.getLogger(__name__)


@dataclass
class _Known:
    frames: list[bytes]
    expires: float


class TowerState:
    """Endpoint rules and beacon memory, free of I/O."""

    def __init__(self, loopback_only: bool, timeout: float, lan_address: str | None) -> None:
        self.loopback_only = loopback_only
        self.timeout = timeout
        self.lan_address = lan_address
        self.known: dict[str, _Known] = {}
        self.relayed = 0
        self.malformed = 0

    def endpoint_host(self, beacon_host: str, peer_address: str | None) -> str:
        if beacon_host:
            return beacon_host
        if peer_address and not net.is_loopback(peer_address):
            return peer_address
        if self.loopback_only or self.lan_address is None:
            return "127.0.0.1"
        return self.lan_address

    def on_beacon(self, frames: list[bytes], peer_address: str | None, now: float) -> list[bytes] | None:
        """A beacon from a peer -> the frames to publish, or None if malformed."""
        try:
            beacon = proto.decode_beacon(frames)
        except proto.MalformedMessage as exc:
            self.malformed += 1
            log.debug("dropped malformed beacon: %s", exc)
            return None
        host = self.endpoint_host(beacon.host, peer_address)
        out = proto.encode_tower_beacon(proto.TowerBeacon(beacon.sender, f"tcp://{host}:{beacon.port}"))
        self.known[beacon.sender] = _Known(out, now + self.timeout)
        self.relayed += 1
        return out

    def live(self, now: float) -> list[list[bytes]]:
        """The latest beacon of every peer that has not expired."""
        for sender in [s for s, k in self.known.items() if k.expires <= now]:
            del self.known[sender]
        return [k.frames for k in self.known.values()]

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
        self._sub_addresses = net.split_endpoints(self.config["tower/sub_address"])
        self._pub_addresses = net.split_endpoints(self.config["tower/pub_address"])
        loopback_only = all(_is_loopback_endpoint(a) for a in self._sub_addresses + self._pub_addresses)
        self.state = TowerState(
            loopback_only,
            self.config["beacon/timeout"] / 1000.0,
            None if loopback_only else net.first_non_loopback_ipv4(),
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
        self.sub_endpoint = self._xsub.last_endpoint.decode()
        self.pub_endpoint = self._xpub.last_endpoint.decode()
        self._stop = threading.Event()
        # stop() wakes the loop through this pipe: the loop waits on its sockets with no timeout
        self._wake, self._waker = net.wake_pipe(self._ctx, "tower")
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
        poller = zmq.Poller()
        poller.register(self._xsub, zmq.POLLIN)
        poller.register(self._xpub, zmq.POLLIN)
        poller.register(self._wake, zmq.POLLIN)
        try:
            # No timer: a peer expires lazily, when a replay or peers() looks at it.
            while not self._stop.is_set():
                ready = dict(poller.poll())
                if self._xpub in ready:
                    self._on_subscriptions()
                if self._xsub in ready:
                    self._on_beacons()
        finally:
            self._close()

    def _on_subscriptions(self) -> None:
        """New listeners get the live peers' beacons at once (rfc 5.5).  A
        dafka-py peer subscribes to B and then to Z<its address>, which
        arrive together: it gets the replay addressed to it alone, then the
        end marker.  Any other new listener of B (a reference peer) makes a
        replay to every listener, as a plain beacon would go."""
        listeners = 0
        newcomers: list[bytes] = []  # Z<address> of the dafka-py peers that subscribed
        while True:
            try:
                frame = self._xpub.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            if len(frame) >= 2 and frame[1:2] == proto.WELCOME:
                continue
            if len(frame) > 2 and frame[1:2] == proto.REPLAY_END:
                if frame[:1] == b"\x01":
                    newcomers.append(frame[1:])
                continue
            self._xsub.send(frame)
            if frame[:1] == b"\x01" and frame[1:2] in (b"", proto.BEACON):
                listeners += 1
        if not listeners and not newcomers:
            return
        with self._lock:
            replay = self.state.live(time.monotonic())
        send = self._xpub.send_multipart
        broadcast = listeners > len(newcomers)
        if broadcast:
            for frames in replay:
                send(frames)
        for marker in newcomers:
            if not broadcast:
                for frames in replay:
                    send([marker, *frames[1:]])
            self._xpub.send(marker)  # after its replay: the end of it

    def _on_beacons(self) -> None:
        while True:
            try:
                frames = self._xsub.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            peer_address = frames[0].get("Peer-Address") if frames else None
            with self._lock:
                out = self.state.on_beacon([f.bytes for f in frames], peer_address, time.monotonic())
            if out is not None:
                self._xpub.send_multipart(out)

    def _close(self) -> None:
        self._xsub.close(0)
        self._xpub.close(0)
        self._wake.close(0)
        release_authenticator(self._ctx, self._curve)


def _is_loopback_endpoint(endpoint: str) -> bool:
    try:
        host, _ = net.parse_tcp_endpoint(endpoint)
    except ValueError:
        return endpoint.startswith(("inproc://", "ipc://"))
    return net.is_loopback(host)
