"""What a producer has published and still holds: the unacked buffer (for
FETCH answers and ``min_acks``) and the live batch (rfc/dafka.md section 13).

:class:`dafka.producer.state.ProducerState` is an :class:`Outbox` and adds
the protocol around it.  Apart because :meth:`Outbox.publish` runs once per
record (``Producer.send``): it has a compiled twin, this same file compiled
as ``dafka.producer._coutbox`` with the field types that ``dafka/producer/_coutbox.pxd``
declares, where Python looks each field up by name (:mod:`dafka.core.extensions`
picks it for :mod:`dafka.producer.state`; ``DAFKA_NO_EXTENSIONS=1`` keeps this
one).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from ..protocol import attributes, batching
from .publish_times import PublishTimes

# read once: the compiled twin holds them as C values (dafka/producer/_coutbox.pxd)
BURST_GAP = batching.BURST_GAP
MAX_RECORDS = batching.MAX_RECORDS
MAX_BYTES = batching.MAX_BYTES
ATTRIBUTES_OVERHEAD = attributes.OVERHEAD  # a held record's attributes count as their headers and this


class Outbox:
    """The unacked buffer holds the values of records ``base .. next_seq-1``
    (and the keys of those that have one); ``released`` is the last record
    that ``min_acks`` stores ACKed.  While somebody reads RECORDS
    (``audience.batches``), published records also wait in ``batch``, from
    sequence ``batch_first`` on."""

    def __init__(self, min_acks: int, max_unacked: int, max_unacked_bytes: int, audience: Any) -> None:
        self.min_acks = min_acks
        self.max_unacked = max_unacked
        self.max_unacked_bytes = max_unacked_bytes
        self.audience = audience  # a batching.Audience: who reads what
        self.next_seq = 0
        self.base = 0  # sequence of buffer[0]
        self.buffer: deque[bytes] = deque()
        self.buffered_bytes = 0  # of the values and keys held
        self.keys: dict[int, bytes] = {}  # the key of each held record that has one (rfc section 18)
        self.attributes: dict[int, Any] = {}  # the attributes of each held record that has some (rfc 18.4)
        self.released = -1  # every sequence <= released is acked by min_acks stores
        self.published_bytes = 0
        self.batch: list[bytes] = []  # published records waiting to go out in one RECORDS
        self.batch_keys: dict[int, bytes] | None = None  # their keys, by place in the batch, once one has a key
        self.batch_attributes: dict[int, Any] | None = None  # ... and their attributes, once one has some
        self.batch_bytes = 0
        self.batch_first = 0  # the sequence of batch[0]
        self.batch_due = False  # the batch is to go out now (see publish)
        self.last_publish = float("-inf")
        self.times = PublishTimes(float("-inf"))  # when records were published (for HEADS-AT, rfc 8.1)
        self.note_due = float("-inf")  # when the next record's time is noted

    def publish(self, content: bytes, now: float = 0.0) -> int:
        """Take a record if the unacked buffer has room for it: returns its
        sequence, or -1, taking nothing, when the buffer is full.  While
        somebody reads RECORDS, the record joins the live batch, and
        :attr:`batch_due` says whether the batch is to go out now (the record
        came alone, not in a burst, or the batch is full) or may wait for more
        (at most ``batching.LINGER``).  One call per record: this is send()'s
        hot path."""
        buffer = self.buffer
        size = len(content)
        if self.min_acks:
            if buffer and (len(buffer) >= self.max_unacked or self.buffered_bytes + size > self.max_unacked_bytes):
                return -1
            buffer.append(content)
            self.buffered_bytes += size
            seq = self.next_seq
        else:
            buffer.append(content)
            self.buffered_bytes += size
            seq = self.released = self.next_seq
            while len(buffer) > self.max_unacked or self.buffered_bytes > self.max_unacked_bytes:
                self._drop_oldest()
        self.next_seq = seq + 1
        self.published_bytes += size
        if now >= self.note_due:
            self.note_due = self.times.note(seq, now)
        if self.audience.batches:
            batch = self.batch
            if not batch:
                self.batch_first = seq
            batch.append(content)
            self.batch_bytes += size
            self.batch_due = (now - self.last_publish >= BURST_GAP or len(batch) >= MAX_RECORDS
                              or self.batch_bytes >= MAX_BYTES)
            self.last_publish = now
        return seq

    def _drop_oldest(self) -> None:
        content = self.buffer.popleft()
        self.buffered_bytes -= len(content)
        if self.keys:
            key = self.keys.pop(self.base, None)
            if key is not None:
                self.buffered_bytes -= len(key)
        if self.attributes:
            held = self.attributes.pop(self.base, None)
            if held is not None:
                self.buffered_bytes -= ATTRIBUTES_OVERHEAD + len(held[1])
        self.base += 1

