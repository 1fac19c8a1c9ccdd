"""What the sans-I/O states that take records from a SUB socket (consumer,
store writer) share: the table of known record headers, and the dispatch on
it that :func:`dafka.core.sockets.drain_records` relies on."""

from __future__ import annotations

import logging
from typing import Any

from .. import protocol as proto

log = logging.getLogger(__name__)


class RecordIntake:
    """Subclasses fill :attr:`record_prefixes` (frame 1 of a RECORD or
    DIRECT-RECORD of a known partition, less its 8-byte sequence -> that
    partition) and implement :meth:`on_frames` and :meth:`on_known_record_frames`."""

    role = "peer"  # for log messages, with ``address``
    address = ""

    def __init__(self) -> None:
        self.record_prefixes: dict[bytes, Any] = {}
        self.malformed = 0

    def on_frames(self, frames: list[bytes]) -> None:
        """Any message (the slow path: decoded)."""
        raise NotImplementedError

    def on_known_record_frames(self, p: Any, frame: bytes, content: bytes) -> None:
        """The hot path: a record of partition ``p``, whose frame 1 matched
        :attr:`record_prefixes` (so it needs no decoding)."""
        raise NotImplementedError

    def on_record_frames(self, frame: bytes, content: bytes) -> None:
        """A two-frame message."""
        p = self.record_prefixes.get(frame[:-8])
        if p is None:
            self.on_frames([frame, content])
        else:
            self.on_known_record_frames(p, frame, content)

    def decode(self, frames: list[bytes]) -> Any:
        """The message in ``frames``, or None (dropped and counted) if it is malformed."""
        try:
            return proto.decode(frames)
        except proto.MalformedMessage as exc:
            self.malformed += 1
            log.debug("%s %s dropped a malformed message: %s", self.role, self.address, exc)
            return None

    def store_heads(self, msg: Any) -> list[tuple[str, str, int]]:
        """(subject, partition, head) of each partition a store's DIRECT-HEAD
        or DIRECT-PARTITIONS addressed to us reports (none for any other
        message); a partition address with a NUL could not be answered, and
        is left out."""
        if isinstance(msg, proto.DirectHeadMsg):
            if msg.topic != self.address:
                return []
            entries = [(msg.subject, msg.address, msg.sequence)]
        elif isinstance(msg, proto.DirectPartitionsMsg):
            if msg.topic != self.address:
                return []
            entries = [(info.subject, info.address, info.head) for info in msg.partitions]
        else:
            return []
        return [entry for entry in entries if "\0" not in entry[1]]

    def lone_header(self) -> None:
        """A known partition's record header arrived without its content frame."""
        self.malformed += 1
