"""A raw-frame test peer that behaves exactly as the reference's consumer does
(zeromq/dafka ``dafka_consumer.c`` and ``dafka_fetch_filter.c`` at c2dc88d).

It is how the tests and the benchmark check that a reference consumer gets
everything from dafka-py peers without any extension:

* it subscribes like the reference: ``D``, ``E``, ``L`` + its address and
  ``M``, ``H`` + each topic, all without the NUL (prefix matching), and
  nothing else: no ``T``, ``R`` or ``P``;
* it FETCHes only on a HEAD, a DIRECT-HEAD or a gap, from the next sequence it
  lacks, for as many records as reach the next multiple of 100,000;
* every FETCH goes through the reference's fetch filter: the same (subject,
  partition, sequence / 100,000) is asked at most once per second of the
  monotonic clock (a 10,000-slot table indexed by the same hash, so that
  collisions behave the same);
* with ``earliest`` it sends GET-HEADS when it subscribes; it answers
  STORE-HELLO and a ``W<reader>`` subscription with CONSUMER-HELLO (its
  topics with ``earliest``, none with ``latest``);
* it drops every out-of-order record.

Every message it receives is checked to be an exact RFC 46 message: any other
id, or a frame the strict decoder refuses, is counted in ``foreign``.
"""

from __future__ import annotations

import time

import zmq

from dafka import protocol as proto
from dafka.discovery.beacon import CONNECT, Beacon

U64 = 2**64 - 1
FILTER_SIZE = 10_000
BLOCK = 100_000
RFC46_IDS = frozenset((proto.RECORD, proto.DIRECT_RECORD, proto.DIRECT_HEAD, proto.HEAD, proto.STORE_HELLO))


def _hash_string(raw: bytes, h: int = 0) -> int:
    """``hash = 33 * hash ^ *s++`` over a C ``char *`` (signed on x86), in uint64."""
    for c in raw:
        h = ((33 * h) ^ (c - 256 if c >= 128 else c)) & U64
    return h


class FetchFilter:
    """dafka_fetch_filter_send: suppress a FETCH identical in (subject,
    address, sequence / 100,000) to the one last sent from the same slot
    within the same second."""

    def __init__(self, clock=time.monotonic) -> None:
        self.clock = clock
        self.slots: dict[int, tuple[int, int, bytes, bytes]] = {}
        self.sent = 0
        self.filtered = 0

    def fetch(self, subject: bytes, address: bytes, sequence: int) -> int | None:
        """The count to FETCH from ``sequence``, or None when filtered."""
        sequence_hash = sequence // BLOCK
        time_hash = int(self.clock() * 1000) // 1000
        h = _hash_string(subject)
        h = ((33 * h) ^ _hash_string(address)) & U64
        h = ((33 * h) ^ sequence_hash) & U64
        h = ((33 * h) ^ time_hash) & U64
        index = h % FILTER_SIZE
        entry = (sequence_hash, time_hash, subject, address)
        if self.slots.get(index) == entry:
            self.filtered += 1
            return None
        self.slots[index] = entry
        self.sent += 1
        return (sequence_hash + 1) * BLOCK - sequence


