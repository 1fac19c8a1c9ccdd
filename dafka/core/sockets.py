"""Frames on ZeroMQ sockets, as every role sends and reads them: the fast send, queue sizes, connecting,
reading subscriptions, the rest of a message and batches of records, and the in-process wake-up pipes."""

from __future__ import annotations

import itertools
import logging
from typing import Any, Callable, Iterator

import zmq

from .. import protocol as proto
from ..protocol import batching, bulk
from ..protocol.intake import RecordIntake

log = logging.getLogger(__name__)


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


_inproc_serials = itertools.count()


def inproc_endpoint(kind: str) -> str:
    """An inproc name no other socket of this process has had.  Not ``id()``
    of the owner: a collected object's id is reused, while its inproc name
    stays bound until its socket is closed, so a new owner could not bind."""
    return f"inproc://dafka-{kind}-{next(_inproc_serials)}"


def drain(sock: zmq.Socket[Any], wanted: bytes | None = None) -> bool:
    """Read every one-frame message waiting on ``sock`` (a wake-up pipe, an
    XPUB's subscriptions); returns whether one of them was ``wanted``."""
    seen = False
    while True:
        try:
            frame = sock.recv(zmq.NOBLOCK)
        except zmq.Again:
            return seen
        seen = seen or frame == wanted


def recv_message(sock: zmq.Socket[Any]) -> tuple[list[bytes], zmq.Frame] | None:
    """One waiting message's frames, and its last frame (for metadata such as
    ``Peer-Address``), without blocking; None if none waits.  Reads each
    frame's own "more" flag: pyzmq's recv_multipart asks the socket for
    RCVMORE after every frame, which makes it cost three times as much
    (a 4-frame beacon: 2.9 against 6.8 us)."""
    recv = sock.recv
    try:
        frame = recv(zmq.NOBLOCK, copy=False)
    except zmq.Again:
        return None
    frames = [frame.bytes]
    while frame.more:
        frame = recv(copy=False)
        frames.append(frame.bytes)
    return frames, frame


def wake_pipe(ctx: zmq.Context[Any], kind: str) -> tuple[zmq.Socket[Any], zmq.Socket[Any]]:
    """A pipe that wakes a loop waiting on its sockets with no timeout: the
    loop polls the first end; another thread sends on the second."""
    endpoint = inproc_endpoint(f"{kind}-wake")
    wake = ctx.socket(zmq.PAIR)
    wake.linger = 0
    wake.bind(endpoint)
    waker = ctx.socket(zmq.PAIR)
    waker.linger = 0
    waker.connect(endpoint)
    return wake, waker
