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
  ``store/fetch_inflight_bytes`` of answers in flight (:mod:`dafka.inflight`):
  beyond that its answers pause until its next FETCH shows what arrived, so a
  requester that asks and never reads costs a bounded amount of memory.
* GET-HEADS and each subject of a CONSUMER-HELLO: a DIRECT-HEAD per partition
  of exactly that subject (the reference matches a prefix: ``hello`` also
  answered ``hello2``).
* A subscription ``L<consumer>`` seen on the XPUB: STORE-HELLO.
"""

from __future__ import annotations

import logging
import time
from collections import deque

import plyvel
import zmq

from dafka import proto
from dafka.config import Config
from dafka.inflight import MESSAGE_OVERHEAD, InflightLedger
from dafka.loop import Loop
from dafka.peer import raw_send

from . import keys
from .database import SharedDB
from .role import RoleThread

log = logging.getLogger(__name__)

SLICE = 10_000  # records sent per loop iteration, across all answers
DRAIN = 10_000  # requests handled per wake-up
STALL_TIMEOUT = 10.0  # seconds an answer may wait for room (pipe or budget) before it is dropped
_STALL_POLL = 0.005  # seconds between attempts while every answer waits for room in a pipe
_PAUSE_CHECK = 1.0  # seconds between looks at answers paused by the budget (only to drop old ones)

_SNDMORE_NOBLOCK = zmq.SNDMORE | zmq.NOBLOCK


class _Answer:
    """One FETCH being answered."""

    __slots__ = ("key", "requester", "subject", "producer", "partition", "prefix", "out_prefix", "seq", "left",
                 "it", "carry", "first", "stalled_since", "paused_since", "done")

    def __init__(self, requester: str, subject: str, producer: str, seq: int, count: int) -> None:
        self.key = (requester, subject, producer)
        self.requester = requester
        self.subject = subject
        self.producer = producer
        self.partition = (subject, producer)
        self.prefix = keys.partition_prefix(keys.RECORD, subject, producer)
        self.out_prefix = proto.record_prefix(proto.DIRECT_RECORD, requester, producer, subject)
        self.seq = seq
        self.left = count
        self.it = None
        self.carry: list[list[bytes]] = []  # messages taken from the iterator but not sent yet
        self.first = True
        self.stalled_since: float | None = None  # its requester's pipe is full
        self.paused_since: float | None = None  # its requester's budget is spent
        self.done = False

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


class Reader(RoleThread):
    def __init__(
        self, ctx: zmq.Context, config: Config, db: SharedDB, address: str, writer_address: str,
        name: str = "store-reader",
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
        for prefix in (
            proto.subscription(proto.FETCH),
            proto.subscription(proto.GET_HEADS),
            proto.subscription(proto.CONSUMER_HELLO, address),
        ):
            self._sub.setsockopt(zmq.SUBSCRIBE, prefix)
        super().__init__(ctx, config, self._xpub, self._sub, address, name)
        self._answers: deque[_Answer] = deque()
        self._by_key: dict[tuple[str, str, str], _Answer] = {}
        self._ledger = InflightLedger(config["store/fetch_inflight_bytes"])
        # counters
        self.malformed = 0
        self.fetches = 0  # FETCHes answered (at least one record or tail)
        self.records_sent = 0
        self.tails_sent = 0
        self.heads_sent = 0
        self.hellos_sent = 0
        self.dropped = 0  # answers abandoned or messages not sent for lack of room
        self.paused = 0  # times an answer paused on its requester's budget

    # -- the thread -----------------------------------------------------------

    def _run(self) -> None:
        loop = Loop()
        loop.add_reader(self._sub, self._on_sub)
        loop.add_reader(self._xpub, self._on_xpub)
        loop.add_reader(self._data.beacon.events, self._links.on_beacon)
        loop.add_reader(self._wake, self._on_wake)
        try:
            while not self._stopping:
                timeout = self._wait_for_answers()
                loop.run_once(timeout)
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
            for sock in (self._sub, self._xpub, self._wake):
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
            if sub.msg_id == proto.DIRECT_RECORD and sub.topic:
                self._ledger.listening(sub.topic, sub.subscribe)
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
        """DIRECT-HEAD for every partition of exactly ``subject``; the empty
        subject asks for every partition of every topic (a reference store,
        matching prefixes, answers it the same way)."""
        raw = keys.to_bytes(subject)
        if not keys.valid_name(raw):
            return
        prefix = keys.HEAD + raw + b"\0" if raw else keys.HEAD
        for key, value in self._db.iterator(prefix=prefix):
            try:
                parsed = keys.parse_key(key)
            except ValueError:
                continue
            if len(value) != keys.SEQ_BYTES or (raw and parsed.subject != subject):
                continue
            try:
                frames = proto.encode(proto.DirectHeadMsg(requester, parsed.address, parsed.subject,
                                                          keys.seq_of(value)))
            except ValueError:
                self.malformed += 1
                return
            if self._send_now(frames):
                self.heads_sent += 1

    def _on_fetch(self, msg: proto.FetchMsg) -> None:
        if msg.address == self.writer_address or msg.count == 0:
            return
        if not (keys.valid_name(keys.to_bytes(msg.subject)) and keys.valid_name(keys.to_bytes(msg.topic))):
            return
        try:
            answer = _Answer(msg.address, msg.subject, msg.topic, msg.sequence, msg.count)
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
            answer.it = self._db.iterator(
                start=answer.prefix + keys.seq_bytes(msg.sequence), stop=keys.prefix_end(answer.prefix)
            )
            self._by_key[answer.key] = answer
            self._answers.append(answer)

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
            sent, finished = self._serve_one(answer, budget)
            budget -= sent
            self.records_sent += sent
            if finished:
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

    def _serve_one(self, answer: _Answer, budget: int) -> tuple[int, bool]:
        """Send part of one answer: (records sent, finished)."""
        sent = self._flush_carry(answer)
        if answer.carry:
            return sent, False
        it = answer.it
        if it is None or answer.left <= 0:
            return sent, True
        room = self._ledger.room(answer.requester)
        if room <= 0:
            if answer.paused_since is None:
                answer.paused_since = time.monotonic()
                self.paused += 1
            return sent, False
        answer.paused_since = None
        out_prefix = answer.out_prefix
        if answer.first:
            answer.first = False
            try:
                key, value = next(it)
            except StopIteration:
                return sent, True  # nothing stored at or after the sequence asked for
            self.fetches += 1
            seq8 = key[-8:]
            oldest = keys.seq_of(seq8)
            if oldest > answer.seq:
                # The records before this one are gone (retention): say so first.
                answer.carry.append(
                    proto.encode(proto.DirectTailMsg(answer.requester, answer.producer, answer.subject, oldest))
                )
                self.tails_sent += 1
            answer.carry.append([out_prefix + seq8, value])
            answer.left -= 1
            sent += self._flush_carry(answer)
            if answer.carry:
                return sent, False
            if answer.left <= 0:
                return sent, True
            room = self._ledger.room(answer.requester)
        if sent >= budget or room <= 0:
            return sent, False
        xpub = self._xpub
        send_rest = self._send_rest
        per_message = len(out_prefix) + keys.SEQ_BYTES + MESSAGE_OVERHEAD
        left = answer.left
        spent = 0
        first_seq8 = last_seq8 = None
        for key, value in it:
            seq8 = key[-8:]
            frame = out_prefix + seq8
            try:
                raw_send(xpub, frame, _SNDMORE_NOBLOCK)
            except zmq.Again:
                answer.carry.append([frame, value])  # taken from the iterator: sent (and charged) later
                answer.stalled_since = time.monotonic()
                left -= 1
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
            left = 0  # no more records in the partition
        answer.left = left
        if first_seq8 is not None:
            self._ledger.sent(answer.requester, answer.partition, keys.seq_of(first_seq8),
                              keys.seq_of(last_seq8) + 1, spent)
        return sent, left <= 0 and not answer.carry

    def _flush_carry(self, answer: _Answer) -> int:
        """Send what was taken from the iterator but not sent; returns the
        records sent.  Leaves ``answer.carry`` non-empty if there is no room."""
        carry = answer.carry
        sent = 0
        send = self._xpub.send
        while carry:
            frames = carry[0]
            try:
                if len(frames) == 2:
                    send(frames[0], _SNDMORE_NOBLOCK)
                    self._send_rest(frames[1])
                    sent += 1
                    seq = keys.seq_of(frames[0][-8:])
                    self._ledger.sent(answer.requester, answer.partition, seq, seq + 1,
                                      len(frames[0]) + len(frames[1]) + MESSAGE_OVERHEAD)
                else:
                    send(frames[0], zmq.NOBLOCK)
            except zmq.Again:
                if answer.stalled_since is None:
                    answer.stalled_since = time.monotonic()
                return sent
            carry.pop(0)
        answer.stalled_since = None
        return sent

    def _send_rest(self, content: bytes) -> None:
        """The content frame after an accepted first frame: libzmq only checks
        the high-water mark at the start of a message, so this cannot fail
        with EAGAIN; if it ever did, block rather than cut the message."""
        try:
            raw_send(self._xpub, content, zmq.NOBLOCK)
        except zmq.Again:
            self._xpub.send(content)

    # -- reporting -------------------------------------------------------------

