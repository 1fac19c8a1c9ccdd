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


def _record_factory():
    """``new_record(topic, partition, offset, value)``: a :class:`Record`,
    built in half the time of ``Record(...)``.  A frozen dataclass's
    ``__init__`` sets each field through ``object.__setattr__`` by name; the
    consumer's hot path sets the slots through their descriptors instead."""
    new = object.__new__
    set_topic = Record.topic.__set__  # type: ignore[attr-defined]
    set_partition = Record.partition.__set__  # type: ignore[attr-defined]
    set_offset = Record.offset.__set__  # type: ignore[attr-defined]
    set_value = Record.value.__set__  # type: ignore[attr-defined]

    def new_record(topic: str, partition: str, offset: int, value: Any) -> Record:
        record = new(Record)
        set_topic(record, topic)
        set_partition(record, partition)
        set_offset(record, offset)
        set_value(record, value)
        return record

    return new_record


new_record = _record_factory()
