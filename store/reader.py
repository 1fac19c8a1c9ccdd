"""The store reader: one thread that answers from LevelDB.

It binds an XPUB (``xpub_verbose=1``, ``sndhwm = store/high_watermark``)
advertised by its own beacon, and connects one SUB to every peer the beacon
reports, subscribed to exactly ``F``, ``G`` and ``W<reader>`` like the
reference.

* FETCH (from a consumer or another store's writer, never from its own
  writer): DIRECT-RECORDs (topic = requester) for ``count`` records from the
  first stored record at or after ``sequence``.  The reference sends up to
  ``count + 1`` records and nothing at all when the first one is missing; we
  are exact.  If records before the first one we have were deleted by
  retention, a DIRECT-TAIL (extension) saying where the partition now starts
  goes first.  Answers are streamed in slices of :data:`SLICE` records from a
  LevelDB iterator, so any ``count`` costs constant memory, and several
  requesters are served in turn.  The XPUB runs with ``XPUB_NODROP``: a
  requester whose queue is full holds only its own answer back (its pipe is the
  only one a DIRECT-RECORD matches) instead of silently losing records; an
  answer that cannot move for :data:`STALL_TIMEOUT` seconds is abandoned (the
  requester retries).  A newer FETCH from the same requester for the same
  partition replaces the answer in progress.  Each requester may have at most
  ``store/fetch_inflight_bytes`` of answers in flight (:mod:`dafka.core.inflight`):
  beyond that its answers pause until its next FETCH shows what arrived, so a
  requester that asks and never reads costs a bounded amount of memory.
  A FETCH from a requester not subscribed to its answers waits
  :data:`dafka.protocol.bulk.UNHEARD_WAIT` for that subscription, then is dropped (rfc 6.7): nobody
  could read the answer, and serving it would cost reads and CPU for nothing.
* GET-HEADS and each subject of a CONSUMER-HELLO: a DIRECT-HEAD per partition
  of exactly that subject (the reference matches a prefix: ``hello`` also
  answered ``hello2``).
* A subscription ``L<consumer>`` seen on the XPUB: STORE-HELLO.
"""

from __future__ import annotations

import logging
import struct
import time
from collections import deque
from itertools import islice

import plyvel
import zmq

from dafka import protocol as proto
from dafka.protocol.attributes import pack as attributes_frames
from dafka.discovery.beacon import Beacon
from dafka.config import Config
from dafka.protocol import bulk as bulk_answers
from dafka.core.inflight import MESSAGE_OVERHEAD, InflightLedger
from dafka.core.loop import Loop
from dafka.core.sockets import ZERO_COPY_BYTES, raw_send

from . import keys
from .database import SharedDB
from .role import RoleThread

log = logging.getLogger(__name__)

SLICE = 10_000  # records sent per loop iteration, across all answers
DRAIN = 10_000  # requests handled per wake-up
# What a requester learns of the records compaction removed from inside a partition (rfc 19): a DIRECT-GAP
# (it subscribed N), a DIRECT-TAIL (a dafka-py peer of 0.2: it subscribed T), or an empty record in the place
# of each (a reference peer, which would otherwise wait for them for ever).
GAP, TAIL, FILL = "gap", "tail", "fill"
STALL_TIMEOUT = 10.0  # seconds an answer may wait for room (pipe or budget) before it is dropped
_STALL_POLL = 0.005  # seconds between attempts while every answer waits for room in a pipe
_PAUSE_CHECK = 1.0  # seconds between looks at answers paused by the budget (only to drop old ones)
PACE_RETRY = 1.0  # seconds between DIRECT-HEADs to a paused requester without bulk answers
HELD_AT_STEPS = 10_000  # stamps a HEADS-AT reads back from a partition's newest at most (~1,000 s of writes)

_SNDMORE_NOBLOCK = zmq.SNDMORE | zmq.NOBLOCK


