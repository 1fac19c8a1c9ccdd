"""Idempotent producers: producer ids, epochs and per-partition sequences, free of I/O (KIP-98).

A producer with idempotence on numbers the batches of each partition from
0.  :meth:`Sequences.check` says what to do with a batch: append it, answer
it again with the offset it got (a retry of one of the last
:data:`CACHED` batches), or refuse it with Kafka's error code.  After an
append, :meth:`Sequences.record` keeps its sequence and offset.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from dataclasses import dataclass, field

from . import errors

CACHED = 5  # batches remembered per producer and partition (Kafka's, and the clients' in-flight limit)
SEQUENCE_WRAP = 2 ** 31


@dataclass
class ProducerEntry:
    epoch: int
    last_seq: int = -1
    batches: deque[tuple[int, int, int]] = field(default_factory=lambda: deque(maxlen=CACHED))  # first, last, offset


APPEND, DUPLICATE, REFUSE = "append", "duplicate", "refuse"


class Sequences:
    def __init__(self) -> None:
        self.partitions: dict[tuple[str, int], dict[int, ProducerEntry]] = {}
        # Producer ids unique across restarts without a record of them: the clock's ms, then a counter.
        self._ids = itertools.count(int(time.time() * 1000) << 12)

    def new_id(self) -> int:
        return next(self._ids)

    def check(self, key: tuple[str, int], pid: int, epoch: int, base_seq: int, count: int) -> tuple[str, int]:
        """(APPEND, -1), (DUPLICATE, the offset it got) or (REFUSE, Kafka's error code)."""
        if pid < 0:
            return APPEND, -1
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

    def record(self, key: tuple[str, int], pid: int, epoch: int, base_seq: int, count: int, offset: int) -> None:
        if pid < 0:
            return
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
