"""What every CDC connector shares: the dafka side (producers that resume
their partitions, changes held and published in bursts, acks), the state
file, the counters and the error a user must act on."""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Callable

from dafka import FlushTimeout, Producer, partition_address
from dafka.config import Config

log = logging.getLogger(__name__)

SEND_BATCH = 1024  # changes held at most before they are published (while more wait, they are held)


class CdcError(Exception):
    """A problem the user must fix; the message names the setting."""


@dataclass
class Stats:
    changes: int = 0
    transactions: int = 0
    snapshot_rows: int = 0
    confirmed_lsn: int = 0  # PostgreSQL: the slot's confirmed LSN; MySQL: the position saved in the state file
    wal_end: int = 0
    malformed: int = 0
    unexpected: int = 0
    reconnects: int = 0

    @property
    def lag_bytes(self) -> int:
        return max(0, self.wal_end - self.confirmed_lsn)


class Publisher:
    """The connector's producers, one per topic, each resuming its partition
    (``dafka.partition_address("cdc/<name>/<topic>")``, rfc section 15)."""

    def __init__(self, name: str, topic: str, topic_per_table: bool, config: Config) -> None:
        self.name = name
        self.topic = topic
        self.topic_per_table = topic_per_table
        self.config = config
        self.producers: dict[str, Producer] = {}
        self.last_offset: dict[str, int] = {}  # producer topic -> offset of its last record sent
        self._pending: dict[str, list[bytes]] = {}  # records held for the next send_many, by topic
        self._held = 0

    def topic_of(self, table: str) -> str:
        return f"{self.topic}.{table}" if self.topic_per_table else self.topic

    def open(self, tables: list[str]) -> None:
        for table in tables:
            topic = self.topic_of(table)
            if topic in self.producers:
                continue
            address = partition_address(f"cdc/{self.name}/{topic}")
            producer = Producer(topic, self.config, address=address, resume=True)
            self.producers[topic] = producer
            self.last_offset[topic] = producer.stats()["sent"] - 1
            log.info("cdc: topic %s partition %s resumes after offset %d", topic, address, self.last_offset[topic])

    def queue(self, outs: list) -> int:
        """Hold records to publish with the next :meth:`publish`; returns how many are held."""
        pending = self._pending
        for out in outs:
            pending.setdefault(self.topic_of(out.table), []).append(out.value)
        self._held += len(outs)
        return self._held

    def publish(self) -> None:
        """Publish what is held: each topic's records in one call (one lock, the fewest RECORDS)."""
        for topic, values in self._pending.items():
            if values:
                self.last_offset[topic] = self.producers[topic].send_many(values) + len(values) - 1
                values.clear()
        self._held = 0

    def released(self, topic: str) -> int:
        return self.producers[topic].acked_offset

    def acked(self) -> int:
        """Records the stores acked, over every topic (any thread)."""
        return sum(p.acked_offset + 1 for p in list(self.producers.values()))

    def flush(self, keepalive: Callable[[], None] | None = None) -> None:
        """Wait until the stores acked everything sent, up to producer/close_timeout (FlushTimeout)."""
        deadline = time.monotonic() + self.config["producer/close_timeout"] / 1000.0
        for producer in self.producers.values():
            while True:
                try:
                    producer.flush(timeout=max(0.0, min(1.0, deadline - time.monotonic())))
                    break
                except FlushTimeout:
                    if time.monotonic() >= deadline:
                        raise
                if keepalive is not None:
                    keepalive()

    def close(self) -> None:
        for producer in self.producers.values():
            try:
                producer.close(timeout=self.config["producer/close_timeout"] / 1000.0)
            except Exception as exc:  # noqa: BLE001 - report and go on closing the others
                log.error("cdc: closing producer of %s: %s", producer.topic, exc)
        self.producers.clear()


class StateFile:
    """A small JSON document, replaced atomically and fsynced: what a connector must remember."""

    def __init__(self, path: str) -> None:
        self.path = path

    def load(self) -> dict[str, Any]:
        try:
            with open(self.path) as f:
                return json.load(f)
        except (OSError, ValueError):
            return {}

    def save(self, doc: dict[str, Any]) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
