"""The tower's frames: a peer's beacon and the tower's relay of it, the replay's end (rfc 5.5), and the
profiles and scopes of scoped discovery (rfc 5.6)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from .messages import MalformedMessage, _b, _s

# Tower / beacon frames.
BEACON = b"B"
WELCOME = b"W"
# Extension (rfc 5.5): a dafka-py peer subscribes to REPLAY_END + its address on the tower's XPUB, after
# B; a dafka-py tower answers with that one frame, which follows the beacons it replayed for the B.
REPLAY_END = b"Z"
# Extension (rfc 5.6, scoped discovery): a dafka-py peer's beacon SUB subscribes to PROFILE + its address +
# NUL + a role + a topic, saying what it is; a dafka-py tower then also publishes its beacons under
# SCOPE + role + topic + NUL, and each peer subscribes to the scopes it needs (scope_needs).
PROFILE = b"P"
SCOPE = b"S"
ROLE_PRODUCER = b"p"  # of its topic
ROLE_CONSUMER = b"c"  # of its topic ("" for a consumer that reads none yet)
ROLE_GROUP = b"g"  # a member of the consumer group named by the topic field
ROLE_STORE = b"s"  # a store's writer or reader (no topic)
ROLES = (ROLE_PRODUCER, ROLE_CONSUMER, ROLE_GROUP, ROLE_STORE)
SCOPE_UNKNOWN = b"S*"  # the scope of a peer that gave no profile (a reference peer): every scoped peer hears it
SCOPED_REPLAY_END = b"S1"  # second frame of Z<address>: the replay was scoped (version 1 of rfc 5.6)


@dataclass(frozen=True, slots=True)
class Beacon:
    """Peer -> tower: ``"B", sender, host, port``; host may be empty."""

    sender: str
    host: str
    port: int


@dataclass(frozen=True, slots=True)
class TowerBeacon:
    """Tower -> peers: ``"B", sender, "tcp://host:port"``."""

    sender: str
    endpoint: str


def encode_beacon(beacon: Beacon) -> list[bytes]:
    if not 0 < beacon.port < 65536:
        raise ValueError(f"port {beacon.port} is outside 1..65535")
    return [BEACON, _b(beacon.sender), _b(beacon.host), str(beacon.port).encode()]


def decode_beacon(frames: Sequence[bytes]) -> Beacon:
    if len(frames) != 4:
        raise MalformedMessage(f"beacon needs 4 frames, got {len(frames)}")
    frames = [bytes(f) for f in frames]
    if frames[0] != BEACON:
        raise MalformedMessage(f"beacon starts with {frames[0]!r}, not 'B'")
    port_text = frames[3]
    if not port_text.isdigit() or len(port_text) > 5:
        raise MalformedMessage(f"beacon port {port_text!r} is not a decimal number")
    if len(port_text) > 1 and port_text[:1] == b"0":
        raise MalformedMessage(f"beacon port {port_text!r} has a leading zero")
    port = int(port_text)
    if not 0 < port < 65536:
        raise MalformedMessage(f"beacon port {port} is outside 1..65535")
    if not frames[1]:
        raise MalformedMessage("beacon has an empty sender")
    return Beacon(_s(frames[1]), _s(frames[2]), port)


def encode_tower_beacon(beacon: TowerBeacon) -> list[bytes]:
    return [BEACON, _b(beacon.sender), _b(beacon.endpoint)]


def decode_tower_beacon(frames: Sequence[bytes]) -> TowerBeacon:
    if len(frames) != 3:
        raise MalformedMessage(f"tower beacon needs 3 frames, got {len(frames)}")
    frames = [bytes(f) for f in frames]
    if frames[0] != BEACON and not (frames[0][:1] == SCOPE and frames[0][-1:] == b"\x00" or frames[0] == SCOPE_UNKNOWN):
        raise MalformedMessage(f"tower beacon starts with {frames[0]!r}, not 'B' or a scope (rfc 5.6)")
    if not _ENDPOINT.fullmatch(frames[2]) or int(frames[2].rsplit(b":", 1)[1]) > 65535:
        raise MalformedMessage(f"tower beacon endpoint {frames[2]!r} is not a tcp://host:port endpoint")
    if not frames[1]:
        raise MalformedMessage("tower beacon has an empty sender")
    try:
        sender = frames[1].decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedMessage("tower beacon sender is not UTF-8") from None
    return TowerBeacon(sender, frames[2].decode("ascii"))


def encode_profile(address: str, role: bytes, topic: str = "") -> bytes:
    """The subscription (without its leading 0x01) by which a peer tells a tower what it is (rfc 5.6)."""
    if role not in ROLES:
        raise ValueError(f"unknown discovery role {role!r}")
    if role == ROLE_STORE and topic:
        raise ValueError("a store's profile has no topic")
    sender, name = _b(address), _b(topic)
    if not sender or b"\x00" in sender or b"\x00" in name:
        raise ValueError("a profile's address must be non-empty, and neither it nor the topic may hold NUL")
    return PROFILE + sender + b"\x00" + role + name


def decode_profile(data: bytes) -> tuple[str, bytes, str]:
    """A profile subscription's body (after 0x01) -> (address, role, topic)."""
    data = bytes(data)
    if data[:1] != PROFILE:
        raise MalformedMessage(f"profile starts with {data[:1]!r}, not 'P'")
    sender, sep, rest = data[1:].partition(b"\x00")
    if not sep or not sender:
        raise MalformedMessage("profile has no address, or no NUL after it")
    role, name = rest[:1], rest[1:]
    if role not in ROLES:
        raise MalformedMessage(f"profile role {role!r} is not one of p, c, g, s")
    if b"\x00" in name or (role == ROLE_STORE and name):
        raise MalformedMessage("profile topic holds NUL, or a store's profile has a topic")
    try:
        return sender.decode("utf-8"), role, name.decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedMessage("profile address or topic is not UTF-8") from None


def scope_key(role: bytes, topic: str = "") -> bytes:
    """The first frame under which a dafka-py tower publishes the beacons of a peer with this profile."""
    return SCOPE + role + _b(topic) + b"\x00"


def scope_needs(role: bytes, topic: str = "") -> list[bytes]:
    """The scopes (subscription prefixes) a peer with this profile needs to hear (rfc 5.6): a producer the
    consumers and the producers of its topic and the stores; a consumer the producers of its topic and the
    stores; a group member the other members; a store everyone.  And every peer without a profile."""
    name = _b(topic) + b"\x00"
    if role == ROLE_PRODUCER:
        return [SCOPE + ROLE_CONSUMER + name, SCOPE + ROLE_PRODUCER + name, SCOPE + ROLE_STORE, SCOPE_UNKNOWN]
    if role == ROLE_CONSUMER:
        return [SCOPE + ROLE_PRODUCER + name, SCOPE + ROLE_STORE, SCOPE_UNKNOWN]
    if role == ROLE_GROUP:
        return [SCOPE + ROLE_GROUP + name, SCOPE_UNKNOWN]
    if role == ROLE_STORE:
        return [SCOPE]
    raise ValueError(f"unknown discovery role {role!r}")


# What a peer can connect to: tcp://, an IPv4/IPv6/DNS host, a decimal port.
_ENDPOINT = re.compile(rb"tcp://(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.\-]*[A-Za-z0-9])?):[1-9][0-9]{0,4}")
