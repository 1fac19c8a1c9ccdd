"""The producer's protocol logic, free of I/O.

Feed it published records, ACKs (with the acking store's identity), FETCHes,
subscriptions and time; read back the frames it wants to publish.  Frames are
produced ready to send: ``(frame1, content)`` for records, ``(frame1,)`` for
the rest.

Unlike the reference:

* a record is released only when ``min_acks`` distinct stores have ACKed it;
* FETCH answers are exact for every sequence still held (the reference could
  send the wrong payload after a partial ACK) and are streamed out in slices
  so a huge request cannot monopolise the producer; a newer FETCH from a
  requester replaces its answer in progress, and each requester may have at
  most ``fetch_inflight_bytes`` of answers in flight (:mod:`dafka.core.inflight`);
* ``min_acks = 0`` keeps the newest ``max_unacked`` records in a ring for
  FETCH answers but never holds ``send`` back;
* a FETCH for records that the producer let go and that no store ever ACKed
  gets a DIRECT-TAIL (rfc 6.3): nobody holds them any more, and a dafka-py
  consumer goes on past them instead of asking for ever.
"""

from __future__ import annotations

import time
from collections import deque
from itertools import islice
from typing import TYPE_CHECKING, Generator, Iterator, Sequence

from .. import protocol as proto
from ..core import extensions
from ..core.inflight import MESSAGE_OVERHEAD, InflightLedger
from ..protocol import batching
from ..protocol import bulk as bulk_answers
from ..protocol.attributes import Attributes
from ..protocol.attributes import pack as attributes_frames
from ..protocol.attributes import size as attributes_size
from . import outbox
from .publish_times import PublishTimes

if TYPE_CHECKING:
    from .outbox import Outbox
else:  # the compiled twin of dafka/producer/outbox.py where it runs (dafka/core/extensions.py)
    Outbox = (extensions.twin(outbox.__name__) or outbox).Outbox

FETCH_SLICE = 10_000
# A window that held this many unacked bytes and drained to an eighth of its peak is followed by a trim
# of the heap: with 10 KB records glibc kept ~100 MiB of a drained 128 MiB window (the soak, issue 24).
TRIM_AFTER_BYTES = 16 * 1024 * 1024


