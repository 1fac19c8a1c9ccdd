"""Live mode: read a running Dafka cluster through the protocol.

:class:`LivePeer` is a short-lived raw peer, the minimum a consumer needs: it
binds an XPUB (``xpub_verbose``) announced by a :class:`dafka.discovery.beacon.Beacon`,
and connects one SUB to every peer the tower reports, subscribed to what is
addressed to it (``D``, ``E``, ``L``, ``T`` + its own address, exact).  The
store readers in turn connect to it and subscribe ``F``, ``G`` and
``W<reader>``; seeing ``W<reader>`` on the XPUB is how it learns that a store
reader is there and listening.

* The peer announces bulk answers (:mod:`dafka.protocol.bulk`): dafka-py stores answer
  it with one DIRECT-PARTITIONS per request and DIRECT-RECORDS of many records
  each; reference stores with DIRECT-HEADs and DIRECT-RECORDs, as ever.
* The driver asks every store reader for the heads of the topic with
  CONSUMER-HELLO (subjects = [topic]) and collects the answers
  (:func:`discover`), until every peer the tower reported has connected back
  (or is known dead) and every store reader has answered: a DIRECT-PARTITIONS
  is a whole answer; after DIRECT-HEADs, nothing arriving for a short quiet
  period is.
* Each Spark task FETCHes its own offset range (:func:`fetch_range`) and keeps
  the records in sequence order, dropping duplicates (every store answers
  every FETCH, and so does a live producer for its unacked records), as Arrow
  arrays: a DIRECT-RECORDS becomes one without a Python step per record, its
  frames being an Arrow binary column's buffers.  An unanswered range is
  asked for again; a DIRECT-TAIL says the store's retention deleted the
  beginning.

Nothing here keeps state between calls: every function opens its own peer, on
its own ZeroMQ context, and closes both.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import numpy as np
import pyarrow as pa
import zmq
from zmq.utils.monitor import recv_monitor_message

from dafka.protocol import bulk
from dafka import protocol as proto
from dafka.discovery.beacon import CONNECT, Beacon
from dafka.config import Config
from dafka.core.inflight import fetch_window, mean_size
from dafka.discovery.links import DataSocket
from dafka.core.sockets import connect, read_rest, read_subscriptions
from dafka.core.addresses import new_address
from dafka.core.security import Curve
from dafka.store.running import RunningStore

from . import arrow
from .options import DafkaSparkError

log = logging.getLogger(__name__)

RCVHWM = 100_000  # messages queued for a slow task before the store waits (it never drops)
QUIET = 0.2  # seconds without news after which the heads are taken as complete
REPLAY_GRACE = 0.1  # seconds after a reference tower's welcome for its replay of the peers to arrive
RETRY = 1.0  # seconds without progress before a FETCH is repeated
READER_GRACE = 2.0  # seconds to wait for a store reader that holds the partition before asking anyone
DIRECT_GRACE = 2.0  # seconds a task waits for the readers known at planning before going through the tower
BATCH_ROWS = 32_768
BATCH_BYTES = 16 * 1024 * 1024

_MONITOR_EVENTS = zmq.EVENT_CONNECTED | zmq.EVENT_CONNECT_RETRIED | zmq.EVENT_DISCONNECTED


class TowerUnreachable(DafkaSparkError):
    """No tower answered."""


class NoStore(DafkaSparkError):
    """No store reader answered."""


class FetchTimeout(DafkaSparkError):
    """A range could not be read in time."""


class DataLoss(DafkaSparkError):
    """Records to read were deleted by a store's retention."""


@dataclass(frozen=True)
class ReaderAt:
    """A store reader reachable without a tower: its address, its data
    endpoint (the XPUB answers come from) and its request endpoint (the SUB it
    binds for requests, rfc section 7.3)."""

    reader: str
    data: str
    requests: str

    @classmethod
    def running(cls, store: RunningStore) -> "ReaderAt":
        return cls(store.reader, store.data, store.requests)


