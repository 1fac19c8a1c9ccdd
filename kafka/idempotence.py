"""Idempotent producers: producer ids, epochs and per-partition sequences, free of I/O (KIP-98).

A producer with idempotence on numbers the batches of each partition from
0.  :meth:`Sequences.check` says what to do with a batch: append it, answer
it again with the offset it got (a retry of one of the last
:data:`CACHED` batches), or refuse it with Kafka's error code.  After an
append, :meth:`Sequences.record` keeps its sequence and offset.

What an idempotent producer's batches got is also kept in the cluster, so
that a gateway restarted while a client retries still stores each batch once:
before a batch's records are published, a :class:`BatchEntry` (its producer,
sequences and the offset its first record will get) is written to the
topic's sequences partition and acked by ``producer/min_acks`` stores.  A
gateway that resumes a partition reads the tail of those entries back
(:meth:`Sequences.restore`): an entry whose records the partition does not
hold (the gateway died in between) is left out, so its retry is appended.
One whose first records the partition holds, but not its last (the gateway
died while they went out: a batch may leave in more than one message), is
kept as partial: its retry appends only the records after those
(:data:`PARTIAL`, :meth:`Sequences.take_partial`).
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterable
from collections import deque
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from . import errors

if TYPE_CHECKING:
    from .batches import Batch

CACHED = 5  # batches remembered per producer and partition (Kafka's, and the clients' in-flight limit)
SEQUENCE_WRAP = 2 ** 31
ID_NODES = 256  # gateways whose node ids differ modulo this never give one producer id


@dataclass
class ProducerEntry:
    epoch: int
    last_seq: int = -1
    batches: deque[tuple[int, int, int]] = field(default_factory=lambda: deque(maxlen=CACHED))  # first, last, offset


APPEND, DUPLICATE, REFUSE, PARTIAL = "append", "duplicate", "refuse", "partial"
SEQUENCES_TOPIC = "__dafka_kafka_sequences."  # + topic: where its partitions' idempotent batches are noted


@dataclass(frozen=True)
class BatchEntry:
    """Idempotent producer ``pid`` at ``epoch`` wrote sequences ``base .. base + count - 1`` of Kafka
    partition ``partition`` at offsets from ``offset``; a negative ``count`` voids the entry written
    before with ``-count`` (the batch was noted, then not published)."""

    partition: int
    pid: int
    epoch: int
    base: int
    count: int
    offset: int

    def encode(self) -> bytes:
        return json.dumps([self.partition, self.pid, self.epoch, self.base, self.count, self.offset],
                          separators=(",", ":")).encode()

    def voided(self) -> BatchEntry:
        """The entry that voids this one (or, of a voiding entry, the one it voids)."""
        return replace(self, count=-self.count)


def decode_entry(value: bytes) -> BatchEntry:
    """A batch entry from a sequences record (ValueError if it is not one)."""
    try:
        fields = json.loads(value)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if (not isinstance(fields, list) or len(fields) != 6
            or not all(isinstance(f, int) and not isinstance(f, bool) for f in fields)):
        raise ValueError("not a list of six integers")
    partition, pid, epoch, base, count, offset = fields
    if not (0 <= partition < 2 ** 31 and 0 <= pid < 2 ** 63 and 0 <= epoch < 2 ** 15 and 0 <= base < SEQUENCE_WRAP
            and count != 0 and abs(count) < 2 ** 31 and 0 <= offset < 2 ** 63):
        raise ValueError(f"a field out of range: {fields}")
    return BatchEntry(partition, pid, epoch, base, count, offset)


class Sequences:
    def __init__(self, node_id: int = 0) -> None:
        self.partitions: dict[tuple[str, int], dict[int, ProducerEntry]] = {}
        # Producer ids unique across restarts and gateways without a record of them: the clock's ms, then a
        # counter in steps of ID_NODES whose remainder is the node's (< 2**63 until the year 2248).
        self._ids = itertools.count((int(time.time() * 1000) << 12) * ID_NODES + node_id % ID_NODES, ID_NODES)
        # (partition, producer id) -> (epoch, first and last sequence, first offset, records stored) of a batch
        # partly stored when its gateway died
        self.partials: dict[tuple[tuple[str, int], int], tuple[int, int, int, int, int]] = {}

    def new_id(self) -> int:
        return next(self._ids)

    def check(self, key: tuple[str, int], pid: int, epoch: int, base_seq: int, count: int) -> tuple[str, int]:
        """(APPEND, -1), (DUPLICATE, the offset it got), (PARTIAL, how many of its first records the partition
        holds) or (REFUSE, Kafka's error code)."""
        if pid < 0:
            return APPEND, -1
        partial = self.partials.get((key, pid))
        if partial is not None and partial[:3] == (epoch, base_seq, (base_seq + count - 1) % SEQUENCE_WRAP):
            return PARTIAL, partial[4]
        entry = self.partitions.get(key, {}).get(pid)
        if entry is None:
            return APPEND, -1  # a new producer, or one whose state is gone (as Kafka's after retention)
        if epoch < entry.epoch:
            return REFUSE, errors.INVALID_PRODUCER_EPOCH
        if epoch > entry.epoch:
            return (APPEND, -1) if base_seq == 0 else (REFUSE, errors.OUT_OF_ORDER_SEQUENCE_NUMBER)
        last = (base_seq + count - 1) % SEQUENCE_WRAP
        for first, end, offset in entry.batches:
            if (first, end) == (base_seq, last):
                return DUPLICATE, offset
        if base_seq == (entry.last_seq + 1) % SEQUENCE_WRAP:
            return APPEND, -1
        if _behind(base_seq, entry.last_seq):
            return REFUSE, errors.DUPLICATE_SEQUENCE_NUMBER
        return REFUSE, errors.OUT_OF_ORDER_SEQUENCE_NUMBER

    def restore(self, topic: str, entries: Iterable[BatchEntry], heads: dict[int, int]) -> int:
        """Take the entries read back from ``topic``'s sequences partition, oldest first, whose records the
        partition holds (``heads``: Kafka partition -> its head); how many were taken."""
        kept = list(entries)
        void = {e.voided() for e in kept if e.count < 0}  # (the entries they void)
        taken = 0
        for e in kept:
            if e.count < 0 or e in void:
                continue
            head = heads.get(e.partition)
            if head is None or head < e.offset:
                continue
            if e.offset + e.count - 1 <= head:
                self.record((topic, e.partition), e.pid, e.epoch, e.base, e.count, e.offset)
            else:  # only its first records went out before the gateway died
                self.partials[((topic, e.partition), e.pid)] = (
                    e.epoch, e.base, (e.base + e.count - 1) % SEQUENCE_WRAP, e.offset, head - e.offset + 1)
            taken += 1
        return taken

    def take_partial(self, key: tuple[str, int], pid: int, batch: Batch) -> tuple[int, int, Batch]:
        """For the retry of ``pid``'s ``batch`` (read as columns), partly stored in ``key``: the batch's first
        offset, how many of its records are stored, and the rest to append (:meth:`record` the whole batch
        after)."""
        _, _, _, offset, present = self.partials.pop((key, pid))
        rest = replace(batch, values=batch.values[present:], keys=None if batch.keys is None else batch.keys[present:],
                       record_attributes=batch.record_attributes[present:], count=batch.count - present,
                       base_sequence=(batch.base_sequence + present) % SEQUENCE_WRAP)
        return offset, present, rest

    def forget(self, key: tuple[str, int]) -> None:
        """Drop what is known of a partition's producers (another gateway writes it now)."""
        self.partitions.pop(key, None)
        for partial in [k for k in self.partials if k[0] == key]:
            del self.partials[partial]

    def record(self, key: tuple[str, int], pid: int, epoch: int, base_seq: int, count: int, offset: int) -> None:
        if pid < 0:
            return
        self.partials.pop((key, pid), None)
        entries = self.partitions.setdefault(key, {})
        entry = entries.get(pid)
        if entry is None or epoch != entry.epoch:
            entry = entries[pid] = ProducerEntry(epoch)
        last = (base_seq + count - 1) % SEQUENCE_WRAP
        entry.last_seq = last
        entry.batches.append((base_seq, last, offset))


def _behind(seq: int, last: int) -> bool:
    """``seq`` is at or before ``last``, sequences wrapping at 2**31."""
    return (last - seq) % SEQUENCE_WRAP < SEQUENCE_WRAP // 2
