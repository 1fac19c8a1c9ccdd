"""The checker: what producers had acknowledged against what consumers
delivered and what stores hold.

Inputs are the line logs of ``roles.py`` (readable after SIGKILL) and the
LevelDB directories of the stores (opened read-only after the stores are gone).

Anomalies (each must be zero for a scenario to pass, except ``unseen``):

* **lost**: a record a producer saw acked that a required consumer never
  delivered, or that no store holds (when stores are required), or that a
  store marked ``complete`` lacks.
* **dup**: a consumer (one identity, across all of its runs) delivered the same
  record twice.  The one repeat that a SIGKILL can legitimately cause is
  allowed and reported as ``redelivered``: the record logged last by the killed
  run, when the offsets journal left on disk shows it was not committed yet
  (the journal commits a record at the *next* poll, and a kill can land between
  the log line and that poll).
* **out_of_order**: a consumer delivered an offset below one it had already
  delivered for that partition.
* **corrupt**: a delivered or stored value that is not what the producer sent
  for that partition and offset.
* **unseen** (informational): sent, never acked, never delivered.

Records of partitions that no producer log describes (fuzzing injects such
records) are counted as ``foreign`` and otherwise ignored.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import msgpack
import plyvel

from dafka.store import keys
from roles import decode_value, value_for

ANOMALIES = ("lost", "dup", "out_of_order", "corrupt")


@dataclass
class ProducerLog:
    path: str
    address: str = ""
    topic: str = ""
    sent: set[int] = field(default_factory=set)
    acked: set[int] = field(default_factory=set)
    done: int | None = None
    close: str | None = None  # "ok" or "unacked <n>"

    @classmethod
    def read(cls, path: str | os.PathLike) -> "ProducerLog":
        log = cls(str(path))
        for line in _lines(path):
            word, _, rest = line.partition(" ")
            if word == "sent":
                log.sent.add(int(rest))
            elif word == "acked":
                log.acked.add(int(rest))
            elif word == "address":
                log.address = rest
            elif word == "topic":
                log.topic = rest
            elif word == "done":
                log.done = int(rest)
            elif word == "close":
                log.close = rest
        return log

    @property
    def unacked_at_close(self) -> int | None:
        if self.close and self.close.startswith("unacked "):
            return int(self.close.split()[1])
        return 0 if self.close == "ok" else None


@dataclass
class ConsumerRun:
    """One process lifetime of a consumer: its deliveries in order, and (if it
    was killed) the offsets journal as the kill left it."""

    path: str
    deliveries: list[tuple[str, int, bytes]]
    journal_after: dict[str, int] | None = None  # partition -> next offset committed

    @classmethod
    def read(cls, path: str | os.PathLike, journal_snapshot: str | os.PathLike | None = None) -> "ConsumerRun":
        deliveries = []
        for line in _lines(path):
            parts = line.split(" ")
            if len(parts) != 3:
                continue  # a line cut by SIGKILL cannot happen (one write each), but be lenient
            partition = decode_value(parts[0]).decode("utf-8", "surrogateescape")
            deliveries.append((partition, int(parts[1]), decode_value(parts[2])))
        journal = read_journal(journal_snapshot) if journal_snapshot is not None else None
        return cls(str(path), deliveries, journal)


def read_journal(path: str | os.PathLike) -> dict[str, int]:
    """partition -> next offset, from a consumer offsets journal (msgpack entries)."""
    positions: dict[str, int] = {}
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return positions
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(data)
    try:
        for topic, partition, offset in unpacker:
            positions[str(partition)] = int(offset)
    except (ValueError, TypeError, msgpack.UnpackException):
        pass
    return positions


def _lines(path) -> list[str]:
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return []
    # A SIGKILL cannot cut a single write(2) in half, but keep only complete lines anyway.
    lines = text.split("\n")
    return [line for line in lines[:-1] if line]


def read_store(path: str | os.PathLike, topic: str | None = None) -> dict[tuple[str, int], bytes]:
    """(partition, offset) -> value of every record in a store database.
    Every key must parse with store/keys.py (raises ValueError otherwise)."""
    out: dict[tuple[str, int], bytes] = {}
    db = plyvel.DB(str(path), create_if_missing=False)
    try:
        for key, value in db.iterator():
            if key == keys.FORMAT:  # the database's one metadata key (rfc 7.4), not a partition's
                if msgpack.unpackb(value) != keys.FORMAT_VERSION:
                    raise ValueError(f"format version {value!r}")
                continue
            if key == keys.HEADS_END:  # where a listing of heads stops (rfc Appendix A)
                continue
            if key == keys.STORE_ID:  # the store's identity (rfc 7.4)
                if len(value) != 32 or int(value, 16) < 0:
                    raise ValueError(f"store identity {value!r}")
                continue
            parsed = keys.parse_key(key)
            if parsed.tag == keys.HEAD and len(value) != keys.SEQ_BYTES:
                raise ValueError(f"head key {key!r} holds {len(value)} bytes")
            if parsed.tag == keys.STAMP:
                keys.decode_stamp(key, value)
            if parsed.tag == keys.RECORD and (topic is None or parsed.subject == topic):
                out[(parsed.address, parsed.seq)] = value
    finally:
        db.close()
    return out


@dataclass
class Report:
    scenario: str
    produced: int = 0
    acked: int = 0
    delivered: int = 0
    stored: int = 0
    lost: int = 0
    dup: int = 0
    out_of_order: int = 0
    corrupt: int = 0
    unseen: int = 0
    redelivered: int = 0
    foreign: int = 0
    details: list[str] = field(default_factory=list)
    extra: dict = field(default_factory=dict)

    @property
    def anomalies(self) -> int:
        return sum(getattr(self, name) for name in ANOMALIES)

    def as_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        head = (f"{self.scenario}: produced {self.produced}, acked {self.acked}, delivered {self.delivered}, "
                f"stored {self.stored}; lost {self.lost}, dup {self.dup}, out of order {self.out_of_order}, "
                f"corrupt {self.corrupt}, unseen {self.unseen} (redelivered after kill {self.redelivered}, "
                f"foreign {self.foreign})")
        extra = [f"  {k}: {v}" for k, v in self.extra.items()]
        return "\n".join([head, *extra, *("  " + d for d in self.details[:40])])


def _sample(items, n: int = 8) -> str:
    items = sorted(items)
    text = ", ".join(map(str, items[:n]))
    return text + (f", ... ({len(items)} in all)" if len(items) > n else "")


def check(
    scenario: str,
    producers: list[ProducerLog],
    consumers: dict[str, list[ConsumerRun]] | None = None,
    stores: dict[str, str | os.PathLike] | None = None,
    *,
    required_consumers: list[str] | None = None,
    stores_required: bool = False,
    complete_stores: list[str] | None = None,
    value_size: int = 0,
    topic: str | None = None,
) -> Report:
    """Compare producers' logs with consumers' deliveries and stores' contents.

    ``required_consumers`` (default: all) must each have delivered every acked
    record; with ``stores_required`` every acked record must be in at least one
    store; each of ``complete_stores`` must hold every acked record."""
    consumers = consumers or {}
    stores = stores or {}
    required = list(consumers) if required_consumers is None else required_consumers
    report = Report(scenario)
    by_address = {p.address: p for p in producers}
    expected_topic = topic or (producers[0].topic if producers else None)

    sent: set[tuple[str, int]] = set()
    acked: set[tuple[str, int]] = set()
    for p in producers:
        sent.update((p.address, o) for o in p.sent)
        acked.update((p.address, o) for o in p.acked)
        bogus = p.acked - p.sent
        if bogus:
            report.corrupt += len(bogus)
            report.details.append(f"producer {p.address[:8]} saw acks for records it never sent: {_sample(bogus)}")
    report.produced = len(sent)
    report.acked = len(acked)

    def expected(address: str, offset: int) -> bytes | None:
        if address not in by_address or offset not in by_address[address].sent:
            return None
        return value_for(address, offset, value_size)

    delivered_any: set[tuple[str, int]] = set()
    lost: set[tuple[str, int]] = set()
    for name, runs in consumers.items():
        seen: set[tuple[str, int]] = set()
        high: dict[str, int] = {}
        dups: list[tuple[str, int]] = []
        ooo: list[tuple[str, int]] = []
        corrupt: list[tuple[str, int]] = []
        foreign = 0
        allowed: set[tuple[str, int]] = set()
        for index, run in enumerate(runs):
            last_logged: dict[str, int] = {}
            for address, offset, value in run.deliveries:
                if address not in by_address:
                    foreign += 1
                    continue
                key = (address, offset)
                if expected(address, offset) != value:
                    corrupt.append(key)
                if key in seen:
                    if key in allowed:
                        allowed.discard(key)
                        report.redelivered += 1
                    else:
                        dups.append(key)
                    continue
                if offset < high.get(address, -1):
                    ooo.append(key)
                high[address] = max(high.get(address, -1), offset)
                seen.add(key)
                last_logged[address] = offset
            if run.journal_after is not None and index + 1 < len(runs):
                # Killed: a record it logged but had not committed yet comes again.
                for address, offset in last_logged.items():
                    if run.journal_after.get(address, -1) <= offset:
                        allowed.add((address, offset))
                        # resuming from the journal: "high" restarts below it
                        high[address] = min(high[address], run.journal_after.get(address, 0) - 1)
        delivered_any |= seen
        report.dup += len(dups)
        report.out_of_order += len(ooo)
        report.corrupt += len(corrupt)
        report.foreign += foreign
        if dups:
            report.details.append(f"consumer {name} delivered twice: {_sample(dups)}")
        if ooo:
            report.details.append(f"consumer {name} delivered out of order: {_sample(ooo)}")
        if corrupt:
            report.details.append(f"consumer {name} delivered wrong values for: {_sample(corrupt)}")
        if name in required:
            missing = acked - seen
            if missing:
                lost |= missing
                report.details.append(f"consumer {name} never delivered these acked records: {_sample(missing)}")
        report.extra.setdefault("delivered_by", {})[name] = len(seen)

    stored_any: set[tuple[str, int]] = set()
    for name, path in stores.items():
        content = read_store(path, expected_topic)
        wrong = []
        mine = set()
        for (address, offset), value in content.items():
            if address not in by_address:
                report.foreign += 1
                continue
            mine.add((address, offset))
            if expected(address, offset) != value:
                wrong.append((address, offset))
        stored_any |= mine
        report.corrupt += len(wrong)
        if wrong:
            report.details.append(f"store {name} holds wrong values for: {_sample(wrong)}")
        if complete_stores and name in complete_stores:
            missing = acked - mine
            if missing:
                lost |= missing
                report.details.append(f"store {name} lacks these acked records: {_sample(missing)}")
        report.extra.setdefault("stored_by", {})[name] = len(mine)
    if stores_required:
        missing = acked - stored_any
        if missing:
            lost |= missing
            report.details.append(f"no store holds these acked records: {_sample(missing)}")
    report.lost = len(lost)
    report.delivered = len(delivered_any)
    report.stored = len(stored_any)
    report.unseen = len(sent - acked - delivered_any - stored_any)
    return report


def write_json(reports: list[Report], path: str) -> None:
    with open(path, "w") as f:
        json.dump([r.as_dict() for r in reports], f, indent=2)