class RefConsumer:
    """The reference consumer, driven by hand: call :meth:`run` to process
    messages; ``delivered[(topic, partition)]`` counts the records delivered
    in order, ``contents`` keeps them when ``keep`` is set."""

    def __init__(self, tower_sub: str, tower_pub: str, address: str, *, earliest: bool, keep: bool = False) -> None:
        ctx = zmq.Context.instance()
        self.address = address
        self.raw_address = address.encode()
        self.earliest = earliest
        self.keep = keep
        self.xpub = ctx.socket(zmq.XPUB)
        self.xpub.setsockopt(zmq.XPUB_VERBOSE, 1)
        self.xpub.sndhwm = 1_000_000
        self.xpub.linger = 0
        port = self.xpub.bind_to_random_port("tcp://127.0.0.1")
        self.sub = ctx.socket(zmq.SUB)
        self.sub.rcvhwm = 1_000_000
        self.sub.linger = 0
        for msg_id in (proto.DIRECT_RECORD, proto.DIRECT_HEAD, proto.STORE_HELLO):
            self.sub.setsockopt(zmq.SUBSCRIBE, msg_id + self.raw_address)
        self.beacon = Beacon(ctx, address, port, host="127.0.0.1", tower_sub=tower_sub, tower_pub=tower_pub,
                             interval_ms=200, name="refconsumer").start()
        self.peers: set[str] = set()
        self.topics: list[bytes] = []
        self.last: dict[tuple[bytes, bytes], int] = {}  # (subject, partition) -> last delivered sequence
        self.filter = FetchFilter()
        self.delivered: dict[tuple[str, str], int] = {}
        self.contents: dict[tuple[str, str], list[bytes]] = {}
        self.fetches: list[proto.FetchMsg] = []
        self.foreign = 0  # messages that are not exact RFC 46 messages
        self.received = 0
        # frame 1 of a known partition's DIRECT-RECORD or RECORD, less its sequence -> (subject, partition)
        self._known: dict[bytes, tuple[bytes, bytes]] = {}

    def subscribe(self, topic: str) -> None:
        raw = topic.encode()
        self.topics.append(raw)
        self.sub.setsockopt(zmq.SUBSCRIBE, proto.RECORD + raw)
        self.sub.setsockopt(zmq.SUBSCRIBE, proto.HEAD + raw)
        if self.earliest:
            self.xpub.send(proto.encode(proto.GetHeadsMsg(topic, self.address))[0])

    def total(self) -> int:
        return sum(self.delivered.values())

    def run(self, until, timeout: float) -> bool:
        """Process messages until ``until()`` is true (True) or ``timeout`` seconds pass (False)."""
        deadline = time.monotonic() + timeout
        while not until():
            if time.monotonic() >= deadline:
                return False
            self.step(0.02)
        return True

    def step(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for messages and process what came."""
        self._pump()
        if self.sub.poll(int(timeout * 1000)):
            self._drain(10_000)

    # -- what the reference's actor does ---------------------------------------

    def _pump(self) -> None:
        for event in Beacon.read_events(self.beacon.events):
            if event.kind == CONNECT and event.endpoint not in self.peers:
                self.peers.add(event.endpoint)
                self.sub.connect(event.endpoint)
        while True:
            try:
                frame = self.xpub.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            if frame[:1] == b"\x01" and frame[1:2] == proto.CONSUMER_HELLO and len(frame) > 2:
                self._hello(frame[2:].rstrip(b"\0").decode())

    def _hello(self, reader: str) -> None:
        subjects = tuple(t.decode() for t in self.topics) if self.earliest else ()
        self.xpub.send(proto.encode(proto.ConsumerHelloMsg(reader, self.address, subjects))[0])

    def _drain(self, limit: int) -> None:
        sub = self.sub
        known = self._known
        for _ in range(limit):
            try:
                frame = sub.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            self.received += 1
            key = known.get(frame[:-8])
            if key is not None:  # a known partition's record header: its content is here (messages are atomic)
                try:
                    content = sub.recv(zmq.NOBLOCK)
                except zmq.Again:
                    self.foreign += 1
                    continue
                self._record(key, int.from_bytes(frame[-8:], "big"), content)
                continue
            frames = [frame]
            while sub.getsockopt(zmq.RCVMORE):
                frames.append(sub.recv(zmq.NOBLOCK))
            if frame[:1] not in RFC46_IDS:
                self.foreign += 1
                continue
            try:
                msg = proto.decode(frames)
            except proto.MalformedMessage:
                self.foreign += 1
                continue
            self._message(msg)

    def _message(self, msg) -> None:
        kind = type(msg)
        if kind is proto.StoreHelloMsg:
            self._hello(msg.address)
            return
        subject, address = msg.subject.encode(), msg.address.encode()
        key = (subject, address)
        if kind is proto.RecordMsg or kind is proto.DirectRecordMsg:
            known = key in self.last
            if not known:
                self._start(key, msg.sequence)
            self._known[proto.record_prefix(proto.DIRECT_RECORD, self.address, msg.address, msg.subject)] = key
            self._known[proto.record_prefix(proto.RECORD, msg.subject, msg.address, msg.subject)] = key
            self._record(key, msg.sequence, msg.content)
        elif kind is proto.HeadMsg or kind is proto.DirectHeadMsg:
            known = key in self.last
            if not known:
                self._start(key, msg.sequence)
            last = self.last[key]
            if not known or msg.sequence > last:
                self._fetch(key, (last + 1) & U64)

    def _start(self, key: tuple[bytes, bytes], sequence: int) -> None:
        """s_set_inital_offset: latest -> sequence - 1; earliest -> -1 (so that last + 1 is 0)."""
        self.last[key] = U64 if self.earliest else (sequence - 1) & U64

    def _record(self, key: tuple[bytes, bytes], sequence: int, content: bytes) -> None:
        last = self.last[key]
        nxt = (last + 1) & U64
        if sequence > nxt:
            self._fetch(key, nxt)
        elif sequence == nxt:
            self.last[key] = sequence
            name = (key[0].decode(), key[1].decode())
            self.delivered[name] = self.delivered.get(name, 0) + 1
            if self.keep:
                self.contents.setdefault(name, []).append(content)

    def _fetch(self, key: tuple[bytes, bytes], sequence: int) -> None:
        count = self.filter.fetch(key[0], key[1], sequence)
        if count is None:
            return
        msg = proto.FetchMsg(key[1].decode(), self.address, key[0].decode(), sequence, count)
        self.fetches.append(msg)
        self.xpub.send(proto.encode(msg)[0])

    def close(self) -> None:
        self.beacon.stop()
        self.xpub.close(0)
        self.sub.close(0)
