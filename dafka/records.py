"""What the public API hands to users."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from itertools import count
from typing import Any, Callable, Generic, NamedTuple, Sequence, TypeVar

V = TypeVar("V")  # a record's value: bytes, or what the consumer's value_deserializer returns


class Record(NamedTuple, Generic[V]):
    """One record of a partition, as delivered by :class:`dafka.Consumer`.

    ``partition`` is the producer's address; ``offset`` its sequence number.
    A named tuple, like kafka-python's ``ConsumerRecord``: it unpacks
    (``topic, partition, offset, value = record``), and a consumer builds it
    with no Python code run per record (:func:`dafka.protocol.packing.split_records`), in a third of the
    time a frozen dataclass took."""

    topic: str
    partition: str
    offset: int
    value: V

    @property
    def key(self) -> Any:
        """The record's key (rfc section 18; what the consumer's ``key_deserializer`` made of it), None
        when it has none.  Not one of the tuple's fields, so that any record unpacks as four."""
        return None

    @property
    def timestamp(self) -> int | None:
        """The record's own timestamp, unix milliseconds (rfc 18.4: a Kafka producer's, or ``timestamp_ms``
        of :meth:`dafka.Producer.send`), None when it has none."""
        return None

    @property
    def headers(self) -> tuple[tuple[str, bytes | None], ...]:
        """The record's headers, (name, value) pairs in order (rfc 18.4), empty when it has none."""
        return ()


class RecordExtra(NamedTuple):
    """What a record carries beside its value, where it has attributes (rfc 18.4): :func:`keyed_record`
    takes it in place of a key."""

    key: Any
    timestamp: int | None
    headers: tuple[tuple[str, bytes | None], ...]


class KeyedRecord(Record[V]):
    """A :class:`Record` with a key or attributes: built only for records that have them
    (:func:`keyed_records`), so that the records of plain topics stay plain tuples, built in C."""

    # set on each instance (its __dict__), in place of the properties
    key: Any = None
    timestamp: int | None = None
    headers: tuple[tuple[str, bytes | None], ...] = ()

    def __repr__(self) -> str:
        extra = "" if self.timestamp is None and not self.headers else \
            f", timestamp={self.timestamp!r}, headers={self.headers!r}"
        return f"Record(topic={self.topic!r}, partition={self.partition!r}, offset={self.offset!r}, " \
               f"value={self.value!r}, key={self.key!r}{extra})"

    def __reduce__(self) -> tuple[Any, ...]:
        key = self.key if self.timestamp is None and not self.headers else \
            RecordExtra(self.key, self.timestamp, self.headers)
        return keyed_record, (self.topic, self.partition, self.offset, self.value, key)


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


PartitionKey = tuple[str, str]
"""``(topic, partition)``: how the library keys a partition in its maps (a :class:`TopicPartition` is one)."""


make_record = partial(tuple.__new__, Record)
"""``make_record((topic, partition, offset, value))``: a :class:`Record` from a
4-tuple, without the Python ``__new__`` a named tuple's class call runs."""


def keyed_record(topic: str, partition: str, offset: int, value: Any, key: Any) -> Record[Any]:
    """A record with ``key`` (or a :class:`RecordExtra`: a key and attributes); a plain :class:`Record`
    when ``key`` is None."""
    if key is None:
        return make_record((topic, partition, offset, value))
    record = tuple.__new__(KeyedRecord, (topic, partition, offset, value))
    if type(key) is RecordExtra:
        record.key, record.timestamp, record.headers = key
    else:
        record.key = key
    return record


def keyed_records(topic: str, partition: str, first: int, values: Sequence[Any],
                  keys: Sequence[Any]) -> list[Record[Any]]:
    """Records ``first, first+1, ...`` of a partition with ``values`` and ``keys`` (None: no key; or a
    :class:`RecordExtra`), as :func:`keyed_record` makes each, in one loop (a catch-up's hot path)."""
    out: list[Record[Any]] = []
    append, new = out.append, tuple.__new__
    for offset, value, key in zip(count(first), values, keys):
        if key is None:
            append(new(Record, (topic, partition, offset, value)))
            continue
        record = new(KeyedRecord, (topic, partition, offset, value))
        if type(key) is RecordExtra:
            record.key, record.timestamp, record.headers = key
        else:
            record.key = key
        append(record)
    return out


def deserialized(record: Record[bytes], value: Callable[[bytes], Any] | None,
                 key: Callable[[bytes], Any] | None) -> Record[Any]:
    """``record`` with its value and key (if it has one) passed through the consumer's deserializers
    (None: kept as bytes)."""
    raw_key = record.key
    new_value = record.value if value is None else value(record.value)
    plain = record.timestamp is None and not record.headers
    if raw_key is None and plain:
        return make_record((record.topic, record.partition, record.offset, new_value))
    new_key = raw_key if key is None or raw_key is None else key(raw_key)
    return keyed_record(record.topic, record.partition, record.offset, new_value,
                        new_key if plain else RecordExtra(new_key, record.timestamp, record.headers))
