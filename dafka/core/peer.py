"""What every peer shares: configuration coercion, addresses, binding its data
socket on the right interface and starting its beacon."""

from __future__ import annotations

import logging
import os

# hashlib's blake2b itself, without hashlib's import of OpenSSL (8 ms a process start)
from _blake2 import blake2b
from typing import Any, Callable, Iterable, Iterator, Mapping, Union

import zmq

from .. import protocol as proto
from ..config import Config
from ..discovery import peer_info
from ..discovery.beacon import CONNECT, Beacon, Companion
from ..protocol import batching, bulk
from ..protocol.intake import RecordIntake
from . import net
from .security import Curve, acquire_authenticator, release_authenticator

log = logging.getLogger(__name__)

ConfigLike = Union[Config, Mapping[str, object], str, "os.PathLike[str]", None]

# pyzmq's Python-level Socket.send wrapper doubles the cost of a send (it checks
# for routing ids, groups and zero-copy thresholds dafka never uses): the
# per-record paths call the Cython method underneath, ``raw_send(sock, data, flags)``.
raw_send: Callable[..., Any] = zmq.backend.Socket.send
# Frames at least this big are sent without a copy (raw_send(sock, data, flags, False)):
# libzmq keeps a reference to the bytes object until it has sent them.
ZERO_COPY_BYTES = 65536
# The largest message a dafka-py peer sends: a burst's RECORDS, or a DIRECT-RECORDS.
MAX_MESSAGE_BYTES = max(batching.BURST_BYTES, bulk.MAX_BYTES)


def queue_messages(nbytes: int, hwm: int) -> int:
    """The high-water mark that keeps one libzmq queue (one per connected peer)
    within ``nbytes``: libzmq counts messages, so as many of the largest
    messages as fit, and at most ``hwm`` (0: no limit of its own)."""
    fit = max(1, nbytes // MAX_MESSAGE_BYTES)
    return min(hwm, fit) if hwm else fit


def read_subscriptions(xpub: zmq.Socket[Any]) -> Iterator[proto.Subscription | None]:
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


def read_rest(sock: zmq.Socket[Any], frame: bytes) -> list[bytes]:
    """Every frame of the message whose first frame, ``frame``, was just
    received as bytes (messages are atomic: the rest is already here)."""
    frames = [frame]
    while sock.getsockopt(zmq.RCVMORE):
        frames.append(sock.recv(zmq.NOBLOCK))
    return frames


def drain_records(sock: zmq.Socket[Any], limit: int, intake: RecordIntake) -> int:
    """Receive up to ``limit`` messages from a SUB socket into ``intake``, as
    plain bytes; returns how many (fewer: the socket had no more).

    A zmq.Frame, only there for its ``more`` flag, costs 0.6 us a message and
    ``sock.rcvmore`` 1.3 us.  So frame 1 comes as bytes: if it is a key of
    ``intake.record_prefixes`` (less its 8-byte sequence), it is byte for byte
    the header of a record of that partition, and its content frame is
    already here: read without blocking and handed to
    ``intake.on_known_record_frames``; its absence, a malformed one-frame
    record, goes to ``intake.lone_header``.  Every other message is rare: its
    frames are read with RCVMORE (:func:`read_rest`), so that no frame of one
    message is taken for another's, and handed to ``intake.on_frames``."""
    recv = sock.recv
    known = intake.record_prefixes.get
    on_known = intake.on_known_record_frames
    for received in range(limit):
        try:
            frame = recv(zmq.NOBLOCK)
        except zmq.Again:
            return received
        p = known(frame[:-8])
        if p is None:
            intake.on_frames(read_rest(sock, frame))
            continue
        try:
            content = recv(zmq.NOBLOCK)
        except zmq.Again:
            intake.lone_header()
            continue
        on_known(p, frame, content)
    return limit


def connect(sock: zmq.Socket[Any], endpoint: str) -> bool:
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


def new_address(producer: bool = False) -> str:
    """A fresh peer address: 32 upper-case hex characters, like the reference's
    zuuid.  A producer's is tagged (rfc 5.5): its second half is a hash of
    its first, so that other dafka-py producers, which need nothing from it,
    do not connect to it."""
    if not producer:
        return os.urandom(16).hex().upper()
    head = os.urandom(8).hex().upper()
    return head + _producer_tag(head)


def partition_address(name: str) -> str:
    """The stable producer address named ``name`` (a connector's, a service's):
    the same name gives the same partition on every start, for
    ``Producer(..., address=partition_address(name), resume=True)``.  Tagged as
    :func:`new_address` tags a producer's."""
    if not name:
        raise ValueError("a partition name must not be empty")
    head = blake2b(name.encode(), digest_size=8, person=b"dafka-partition").hexdigest().upper()
    return head + _producer_tag(head)


def _producer_tag(head: str) -> str:
    return blake2b(head.encode(), digest_size=8, person=b"dafka-producer").hexdigest().upper()


def is_tagged_producer(address: str) -> bool:
    """Whether ``address`` is a dafka-py producer's (a random address has one
    chance in 2**64 of looking like one)."""
    return len(address) == 32 and address[16:] == _producer_tag(address[:16])


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
        self.host = net.advertised_host(config["beacon/address"], config["beacon/sub_address"])
        self.bind_host = net.bind_host(config["beacon/bind_address"], self.host)
        self.port = net.bind_ephemeral(sock, self.bind_host)
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
        return f"tcp://{self.host}:{net.bind_ephemeral(sock, self.bind_host)}"

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