class LivePeer:
    """A raw Dafka peer for one short job; use as a context manager.

    It finds the store readers through the tower, or, given ``direct``
    readers (what a running store left in its directory, store/running.py, or
    what the stores said of themselves at planning), talks to those alone:
    its SUB connects to each reader's data endpoint and its XPUB to each
    reader's request endpoint, with no tower and no beacon."""

    def __init__(self, config: Config, *, name: str = "spark", direct: Sequence[ReaderAt] = ()) -> None:
        self.config = config
        self.address = new_address()
        self.name = name
        self._ctx = zmq.Context()
        self._sockets: list[zmq.Socket] = []
        self.beacon: Beacon | None = None
        self.data: DataSocket | None = None  # with a tower: what announces us (and answers PEER-INFO, rfc 17)
        self.peers: dict[str, str] = {}  # endpoint -> sender, as the tower reports them
        try:
            self.xpub = self._socket(zmq.XPUB)
            self.xpub.setsockopt(zmq.XPUB_VERBOSE, 1)
            self.sub = self._socket(zmq.SUB)
            self.sub.rcvhwm = RCVHWM
            for msg_id in (proto.DIRECT_RECORD, proto.DIRECT_HEAD, proto.STORE_HELLO, proto.DIRECT_TAIL,
                           proto.DIRECT_GAP):
                self.sub.setsockopt(zmq.SUBSCRIBE, proto.subscription(msg_id, self.address, exact=True))
            if config["consumer/bulk"]:
                for prefix in bulk.subscriptions(self.address, keys=True):
                    self.sub.setsockopt(zmq.SUBSCRIBE, prefix)
            self.monitor = self.sub.get_monitor_socket(_MONITOR_EVENTS)
            self._sockets.append(self.monitor)
            if not direct:
                self.data = DataSocket(self._ctx, config, self.xpub, self.address, name)
                self.endpoint = self.data.endpoint
                self.beacon = self.data.beacon.start()
            else:
                curve = Curve.from_config(config)
                if curve is not None:
                    curve.client(self.xpub)
                    curve.client(self.sub)
                self.endpoint = ", ".join(r.requests for r in direct)
                for reader in direct:
                    if connect(self.xpub, reader.requests) and connect(self.sub, reader.data):
                        self.peers[reader.data] = reader.reader
        except BaseException:
            self.close()
            raise
        self.dead: set[str] = set()  # endpoints that refuse connections
        self.subscribers: set[str] = set()  # addresses seen in subscriptions to our XPUB
        # A store reader is *ready* once it listens to us (its SUB subscribed
        # W<reader> on our XPUB, so it gets what we send) and we hear it (it
        # sent STORE-HELLO, so our SUB's subscriptions reached its XPUB):
        # before that, a request could be lost or answered into the void.
        self.listening: dict[str, float] = {}  # reader -> when it subscribed to us
        self.hearing: set[str] = set()  # readers that sent us STORE-HELLO
        self.ready: list[str] = []  # readers ready, in order
        self.new_ready: list[str] = []
        self.changed = time.monotonic()
        # with a tower: when it welcomed us (its replay of the peers follows); direct: no replay to wait for
        self.welcomed_at: float | None = float("-inf") if direct else None

    def _socket(self, kind: int) -> zmq.Socket:
        sock = self._ctx.socket(kind)
        sock.linger = 0
        self._sockets.append(sock)
        return sock

    def close(self) -> None:
        stuck = False
        if self.beacon is not None:
            self.beacon.stop()
            thread = getattr(self.beacon, "_thread", None)
            stuck = thread is not None and thread.is_alive()
            self.beacon = None
        for sock in self._sockets:
            sock.close(0)
        self._sockets.clear()
        if stuck:  # its sockets are still open: term() would wait for them forever
            log.warning("dafka.spark: a beacon thread did not stop; leaving its ZeroMQ context to the process")
        else:
            self._ctx.term()

    def __enter__(self) -> "LivePeer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- discovery ----------------------------------------------------------

    def wait_tower(self, timeout: float) -> None:
        if self.beacon is None:
            return  # direct: no tower
        if not self.beacon.wait_connected(timeout):
            raise TowerUnreachable(
                f"no Dafka tower answered within {timeout:.0f} s at {self.config['beacon/pub_address']} "
                f"(beacons sent to {self.config['beacon/sub_address']}): check that the tower runs and that "
                f'option "tower" is its XPUB address and "towerSub" its XSUB address '
                f"(tower/pub_address and tower/sub_address in its configuration)"
            )
        self.welcomed_at = time.monotonic()

    def pump(self) -> None:
        """Apply discovery events, connection events and new subscriptions."""
        now = time.monotonic()
        for event in Beacon.read_events(self.beacon.events) if self.beacon is not None else ():
            if event.kind == CONNECT:
                if event.endpoint not in self.peers and not connect(self.sub, event.endpoint):
                    continue
                self.peers[event.endpoint] = event.sender
            elif self.peers.pop(event.endpoint, None) is not None:
                self.dead.discard(event.endpoint)
                try:
                    self.sub.disconnect(event.endpoint)
                except zmq.ZMQError:
                    pass
            self.changed = now
        while True:
            try:
                msg = recv_monitor_message(self.monitor, zmq.NOBLOCK)
            except zmq.Again:
                break
            endpoint = msg["endpoint"].decode(errors="replace")
            if msg["event"] == zmq.EVENT_CONNECTED and endpoint in self.dead:
                self.dead.discard(endpoint)
                self.changed = now
            elif msg["event"] == zmq.EVENT_CONNECT_RETRIED and endpoint not in self.dead:
                self.dead.add(endpoint)  # (retries repeat: only the first one is news)
                self.changed = now
        for sub in read_subscriptions(self.xpub):
            if sub is None or not sub.topic or (self.data is not None and self.data.answer_info(sub)):
                continue
            if sub.subscribe:
                self.subscribers.add(sub.topic)
                if sub.msg_id == proto.CONSUMER_HELLO and sub.topic not in self.listening:
                    self.listening[sub.topic] = now
                    self._check_ready(sub.topic)
            elif sub.msg_id == proto.CONSUMER_HELLO:
                self.listening.pop(sub.topic, None)  # that reader went away
                self.hearing.discard(sub.topic)
                if sub.topic in self.ready:
                    self.ready.remove(sub.topic)
            self.changed = now

    def _check_ready(self, reader: str) -> None:
        if reader in self.listening and reader in self.hearing and reader not in self.ready:
            self.ready.append(reader)
            self.new_ready.append(reader)
            self.changed = time.monotonic()

    def on_control(self, msg) -> None:
        """A one-frame message other than the answers a caller waits for."""
        if type(msg) is proto.StoreHelloMsg and msg.topic == self.address and msg.address not in self.hearing:
            self.hearing.add(msg.address)
            self._check_ready(msg.address)

    def wait_ready(self, timeout: float, prefer: set[str] = frozenset(), grace: float = 0.0) -> bool:
        """Wait until a store reader is ready: one of ``prefer`` if it comes
        within ``grace`` seconds, else any.  False after ``timeout``."""
        began = time.monotonic()
        while True:
            self.pump()
            msg = self.recv(0.005)
            while msg is not None:
                self.on_control(msg)
                msg = self.recv(0)
            waited = time.monotonic() - began
            if prefer & set(self.ready) or (self.ready and (waited >= grace or not prefer)):
                return True
            if waited >= timeout:
                return False

    def settled(self) -> bool:
        """Has every live peer the tower reported connected back to us?"""
        if self.welcomed_at is None:
            return False
        if time.monotonic() - self.welcomed_at < REPLAY_GRACE and not (self.beacon and self.beacon.replayed):
            return False
        if any(reader not in self.hearing for reader in self.listening):
            return False
        return all(sender in self.subscribers for ep, sender in self.peers.items() if ep not in self.dead)

    def send(self, msg) -> None:
        self.xpub.send_multipart(proto.encode(msg))

    def recv(self, timeout: float):
        """The next decoded message for us, or None after ``timeout`` seconds."""
        if not self.sub.poll(max(0, int(timeout * 1000))):
            return None
        frames = self.sub.recv_multipart(zmq.NOBLOCK)
        try:
            return proto.decode(frames)
        except proto.MalformedMessage:
            return None

    def collect_heads(self, topic: str, timeout: float) -> "Discovery":
        """Ask every store reader for the partitions of ``topic``: each one's
        highest head, and its lowest tail where every reader said (a
        DIRECT-PARTITIONS does; a DIRECT-HEAD does not)."""
        deadline = time.monotonic() + timeout
        heads: dict[str, int] = {}
        tails: dict[str, int] = {}
        held: dict[str, dict[str, int]] = {}  # partition -> reader -> its head there
        asked: set[str] = set()
        whole: set[str] = set()  # readers whose DIRECT-PARTITIONS came: their answer is complete
        requests: dict[str, str] = {}  # reader -> its request endpoint, as its DIRECT-PARTITIONS said
        self.new_ready = list(self.ready)  # a new round asks every ready reader again
        last_news = time.monotonic()
        while True:
            self.pump()
            msg = self.recv(0.01 if asked - whole or not self.settled() else 0.002)
            while msg is not None:
                kind = type(msg)
                if kind is proto.DirectPartitionsMsg and msg.topic == self.address:
                    for info in msg.partitions:
                        if info.subject == topic:
                            heads[info.address] = max(heads.get(info.address, -1), info.head)
                            tails[info.address] = min(tails.get(info.address, info.tail), info.tail)
                            held.setdefault(info.address, {})[msg.address] = info.head
                    whole.add(msg.address)
                    if msg.endpoint:
                        requests[msg.address] = msg.endpoint
                    last_news = time.monotonic()
                elif kind is proto.DirectHeadMsg:
                    if msg.topic == self.address and msg.subject == topic:
                        heads[msg.address] = max(heads.get(msg.address, -1), msg.sequence)
                        last_news = time.monotonic()
                else:
                    self.on_control(msg)
                msg = self.recv(0)
            while self.new_ready:
                reader = self.new_ready.pop(0)
                if reader in self.ready:
                    self.send(proto.ConsumerHelloMsg(reader, self.address, (topic,)))
                    asked.add(reader)
                    last_news = time.monotonic()
            now = time.monotonic()
            if self.settled() and ((asked and asked <= whole) or now - max(last_news, self.changed) >= QUIET):
                break
            if now >= deadline:
                log.info("dafka.spark: discovery of %r stopped after %.1f s without settling "
                         "(%d peers, %d readers)", topic, timeout, len(self.peers), len(asked))
                break
        exact = bool(asked) and asked <= whole
        data = {sender: endpoint for endpoint, sender in self.peers.items() if endpoint not in self.dead}
        direct = tuple(ReaderAt(r, data[r], requests[r]) for r in sorted(asked) if r in requests and r in data)
        return Discovery(heads, sorted(asked), len(self.peers), tails=tails if exact else None,
                         direct=direct if exact and len(direct) == len(asked) else (), held=held)