class _Answer:
    """One FETCH being answered: records ``next .. end-1`` still to send."""

    __slots__ = ("key", "requester", "subject", "producer", "partition", "prefix", "out_prefix", "bulk", "keys_prefix",
                 "attributes_prefix",
                 "next", "end", "left", "it", "last", "carry", "first", "chunk", "exhausted",
                 "stalled_since", "paused_since", "paced_at", "done")

    def __init__(self, requester: str, subject: str, producer: str, seq: int, count: int, bulk: bool,
                 keyed: bool = False) -> None:
        self.key = (requester, subject, producer)
        self.requester = requester
        self.subject = subject
        self.producer = producer
        self.partition = (subject, producer)
        self.prefix = keys.partition_prefix(keys.RECORD, subject, producer)
        self.bulk = bulk or keyed  # the requester reads DIRECT-RECORDS
        # ...with the records' keys (rfc 18): where they are kept, None when it does not read them
        self.keys_prefix = keys.partition_prefix(keys.RECORD_KEY, subject, producer) if keyed else None
        # ...and their attributes (rfc 18.4)
        self.attributes_prefix = keys.partition_prefix(keys.RECORD_ATTRIBUTES, subject, producer) if keyed else None
        if keyed:
            self.out_prefix = proto.record_prefix(proto.DIRECT_KEYED_RECORDS, requester, producer, subject)
        elif bulk:
            self.out_prefix = proto.record_prefix(proto.DIRECT_RECORDS, requester, producer, subject)
        else:
            self.out_prefix = proto.record_prefix(proto.DIRECT_RECORD, requester, producer, subject)
        self.next = seq  # the next sequence to send
        self.end = min(seq + count, proto.MAX_SEQUENCE + 1)
        self.left = count  # records still to send (DIRECT-RECORD answers)
        self.it = None  # DIRECT-RECORD answers read one LevelDB iterator
        self.last = -1  # ...up to the partition's head when it was made (Reader._head)
        # messages taken from the database but not sent yet: (frames, first, end) with the
        # sequence range they carry (first = end for one that carries none, a DIRECT-TAIL)
        self.carry: deque[tuple[list[bytes], int, int]] = deque()
        self.first = True
        self.chunk = bulk_answers.FIRST_COUNT  # records in the next DIRECT-RECORDS
        self.exhausted = False  # nothing stored after ``next``
        self.stalled_since: float | None = None  # its requester's pipe is full
        self.paused_since: float | None = None  # its requester's budget is spent
        self.paced_at = float("-inf")  # when a DIRECT-HEAD last told a paused requester to ask again
        self.done = False

    @property
    def finished(self) -> bool:
        return not self.carry and (self.exhausted or self.next >= self.end)

    def close(self) -> None:
        self.done = True
        if self.it is not None:
            self.it.close()
            self.it = None


def _waiting_since(answer: _Answer, now: float) -> float:
    """Since when ``answer`` waits for room in its requester's pipe or budget (``now``: it does not)."""
    if answer.stalled_since is not None:
        return answer.stalled_since
    return answer.paused_since if answer.paused_since is not None else now


def _key(prefix: bytes, seq: int) -> bytes:
    """Record ``seq``'s key under ``prefix``; past the last possible one, the end of the partition."""
    return prefix + keys.seq_bytes(seq) if seq <= proto.MAX_SEQUENCE else keys.prefix_end(prefix)


