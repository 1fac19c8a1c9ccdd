"""The records of a consumer group's offsets topic (rfc 14.6): which topic holds a group's commits, and a
commit record's msgpack encoding.  The group's members write and read them, the store compacts them, the
console and the Kafka gateway read them."""

from __future__ import annotations

import msgpack

from ..records import PartitionKey
from .messages import NO_OFFSET

OFFSETS_TOPIC = "__dafka_offsets."  # + group: the topic the members' commits are kept in


def offsets_topic(group: str) -> str:
    """The topic where the members of ``group`` write their commits (the stores keep it)."""
    return OFFSETS_TOPIC + group


SNAPSHOT = 1  # the third element of a commit record that holds the member's whole view (rfc 14.6)


def encode_commits(member: str, offsets: dict[PartitionKey, int], snapshot: bool = False) -> bytes:
    """A record of the offsets topic: ``[member, [[topic, partition, offset], ...]]`` in msgpack, with a
    third element :data:`SNAPSHOT` when ``offsets`` is the member's whole view of the group's commits."""
    entries = [[topic, partition, offset] for (topic, partition), offset in offsets.items()]
    packed: bytes = msgpack.packb([member, entries, SNAPSHOT] if snapshot else [member, entries])
    return packed


def decode_commits(value: bytes) -> tuple[str, dict[PartitionKey, int]]:
    """The member and the commits in a record of the offsets topic; ValueError if it is not one."""
    try:
        member, entries, *flags = msgpack.unpackb(value)
        if not isinstance(member, str) or len(flags) > 1:
            raise ValueError("bad member")
        out = {}
        for topic, partition, offset in entries:
            if not (isinstance(topic, str) and isinstance(partition, str) and isinstance(offset, int)
                    and 0 <= offset < NO_OFFSET):
                raise ValueError("bad entry")
            out[(topic, partition)] = offset
        return member, out
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise ValueError(f"not a commit record: {exc}") from None


def is_snapshot(value: bytes) -> bool:
    """True if ``value`` is a commit record that supersedes every earlier one of its partition."""
    try:
        decoded = msgpack.unpackb(value)
    except (ValueError, TypeError, msgpack.UnpackException):
        return False
    return isinstance(decoded, list) and len(decoded) == 3 and decoded[2] == SNAPSHOT
