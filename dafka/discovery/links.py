"""A peer's presence: its data socket, bound on the interface its tower reaches and announced by its
beacon, and its links to the peers the beacon finds."""

from __future__ import annotations

import logging
from typing import Any, Iterable

import zmq

from .. import protocol as proto
from ..config import Config
from ..core import endpoints
from ..core.security import Curve, acquire_authenticator, release_authenticator
from ..core.sockets import connect
from . import peer_info
from .beacon import CONNECT, Beacon, Companion

log = logging.getLogger(__name__)


class DataSocket:
    """A peer's bound data socket, the beacon that advertises it, and the
    CURVE settings (``security/*``) of every socket the peer opens."""

    def __init__(self, ctx: zmq.Context[Any], config: Config, sock: zmq.Socket[Any], sender: str, name: str,
                 profiles: Iterable[tuple[bytes, str]] | None = None, beside: Beacon | None = None) -> None:
        self.curve = Curve.from_config(config)
        self._ctx = ctx
        if self.curve is not None:
            acquire_authenticator(ctx, self.curve)
            self.curve.serve(sock)
        self.host = endpoints.advertised_host(config["beacon/address"], config["beacon/sub_address"])
        self.bind_host = endpoints.bind_host(config["beacon/bind_address"], self.host)
        self.port = endpoints.bind_ephemeral(sock, self.bind_host)
        self.endpoint = f"tcp://{self.host}:{self.port}"
        self._config = config
        self._name = name
        self._sock = sock
        self._sender = sender
        # what the role reports of itself in its PEER-INFO's details (rfc 17); set by the role
        self.describe: peer_info.Describe | None = None
        # what the peer is (rfc 5.6); None: a peer that hears every beacon and is heard by every peer
        self._profiles = None if profiles is None else list(profiles)
        # beside: another socket's beacon of this process (same config and profiles) announces this one too
        self.beacon: Beacon | Companion = self._new_beacon(sender) if beside is None else \
            beside.add_companion(sender, self.port)

    def _new_beacon(self, sender: str) -> Beacon:
        config = self._config
        beacon = Beacon(
            self._ctx,
            sender,
            self.port,
            host=self.host,
            tower_sub=config["beacon/sub_address"],
            tower_pub=config["beacon/pub_address"],
            interval_ms=config["beacon/interval"],
            timeout_ms=config["beacon/timeout"],
            name=self._name,
            curve=self.curve,
            scoped=self._profiles is not None and bool(config["beacon/scoped"]),
        )
        for role, topic in self._profiles or ():
            beacon.add_profile(role, topic)
        return beacon

    def answer_info(self, sub: proto.Subscription) -> bool:
        """Answer a PEER-INFO subscription (rfc 17) seen on the data socket; True if ``sub`` was one.
        Call from the thread that owns the socket."""
        return peer_info.answer(self._sock, sub, self._sender, self._name, self.describe)

    def rebeacon(self, sender: str) -> Beacon:
        """Announce the data socket under another address from now on (a
        resumed producer, after it learnt its head under a temporary one):
        stops the beacon and starts a new one, which the caller polls instead."""
        self.beacon.stop()
        self._sender = sender
        self.beacon = self._new_beacon(sender).start()
        return self.beacon

    def add_profile(self, role: bytes, topic: str = "") -> None:
        """Say one more thing the peer is (a consumer's new topic): see :meth:`Beacon.add_profile`."""
        if self._profiles is not None and (role, topic) not in self._profiles:
            self._profiles.append((role, topic))
            self.beacon.add_profile(role, topic)

    def bind_also(self, sock: zmq.Socket[Any]) -> str:
        """Bind another socket of the peer where the data socket is bound (a
        CURVE server like it); returns its endpoint at the advertised host."""
        if self.curve is not None:
            self.curve.serve(sock)
        return f"tcp://{self.host}:{endpoints.bind_ephemeral(sock, self.bind_host)}"

    def secure(self, sock: zmq.Socket[Any]) -> zmq.Socket[Any]:
        """Prepare a socket that will connect to other peers (CURVE client)."""
        if self.curve is not None:
            self.curve.client(sock)
        return sock

    def close(self) -> None:
        """Stop the beacon and let go of the authenticator."""
        self.beacon.stop()
        release_authenticator(self._ctx, self.curve)


class PeerLinks:
    """Keeps one SUB socket connected to every peer a beacon reports."""

    def __init__(self, sock: zmq.Socket[Any]) -> None:
        self.sock = sock
        self.endpoints: dict[str, str] = {}  # endpoint -> the sender address its beacon gave

    def senders(self) -> set[str]:
        """The addresses of the peers connected to."""
        return set(self.endpoints.values())

    def __len__(self) -> int:
        return len(self.endpoints)

    def on_beacon(self, pipe: zmq.Socket[Any]) -> int:
        """A loop handler for the beacon's event pipe; returns how many peers went away."""
        gone = 0
        for event in Beacon.read_events(pipe):
            if event.kind == CONNECT:
                if event.endpoint not in self.endpoints and connect(self.sock, event.endpoint):
                    self.endpoints[event.endpoint] = event.sender
            elif event.endpoint in self.endpoints:
                del self.endpoints[event.endpoint]
                gone += 1
                try:
                    self.sock.disconnect(event.endpoint)
                except zmq.ZMQError:
                    pass  # already gone
        return gone
