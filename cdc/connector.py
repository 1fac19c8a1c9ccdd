"""What every CDC connector shares: the dafka side (producers that resume
their partitions, changes held and published in bursts, acks), the rule of
what may be confirmed to the database, the state file, the counters, the
run's frame and the error a user must act on."""

from __future__ import annotations

import json
import logging
import os
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

from dafka import FlushTimeout, Producer, partition_address
from dafka.discovery import peer_info
from dafka.config import Config

log = logging.getLogger(__name__)

SEND_BATCH = 1024  # changes held at most before they are published (while more wait, they are held)


class CdcError(Exception):
    """A problem the user must fix; the message names the setting."""


class ServerUnavailable(CdcError):
    """The database server is not there for now: it refuses connections, is shutting down or starting up,
    or dropped ours.  Unlike a setting to fix, the connector tries again (with a warning each time), whether
    it is starting or streaming: a server restart never stops a connector."""


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

    def __init__(self, name: str, topic: str, topic_per_table: bool, config: Config, tombstones: bool = False) -> None:
        self.name = name
        self.topic = topic
        self.topic_per_table = topic_per_table
        self.tombstones = tombstones  # after each delete of a keyed row, its key with an empty value
        self.config = config
        self.producers: dict[str, Producer] = {}
        self.last_offset: dict[str, int] = {}  # producer topic -> offset of its last record sent
        self._pending: dict[str, list[bytes]] = {}  # records held for the next send_many, by topic
        self._pending_keys: dict[str, list[bytes | None]] = {}  # ...and their keys
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

    def has_records(self, table: str) -> bool:
        """Whether the partition that carries ``table`` has records already (resumed, or published since)."""
        return self.last_offset[self.topic_of(table)] >= 0

    def queue(self, outs: list) -> int:
        """Hold records to publish with the next :meth:`publish`; returns how many are held."""
        pending, keys = self._pending, self._pending_keys
        held = 0
        for out in outs:
            topic = self.topic_of(out.table)
            values, record_keys = pending.setdefault(topic, []), keys.setdefault(topic, [])
            values.append(out.value)
            record_keys.append(out.key)
            held += 1
            if out.op == "d" and out.key is not None and self.tombstones:
                # a tombstone (rfc/cdc.md): a compacted topic drops the row's every record, then this one
                values.append(b"")
                record_keys.append(out.key)
                held += 1
        self._held += held
        return self._held

    def publish(self) -> None:
        """Publish what is held: each topic's records in one call (one lock, the fewest RECORDS)."""
        for topic, values in self._pending.items():
            if values:
                keys = self._pending_keys[topic]
                self.last_offset[topic] = self.producers[topic].send_many(values, keys=keys) + len(values) - 1
                values.clear()
                keys.clear()
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


class ConfirmRule:
    """Which position the database may be told is done (PostgreSQL's slot,
    MySQL's saved position): the end of the newest transaction whose every
    record ``producer/min_acks`` stores acked.  Confirming more could lose a
    change a store never got; confirming less only keeps the log longer, and
    sends changes again after a restart, which consumers drop by their
    position (:mod:`dafka.cdc.apply`)."""

    def __init__(self, confirmed: int = 0) -> None:
        self.confirmed = confirmed
        # committed transactions not yet confirmable: (end LSN, {producer: its last record's offset})
        self._pending: deque[tuple[int, dict[Any, int]]] = deque()

    def committed(self, end_lsn: int, last_offsets: dict[Any, int]) -> None:
        """A transaction ended at ``end_lsn``; its records are all at or below
        ``last_offsets`` in their producers (empty: nothing to wait for)."""
        self._pending.append((end_lsn, dict(last_offsets)))

    def idle(self, wal_end: int) -> None:
        """Nothing is open or pending: the server's WAL end may be confirmed (keeps WAL bounded while
        the captured tables are idle)."""
        if not self._pending and wal_end > self.confirmed:
            self.confirmed = wal_end

    @property
    def pending(self) -> int:
        return len(self._pending)

    def acked(self, released: Callable[[Any], int]) -> int:
        """``released(producer)`` is the highest offset of that producer the
        stores acked; returns the LSN that may be confirmed now."""
        pending = self._pending
        while pending:
            end_lsn, offsets = pending[0]
            if any(released(p) < offset for p, offset in offsets.items()):
                break
            pending.popleft()
            self.confirmed = max(self.confirmed, end_lsn)
        return self.confirmed