@dataclass
class Discovery:
    heads: dict[str, int]  # partition -> highest sequence stored
    readers: list[str]  # store reader addresses that were asked
    peers: int = 0
    tails: dict[str, int] | None = None  # partition -> oldest sequence kept, where every reader said
    direct: tuple[ReaderAt, ...] = ()  # every reader asked, reachable without the tower
    held: dict[str, dict[str, int]] = field(default_factory=dict)  # partition -> reader -> head it holds
    when: float = field(default_factory=time.time)

    def holders(self, partition: str, last: int) -> tuple[ReaderAt, ...]:
        """The direct readers that hold ``partition`` up to offset ``last`` (sharded stores, rfc 16, hold a
        partition on store/replicas stores only; a store that is still filling it holds less)."""
        held = self.held.get(partition, {})
        return tuple(r for r in self.direct if held.get(r.reader, -1) >= last)


def discover(config: Config, topic: str, *, tower_timeout: float, timeout: float,
             direct: Sequence[ReaderAt] = ()) -> Discovery:
    """The heads of ``topic`` on the stores (or on the ``direct`` ones), through a short-lived peer."""
    with LivePeer(config, name="spark-planner", direct=direct) as peer:
        peer.wait_tower(tower_timeout)
        return peer.collect_heads(topic, timeout)