class Reader(RoleThread):
    def __init__(
        self, ctx: zmq.Context, config: Config, db: SharedDB, address: str, writer_address: str,
        name: str = "store-reader", beside: Beacon | None = None,
    ) -> None:
        self.writer_address = writer_address
        self._shared = db
        self._generation = db.generation
        hwm = config["store/high_watermark"]
        self.verbose = bool(config["store/verbose"])
        self._xpub = ctx.socket(zmq.XPUB)
        self._xpub.setsockopt(zmq.XPUB_VERBOSE, 1)
        self._xpub.setsockopt(zmq.XPUB_NODROP, 1)
        self._xpub.sndhwm = hwm
        self._xpub.linger = 0
        self._sub = ctx.socket(zmq.SUB)
        self._sub.rcvhwm = hwm
        self._sub.linger = 0
        # Requests come on a SUB connected to every peer, and (extension) on
        # one bound for requesters that know the store's directory and no
        # tower (store/running.py): the same subscriptions on both.
        self._requests = ctx.socket(zmq.SUB)
        for sock in (self._sub, self._requests):
            for prefix in (
                proto.subscription(proto.FETCH),
                proto.subscription(proto.GET_HEADS),
                proto.subscription(proto.CONSUMER_HELLO, address),
            ):
                sock.setsockopt(zmq.SUBSCRIBE, prefix)
        self._requests.rcvhwm = hwm
        self._requests.linger = 0
        try:
            super().__init__(ctx, config, self._xpub, self._sub, address, name, beside)
            self.requests_endpoint = self._data.bind_also(self._requests)
        except BaseException:
            self._requests.close(0)
            raise
        self._sockets.append(self._requests)
        self._answers: deque[_Answer] = deque()
        self._by_key: dict[tuple[str, str, str], _Answer] = {}
        self._ledger = InflightLedger(config["store/fetch_inflight_bytes"])
        self._bulk = bulk_answers.Negotiated()
        # counters
        self.malformed = 0
        self.fetches = 0  # FETCHes answered (at least one record or tail)
        self.fetches_received = 0
        self.records_sent = 0
        self.bulk_messages = 0  # DIRECT-RECORDS and DIRECT-PARTITIONS sent
        self.paced = 0  # DIRECT-HEADs that told a requester without bulk answers to ask again
        self.tails_sent = 0
        self.gaps_sent = 0  # DIRECT-GAPs: holes compaction left, told to dafka-py requesters (rfc 19)
        self.fillers_sent = 0  # ...and the empty records sent in their place to reference requesters
        self.heads_sent = 0
        self.hellos_sent = 0
        self.heads_at_sent = 0  # HEADS-AT answers (rfc 8.1)
        self.dropped = 0  # answers abandoned or messages not sent for lack of room
        self.paused = 0  # times an answer paused on its requester's budget
        self.abandoned = 0  # answers stopped because their requester went away
        # FETCHes that wait for their requester to subscribe to the answers, or until what it reads (keys,
        # gaps) is known (dafka.protocol.bulk.SETTLE), by answer key (requester, subject, partition)
        self._settling = bulk_answers.Settling()

    @property
    def unheard(self) -> int:
        """FETCHes dropped: nobody subscribed to their answers."""
        return self._settling.unheard_dropped

    # -- the thread -----------------------------------------------------------

    def _run(self) -> None:
        loop = Loop()
        loop.add_reader(self._sub, self._on_sub)
        loop.add_reader(self._requests, self._on_sub)
        loop.add_reader(self._xpub, self._on_xpub)
        loop.add_reader(self._data.beacon.events, self._links.on_beacon)
        loop.add_reader(self._wake, self._on_wake)
        try:
            while not self._stopping:
                timeout = self._wait_for_answers()
                if self._settling.unheard:
                    timeout = _PAUSE_CHECK if timeout is None else min(timeout, _PAUSE_CHECK)
                due = self._settling.next_due()
                if due is not None:
                    due = max(0.0, due - time.monotonic())
                    timeout = due if timeout is None else min(timeout, due)
                loop.run_once(timeout)
                if self._settling.unheard:
                    self._settling.drop_unheard(time.monotonic())
                if self._settling.waiting:
                    for msg in self._settling.due(time.monotonic()):
                        self._answer(msg)
                if self._answers and not self._stopping:
                    with self._shared.lock:
                        if self._db_ready():
                            self._serve(SLICE)
        except BaseException as exc:  # noqa: BLE001 - logged and reported by Store
            self.error = exc
            log.exception("store reader %s failed", self.address)
        finally:
            for answer in self._answers:
                answer.close()
            self._answers.clear()
            self._by_key.clear()
            for sock in self._sockets:
                sock.close()

    def _wait_for_answers(self) -> float | None:
        """How long the loop may wait: not at all while an answer can move; a
        little while one waits for room in a pipe (libzmq does not say when
        there is some); only to drop old ones while all wait for their
        requester's next FETCH, which wakes the loop itself."""
        if not self._answers:
            return None
        timeout = _PAUSE_CHECK
        for answer in self._answers:
            if answer.stalled_since is None and answer.paused_since is None:
                return 0.0
            if answer.stalled_since is not None:
                timeout = _STALL_POLL
        return timeout

    def _on_sub(self, sock: zmq.Socket) -> None:
        for _ in range(DRAIN):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                msg = proto.decode(frames)
            except proto.MalformedMessage as exc:
                self.malformed += 1
                log.debug("store reader %s dropped a malformed message: %s", self.address, exc)
                continue
            kind = type(msg)
            if kind is proto.FetchMsg:
                self._on_fetch(msg)
            elif kind is proto.GetHeadsMsg:
                if msg.address != self.writer_address:  # our writer asks the other stores (rfc 7.1)
                    self._send_heads(msg.address, msg.topic)
            elif kind is proto.ConsumerHelloMsg:
                if msg.topic == self.address:
                    for subject in msg.subjects:
                        self._send_heads(msg.address, subject)

    def _on_xpub(self, sock: zmq.Socket) -> None:
        for _ in range(DRAIN):
            try:
                frame = sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                sub = proto.decode_subscription(frame)
            except proto.MalformedMessage as exc:
                self.malformed += 1
                log.debug("store reader %s dropped a malformed subscription frame: %s", self.address, exc)
                continue
            if self._data.answer_info(sub):
                continue
            if sub.msg_id == proto.HEADS_AT:
                request = proto.decode_heads_at_request(sub)
                if request is not None:
                    self._send_heads_at(*request)
                elif sub.subscribe:
                    self.malformed += 1
                continue
            self._settling.on_subscription(sub, time.monotonic())
            if sub.msg_id == proto.DIRECT_RECORD and sub.topic:
                self._ledger.listening(sub.topic, sub.subscribe)
                if not sub.subscribe:
                    self._abandon(sub.topic)
                else:
                    self._heard_from(sub.topic)
                continue
            if self._bulk.on_subscription(sub):
                if not sub.subscribe and sub.msg_id in (proto.DIRECT_RECORDS, proto.DIRECT_KEYED_RECORDS):
                    self._abandon(sub.topic)
                elif sub.subscribe:
                    self._heard_from(sub.topic)
                continue
            if sub.subscribe and sub.msg_id == proto.STORE_HELLO and sub.topic:
                try:
                    frames = proto.encode(proto.StoreHelloMsg(sub.topic, self.address))
                except ValueError:
                    self.malformed += 1
                    continue
                if self._send_now(frames):
                    self.hellos_sent += 1

    # -- answers --------------------------------------------------------------

    def _send_now(self, frames: list[bytes]) -> bool:
        """Send a one-off message; drop it (counted) if its requester's queue is full."""
        try:
            self._xpub.send(frames[0], zmq.NOBLOCK)
            return True
        except zmq.Again:
            self.dropped += 1
            return False

    @property
    def bytes_served(self) -> int:
        """Bytes of every FETCH answer sent, ever."""
        return self._ledger.bytes_sent

    @property
    def inflight_bytes(self) -> int:
        """Answer bytes sent and not yet shown received, every requester together."""
        return self._ledger.total()

    @property
    def _db(self) -> plyvel.DB:
        return self._shared.db

    def _db_ready(self) -> bool:
        """With the handle's lock held: False while the writer has no open
        handle; after a reopen, drop the answers whose iterators died with the
        old handle (their requesters FETCH again)."""
        if self._shared.generation != self._generation:
            self._generation = self._shared.generation
            if self._answers:
                log.warning("store reader %s: database reopened; %d answers in progress dropped",
                            self.address, len(self._answers))
            for answer in self._answers:
                answer.it = None
                answer.done = True
            self._answers.clear()
            self._by_key.clear()
        return self._shared.db is not None

    def _send_heads(self, requester: str, subject: str) -> None:
        with self._shared.lock:
            if self._db_ready():
                self._send_heads_locked(requester, subject)

    def _send_heads_locked(self, requester: str, subject: str) -> None:
        """The heads of every partition of exactly ``subject`` (the empty
        subject asks for every partition of every topic; a reference store,
        matching prefixes, answers it the same way): one DIRECT-PARTITIONS to
        a requester that reads it, else a DIRECT-HEAD per partition."""
        raw = keys.to_bytes(subject)
        if not keys.valid_name(raw):
            return
        bulk = requester in self._bulk.partitions
        found: list[proto.PartitionInfo] = []
        prefix = keys.HEAD + raw + b"\0" if raw else keys.HEAD
        for key, value in self._db.iterator(prefix=prefix):
            try:
                parsed = keys.parse_key(key)
            except ValueError:
                continue
            if len(value) != keys.SEQ_BYTES or (raw and parsed.subject != subject):
                continue
            head = keys.seq_of(value)
            if bulk:
                found.append(proto.PartitionInfo(parsed.subject, parsed.address, self._tail(key, head), head))
                continue
            try:
                frames = proto.encode(proto.DirectHeadMsg(requester, parsed.address, parsed.subject, head))
            except ValueError:
                self.malformed += 1
                return
            if self._send_now(frames):
                self.heads_sent += 1
        if bulk:
            try:
                frames = proto.encode(proto.DirectPartitionsMsg(requester, self.address, subject, tuple(found),
                                                                self.requests_endpoint))
            except ValueError:
                self.malformed += 1
                return
            if self._send_now(frames):
                self.heads_sent += len(found)
                self.bulk_messages += 1

    def _send_heads_at(self, requester: str, since_ms: int, subject: str) -> None:
        """HEADS-AT (rfc 8.1): for each partition of ``subject`` held here, the last record received at or
        before ``since_ms``, from the receive stamps (Appendix A): a lower bound of the last one produced by
        then."""
        raw = keys.to_bytes(subject)
        if not raw or not keys.valid_name(raw):
            return
        with self._shared.lock:
            if not self._db_ready():
                return
            entries = []
            for key, value in self._db.iterator(prefix=keys.HEAD + raw + b"\0"):
                try:
                    parsed = keys.parse_key(key)
                except ValueError:
                    continue
                if len(value) == keys.SEQ_BYTES and parsed.subject == subject:
                    entries.append(proto.HeldAt(parsed.address, self._held_at(subject, parsed.address, since_ms)))
        try:
            frames = proto.encode(proto.HeadsAtMsg(requester, since_ms, subject, self.address, True, tuple(entries)))
        except ValueError:
            self.malformed += 1
            return
        if self._send_now(frames):
            self.heads_at_sent += 1

    def _held_at(self, subject: str, address: str, since_ms: int) -> int:
        """The last record of a partition received at or before ``since_ms``: the newest stamp that is not
        younger (a stamp's time is that of the last batch it covers).  :data:`dafka.protocol.codec.NOT_KNOWN` for a
        partition without stamps (a reference store's database) or with more than :data:`HELD_AT_STEPS`
        stamps after that moment."""
        steps = 0
        for key, value in self._db.iterator(prefix=keys.partition_prefix(keys.STAMP, subject, address), reverse=True):
            try:
                stamp = keys.decode_stamp(key, value)
            except ValueError:
                continue
            if stamp.unix_ms <= since_ms:
                return stamp.last
            steps += 1
            if steps >= HELD_AT_STEPS:
                return proto.NOT_KNOWN
        return proto.NOTHING_HELD if steps else proto.NOT_KNOWN

    # A LevelDB seek or step finds the next key that is not deleted, and a deleted key stays behind as a
    # tombstone until a compaction reaches it: a read that asks for a key below a partition's floor steps
    # over every record retention deleted there, and one that asks past the partition's last record steps
    # over the tombstones at the start of the next partition (or region) before it can see it has left the
    # partition: 285 ms a seek past 300,000 of them (/tmp/probe/edge.py, 2026-11-27).  So every read of a
    # partition starts at its floor or above (_from) and ends at its head (_head): the writer writes a
    # partition's records in order and retention and compaction never delete its head record, so every
    # record from the floor to the head is stored.

    def _from(self, prefix: bytes, seq: int) -> int:
        """Where a read of the partition under ``prefix`` from record ``seq`` starts: at the partition's
        floor if ``seq`` is below it."""
        return max(seq, self._shared.floors.get(prefix, 0))

    def _head(self, prefix: bytes) -> int:
        """The head stored for the partition under (record key) ``prefix``; -1 if none."""
        value = self._db.get(keys.HEAD + prefix[1:])
        return keys.seq_of(value) if value is not None and len(value) == keys.SEQ_BYTES else -1

    def _tail(self, head_key: bytes, head: int) -> int:
        """The oldest sequence stored of the partition of ``head_key`` (head + 1 if none is left)."""
        prefix = keys.RECORD + head_key[1:]
        start = self._from(prefix, 0)
        if start > head:
            return head + 1
        first = next(self._db.iterator(start=_key(prefix, start), stop=keys.prefix_end(prefix), include_value=False),
                     None)
        return head + 1 if first is None else keys.seq_of(first[-keys.SEQ_BYTES:])

    def _on_fetch(self, msg: proto.FetchMsg) -> None:
        if msg.address == self.writer_address or msg.count == 0:
            return
        self.fetches_received += 1
        if not (keys.valid_name(keys.to_bytes(msg.subject)) and keys.valid_name(keys.to_bytes(msg.topic))):
            return
        if not (self._ledger.listens(msg.address) or msg.address in self._bulk.records
                or msg.address in self._bulk.keyed):
            self._settling.wait_unheard((msg.address, msg.subject, msg.topic), msg.address, msg, time.monotonic())
            return
        self._on_fetch_heard(msg)

    def _on_fetch_heard(self, msg: proto.FetchMsg) -> None:
        """A FETCH whose requester subscribed to its answers: answered now, or once its subscriptions settled."""
        if not self._settling.hold((msg.address, msg.subject, msg.topic), msg.address, msg, time.monotonic()):
            self._answer(msg)

    def _heard_from(self, requester: str) -> None:
        """``requester`` subscribed to its answers: answer the FETCHes it sent before."""
        for msg in self._settling.heard_from(requester):
            self._on_fetch_heard(msg)

    def _answer(self, msg: proto.FetchMsg) -> None:
        try:
            requester = msg.address
            answer = _Answer(requester, msg.subject, msg.topic, msg.sequence, msg.count,
                             requester in self._bulk.records, requester in self._bulk.keyed)
        except ValueError:  # a requester address the wire cannot carry back
            self.malformed += 1
            return
        self._ledger.received_below(msg.address, answer.partition, msg.sequence)
        with self._shared.lock:
            if not self._db_ready():
                return
            old = self._by_key.pop(answer.key, None)
            if old is not None:
                old.close()  # superseded: the requester has moved on
            if not answer.bulk:
                answer.last = self._head(answer.prefix)  # first: the iterator sees every record up to it
                answer.it = self._db.iterator(start=_key(answer.prefix, self._from(answer.prefix, msg.sequence)),
                                              stop=keys.prefix_end(answer.prefix))
            self._by_key[answer.key] = answer
            self._answers.append(answer)

    def _abandon(self, requester: str) -> None:
        """``requester`` went away (its pipe closed): stop reading its answers."""
        with self._shared.lock:  # iterators are closed under the handle's lock (see _db_ready)
            for answer in self._answers:
                if answer.requester == requester and not answer.done:
                    answer.close()
                    self.abandoned += 1
                    if self._by_key.get(answer.key) is answer:
                        del self._by_key[answer.key]

    def _serve(self, budget: int) -> None:
        """Send up to ``budget`` records, taking the answers in turn."""
        answers = self._answers
        now = time.monotonic()
        for _ in range(len(answers)):
            if budget <= 0:
                break
            answer = answers.popleft()
            if answer.done:
                continue
            sent = self._serve_one(answer, budget)
            budget -= sent
            self.records_sent += sent
            if answer.finished:
                if not answer.bulk:
                    self._pace(answer)
                answer.close()
                if self._by_key.get(answer.key) is answer:
                    del self._by_key[answer.key]
            elif now - _waiting_since(answer, now) > STALL_TIMEOUT:
                log.warning(
                    "store reader %s: %s has not read its answer for %.0f s; dropped the rest of it",
                    self.address, answer.requester, STALL_TIMEOUT,
                )
                self.dropped += 1
                answer.close()
                if self._by_key.get(answer.key) is answer:
                    del self._by_key[answer.key]
            else:
                answers.append(answer)

    def _serve_one(self, answer: _Answer, budget: int) -> int:
        """Send part of one answer; returns the records sent."""
        sent = self._flush_carry(answer)
        if answer.carry or answer.finished:
            return sent
        room, stop = self._ledger.room_at(answer.requester, answer.next, answer.bulk)
        if room <= 0:
            now = time.monotonic()
            if answer.paused_since is None:
                answer.paused_since = now
                self.paused += 1
            if not answer.bulk and now - answer.paced_at >= PACE_RETRY:
                answer.paced_at = now
                self._pace(answer)
            return sent
        answer.paused_since = None
        if answer.first:
            answer.first = False
            if not self._start(answer):
                return sent
            sent += self._flush_carry(answer)
            if answer.carry or answer.finished:
                return sent
        if sent >= budget:
            return sent
        end = answer.end if stop is None else min(answer.end, stop)
        if answer.bulk:
            return sent + self._send_bulk(answer, budget - sent, room, end)
        return sent + self._send_direct(answer, budget - sent, room, end)

    def _start(self, answer: _Answer) -> bool:
        """Find the first stored record at or after the sequence asked for;
        if records before it were deleted (retention), a DIRECT-TAIL saying
        so goes first.  False if there is nothing to send."""
        start = self._from(answer.prefix, answer.next)
        if start > (answer.last if answer.it is not None else self._head(answer.prefix)):
            answer.exhausted = True  # nothing stored from there on (and no seek past the partition's end)
            return False
        if answer.it is not None:
            first = next(answer.it, None)  # (key, value): its record is carried to be sent first
        else:
            first = next(self._db.iterator(start=_key(answer.prefix, start), stop=keys.prefix_end(answer.prefix),
                                           include_value=False), None)
        if first is None:
            answer.exhausted = True
            return False
        key = first[0] if answer.it is not None else first
        seq = keys.seq_of(key[-keys.SEQ_BYTES:])
        self.fetches += 1
        if seq > answer.next and self._holes(answer) != TAIL and answer.next >= self._first_kept(answer.prefix):
            # a hole inside the partition: records that compaction removed (rfc 19)
            self._hole(answer, answer.next, seq)
        elif seq > answer.next:
            # From the oldest record kept on, as many as were asked for (section 7.5).
            tail = proto.encode(proto.DirectTailMsg(answer.requester, answer.producer, answer.subject, seq))
            answer.carry.append((tail, seq, seq))
            self.tails_sent += 1
            answer.end = min(seq + answer.end - answer.next, proto.MAX_SEQUENCE + 1)
            answer.next = seq
        if answer.it is not None:
            answer.carry.append(([answer.out_prefix + key[-keys.SEQ_BYTES:], first[1]], seq, seq + 1))
            answer.left -= 1
            answer.next = seq + 1
        return True

    def _first_kept(self, prefix: bytes) -> int:
        """The partition's oldest kept record (its tail); past the end of the partition if none is."""
        first = next(self._db.iterator(start=_key(prefix, self._from(prefix, 0)), stop=keys.prefix_end(prefix),
                                       include_value=False), None)
        return proto.MAX_SEQUENCE + 1 if first is None else keys.seq_of(first[-keys.SEQ_BYTES:])

    def _holes(self, answer: _Answer) -> str:
        """What ``answer``'s requester is told of the records compaction removed: GAP if it subscribed N, else
        TAIL if it reads bulk answers or subscribed T (a dafka-py peer), else FILL (a reference peer).  Asked
        when a hole is met, not when the FETCH came: its subscriptions come on another connection, D first."""
        requester = answer.requester
        if requester in self._bulk.gaps:
            return GAP
        return TAIL if answer.bulk or requester in self._bulk.tails else FILL

    def _hole(self, answer: _Answer, first: int, end: int) -> None:
        """Records ``first .. end-1`` are gone from inside the partition (compaction removed them, rfc 19):
        a DIRECT-GAP says so to a requester that reads it; a reference peer, which could only wait for them,
        gets an empty record for each (as many as it asked for)."""
        if self._holes(answer) == GAP:
            gap = proto.encode(proto.DirectGapMsg(answer.requester, answer.producer, answer.subject, first, end))
            answer.carry.append((gap, end, end))
            self.gaps_sent += 1
            answer.end = min(answer.end + end - first, proto.MAX_SEQUENCE + 1)  # as many records as asked for
        else:
            stop = min(end, first + max(answer.left, 0), answer.end)
            for seq in range(first, stop):
                answer.carry.append(([answer.out_prefix + keys.seq_bytes(seq), b""], seq, seq + 1))
            answer.left -= stop - first
            self.fillers_sent += stop - first
        answer.next = end

    def _send_direct(self, answer: _Answer, budget: int, room: int, end: int) -> int:
        """DIRECT-RECORDs from the answer's iterator, one message per record,
        until ``budget`` records or ``room`` bytes are spent or ``end``."""
        xpub = self._xpub
        send_rest = self._send_rest
        out_prefix = answer.out_prefix
        per_message = len(out_prefix) + keys.SEQ_BYTES + MESSAGE_OVERHEAD
        left = min(answer.left, end - answer.next, answer.last + 1 - answer.next)  # (not past the head: _head)
        if left <= 0:
            if answer.next > answer.last:
                answer.exhausted = True
            return 0
        sent = spent = 0
        first_seq8 = last_seq8 = None
        fill = self._holes(answer) == FILL
        expected = answer.next
        for key, value in answer.it:
            seq8 = key[-8:]
            frame = out_prefix + seq8
            if fill:
                seq = keys.seq_of(seq8)
                if seq > expected:  # a hole compaction left: an empty record for each offset, first (rfc 19)
                    self._hole(answer, expected, seq)
                    answer.carry.append(([frame, value], seq, seq + 1))
                    answer.left -= 1
                    answer.next = seq + 1
                    break
                expected = seq + 1
            try:
                raw_send(xpub, frame, _SNDMORE_NOBLOCK)
            except zmq.Again:
                seq = keys.seq_of(seq8)
                answer.carry.append(([frame, value], seq, seq + 1))  # sent (and charged) later
                answer.stalled_since = time.monotonic()
                answer.left -= 1
                answer.next = seq + 1
                break
            send_rest(value)
            if first_seq8 is None:
                first_seq8 = seq8
            last_seq8 = seq8
            spent += per_message + len(value)
            sent += 1
            left -= 1
            if left <= 0 or sent >= budget or spent >= room:
                break
        else:
            answer.exhausted = True  # no more records in the partition
        answer.left -= sent
        if first_seq8 is not None:
            answer.next = max(answer.next, keys.seq_of(last_seq8) + 1)
            self._ledger.sent(answer.requester, answer.partition, keys.seq_of(first_seq8), keys.seq_of(last_seq8) + 1,
                              spent)
        return sent

    def _send_bulk(self, answer: _Answer, budget: int, room: int, end: int) -> int:
        """DIRECT-RECORDS, each with up to :data:`dafka.protocol.bulk.MAX_BYTES` of
        records read in one go from LevelDB and packed in C, until ``budget``
        records or ``room`` bytes are spent or ``end``."""
        db = self._db
        prefix = answer.prefix
        head = self._head(prefix)
        sent = spent = 0
        while sent < budget and spent < room and answer.next < end:
            first = answer.next
            n = min(end - first, answer.chunk, head + 1 - first)  # (not past the head: _head)
            if n <= 0:
                answer.exhausted = True
                break
            # fill_cache=False: a scan would evict the blocks live traffic uses, and costs 30 % more.
            # islice: n values and not one step more, which would look past the head.
            values = list(islice(db.iterator(start=_key(prefix, self._from(prefix, first)), stop=_key(prefix, first + n),
                                             include_key=False, fill_cache=False), n))
            if len(values) != n:
                start, values = self._contiguous_run(answer, first, n, head)
                gaps = self._holes(answer) == GAP
                if start > first and gaps and not answer.exhausted:
                    # records compaction removed (rfc 19): said in one message, and the answer goes on
                    gap = proto.encode(proto.DirectGapMsg(answer.requester, answer.producer, answer.subject,
                                                          first, start))
                    self.gaps_sent += 1
                    answer.next = start
                    answer.end = min(answer.end + start - first, proto.MAX_SEQUENCE + 1)
                    end = min(end + start - first, proto.MAX_SEQUENCE + 1)
                    if not self._send_message(answer, gap, start, start):
                        answer.carry.append((gap, start, start))
                        break
                first = start
                if not values:
                    if gaps and not answer.exhausted:
                        continue
                    break
            n = len(values)
            lengths, contents = proto.pack_contents(values)
            del values
            frame = (answer.out_prefix + first.to_bytes(8, "big") + n.to_bytes(4, "big")
                     + proto.encode_stamps(self._stamps(answer, first, first + n)))
            answer.next = first + n
            answer.chunk = bulk_answers.next_count(n, len(contents))
            frames = [frame, lengths, contents]
            if answer.keys_prefix is not None:
                frames += self._record_keys(answer.keys_prefix, first, n)
                frames += self._record_attributes(answer.attributes_prefix, first, n)
            if not self._send_message(answer, frames, first, first + n):
                answer.carry.append((frames, first, first + n))
                break
            sent += n
            spent += sum(map(len, frames)) + MESSAGE_OVERHEAD
        return sent

    def _record_keys(self, prefix: bytes, first: int, n: int) -> tuple[bytes, bytes]:
        """Frames 4 and 5 of a DIRECT-KEYED-RECORDS of records ``first .. first+n-1``: their keys, kept
        apart from the records (store/keys.py), read in one seek (which finds none in an unkeyed topic)."""
        found = {keys.seq_of(key[-keys.SEQ_BYTES:]): value[1:] for key, value in self._db.iterator(
            start=_key(prefix, first), stop=_key(prefix, first + n), fill_cache=False)}  # (after the flag)
        if not found:
            return b"", b""
        return proto.pack_keys([found.get(seq) for seq in range(first, first + n)])

    def _record_attributes(self, prefix: bytes, first: int, n: int) -> tuple[bytes, bytes, bytes]:
        """Frames 6, 7 and 8 of a DIRECT-KEYED-RECORDS of records ``first .. first+n-1``: their attributes
        (rfc 18.4), read in one seek as their keys are (none in a topic that no Kafka producer writes)."""
        start, stop = _key(prefix, first), _key(prefix, first + n)
        values = list(self._db.iterator(start=start, stop=stop, include_key=False, fill_cache=False))
        if not values:
            return b"", b"", b""
        if len(values) == n:  # every record has some (a Kafka producer's): the entries are the frames' parts
            cut = keys.ENTRY_TIME.size
            joined = b"".join(values)
            if len(joined) == cut * n:  # timestamps and no headers: the entries are frame 6, back to back
                return joined, bytes(4 * n), b""
            blobs = [value[cut:] for value in values]
            return (b"".join([value[:cut] for value in values]), struct.pack(f"<{n}I", *map(len, blobs)),
                    b"".join(blobs))
        entries = self._db.iterator(start=start, stop=stop, fill_cache=False)  # (which records have some)
        found = {keys.seq_of(key[-keys.SEQ_BYTES:]): keys.attributes_of_entry(value) for key, value in entries}
        return attributes_frames(list(map(found.get, range(first, first + n))))

    def _contiguous_run(self, answer: _Answer, first: int, n: int, head: int) -> tuple[int, list[bytes]]:
        """The records from ``first`` on when ``first .. first+n-1`` (at most
        the ``head``) are not all stored: the run of consecutive ones the
        range starts with (from the first one stored, if ``first`` itself is
        gone); none when the partition has nothing more."""
        prefix = answer.prefix
        items = list(islice(self._db.iterator(start=_key(prefix, self._from(prefix, first)), stop=_key(prefix, first + n)),
                            n))
        if not items:
            start = self._from(prefix, first + n)
            later = None if start > head else next(
                self._db.iterator(start=_key(prefix, start), stop=keys.prefix_end(prefix), include_value=False), None)
            if later is None:
                answer.exhausted = True
                return first, []
            answer.next = keys.seq_of(later[-keys.SEQ_BYTES:])  # a gap: the requester FETCHes it, and learns the tail
            return answer.next, []
        start = keys.seq_of(items[0][0][-keys.SEQ_BYTES:])
        run = 1
        while run < len(items) and keys.seq_of(items[run][0][-keys.SEQ_BYTES:]) == start + run:
            run += 1
        return start, [value for _, value in items[:run]]

    def _stamps(self, answer: _Answer, first: int, end: int) -> list[tuple[int, int]]:
        """When records ``first .. end-1`` were received, from the store's
        stamps (rfc section 12.1): (first sequence, unix ms) pairs, with
        :data:`dafka.protocol.codec.UNKNOWN_TIME` over a range that no stamp covers."""
        prefix = keys.STAMP + answer.prefix[1:]
        db = self._db
        # The stamp of ``first`` is the last one that starts at or before it.  Neither read looks past the
        # partition's newest stamp (see _head): a reverse seek from first + 1 when a newer stamp is known,
        # else a read from the newest itself (the writer shares where it starts: SharedDB.newest_stamps).
        newest = self._shared.newest_stamps.get(answer.prefix, -1)
        if 0 <= newest <= first:
            start = _key(prefix, newest)
        else:
            floor = _key(prefix, self._from(answer.prefix, 0))  # the stamps below it were deleted
            before = next(db.iterator(start=floor, stop=_key(prefix, first + 1), reverse=True), None)
            start = before[0] if before is not None else floor
        stamps: list[tuple[int, int]] = []
        covered = first  # every record below this one has a time (or is before the message)
        for key, value in db.iterator(start=start, stop=_key(prefix, end)):
            try:
                stamp = keys.decode_stamp(key, value)
            except ValueError:
                continue
            if stamp.last >= covered:
                start_seq = max(stamp.first, first)
                if start_seq > covered:
                    stamps.append((covered, proto.UNKNOWN_TIME))
                if not (stamps and stamps[-1][1] == stamp.unix_ms):
                    stamps.append((start_seq, stamp.unix_ms))
                covered = stamp.last + 1
                if covered >= end:
                    break  # before the next step, which would look past the newest stamp
        if stamps and covered < end:
            stamps.append((covered, proto.UNKNOWN_TIME))
        return stamps

    def _pace(self, answer: _Answer) -> None:
        """Tell a requester without bulk answers, with a DIRECT-HEAD after
        what was sent, that the partition holds more than it got: a reference
        consumer FETCHes again only on a HEAD, a DIRECT-HEAD or a gap, and the
        producer may be gone (rfc section 6.7)."""
        head = self._head(answer.prefix)
        if head < answer.next:
            return
        try:
            frames = proto.encode(proto.DirectHeadMsg(answer.requester, answer.producer, answer.subject, head))
        except ValueError:
            return
        if self._send_now(frames):
            self.paced += 1

    def _send_message(self, answer: _Answer, frames: list[bytes], first: int, end: int) -> bool:
        """Send one message of an answer without blocking and charge its
        records ``first .. end-1`` to the requester; False if its pipe is full."""
        try:
            raw_send(self._xpub, frames[0], _SNDMORE_NOBLOCK if len(frames) > 1 else zmq.NOBLOCK)
        except zmq.Again:
            if answer.stalled_since is None:
                answer.stalled_since = time.monotonic()
            return False
        last = len(frames) - 1
        for i in range(1, len(frames)):
            self._send_rest(frames[i], more=i < last)
        if end > first:
            self._ledger.sent(answer.requester, answer.partition, first, end,
                              sum(map(len, frames)) + MESSAGE_OVERHEAD)
            if len(frames) >= 3:
                self.bulk_messages += 1
        return True

    def _flush_carry(self, answer: _Answer) -> int:
        """Send what was taken from the database but not sent; returns the
        records sent.  Leaves ``answer.carry`` non-empty if there is no room."""
        carry = answer.carry
        sent = 0
        while carry:
            frames, first, end = carry[0]
            if not self._send_message(answer, frames, first, end):
                return sent
            sent += end - first
            carry.popleft()
        answer.stalled_since = None
        return sent

    def _send_rest(self, frame: bytes, more: bool = False) -> None:
        """A frame after an accepted first frame: libzmq only checks the
        high-water mark at the start of a message, so this cannot fail with
        EAGAIN; if it ever did, block rather than cut the message.  A big
        frame (a DIRECT-RECORDS' contents) is handed over without a copy: a
        copy of 256 KiB costs 70 us, the hand-over 5."""
        flags = _SNDMORE_NOBLOCK if more else zmq.NOBLOCK
        copy = len(frame) < ZERO_COPY_BYTES
        try:
            raw_send(self._xpub, frame, flags, copy)
        except zmq.Again:
            self._xpub.send(frame, flags & ~zmq.NOBLOCK, copy=copy)

    # -- reporting -------------------------------------------------------------

