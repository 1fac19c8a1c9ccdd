"""The producer's protocol logic, free of I/O.

Feed it published records, ACKs (with the acking store's identity), FETCHes,
subscriptions and time; read back the frames it wants to publish.  Frames are
produced ready to send: ``(frame1, content)`` for records, ``(frame1,)`` for
the rest.

Unlike the reference:

* a record is released only when ``min_acks`` distinct stores have ACKed it;
* FETCH answers are exact for every sequence still held (the reference could
  send the wrong payload after a partial ACK) and are streamed out in slices
  so a huge request cannot monopolise the producer;
* ``min_acks = 0`` keeps the newest ``max_unacked`` records in a ring for
  FETCH answers but never holds ``send`` back.
"""

from __future__ import annotations

from collections import deque
from typing import Iterator

from . import proto

FETCH_SLICE = 10_000


class ProducerState:
    def __init__(
        self,
        address: str,
        topic: str,
        *,
        min_acks: int = 1,
        max_unacked: int = 1_000_000,
        max_unacked_bytes: int = 128 * 1024 * 1024,
    ) -> None:
        self.address = address
        self.topic = topic
        self.min_acks = min_acks
        self.max_unacked = max_unacked
        self.max_unacked_bytes = max_unacked_bytes
        self.record_prefix = proto.record_prefix(proto.RECORD, topic, address, topic)
        self.head_prefix = proto.record_prefix(proto.HEAD, topic, address, topic)
        self.next_seq = 0
        self.base = 0  # sequence of buffer[0]
        self.buffer: deque[bytes] = deque()
        self.buffered_bytes = 0
        self.released = -1  # every sequence <= released is acked by min_acks stores
        self.store_acks: dict[str, int] = {}
        self.malformed = 0
        self._answers: deque[list] = deque()  # pending FETCH answers: [requester, next, end]

    # -- publishing ---------------------------------------------------------

    def has_room(self, size: int) -> bool:
        if self.min_acks == 0 or not self.buffer:
            return True
        return len(self.buffer) < self.max_unacked and self.buffered_bytes + size <= self.max_unacked_bytes

    def publish(self, content: bytes) -> bytes | None:
        """Take a record if the unacked buffer has room for it: returns frame 1
        of its RECORD (its sequence is ``next_seq - 1``), or None, taking
        nothing, when the buffer is full."""
        buffer = self.buffer
        size = len(content)
        if self.min_acks:
            if buffer and (len(buffer) >= self.max_unacked or self.buffered_bytes + size > self.max_unacked_bytes):
                return None
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
        return self.record_prefix + seq.to_bytes(8, "big")

    @property
    def unacked(self) -> int:
        return self.next_seq - 1 - self.released

    def head_frame(self) -> bytes | None:
        """Frame 1 of a HEAD with the last published sequence, None before the first record."""
        if self.next_seq == 0:
            return None
        return self.head_prefix + (self.next_seq - 1).to_bytes(8, "big")

    def wants_head_for(self, sub: proto.Subscription) -> bool:
        """A new subscriber that would receive our RECORDs or HEADs should get a
        HEAD at once so it can fetch what it missed."""
        if not sub.subscribe or self.next_seq == 0:
            return False
        prefix = sub.msg_id + proto._b(sub.topic) + (b"\0" if sub.exact else b"")
        return self.head_prefix.startswith(prefix) or self.record_prefix.startswith(prefix)

    # -- acks ---------------------------------------------------------------

    def on_ack(self, store: str, msg: proto.AckMsg) -> bool:
        """An ACK from ``store``; True if more records were released."""
        if msg.subject != self.topic or msg.topic != self.address or self.min_acks == 0:
            return False
        if msg.sequence >= self.next_seq:
            self.malformed += 1  # an ACK for a record we never published
            return False
        if msg.sequence <= self.store_acks.get(store, -1):
            return False
        self.store_acks[store] = msg.sequence
        if len(self.store_acks) < self.min_acks:
            return False
        released = sorted(self.store_acks.values(), reverse=True)[self.min_acks - 1]
        if released <= self.released:
            return False
        self.released = released
        while self.base <= released and self.buffer:
            self._drop_oldest()
        return True

    def forget_store(self, store: str) -> None:
        """A store went away; its past ACKs stay valid, it just stops counting for new ones."""
        self.store_acks.pop(store, None)

    def _drop_oldest(self) -> None:
        content = self.buffer.popleft()
        self.buffered_bytes -= len(content)
        self.base += 1

    # -- fetch --------------------------------------------------------------

    def on_fetch(self, msg: proto.FetchMsg) -> None:
        """Queue DIRECT-RECORD answers for the part of the range we still hold."""
        if msg.topic != self.address or msg.subject != self.topic or msg.count == 0:
            return
        if "\0" in msg.address:
            self.malformed += 1  # its answers could not be addressed
            return
        start = max(msg.sequence, self.base)
        end = min(msg.sequence + msg.count, self.next_seq)
        if start < end:
            self._answers.append([msg.address, start, end])

    @property
    def answering(self) -> bool:
        return bool(self._answers)

    def fetch_answers(self, budget: int = FETCH_SLICE) -> Iterator[tuple[bytes, bytes]]:
        """Up to ``budget`` DIRECT-RECORD frames from the queued answers."""
        while budget > 0 and self._answers:
            job = self._answers[0]
            requester, seq, end = job
            prefix = proto.record_prefix(proto.DIRECT_RECORD, requester, self.address, self.topic)
            seq = max(seq, self.base)  # records may have been released meanwhile
            stop = min(end, seq + budget, self.base + len(self.buffer))
            buffer, base = self.buffer, self.base
            for s in range(seq, stop):
                yield prefix + s.to_bytes(8, "big"), buffer[s - base]
            budget -= max(0, stop - seq)
            if stop >= end or stop >= self.base + len(self.buffer):
                self._answers.popleft()
            else:
                job[1] = stop
