"""A consumer's positions on disk, so that a restarted consumer neither loses
nor repeats records.

The file is an append-only journal of msgpack ``[topic, partition, next]``
entries: one small ``write`` per update, which survives the process being
killed (the kernel keeps it).  Opening it replays the journal, keeps the last
position of each partition, and rewrites the file compactly.
"""

from __future__ import annotations

from ..records import PartitionKey

import logging
import os

import msgpack

log = logging.getLogger(__name__)


class OffsetJournal:
    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self.positions = self._load()
        self._compact()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def _load(self) -> dict[PartitionKey, int]:
        positions: dict[PartitionKey, int] = {}
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return positions
        unpacker = msgpack.Unpacker(raw=False)
        unpacker.feed(data)
        try:
            for entry in unpacker:
                topic, partition, offset = entry
                positions[(str(topic), str(partition))] = int(offset)
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            log.warning("offsets file %s: ignoring a damaged tail (%s)", self.path, exc)
        return positions

    def _compact(self) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "wb") as f:
            for (topic, partition), offset in self.positions.items():
                f.write(msgpack.packb([topic, partition, offset]))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def record(self, topic: str, partition: str, next_offset: int) -> None:
        self.positions[(topic, partition)] = next_offset
        os.write(self._fd, msgpack.packb([topic, partition, next_offset]))

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
            self._compact()