def count_stores(config: Config, *, tower_timeout: float, timeout: float) -> int:
    """How many store readers are reachable through the tower."""
    with LivePeer(config, name="spark-writer-check") as peer:
        peer.wait_tower(tower_timeout)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            peer.pump()
            msg = peer.recv(0.01)
            while msg is not None:
                peer.on_control(msg)
                msg = peer.recv(0)
            if peer.settled() and time.monotonic() - peer.changed >= QUIET:
                break
        return len(peer.ready)


class Stream:
    """A peer that stays up between micro-batches (the driver of a streaming
    query): each :meth:`heads` call asks the stores again."""

    def __init__(self, config: Config, topic: str, *, tower_timeout: float, timeout: float,
                 direct: Sequence[ReaderAt] = ()) -> None:
        self.topic = topic
        self.timeout = timeout
        self.peer = LivePeer(config, name="spark-stream", direct=direct)
        try:
            self.peer.wait_tower(tower_timeout)
        except BaseException:
            self.peer.close()
            raise

    def heads(self) -> Discovery:
        return self.peer.collect_heads(self.topic, self.timeout)

    def close(self) -> None:
        self.peer.close()


# --------------------------------------------------------------------------
# Reading a range
# --------------------------------------------------------------------------


def fetch_range(
    config: Config,
    topic: str,
    partition: str,
    start: int,
    end: int,
    *,
    readers: list[str],
    from_earliest: bool,
    fail_on_data_loss: bool,
    tower_timeout: float,
    fetch_timeout: float,
    direct: Sequence[ReaderAt] = (),
    tower_fallback: bool = True,
) -> Iterator[tuple[int, pa.Array, pa.Array, pa.Array]]:
    """Records ``start .. end-1`` of a partition, as ``(first offset, values,
    receive times, keys)`` chunks of consecutive records (Arrow binary,
    timestamp and binary arrays; the time is null where no store said, the
    key where the record has none).

    ``readers`` are the store readers that held the partition at planning;
    ``from_earliest`` says ``start`` was "earliest", so records deleted by
    retention before it are skipped rather than reported as lost; ``direct``
    reads from those readers without the tower (no beacon, no discovery:
    tens of milliseconds less per task), falling back on the tower when
    ``tower_fallback`` and none of them answers within :data:`DIRECT_GRACE`
    seconds (restarted stores have new endpoints)."""
    if end <= start:
        return
    if direct:
        with LivePeer(config, name="spark-task", direct=direct) as peer:
            if peer.wait_ready(DIRECT_GRACE if tower_fallback else fetch_timeout):
                yield from _RangeReader(peer, config["consumer/fetch_max_bytes"], topic, partition, start, end,
                                        from_earliest, fail_on_data_loss, fetch_timeout).run()
                return
            if not tower_fallback:
                raise NoStore(f"the store reader at {peer.endpoint} did not answer within {fetch_timeout:.0f} s "
                              f"to read {topic}/{partition}")
            log.info("dafka.spark: no store reader answered at %s; reading %s/%s through the tower",
                     peer.endpoint, topic, partition)
    with LivePeer(config, name="spark-task") as peer:
        peer.wait_tower(tower_timeout)
        if not peer.wait_ready(fetch_timeout, prefer=set(readers), grace=READER_GRACE):
            raise NoStore(f"no store reader connected within {fetch_timeout:.0f} s to read "
                          f"{topic}/{partition} (stores at planning: {', '.join(readers) or 'none'})")
        yield from _RangeReader(peer, config["consumer/fetch_max_bytes"], topic, partition, start, end,
                                from_earliest, fail_on_data_loss, fetch_timeout).run()


