"""Kafka partition numbers for the partitions of a topic that no gateway writes.

A gateway's own partitions have their numbers in their addresses
(:func:`~.mapping.address_of`: Kafka partition ``n`` of ``t`` is the dafka
partition of ``kafka:t:n``).  A partition written by a dafka-py or reference
producer (a *foreign* one) has a random address, so its number is chosen once
and kept in the cluster: the gateway writes an :class:`Entry` to its registry
partition (topic :data:`REGISTRY_TOPIC`, resumed at
``partition_address(REGISTRY_NAME)``), acked by ``producer/min_acks`` stores
before any client sees the number, and a gateway that starts reads the
registry back before it numbers anything.  So a number never changes once a
client has seen it, and every gateway reading the registry gives the same.

How a number is chosen: the foreign partitions a survey finds that have none
yet are sorted by address and take the next free numbers, after the topic's
gateway partitions and after every number given before.  A number is never
reused, even when retention has removed its partition: Kafka partitions are
``0 .. count - 1``, so such a partition stays listed, empty.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

REGISTRY_TOPIC = "__dafka_kafka_partitions"
REGISTRY_NAME = "kafka-partitions"


@dataclass(frozen=True)
class Entry:
    """Foreign partition ``address`` of ``topic`` is Kafka partition ``number``."""

    topic: str
    address: str
    number: int

    def encode(self) -> bytes:
        return json.dumps({"topic": self.topic, "address": self.address, "number": self.number},
                          separators=(",", ":")).encode()

    @property
    def key(self) -> bytes:
        """The registry record's key (rfc 18): one a partition, so a compacting store keeps each entry."""
        return f"{self.topic}/{self.address}".encode()


def decode_entry(value: bytes) -> Entry:
    """An entry from a registry record (ValueError if it is not one)."""
    try:
        fields = json.loads(value)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(fields, dict) or set(fields) != {"topic", "address", "number"}:
        raise ValueError("not an object of topic, address and number")
    topic, address, number = fields["topic"], fields["address"], fields["number"]
    if not isinstance(topic, str) or not isinstance(address, str) or not address:
        raise ValueError("topic and address must be strings")
    if not isinstance(number, int) or isinstance(number, bool) or not 0 <= number < 2 ** 31:
        raise ValueError(f"number must be 0 .. 2**31-1, not {number!r}")
    return Entry(topic, address, number)


class Numbers:
    """The registry as read so far: each topic's foreign partitions by address, and by number."""

    def __init__(self) -> None:
        self._by_address: dict[str, dict[str, int]] = {}
        self._by_number: dict[str, dict[int, str]] = {}

    def take(self, entry: Entry) -> bool:
        """Keep an entry read back (in the registry's order: the first for an address or a number wins)."""
        by_address = self._by_address.setdefault(entry.topic, {})
        by_number = self._by_number.setdefault(entry.topic, {})
        if entry.address in by_address or entry.number in by_number:
            return False
        by_address[entry.address] = entry.number
        by_number[entry.number] = entry.address
        return True

    def number(self, topic: str, address: str) -> int | None:
        return self._by_address.get(topic, {}).get(address)

    def assign(self, topic: str, addresses: Iterable[str], first: int) -> list[Entry]:
        """Numbers for the ``addresses`` that have none, from ``first`` (the topic's gateway partitions'
        count) or after the highest given, whichever is higher; the entries to write (not kept yet)."""
        known = self._by_address.get(topic, {})
        new = sorted(set(addresses) - set(known))
        start = max(first, max(self._by_number.get(topic, {}), default=-1) + 1)
        return [Entry(topic, address, start + i) for i, address in enumerate(new)]

    def slots(self, topic: str, gateway: list[str]) -> list[str | None]:
        """The topic's partitions by Kafka number: its ``gateway`` partitions first, then the foreign ones
        at their numbers (None: a number no partition holds, which a client sees as an empty partition)."""
        by_number = self._by_number.get(topic, {})
        count = max(len(gateway), max(by_number, default=-1) + 1)
        return [gateway[n] if n < len(gateway) else by_number.get(n) for n in range(count)]
