"""What the public API hands to users."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from itertools import count, repeat
from typing import Any, Generic, Iterable, Iterator, NamedTuple, TypeVar

V = TypeVar("V")  # a record's value: bytes, or what the consumer's value_deserializer returns


class Record(NamedTuple, Generic[V]):
    """One record of a partition, as delivered by :class:`dafka.Consumer`.

    ``partition`` is the producer's address; ``offset`` its sequence number.
    A named tuple, like kafka-python's ``ConsumerRecord``: it unpacks
    (``topic, partition, offset, value = record``), and a consumer builds it
    with no Python code run per record (:func:`records`), in a third of the
    time a frozen dataclass took."""

    topic: str
    partition: str
    offset: int
    value: V


@dataclass(frozen=True, slots=True)
class RecordMetadata:
    """Where a sent record landed."""

    topic: str
    partition: str
    offset: int


class TopicPartition(NamedTuple):
    """A partition of a topic: the keys of :meth:`dafka.aio.AsyncConsumer.getmany`
    (aiokafka's name).  Equal to, and hashed as, the plain ``(topic, partition)``
    tuple that :meth:`dafka.Consumer.positions` uses."""

    topic: str
    partition: str


make_record = partial(tuple.__new__, Record)
"""``make_record((topic, partition, offset, value))``: a :class:`Record` from a
4-tuple, without the Python ``__new__`` a named tuple's class call runs."""


def records(topic: str, partition: str, first: int, values: Iterable[Any]) -> Iterator[Record[Any]]:
    """Records ``first, first+1, ...`` of a partition with ``values``, built in C."""
    return map(make_record, zip(repeat(topic), repeat(partition), count(first), values))