class _RangeReader:
    """One task's reading of records ``start .. end-1`` through ``peer``.

    FETCH windows of about ``window_bytes``, the next one asked as soon as one
    is complete: a store pauses an answer beyond its in-flight budget
    (dafka.core.inflight) until the requester asks further.  What arrives in order
    collects as Arrow arrays (``parts``), or as the contents of DIRECT-RECORDs
    (``loose``) until something else comes, and leaves in chunks of about
    :data:`BATCH_ROWS` rows or :data:`BATCH_BYTES`."""

    def __init__(self, peer: LivePeer, window_bytes: int, topic: str, partition: str, start: int, end: int,
                 from_earliest: bool, fail_on_data_loss: bool, fetch_timeout: float) -> None:
        self.peer = peer
        self.window_bytes = window_bytes
        self.topic = topic
        self.partition = partition
        self.start = start
        self.end = end
        self.from_earliest = from_earliest
        self.fail_on_data_loss = fail_on_data_loss
        self.fetch_timeout = fetch_timeout
        self.prefix = proto.record_prefix(proto.DIRECT_RECORD, peer.address, partition, topic)
        self.bulk = bool(peer.config["consumer/bulk"])  # answered with DIRECT-RECORDS by dafka-py peers
        self.nxt = start  # the next offset to read
        self.first = start  # the offset of the first record collected and not yet yielded
        self.parts: list[tuple[pa.Array, pa.Array, pa.Array]] = []  # (values, times, keys)
        self.loose: list[bytes] = []
        self.rows = 0
        self.size = 0
        self.window_from = self.window_end = start
        self.record_size = -1
        self.received = 0  # content bytes received in the current window
        self.fetched_at = 0.0
        self.progress_at = time.monotonic()
        self.compacted = False  # the skip at hand is a DIRECT-GAP's (rfc 19), not a loss

    def fetch(self) -> None:
        nxt = self.nxt
        if nxt > self.window_from and self.received:
            self.record_size = mean_size(self.record_size, self.received // (nxt - self.window_from))
        count = min(self.end - nxt, proto.MAX_COUNT, fetch_window(self.window_bytes, self.record_size, self.bulk))
        self.peer.send(proto.FetchMsg(self.partition, self.peer.address, self.topic, nxt, count))
        self.window_from, self.window_end, self.received = nxt, nxt + count, 0
        self.fetched_at = time.monotonic()

    def run(self) -> Iterator[tuple[int, pa.Array, pa.Array, pa.Array]]:
        sub = self.peer.sub
        recv = sub.recv
        from_bytes = int.from_bytes
        prefix = self.prefix
        plen = len(prefix)
        flen = plen + 8
        self.fetch()
        while self.nxt < self.end:
            if not sub.poll(50):
                self._idle()
                continue
            before = self.nxt
            for _ in range(10_000):
                # Bytes, not zmq.Frame (0.6 us a message): a frame that is our
                # DIRECT-RECORD header is followed by its content, already here.
                try:
                    frame = recv(zmq.NOBLOCK)
                except zmq.Again:
                    break
                if len(frame) != flen or frame[:plen] != prefix:
                    tail = self._other(read_rest(sub, frame))
                    if tail is not None:
                        if self.rows:
                            yield self._take()  # a chunk holds consecutive offsets
                        self._skip_to(tail)
                else:
                    try:
                        value = recv(zmq.NOBLOCK)
                    except zmq.Again:
                        continue  # a header without its content: malformed
                    if from_bytes(frame[plen:], "big") != self.nxt:
                        continue  # a duplicate (another store, a repeated answer) or ahead of a gap
                    self.loose.append(value)
                    self.size += len(value)
                    self.received += len(value)
                    self.rows += 1
                    self.nxt += 1
                if self.nxt >= self.end:
                    break
                if self.rows >= BATCH_ROWS or self.size >= BATCH_BYTES:
                    yield self._take()
                if self.nxt >= self.window_end:
                    self.fetch()
            if self.nxt != before:
                self.progress_at = time.monotonic()
        if self.rows:
            yield self._take()

    def _idle(self) -> None:
        now = time.monotonic()
        self.peer.pump()
        if now - self.progress_at >= self.fetch_timeout:
            raise FetchTimeout(
                f"no store sent {self.topic}/{self.partition} records from offset {self.nxt} (reading "
                f"{self.start}..{self.end - 1}) for {self.fetch_timeout:.0f} s; store readers connected: "
                f'{len(self.peer.ready)}. Check that the stores are running, or raise option "fetchTimeoutMs"'
            )
        if now - max(self.progress_at, self.fetched_at) >= RETRY:
            self.fetch()

    def _other(self, frames: list[bytes]) -> int | None:
        """A message that is not one of our DIRECT-RECORDs: a DIRECT-RECORDS
        for us is taken in; returns the sequence of a DIRECT-TAIL for us that
        skips records, else None (a store reader's STORE-HELLO goes to the peer)."""
        if (len(frames) == 3 and frames[0][:1] == proto.DIRECT_RECORDS) or (
                len(frames) == proto.KEYED_FRAMES and frames[0][:1] == proto.DIRECT_KEYED_RECORDS):
            try:
                msg = proto.decode(frames)
            except proto.MalformedMessage:
                return None
            if msg.topic == self.peer.address and msg.address == self.partition and msg.subject == self.topic:
                self._records(msg)
        elif len(frames) == 1:
            skip = _tail(frames[0], self.peer, self.topic, self.partition, self.nxt)
            if skip is not None and skip[0] > self.nxt:
                if skip[1]:  # compaction removed them: nothing lost
                    self.compacted = True
                return skip[0]
        return None

    def _records(self, msg: proto.DirectRecordsMsg) -> None:
        """The records of a DIRECT-RECORDS from ``nxt`` on, as Arrow arrays over its frames."""
        first, nxt = msg.sequence, self.nxt
        stop = min(first + msg.count, self.end)
        if stop <= nxt or first > nxt:
            return  # duplicates, or ahead of a gap (fetched again)
        values = arrow.binary_from_lengths(msg.lengths, msg.contents)
        keys = arrow.keys_from_lengths(msg.key_lengths, msg.keys, msg.count)
        if nxt > first or stop < first + msg.count:
            values = values.slice(nxt - first, stop - nxt)
            keys = keys.slice(nxt - first, stop - nxt)
        self._loose_to_part()
        self.parts.append((values, _times(msg.stamps, nxt, stop), keys))
        self.rows += stop - nxt
        self.size += values.nbytes
        self.received += len(msg.contents)
        self.nxt = stop

    def _skip_to(self, tail: int) -> None:
        """Records before ``tail`` were deleted by a store's retention (or, :attr:`compacted`, by compaction:
        a newer record of each one's key follows)."""
        nxt, end = self.nxt, self.end
        compacted, self.compacted = self.compacted, False
        if not compacted and not (self.from_earliest and nxt == self.start):
            lost = f"records {nxt}..{min(tail, end) - 1} of {self.topic}/{self.partition}"
            if self.fail_on_data_loss:
                raise DataLoss(f"{lost} were deleted by the stores' retention before they could be "
                               f'read; set .option("failOnDataLoss", "false") to skip them')
            log.warning("dafka.spark: %s were deleted by retention; skipped", lost)
        self.nxt = self.first = min(tail, end)
        self.progress_at = time.monotonic()
        if self.nxt < end and self.nxt >= self.window_end:
            self.fetch()

    def _loose_to_part(self) -> None:
        if self.loose:
            n = len(self.loose)
            self.parts.append((arrow.binary(self.loose), arrow.null_timestamps(n), arrow.null_binaries(n)))
            self.loose = []

    def _take(self) -> tuple[int, pa.Array, pa.Array, pa.Array]:
        """What was collected, as one chunk; the next starts at ``nxt``."""
        self._loose_to_part()
        parts = self.parts
        if len(parts) == 1:
            values, times, keys = parts[0]
        else:
            values, times, keys = (pa.concat_arrays([part[i] for part in parts]) for i in range(3))
        chunk = (self.first, values, times, keys)
        self.parts, self.rows, self.size, self.first = [], 0, 0, self.nxt
        return chunk


def _times(stamps: tuple[tuple[int, int], ...], start: int, stop: int) -> pa.Array:
    """The receive time of records ``start .. stop-1`` from a DIRECT-RECORDS' stamps."""
    n = stop - start
    if not stamps:
        return arrow.null_timestamps(n)
    firsts = np.fromiter((f for f, _ in stamps), dtype=np.uint64, count=len(stamps))
    millis = np.fromiter((m for _, m in stamps), dtype=np.uint64, count=len(stamps))
    offsets = np.arange(start, stop, dtype=np.uint64)
    idx = np.searchsorted(firsts, offsets, side="right").astype(np.int64) - 1
    clipped = np.clip(idx, 0, None)
    ms = millis[clipped]
    known = (idx >= 0) & (ms != proto.UNKNOWN_TIME)
    return arrow.timestamps(np.where(known, ms, 0).astype(np.int64) * 1000, known)


def _tail(frame: bytes, peer: LivePeer, topic: str, partition: str, nxt: int) -> tuple[int, bool] | None:
    """Where a DIRECT-TAIL (retention) or a DIRECT-GAP (compaction, rfc 19) about this partition says to
    go on from ``nxt``, and whether it is a gap, else None (other one-frame messages go to the peer: a store
    reader's STORE-HELLO...)."""
    try:
        msg = proto.decode([frame])
    except proto.MalformedMessage:
        return None
    if type(msg) is not proto.DirectTailMsg and type(msg) is not proto.DirectGapMsg:
        peer.on_control(msg)
        return None
    if msg.topic != peer.address or msg.address != partition or msg.subject != topic:
        return None
    if type(msg) is proto.DirectGapMsg:
        return (msg.end, True) if msg.sequence <= nxt < msg.end else None
    return msg.sequence, False