class ProducerState(Outbox):
    """A producer's protocol state: its :class:`~dafka.producer.outbox.Outbox` (the records it holds and the live
    batch), the stores' ACKs, the FETCH answers in progress and what its subscribers read."""

    def __init__(
        self,
        address: str,
        topic: str,
        *,
        min_acks: int = 1,
        max_unacked: int = 1_000_000,
        max_unacked_bytes: int = 128 * 1024 * 1024,
        fetch_inflight_bytes: int = 32 * 1024 * 1024,
        started: float = float("-inf"),
    ) -> None:
        """``started``: when the partition began, on the clock of :meth:`publish`."""
        super().__init__(min_acks, max_unacked, max_unacked_bytes, batching.Audience(topic, address))
        self.address = address
        self.topic = topic
        self.record_prefix = proto.record_prefix(proto.RECORD, topic, address, topic)
        self.head_prefix = proto.record_prefix(proto.HEAD, topic, address, topic)
        self.held_peak = 0  # the most unacked bytes held (seen at ACKs) since the last trim
        self.trim_due = False
        self.store_acks: dict[str, int] = {}
        # The highest sequence any store ever ACKed (kept when the store goes): every record up to it was
        # held by a store, whose reader answers for it; above it, what the producer let go is lost.
        self.stored = -1
        self.tails_sent = 0
        self.malformed = 0
        self.fetches_received = 0
        self.records_answered = 0
        self.ledger = InflightLedger(fetch_inflight_bytes, per_pipe=True)
        self.bulk = bulk_answers.Negotiated(per_pipe=True)  # (XPUB_VERBOSER)
        self.batches_sent = 0
        self._records_prefix = proto.record_prefix(proto.RECORDS, topic, address, topic)
        self._keyed_prefix = proto.record_prefix(proto.KEYED_RECORDS, topic, address, topic)
        # FETCH answers in progress, one per requester, served in turn: requester -> [next, end]
        self._answers: dict[str, list[int]] = {}
        # FETCHes that wait until what their requester reads (bulk answers, keys) is known, by requester
        self.settling = bulk_answers.Settling()
        self._tails: list[list[bytes]] = []  # DIRECT-TAILs to send before the answers
        self.heads_at_out: list[list[bytes]] = []  # HEADS-AT answers to send (rfc 8.1)
        self.times = PublishTimes(started)
        self.refused = False  # the last round of answers met a requester's full queue
        self._turns: deque[str] = deque()

    # -- publishing ---------------------------------------------------------

    def has_room(self, size: int) -> bool:
        if self.min_acks == 0 or not self.buffer:
            return True
        return len(self.buffer) < self.max_unacked and self.buffered_bytes + size <= self.max_unacked_bytes

    def publish_keyed(self, content: bytes, key: bytes | None, now: float = 0.0,
                      attributes: Attributes | None = None) -> int:
        """:meth:`publish` for a record with a key or attributes (a timestamp, headers: rfc 18.4), which
        travel with it to whoever reads keys (kept apart, so that a plain record pays nothing for them);
        their bytes count in the buffer's bytes once the record is in."""
        seq = self.publish(content, now)
        if seq >= 0:
            if key is not None:
                self._keep_key(seq, key)
            if attributes is not None:
                self._keep_attributes(seq, attributes)
        return seq

    def _keep_attributes(self, seq: int, attributes: Attributes) -> None:
        self.attributes[seq] = attributes
        size = attributes_size(attributes)
        self.buffered_bytes += size
        self.published_bytes += size
        if self.batch and seq >= self.batch_first:
            if self.batch_attributes is None:
                self.batch_attributes = {}
            self.batch_attributes[seq - self.batch_first] = attributes

    def _keep_key(self, seq: int, key: bytes) -> None:
        self.keys[seq] = key
        self.buffered_bytes += len(key)
        self.published_bytes += len(key)
        if self.batch and seq >= self.batch_first:
            if self.batch_keys is None:
                self.batch_keys = {}
            self.batch_keys[seq - self.batch_first] = key

    def room_for(self, n: int, size: int) -> bool:
        """Whether the unacked buffer takes ``n`` records of ``size`` bytes together now (always when it is
        empty, or when nothing waits for acks: ``min_acks`` 0)."""
        return not self.min_acks or not self.buffer or (
            len(self.buffer) + n <= self.max_unacked and self.buffered_bytes + size <= self.max_unacked_bytes)

    def publish_many(self, values: Sequence[bytes], size: int, now: float = 0.0,
                     keys: Sequence[bytes | None] | None = None,
                     attributes: Sequence[Attributes | None] | None = None) -> int:
        """Take all of ``values`` (``size`` bytes in all) if the unacked
        buffer has room for them together (or is empty): returns the first
        one's sequence, or -1, taking nothing.  They join the live batch
        whole, due at once: :meth:`publish` for a burst already in hand, with
        no Python call per record.  ``keys``, if given, holds each record's key
        (None: none), and ``size`` counts their bytes too; ``attributes`` likewise
        (:func:`dafka.protocol.attributes.size`)."""
        buffer = self.buffer
        n = len(values)
        if not self.room_for(n, size):
            return -1
        seq = self.next_seq
        buffer.extend(values)
        self.buffered_bytes += size
        if keys is not None:
            self.keys.update((s, key) for s, key in zip(range(seq, seq + n), keys) if key is not None)
        if attributes is not None:  # (a record without attributes is held as None: its frames say so)
            self.attributes.update(zip(range(seq, seq + n), attributes))
        if not self.min_acks:
            self.released = seq + n - 1
            while len(buffer) > self.max_unacked or self.buffered_bytes > self.max_unacked_bytes:
                self._drop_oldest()
        self.next_seq = seq + n
        self.published_bytes += size
        if now >= self.note_due:
            self.note_due = self.times.note(seq, now)
        if self.audience.batches:
            batch = self.batch
            if not batch:
                self.batch_first = seq
            if keys is not None:
                at = len(batch)
                found = {at + i: key for i, key in enumerate(keys) if key is not None}
                if found:
                    self.batch_keys = {**(self.batch_keys or {}), **found}
            if attributes is not None:
                at = len(batch)
                if self.batch_attributes is None:
                    self.batch_attributes = {}
                self.batch_attributes.update(zip(range(at, at + n), attributes))
            batch.extend(values)
            self.batch_bytes += size
            self.batch_due = True
            self.last_publish = now
        return seq

    def resume_after(self, head: int, now: float = float("-inf")) -> None:
        """Continue a partition whose records up to ``head`` the stores hold
        (-1: none): the next record published is ``head + 1`` (dafka.producer.resume).
        ``now``: when (the clock of :meth:`publish`); the earlier run published
        nothing after it."""
        if self.next_seq:
            raise RuntimeError("a producer resumes its partition before its first record")
        self.next_seq = self.base = head + 1
        self.released = self.stored = head
        self.times = PublishTimes(now, head)

    def record_frame(self, seq: int) -> bytes:
        """Frame 1 of the RECORD of published record ``seq``."""
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
        prefix = proto.subscription_prefix(sub)
        return self.head_prefix.startswith(prefix) or self.record_prefix.startswith(prefix)

    # -- acks ---------------------------------------------------------------

    def on_ack(self, store: str, msg: proto.AckMsg) -> bool:
        """An ACK from ``store``; True if more records were released."""
        if msg.subject != self.topic or msg.topic != self.address:
            return False
        if msg.sequence >= self.next_seq:
            self.malformed += 1  # an ACK for a record we never published
            return False
        if msg.sequence > self.stored:
            self.stored = msg.sequence
        if self.min_acks == 0:
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
        held = self.buffered_bytes
        while self.base <= released and self.buffer:
            self._drop_oldest()
        if held > self.held_peak:
            self.held_peak = held
        if self.held_peak >= TRIM_AFTER_BYTES and self.buffered_bytes <= self.held_peak // 8:
            self.trim_due = True  # the window drained: the loop gives the freed memory back (dafka.core.heap)
            self.held_peak = self.buffered_bytes
        return True

    def forget_store(self, store: str) -> None:
        """A store went away; its past ACKs stay valid, it just stops counting for new ones."""
        self.store_acks.pop(store, None)

    # -- fetch --------------------------------------------------------------

    def on_fetch(self, msg: proto.FetchMsg, now: float | None = None) -> None:
        """Queue DIRECT-RECORD answers for the part of the range we still hold,
        in place of whatever this requester asked before.  At ``now`` (without
        it, at once: the tests' shorthand), one whose requester has not
        subscribed to its answers waits for it (``dafka.protocol.bulk.UNHEARD_WAIT``,
        then it is dropped: nobody could read the answer), and one whose
        requester was first heard less than ``dafka.protocol.bulk.SETTLE`` ago waits
        for :meth:`settle`."""
        if msg.topic != self.address or msg.subject != self.topic or msg.count == 0:
            return
        if "\0" in msg.address:
            self.malformed += 1  # its answers could not be addressed
            return
        self.fetches_received += 1
        if now is not None:
            requester, settling = msg.address, self.settling
            if settling.unheard:
                settling.drop_unheard(now)
            if not (self.ledger.listens(requester) or requester in self.bulk.records or requester in self.bulk.keyed):
                settling.wait_unheard(requester, requester, msg, now)
                return
            if settling.hold(requester, requester, msg, now):
                return
        self._take_fetch(msg)

    def settle(self, now: float) -> None:
        """Take in the FETCHes whose requesters' subscriptions have settled."""
        for msg in self.settling.due(now):
            self._take_fetch(msg)

    def _heard_from(self, requester: str, now: float) -> None:
        """``requester`` subscribed to its answers: take in the FETCHes it sent before."""
        for msg in self.settling.heard_from(requester):
            if not self.settling.hold(requester, requester, msg, now):
                self._take_fetch(msg)

    def _take_fetch(self, msg: proto.FetchMsg) -> None:
        requester = msg.address
        self.ledger.received_below(requester, self.topic, msg.sequence)
        if self.stored < msg.sequence < self.base:
            # Let go, and no store ever held it: only dafka-py peers subscribe to DIRECT-TAIL (``T``).
            self._tails.append([proto.encode(proto.DirectTailMsg(requester, self.address, self.topic, self.base))[0]])
            self.tails_sent += 1
        start = max(msg.sequence, self.base)
        end = min(msg.sequence + msg.count, self.next_seq)
        if start >= end:
            self._answers.pop(requester, None)
            return
        if requester not in self._turns:
            self._turns.append(requester)
        self._answers[requester] = [start, end]

    def on_subscription(self, sub: proto.Subscription, now: float = 0.0) -> bool:
        """A (un)subscription seen on the data socket; True if it asks for a
        HEAD now.  A requester whose pipe went away gets no more answers.  A
        ``latest`` consumer's request for HEADS-AT is answered in
        :attr:`heads_at_out`, to send before that HEAD."""
        if sub.msg_id == proto.HEADS_AT:
            request = proto.decode_heads_at_request(sub)
            if request is not None:
                if request[2] == self.topic:
                    self.heads_at_out.append(self.heads_at(request[0], request[1], now))
            elif sub.subscribe:
                self.malformed += 1
            return False
        self.settling.on_subscription(sub, now)
        if sub.msg_id == proto.DIRECT_RECORD and sub.topic:
            # (XPUB_VERBOSER: one per pipe; the requester listens while one of its pipes does)
            if self.ledger.listening(sub.topic, sub.subscribe):
                self._heard_from(sub.topic, now)
            else:
                self._answers.pop(sub.topic, None)
                self.settling.waiting.pop(sub.topic, None)
        elif self.bulk.on_subscription(sub):
            if sub.subscribe and sub.topic:
                self._heard_from(sub.topic, now)
            return False
        self.audience.on_subscription(sub, now)
        return sub.subscribe and self.wants_head_for(sub)

    def heads_at(self, requester: str, since_ms: int, now: float, wall: float | None = None) -> list[bytes]:
        """The HEADS-AT that tells ``requester`` the last record published at
        or before ``since_ms`` (unix ms); ``now`` is the clock of
        :meth:`publish`, ``wall`` the unix time at that moment (default: now)."""
        moment = since_ms / 1000 - ((time.time() if wall is None else wall) - now)
        held = self.times.held_at(moment, self.next_seq)
        seq = proto.NOT_KNOWN if held is None else proto.NOTHING_HELD if held < 0 else held
        return proto.encode(proto.HeadsAtMsg(requester, since_ms, self.topic, self.address, False,
                                             (proto.HeldAt(self.address, seq),)))

    # -- live batches ---------------------------------------------------------

    def take_batch(self) -> list[list[bytes]]:
        """The messages of the waiting records (none wait: no message): a
        KEYED-RECORDS if somebody reads them, then a RECORDS if somebody reads
        those (a dafka-py 0.2 peer: the values without their keys).  The
        records are consecutive: whoever stops adding records to the batch
        (the audience stopped reading batches) takes it first."""
        batch = self.batch
        if not batch:
            return []
        n = len(batch)
        lengths, contents = proto.pack_contents(batch)
        header = self.batch_first.to_bytes(8, "big") + n.to_bytes(4, "big") + _NO_STAMPS
        messages = []
        if self.audience.keyed:
            batch_keys = self.batch_keys
            key_lengths, keys = (b"", b"") if batch_keys is None else proto.pack_keys(
                [batch_keys.get(i) for i in range(n)])
            held = self.batch_attributes
            frames = _NO_ATTRIBUTES if held is None else attributes_frames(list(map(held.get, range(n))))
            messages.append([self._keyed_prefix + header, lengths, contents, key_lengths, keys, *frames])
        if self.audience.plain or not self.audience.keyed:
            messages.append([self._records_prefix + header, lengths, contents])
        self.batch = []
        self.batch_keys = None
        self.batch_attributes = None
        self.batch_bytes = 0
        self.batches_sent += 1
        return messages

    @property
    def answering(self) -> bool:
        return bool(self._answers or self._tails)

    def can_answer(self) -> bool:
        """Whether :meth:`fetch_answers` would send something now: a
        DIRECT-TAIL, or an answer whose requester has room in its budget (the
        others wait for a FETCH, which wakes the loop)."""
        room = self.ledger.room
        return bool(self._tails) or any(room(requester) > 0 for requester in self._answers)

    def fetch_answers(self, budget: int = FETCH_SLICE) -> Generator[list[bytes], bool | None, None]:
        """The frames of up to ``budget`` records' answers (DIRECT-RECORD, or
        DIRECT-RECORDS for a requester that reads them), taking the
        requesters in turn; a requester whose in-flight budget is spent waits
        for its next FETCH.  DIRECT-TAILs go first, ahead of the records they
        precede.

        The caller sends each message it is given and says ``False``
        (``generator.send(False)``) for one it could not send because the
        requester's queue is full: that requester's answer stops there for
        this round and goes on from that message in a later one, and
        :attr:`refused` says so.  An answer is never dropped on the way: it
        would otherwise be charged to the requester's budget for good (rfc
        6.7, "Full queues")."""
        self.refused = False
        tails, self._tails = self._tails, []
        for i, frames in enumerate(tails):
            if (yield frames) is False:
                self._tails = tails[i:]
                self.refused = True
                break
        turns, answers, ledger = self._turns, self._answers, self.ledger
        for _ in range(len(turns)):
            if budget <= 0:
                return
            requester = turns.popleft()
            job = answers.get(requester)
            if job is None:
                continue  # its answer is finished, or its requester left
            room = ledger.room(requester)
            seq = max(job[0], self.base)  # records may have been released meanwhile
            stop = min(job[1], self.base + len(self.buffer))
            if room > 0 and seq < stop:
                first = seq
                held = islice(self.buffer, seq - self.base, stop - self.base)
                if requester in self.bulk.records or requester in self.bulk.keyed:
                    seq, spent, refused = yield from self._bulk_answer(requester, held, seq, stop, budget, room)
                else:
                    seq, spent, refused = yield from self._direct_answer(requester, held, seq, stop, budget, room)
                self.refused = self.refused or refused
                budget -= seq - first
                self.records_answered += seq - first
                ledger.sent(requester, self.topic, first, seq, spent)
            if seq >= stop:
                del answers[requester]
            else:
                job[0] = seq
                turns.append(requester)

    def _direct_answer(self, requester: str, held: Iterator[bytes], seq: int, stop: int, budget: int,
                       room: int) -> Generator[list[bytes], bool | None, tuple[int, int, bool]]:
        """DIRECT-RECORDs of ``held`` (records ``seq..stop-1``); returns (next
        sequence, bytes spent, whether the requester's queue refused one)."""
        prefix = proto.record_prefix(proto.DIRECT_RECORD, requester, self.address, self.topic)
        per_message = len(prefix) + 8 + MESSAGE_OVERHEAD
        spent = 0
        end = min(stop, seq + budget)
        for content in held:
            if (yield [prefix + seq.to_bytes(8, "big"), content]) is False:
                return seq, spent, True
            spent += per_message + len(content)
            seq += 1
            if seq >= end or spent >= room:
                break
        return seq, spent, False

    def _bulk_answer(self, requester: str, held: Iterator[bytes], seq: int, stop: int, budget: int,
                     room: int) -> Generator[list[bytes], bool | None, tuple[int, int, bool]]:
        """DIRECT-RECORDS of ``held`` (records ``seq..stop-1``), packed in C, or
        DIRECT-KEYED-RECORDS for a requester that reads keys; returns (next
        sequence, bytes spent, whether the requester's queue refused one)."""
        keyed = requester in self.bulk.keyed
        prefix = proto.record_prefix(proto.DIRECT_KEYED_RECORDS if keyed else proto.DIRECT_RECORDS, requester,
                                     self.address, self.topic)
        spent = 0
        end = min(stop, seq + budget)
        count = bulk_answers.FIRST_COUNT
        while seq < end and spent < room:
            values = list(islice(held, min(count, end - seq)))
            lengths, contents = proto.pack_contents(values)
            n = len(values)
            frame = prefix + seq.to_bytes(8, "big") + n.to_bytes(4, "big") + _NO_STAMPS
            message = [frame, lengths, contents]
            if keyed:
                keys, kept = self.keys, self.attributes
                message += proto.pack_keys([keys.get(s) for s in range(seq, seq + n)]) if keys else [b"", b""]
                message += attributes_frames(list(map(kept.get, range(seq, seq + n)))) if kept else _NO_ATTRIBUTES
            if (yield message) is False:
                return seq, spent, True
            spent += sum(map(len, message)) + MESSAGE_OVERHEAD
            seq += n
            count = bulk_answers.next_count(n, len(contents))
        return seq, spent, False


_NO_ATTRIBUTES = (b"", b"", b"")  # frames 6-8 of a keyed message whose records have no attributes


_NO_STAMPS = proto.encode_stamps(())  # a producer does not know when stores received its records
