"""XPUB (un)subscription frames: what a peer subscribes to, as its publisher sees it, and the HEADS-AT
request that travels as one (rfc 8.1)."""

from __future__ import annotations

from dataclasses import dataclass

from .decoding import _Reader
from .encoding import _topic
from .messages import HEADS_AT, VERSION, MalformedMessage, _s


def subscription(msg_id: bytes, topic: str = "", exact: bool = False) -> bytes:
    """The SUB prefix for messages of ``msg_id`` whose topic starts with
    ``topic``; with ``exact`` the topic's NUL terminator is included so that
    only that exact topic matches (``hello`` no longer matches ``hello2``)."""
    raw = msg_id + _topic(topic)
    return raw + b"\0" if exact else raw


@dataclass(frozen=True, slots=True)
class Subscription:
    """A (un)subscription frame as seen on an XPUB socket."""

    subscribe: bool
    msg_id: bytes  # b"" when the whole stream was subscribed
    topic: str
    exact: bool = False  # the prefix went on past the topic's NUL...
    rest: bytes = b""  # ...with these bytes: a consumer group member's one partition (rfc 14.2)


def decode_subscription(frame: bytes) -> Subscription:
    """Decode ``0x01|0x00 id topic [NUL [rest]]`` as received by an XPUB socket
    (``rest``: the start of frame 1 after the topic, one partition's records)."""
    if not isinstance(frame, (bytes, bytearray, memoryview)):
        raise MalformedMessage("subscription frame is not bytes")
    frame = bytes(frame)
    if not frame:
        raise MalformedMessage("empty subscription frame")
    flag = frame[0]
    if flag not in (0, 1):
        raise MalformedMessage(f"subscription flag {flag} is neither 0 nor 1")
    msg_id = frame[1:2]
    topic, nul, rest = frame[2:].partition(b"\0")
    return Subscription(flag == 1, msg_id, _s(topic), bool(nul), rest)


def subscription_prefix(sub: Subscription) -> bytes:
    """The prefix ``sub`` subscribes: what a message must start with to reach the subscriber."""
    return sub.msg_id + _topic(sub.topic) + (b"\0" + sub.rest if sub.exact else b"")


def encode_subscription(sub: Subscription) -> bytes:
    """The frame an XPUB sees for ``sub`` (useful for tests and proxies)."""
    return (b"\x01" if sub.subscribe else b"\x00") + subscription_prefix(sub)


def decode_heads_at_request(sub: Subscription) -> tuple[str, int, str] | None:
    """(requester, since, subject) of a subscription that asks for HEADS-AT,
    or None if ``sub`` is not one (an unsubscription, another message, or a
    malformed request, which the caller counts)."""
    if not (sub.subscribe and sub.msg_id == HEADS_AT and sub.exact and sub.topic):
        return None
    r = _Reader(sub.rest, 0)
    try:
        (version,) = r.take(1, "version")
        since = r.u64("since")
        subject = r.string("subject")
        r.end()
    except MalformedMessage:
        return None
    return (sub.topic, since, subject) if version == VERSION else None