class Capture:
    """A connector's frame: check the source, open the producers, capture
    until :meth:`stop`, close.  Subclasses give ``source`` (with name,
    topic, topic_per_table, tables), ``label``, :meth:`_connect`,
    :meth:`_preflight`, :meth:`_capture` and :meth:`stop`."""

    source: Any

    def __init__(self, source: Any, config: Config) -> None:
        self.source = source
        self.config = config
        self.stats = Stats()
        self.out = Publisher(source.name, source.topic, source.topic_per_table, config, source.tombstones)
        self.rule = ConfirmRule()

    @property
    def label(self) -> str:
        """What the metrics call the connector."""
        raise NotImplementedError

    def acked(self) -> int:
        """Records the stores acked, over every topic (any thread)."""
        return self.out.acked()

    def producers(self) -> list[Producer]:
        """The producers the changes go out through (one per topic)."""
        return list(self.out.producers.values())

    def describe(self) -> dict[str, Any]:
        """What the connector's PEER-INFO says of it (rfc 17): its tables, topics, positions and lag."""
        stats = self.stats
        return {"connector": self.label, "tables": list(self.source.tables), "topics": sorted(self.out.producers),
                "changes": stats.changes, "transactions": stats.transactions, "snapshot_rows": stats.snapshot_rows,
                "confirmed": stats.confirmed_lsn, "position": self.position(stats.confirmed_lsn),
                "lag_bytes": stats.lag_bytes, "acked": self.acked()}

    def position(self, confirmed: int) -> str:
        """The confirmed position as the source's own tools write it."""
        return str(confirmed)

    def run(self) -> None:
        """Blocks until :meth:`stop` (another thread, a signal handler); raises :class:`CdcError` for what the
        user must fix."""
        peer_info.set_application("cdc", self.describe)
        try:
            if not self._check_until_up():
                return
            self.out.open(self.source.tables)
            self._capture()
        finally:
            self.out.close()

    def _check_until_up(self) -> bool:
        """:meth:`_check`, again while the server is unavailable; False if stopped meanwhile."""
        backoff = 0.5
        while True:
            try:
                self._check()
                return True
            except ServerUnavailable as exc:
                self.stats.reconnects += 1
                log.warning("cdc: %s; trying again in %.1f s", exc, backoff)
                if self._stopped_within(backoff):
                    return False
                backoff = min(backoff * 2, 10.0)

    def _stopped_within(self, seconds: float) -> bool:
        """Wait up to ``seconds``; True as soon as :meth:`stop` was called."""
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def _confirmed_at(self, lsn: int) -> None:
        """Where the database already stands confirmed (the slot's confirmed LSN, the saved binlog
        position): the rule and the lag count from there, not from 0."""
        if lsn > self.rule.confirmed:
            self.rule.confirmed = lsn
        self.stats.confirmed_lsn = max(self.stats.confirmed_lsn, lsn)

    def _check(self) -> None:
        conn = self._connect()
        try:
            self._preflight(conn)
        finally:
            conn.close()

    def _connect(self) -> Any:
        """A plain connection to the database (CdcError naming --dsn when it fails)."""
        raise NotImplementedError

    def _preflight(self, conn: Any) -> None:
        """Every check that can fail with a setting to fix, before anything is created."""
        raise NotImplementedError

    def _capture(self) -> None:
        raise NotImplementedError
