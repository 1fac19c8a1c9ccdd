"""What the public API hands to users."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Record:
    """One record of a partition, as delivered by :class:`dafka.Consumer`.

    ``partition`` is the producer's address; ``offset`` its sequence number."""

    topic: str
    partition: str
    offset: int
    value: Any


@dataclass(frozen=True, slots=True)
class RecordMetadata:
    """Where a sent record landed."""

    topic: str
    partition: str
    offset: int
