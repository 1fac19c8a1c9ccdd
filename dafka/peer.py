"""What every peer shares: configuration coercion, addresses, binding its data
socket on the right interface and starting its beacon."""

from __future__ import annotations

import logging
import os
import uuid
from typing import Iterator, Mapping, Union

import zmq

from . import net, proto
from .beacon import CONNECT, Beacon
from .config import Config
from .security import Curve, acquire_authenticator, release_authenticator

log = logging.getLogger(__name__)

ConfigLike = Union[Config, Mapping[str, object], str, os.PathLike, None]

# pyzmq's Python-level Socket.send wrapper doubles the cost of a send (it checks
# for routing ids, groups and zero-copy thresholds dafka never uses): the
# per-record paths call the Cython method underneath, ``raw_send(sock, data, flags)``.
raw_send = zmq.backend.Socket.send


def read_subscriptions(xpub: zmq.Socket) -> Iterator[proto.Subscription | None]:
    """Every (un)subscription waiting on an XPUB, decoded; None for a malformed
    frame, for the caller to count."""
    while True:
        try:
            frame = xpub.recv(zmq.NOBLOCK)
        except zmq.Again:
            return
        try:
            yield proto.decode_subscription(frame)
        except proto.MalformedMessage:
            yield None


def drain_records(sock: zmq.Socket, limit: int, known, on_known, on_other, on_lone_header) -> None:
    """Receive up to ``limit`` messages from a SUB socket, as plain bytes.

    A zmq.Frame, only there for its ``more`` flag, costs 0.6 us a message and
    ``sock.rcvmore`` 1.3 us.  So frame 1 comes as bytes: if ``known`` maps it
    (less its 8-byte sequence) to a partition, it is byte for byte the header
    of a record of that partition, and its content frame is already here
    (messages are atomic): read without blocking and handed to
    ``on_known(partition, frame, content)``; its absence, a malformed
    one-frame record, goes to ``on_lone_header()``.  Every other message is
    rare: its frames are read with RCVMORE, so that no frame of one message
    is taken for another's, and handed to ``on_other(frames)``."""
    recv = sock.recv
    for _ in range(limit):
        try:
            frame = recv(zmq.NOBLOCK)
        except zmq.Again:
            return
        p = known(frame[:-8])
        if p is None:
            frames = [frame]
            while sock.getsockopt(zmq.RCVMORE):
                frames.append(recv(zmq.NOBLOCK))
            on_other(frames)
            continue
        try:
            content = recv(zmq.NOBLOCK)
        except zmq.Again:
            on_lone_header()
            continue
        on_known(p, frame, content)


def connect(sock: zmq.Socket, endpoint: str) -> bool:
    """Connect to a peer's endpoint as relayed by a tower; an endpoint libzmq
    refuses is logged and skipped, never fatal to the peer."""
    try:
        sock.connect(endpoint)
    except zmq.ZMQError as exc:
        log.warning("cannot connect to %r relayed by the tower: %s", endpoint, exc)
        return False
    return True


def as_config(config: ConfigLike) -> Config:
    """A :class:`Config` from a Config, a dict of overrides, a ZPL file path, or None (defaults)."""
    if isinstance(config, Config):
        return config
    if config is None:
        return Config.load()
    if isinstance(config, (str, os.PathLike)):
        return Config.load(config)
    return Config.load(overrides=config)


def new_address() -> str:
    """A fresh peer address: 32 upper-case hex characters, like the reference's zuuid."""
    return uuid.uuid4().hex.upper()


class DataSocket:
    """A peer's bound data socket, the beacon that advertises it, and the
    CURVE settings (``security/*``) of every socket the peer opens."""

    def __init__(self, ctx: zmq.Context, config: Config, sock: zmq.Socket, sender: str, name: str) -> None:
        self.curve = Curve.from_config(config)
        self._ctx = ctx
        if self.curve is not None:
            acquire_authenticator(ctx, self.curve)
            self.curve.serve(sock)
        self.host = net.advertised_host(config["beacon/address"], config["beacon/sub_address"])
        self.port = net.bind_ephemeral(sock, net.bind_host(config["beacon/bind_address"], self.host))
        self.endpoint = f"tcp://{self.host}:{self.port}"
        self.beacon = Beacon(
            ctx,
            sender,
            self.port,
            host=self.host,
            tower_sub=config["beacon/sub_address"],
            tower_pub=config["beacon/pub_address"],
            interval_ms=config["beacon/interval"],
            timeout_ms=config["beacon/timeout"],
            name=name,
            curve=self.curve,
        )

    def secure(self, sock: zmq.Socket) -> zmq.Socket:
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

    def __init__(self, sock: zmq.Socket) -> None:
        self.sock = sock
        self.endpoints: set[str] = set()

    def __len__(self) -> int:
        return len(self.endpoints)

    def on_beacon(self, pipe: zmq.Socket) -> int:
        """A loop handler for the beacon's event pipe; returns how many peers went away."""
        gone = 0
        for event in Beacon.read_events(pipe):
            if event.kind == CONNECT:
                if event.endpoint not in self.endpoints and connect(self.sock, event.endpoint):
                    self.endpoints.add(event.endpoint)
            elif event.endpoint in self.endpoints:
                self.endpoints.discard(event.endpoint)
                gone += 1
                try:
                    self.sock.disconnect(event.endpoint)
                except zmq.ZMQError:
                    pass  # already gone
        return gone
