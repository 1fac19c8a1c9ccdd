"""Live mode: read a running Dafka cluster through the protocol.

:class:`LivePeer` is a short-lived raw peer, the minimum a consumer needs: it
binds an XPUB (``xpub_verbose``) announced by a :class:`dafka.beacon.Beacon`,
and connects one SUB to every peer the tower reports, subscribed to what is
addressed to it (``D``, ``E``, ``L``, ``T`` + its own address, exact).  The
store readers in turn connect to it and subscribe ``F``, ``G`` and
``W<reader>``; seeing ``W<reader>`` on the XPUB is how it learns that a store
reader is there and listening.

* The driver asks every store reader for the heads of the topic with
  CONSUMER-HELLO (subjects = [topic]) and collects the DIRECT-HEADs
  (:func:`discover`), until every peer the tower reported has connected back
  (or is known dead) and nothing arrived for a short quiet period.
* Each Spark task FETCHes its own offset range (:func:`fetch_range`) and keeps
  the DIRECT-RECORDs in sequence order, dropping duplicates (every store
  answers every FETCH, and so does a live producer for its unacked records).
  An unanswered range is asked for again; a DIRECT-TAIL says the store's
  retention deleted the beginning.

Nothing here keeps state between calls: every function opens its own peer, on
its own ZeroMQ context, and closes both.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Iterator

import zmq
from zmq.utils.monitor import recv_monitor_message

from dafka import proto
from dafka.beacon import CONNECT, Beacon
from dafka.config import Config
from dafka.inflight import fetch_window, mean_size
from dafka.peer import DataSocket, connect, new_address, read_rest, read_subscriptions

from .options import DafkaSparkError

log = logging.getLogger(__name__)

RCVHWM = 100_000  # messages queued for a slow task before the store waits (it never drops)
QUIET = 0.2  # seconds without news after which the heads are taken as complete
REPLAY_GRACE = 0.1  # seconds after the tower's welcome for its replay of the peers to arrive
RETRY = 1.0  # seconds without progress before a FETCH is repeated
READER_GRACE = 2.0  # seconds to wait for a store reader that holds the partition before asking anyone
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


class LivePeer:
    """A raw Dafka peer for one short job; use as a context manager."""

    def __init__(self, config: Config, *, name: str = "spark") -> None:
        self.config = config
        self.address = new_address()
        self.name = name
        self._ctx = zmq.Context()
        self._sockets: list[zmq.Socket] = []
        self.beacon: Beacon | None = None
        try:
            self.xpub = self._socket(zmq.XPUB)
            self.xpub.setsockopt(zmq.XPUB_VERBOSE, 1)
            self.sub = self._socket(zmq.SUB)
            self.sub.rcvhwm = RCVHWM
            for msg_id in (proto.DIRECT_RECORD, proto.DIRECT_HEAD, proto.STORE_HELLO, proto.DIRECT_TAIL):
                self.sub.setsockopt(zmq.SUBSCRIBE, proto.subscription(msg_id, self.address, exact=True))
            self.monitor = self.sub.get_monitor_socket(_MONITOR_EVENTS)
            self._sockets.append(self.monitor)
            data = DataSocket(self._ctx, config, self.xpub, self.address, name)
            self.endpoint = data.endpoint
            self.beacon = data.beacon.start()
        except BaseException:
            self.close()
            raise
        self.peers: dict[str, str] = {}  # endpoint -> sender, as the tower reports them
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
        self.welcomed_at: float | None = None

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
        for event in Beacon.read_events(self.beacon.events):
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
            if sub is None or not sub.topic:
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
        if self.welcomed_at is None or time.monotonic() - self.welcomed_at < REPLAY_GRACE:
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

    def collect_heads(self, topic: str, timeout: float) -> tuple[dict[str, int], list[str]]:
        """Ask every store reader for the heads of ``topic``; returns
        (partition -> highest head any store has, reader addresses asked)."""
        deadline = time.monotonic() + timeout
        heads: dict[str, int] = {}
        asked: set[str] = set()
        self.new_ready = list(self.ready)  # a new round asks every ready reader again
        last_news = time.monotonic()
        while True:
            self.pump()
            msg = self.recv(0.01)
            while msg is not None:
                if type(msg) is proto.DirectHeadMsg:
                    if msg.topic == self.address and msg.subject == topic:
                        if msg.sequence > heads.get(msg.address, -1):
                            heads[msg.address] = msg.sequence
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
            if self.settled() and now - max(last_news, self.changed) >= QUIET:
                break
            if now >= deadline:
                log.info("dafka.spark: discovery of %r stopped after %.1f s without settling "
                         "(%d peers, %d readers)", topic, timeout, len(self.peers), len(asked))
                break
        return heads, sorted(asked)


@dataclass
class Discovery:
    heads: dict[str, int]  # partition -> highest sequence stored
    readers: list[str]  # store reader addresses that were asked
    peers: int = 0
    when: float = field(default_factory=time.time)


def discover(config: Config, topic: str, *, tower_timeout: float, timeout: float) -> Discovery:
    """The heads of ``topic`` on the stores, through a short-lived peer."""
    with LivePeer(config, name="spark-planner") as peer:
        peer.wait_tower(tower_timeout)
        heads, readers = peer.collect_heads(topic, timeout)
        return Discovery(heads, readers, len(peer.peers))


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

    def __init__(self, config: Config, topic: str, *, tower_timeout: float, timeout: float) -> None:
        self.topic = topic
        self.timeout = timeout
        self.peer = LivePeer(config, name="spark-stream")
        try:
            self.peer.wait_tower(tower_timeout)
        except BaseException:
            self.peer.close()
            raise

    def heads(self) -> Discovery:
        heads, readers = self.peer.collect_heads(self.topic, self.timeout)
        return Discovery(heads, readers, len(self.peer.peers))

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
) -> Iterator[tuple[int, list[bytes]]]:
    """Records ``start .. end-1`` of a partition, as ``(first offset, contents)``
    chunks of consecutive records.

    ``readers`` are the store readers that held the partition at planning;
    ``from_earliest`` says ``start`` was "earliest", so records deleted by
    retention before it are skipped rather than reported as lost."""
    if end <= start:
        return
    with LivePeer(config, name="spark-task") as peer:
        peer.wait_tower(tower_timeout)
        if not peer.wait_ready(fetch_timeout, prefer=set(readers), grace=READER_GRACE):
            raise NoStore(f"no store reader connected within {fetch_timeout:.0f} s to read "
                          f"{topic}/{partition} (stores at planning: {', '.join(readers) or 'none'})")

        prefix = proto.record_prefix(proto.DIRECT_RECORD, peer.address, partition, topic)
        plen = len(prefix)
        flen = plen + 8
        window_bytes = config["consumer/fetch_max_bytes"]
        nxt = start
        first = start
        contents: list[bytes] = []
        size = 0
        sub = peer.sub
        recv = sub.recv
        from_bytes = int.from_bytes
        fetched_at = 0.0
        progress_at = time.monotonic()
        # FETCH windows of about consumer/fetch_max_bytes, the next one asked
        # as soon as one is complete: a store pauses an answer beyond its
        # in-flight budget (dafka.inflight) until the requester asks further.
        window_from = window_end = start
        record_size = -1
        received = 0  # content bytes received in the current window

        def fetch() -> None:
            nonlocal fetched_at, window_from, window_end, record_size, received
            if nxt > window_from and received:
                record_size = mean_size(record_size, received // (nxt - window_from))
            count = min(end - nxt, proto.MAX_COUNT, fetch_window(window_bytes, record_size))
            peer.send(proto.FetchMsg(partition, peer.address, topic, nxt, count))
            window_from, window_end, received = nxt, nxt + count, 0
            fetched_at = time.monotonic()

        fetch()
        while nxt < end:
            if not sub.poll(50):
                now = time.monotonic()
                peer.pump()
                if now - progress_at >= fetch_timeout:
                    raise FetchTimeout(
                        f"no store sent {topic}/{partition} records from offset {nxt} (reading {start}..{end - 1}) "
                        f"for {fetch_timeout:.0f} s; store readers connected: {len(peer.ready)}. "
                        f'Check that the stores are running, or raise option "fetchTimeoutMs"'
                    )
                if now - max(progress_at, fetched_at) >= RETRY:
                    fetch()
                continue
            before = nxt
            for _ in range(10_000):
                # Bytes, not zmq.Frame (0.6 us a message): a frame that is our
                # DIRECT-RECORD header is followed by its content, already here.
                try:
                    frame = recv(zmq.NOBLOCK)
                except zmq.Again:
                    break
                if len(frame) != flen or frame[:plen] != prefix:
                    tail = _other_message(sub, frame, peer, topic, partition)
                    if tail is None or tail <= nxt:
                        continue
                    if not (from_earliest and nxt == start):
                        lost = f"records {nxt}..{min(tail, end) - 1} of {topic}/{partition}"
                        if fail_on_data_loss:
                            raise DataLoss(f"{lost} were deleted by the stores' retention before they could be "
                                           f'read; set .option("failOnDataLoss", "false") to skip them')
                        log.warning("dafka.spark: %s were deleted by retention; skipped", lost)
                    if contents:
                        yield first, contents
                        contents, size = [], 0
                    nxt = first = min(tail, end)
                    progress_at = time.monotonic()
                    if nxt >= end:
                        break
                    if nxt >= window_end:
                        fetch()
                    continue
                try:
                    value = recv(zmq.NOBLOCK)
                except zmq.Again:
                    continue  # a header without its content: malformed
                if from_bytes(frame[plen:], "big") != nxt:
                    continue  # a duplicate (another store, a repeated answer) or ahead of a gap
                contents.append(value)
                size += len(value)
                received += len(value)
                nxt += 1
                if nxt >= end:
                    break
                if len(contents) >= BATCH_ROWS or size >= BATCH_BYTES:
                    yield first, contents
                    first, contents, size = nxt, [], 0
                if nxt >= window_end:
                    fetch()
            if nxt != before:
                progress_at = time.monotonic()
        if contents:
            yield first, contents


def _other_message(sub: zmq.Socket, frame: bytes, peer: LivePeer, topic: str, partition: str) -> int | None:
    """A message that is not one of our DIRECT-RECORDs: read the rest of it;
    the oldest kept sequence if it is a DIRECT-TAIL for us, else None."""
    frames = read_rest(sub, frame)
    if len(frames) > 1:
        return None  # two frames or more, and not ours: dropped
    return _tail(frame, peer, topic, partition)


def _tail(frame: bytes, peer: LivePeer, topic: str, partition: str) -> int | None:
    """The sequence of a DIRECT-TAIL about this partition, else None (other
    one-frame messages go to the peer: a store reader's STORE-HELLO...)."""
    try:
        msg = proto.decode([frame])
    except proto.MalformedMessage:
        return None
    if type(msg) is not proto.DirectTailMsg:
        peer.on_control(msg)
        return None
    if msg.topic != peer.address or msg.address != partition or msg.subject != topic:
        return None
    return msg.sequence
