"""The console's peer: one thread that owns its sockets and feeds the
:class:`~.model.ClusterModel`.

It joins the cluster as an observer, as ``dafka status`` does: an XPUB
announced by a beacon, and one SUB connected to every peer the tower
reports.  The SUB listens only while somebody looks (a page was asked for in
the last :data:`IDLE_AFTER` seconds, or a live tail is open): then it
subscribes to the producers' HEADs, the groups' and sharded stores'
heartbeats and what is addressed to the console (bulk answers, PEER-INFO),
asks the stores for every partition's heads each :data:`HEADS_EVERY`
seconds and every peer for its PEER-INFO each :data:`INFO_EVERY`.  Idle, it
unsubscribes everything: the peers send it nothing, and it does no work
beyond its beacon.

Other threads (the web server's) talk to it through :meth:`ConsolePeer.call`
(run a function in the peer's thread) and :meth:`ConsolePeer.read` (look at
the model under its lock).  Records are read from the stores with FETCH, in
bulk, never as a group member.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, TypeVar

import zmq

from dafka.protocol import bulk
from dafka import protocol as proto
from dafka.discovery.beacon import CONNECT, Beacon
from dafka.config import Config
from dafka.core.sockets import drain, wake_pipe
from dafka.core.endpoints import split_endpoints
from dafka.protocol.packing import split_contents
from dafka.discovery.links import DataSocket
from dafka.core.sockets import connect, read_subscriptions
from dafka.core.addresses import new_address

from .live import Fetching, LiveStarts
from .model import ClusterModel, tail_prefixes

log = logging.getLogger(__name__)

T = TypeVar("T")

IDLE_AFTER = 30.0  # seconds after the last page view the console stops listening
HEADS_EVERY = 2.0  # seconds between two GET-HEADS rounds while active
INFO_EVERY = 5.0  # seconds between two PEER-INFO rounds while active
TICK = 1.0  # seconds between two samples of the rates
REFETCH = 0.5  # seconds without an answer before a FETCH is sent again
TAIL_RATE = 200  # records a second a live tail passes on at most (the rest is counted as skipped)
TAIL_GATHER = 0.02  # seconds the peer lets messages gather while a live tail is open
TAIL_FETCH = 5.0  # seconds a live tail waits for the records it fetches (a partition met late, a gap)


@dataclass
class Fetch:
    """A read of ``count`` records of one partition from ``start``, answered by the first peer that has them."""

    topic: str
    partition: str
    start: int
    end: int  # the last offset wanted
    deadline: float
    future: Future[dict[str, Any]]
    # offset -> (value, unix ms or None, key or None)
    records: dict[int, tuple[bytes, int | None, bytes | None]] = field(default_factory=dict)
    tail: int | None = None  # the oldest offset a store keeps, when it said the start is gone
    sent: float = 0.0
    compacted: set[int] = field(default_factory=set)  # offsets of the range compaction removed (DIRECT-GAP)

    def complete(self) -> bool:
        return all(o in self.records or o in self.compacted for o in range(self.start, self.end + 1))


@dataclass
class Tail:
    """A live tail of a topic: records go to ``deliver`` (called in the peer's thread, cheaply), at most
    :data:`TAIL_RATE` a second; the rest are counted, and said once a second at most."""

    topic: str
    deliver: Callable[[list[tuple[str, int, bytes, bytes | None]], int], None]  # ((partition, offset, value, key), skipped)
    second: float = 0.0  # when the current second of the quota began
    passed: int = 0  # records passed on in it
    pending: list[tuple[str, int, bytes, bytes | None]] = field(default_factory=list)
    skipped: int = 0
    said: float = 0.0  # when deliver was last called

    def room(self, now: float) -> int:
        if now - self.second >= 1.0:
            self.second, self.passed = now, 0
        return TAIL_RATE - self.passed - len(self.pending)


class ConsolePeer:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.address = new_address()
        self.model = ClusterModel(self.address)
        self.lock = threading.Lock()
        self.ctx = zmq.Context()
        self.xpub = self.ctx.socket(zmq.XPUB)
        self.xpub.setsockopt(zmq.XPUB_VERBOSE, 1)
        self.xpub.linger = 0
        self.data = DataSocket(self.ctx, config, self.xpub, self.address, "console")
        self.sub = self.data.secure(self.ctx.socket(zmq.SUB))
        self.sub.linger = 0
        self.sub.rcvhwm = 100_000
        self.endpoints: dict[str, str] = {}
        self._wake, self._waker = wake_pipe(self.ctx, "console")
        self._waker_lock = threading.Lock()
        self._calls: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._fetches: list[Fetch] = []
        self._tails: dict[str, list[Tail]] = {}
        self._live = LiveStarts()  # where each followed partition starts (every record since the tail opened)
        self._subscribed: set[bytes] = set()
        self.last_view = float("-inf")
        self.active = False
        self.activated_at = 0.0
        self.heads_answered: set[str] = set()  # store readers that answered since the console woke
        self.towers = split_endpoints(config["beacon/pub_address"])
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="dafka-console", daemon=True)

    # -- any thread ------------------------------------------------------------

    def start(self) -> "ConsolePeer":
        self.data.beacon.start()
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping = True
        self._wakeup()
        self._thread.join(timeout)
        self.data.close()
        with self._waker_lock:
            self._waker.close(0)
        if not self._thread.is_alive():
            self.ctx.term()

    @property
    def tower_connected(self) -> bool:
        return self.data.beacon.connected

    def _wakeup(self) -> None:
        with self._waker_lock:
            try:
                self._waker.send(b"", zmq.NOBLOCK)
            except (zmq.Again, zmq.ZMQError):
                pass

    def call(self, fn: Callable[[], T]) -> Future[T]:
        """Run ``fn`` in the peer's thread (it may use the sockets); its result in the future."""
        future: Future[T] = Future()

        def run() -> None:
            try:
                future.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                future.set_exception(exc)
        self._calls.put(run)
        self._wakeup()
        return future

    def read(self, fn: Callable[[ClusterModel], T]) -> T:
        """Look at the model (under its lock, briefly)."""
        with self.lock:
            return fn(self.model)

    def stores_answered(self) -> bool:
        """Whether every store reader known has answered GET-HEADS since the console woke."""
        with self.lock:
            readers = {p.address for p in self.model.peers.values() if p.role == "store-reader"}
            return bool(readers) and readers <= self.heads_answered

    def viewed(self) -> None:
        """A page was asked for: listen (again) if idle."""
        self.last_view = time.monotonic()
        if not self.active:
            self.call(self._activate)

    def fetch(self, topic: str, partition: str, start: int, count: int, timeout: float = 2.0) -> Future[dict[str, Any]]:
        """Records ``start .. start+count-1`` of a partition (fewer past its head), from the stores (or its live
        producer): a future of ``{"records": [(offset, value, unix_ms or None, key or None)], "tail": oldest kept or None,
        "head": head}``."""
        future: Future[dict[str, Any]] = Future()

        def begin() -> None:
            try:
                self._start_fetch(topic, partition, start, count, timeout, future)
            except Exception as exc:  # noqa: BLE001 - a name the wire cannot carry: the caller's error
                future.set_exception(exc)
        self.call(begin)
        return future

    def follow(self, tail: Tail) -> None:
        self.call(lambda: self._follow(tail))

    def unfollow(self, tail: Tail) -> None:
        self.call(lambda: self._unfollow(tail))

    # -- the peer's thread -----------------------------------------------------

    def _run(self) -> None:
        poller = zmq.Poller()
        for sock in (self.sub, self.xpub, self.data.beacon.events, self._wake):
            poller.register(sock, zmq.POLLIN)
        next_tick = next_heads = next_info = time.monotonic()
        try:
            while not self._stopping:
                now = time.monotonic()
                if self.active and not self._tails and now - self.last_view > IDLE_AFTER:
                    self._deactivate()
                timeout = None
                if self.active:
                    if now >= next_tick:
                        with self.lock:
                            self.model.tick(now)
                        next_tick = now + TICK
                    if now >= next_heads:
                        self._get_heads()
                        # just woken: again soon, once the new subscriptions (bulk answers) reached the stores
                        quick = now - self.activated_at < 1.0
                        next_heads = now + (0.15 if quick else HEADS_EVERY)
                    if now >= next_info:
                        self._ask_info()
                        next_info = now + INFO_EVERY
                    self._check_fetches(now)
                    live_due = self._live.due()
                    due = min(next_tick, next_heads, next_info, *(f.sent + REFETCH for f in self._fetches),
                              *(() if live_due is None else (live_due,)))
                    timeout = max(0, int((due - now) * 1000)) + 1
                for sock, _ in poller.poll(timeout):
                    if sock is self.sub:
                        self._on_messages()
                        if self._tails:
                            # a followed topic's records come a batch at a time, as often as a thousand times a
                            # second: let them gather (each wake-up costs more than a batch)
                            time.sleep(TAIL_GATHER)
                    elif sock is self.xpub:
                        self._on_subscriptions()
                    elif sock is self.data.beacon.events:
                        self._on_beacon()
                    else:
                        drain(self._wake)
                        self._run_calls()
                    if not self.active and self.last_view > self.activated_at:
                        next_tick = next_heads = next_info = time.monotonic()
        except Exception:  # noqa: BLE001 - logged: the console shows the cluster no more
            log.exception("the console's peer failed")
        finally:
            for fetch in self._fetches:
                if not fetch.future.done():
                    fetch.future.set_exception(RuntimeError("the console is stopping"))
            for sock in (self.sub, self.xpub, self._wake):
                sock.close(0)

    def _run_calls(self) -> None:
        while True:
            try:
                fn = self._calls.get_nowait()
            except queue.Empty:
                return
            fn()

    def _set_subscriptions(self, wanted: set[bytes]) -> None:
        for prefix in self._subscribed - wanted:
            self.sub.setsockopt(zmq.UNSUBSCRIBE, prefix)
        for prefix in sorted(wanted - self._subscribed):  # in the order of their bytes: V<address> last (bulk.py)
            self.sub.setsockopt(zmq.SUBSCRIBE, prefix)
        self._subscribed = wanted

    def _wanted(self) -> set[bytes]:
        if not self.active:
            return set()
        a = self.address
        wanted = {proto.subscription(msg_id, a, exact=True) for msg_id in (
            proto.DIRECT_RECORD, proto.DIRECT_HEAD, proto.STORE_HELLO, proto.DIRECT_TAIL, proto.DIRECT_GAP,
            proto.PEER_INFO)}
        wanted.update(bulk.subscriptions(a, keys=True))
        wanted.add(proto.subscription(proto.HEAD))
        wanted.add(proto.GROUP_MEMBER)
        wanted.add(proto.subscription(proto.STORE_MEMBER, exact=True))
        for topic in self._tails:
            wanted.update(tail_prefixes(topic))
        wanted.update(self._live.subscriptions(a))
        return wanted

    def _activate(self) -> None:
        if self.active:
            return
        self.active = True
        self.activated_at = time.monotonic()
        self.heads_answered.clear()
        with self.lock:
            self.model.woke()
        self._set_subscriptions(self._wanted())
        log.info("console: listening to the cluster (%d peers)", len(self.endpoints))

    def _deactivate(self) -> None:
        self.active = False
        self._set_subscriptions(set())
        log.info("console: idle, no longer listening (nobody looked for %.0f s)", IDLE_AFTER)

    def _get_heads(self) -> None:
        self.xpub.send_multipart(proto.encode(proto.GetHeadsMsg("", self.address)))

    def _ask_info(self) -> None:
        """Every peer answers a new subscription to ``I<console>`` with its PEER-INFO (rfc 17)."""
        prefix = proto.subscription(proto.PEER_INFO, self.address, exact=True)
        self.sub.setsockopt(zmq.UNSUBSCRIBE, prefix)
        self.sub.setsockopt(zmq.SUBSCRIBE, prefix)

    def _on_beacon(self) -> None:
        now = time.monotonic()
        for event in Beacon.read_events(self.data.beacon.events):
            with self.lock:
                if event.kind == CONNECT:
                    if event.endpoint not in self.endpoints and connect(self.sub, event.endpoint):
                        self.endpoints[event.endpoint] = event.sender
                        self.model.peer_up(event.endpoint, event.sender, now)
                elif self.endpoints.pop(event.endpoint, None) is not None:
                    self.model.peer_down(event.endpoint, now)
                    try:
                        self.sub.disconnect(event.endpoint)
                    except zmq.ZMQError:
                        pass

    def _on_subscriptions(self) -> None:
        ask = False
        with self.lock:
            for sub in read_subscriptions(self.xpub):
                if sub is None:
                    self.model.malformed += 1
                    continue
                self.model.on_subscription(sub)
                ask = ask or (sub.subscribe and sub.msg_id == proto.GET_HEADS)
        if ask and self.active:
            self._get_heads()  # a store reader arrived: ask it now

    def _on_messages(self) -> None:
        now = time.monotonic()
        with self.lock:
            model = self.model
            for _ in range(10_000):
                try:
                    frames = self.sub.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                try:
                    msg = proto.decode(frames)
                except proto.MalformedMessage:
                    model.malformed += 1
                    continue
                kind = type(msg)
                if kind is proto.RecordMsg or kind is proto.RecordsMsg or kind is proto.KeyedRecordsMsg:
                    self._on_live(msg, now)
                    continue
                if kind is proto.HeadsAtMsg:
                    self._live.on_answer(msg)  # type: ignore[arg-type]
                    continue
                if self._tails:
                    self._heard_heads(msg, now)
                if kind in (proto.DirectRecordsMsg, proto.DirectKeyedRecordsMsg, proto.DirectRecordMsg,
                            proto.DirectTailMsg, proto.DirectGapMsg):
                    self._on_answer(msg)
                    continue
                if kind is proto.DirectPartitionsMsg:
                    self.heads_answered.add(msg.address)  # type: ignore[union-attr]
                model.on_message(msg, now)
        self._check_fetches(now)
        if self._tails:
            self._deliver(now)

    # -- reads -------------------------------------------------------------------

    def _start_fetch(self, topic: str, partition: str, start: int, count: int, timeout: float,
                     future: Future[dict[str, Any]]) -> None:
        if not self.active:
            self._activate()
        with self.lock:
            p = self.model.partition(topic, partition)
            head = p.head if p is not None else None
        if head is None or start > head or count <= 0:
            future.set_result({"records": [], "tail": None, "head": head})
            return
        end = min(head, start + count - 1)
        fetch = Fetch(topic, partition, start, end, time.monotonic() + timeout, future)
        self._fetches.append(fetch)
        self._send_fetch(fetch)

    def _send_fetch(self, fetch: Fetch) -> None:
        first = next((o for o in range(fetch.start, fetch.end + 1)
                      if o not in fetch.records and o not in fetch.compacted), fetch.start)
        fetch.sent = time.monotonic()
        self.xpub.send_multipart(proto.encode(proto.FetchMsg(
            fetch.partition, self.address, fetch.topic, first, fetch.end - first + 1)))

    def _on_answer(self, msg: proto.Message) -> None:
        for fetch in self._fetches:
            if fetch.topic != getattr(msg, "subject", None) or fetch.partition != getattr(msg, "address", None):
                continue
            if isinstance(msg, proto.DirectGapMsg):
                fetch.compacted.update(range(max(msg.sequence, fetch.start), min(msg.end, fetch.end + 1)))
                continue
            if isinstance(msg, proto.DirectTailMsg):
                if msg.sequence > fetch.start:
                    fetch.tail = msg.sequence
                    fetch.start = min(msg.sequence, fetch.end + 1)
                continue
            if isinstance(msg, proto.DirectRecordMsg):
                if fetch.start <= msg.sequence <= fetch.end:
                    fetch.records.setdefault(msg.sequence, (msg.content, None, None))
                continue
            assert isinstance(msg, proto.DirectRecordsMsg)
            stamps = msg.stamps
            values = split_contents(msg.lengths, msg.contents)
            keys = msg.key_list() or [None] * len(values)
            for i, value in enumerate(values):
                offset = msg.sequence + i
                if fetch.start <= offset <= fetch.end and offset not in fetch.records:
                    stamp = None
                    for first, unix_ms in stamps:
                        if first <= offset:
                            stamp = unix_ms if unix_ms != proto.UNKNOWN_TIME else None
                    fetch.records[offset] = (value, stamp, keys[i])

    def _check_fetches(self, now: float) -> None:
        waiting = []
        for fetch in self._fetches:
            if fetch.complete() or now >= fetch.deadline:
                records = [(o, *fetch.records[o]) for o in sorted(fetch.records) if fetch.start <= o <= fetch.end]
                fetch.future.set_result({"records": records, "tail": fetch.tail, "head": fetch.end,
                                         "complete": fetch.complete()})
            else:
                if now - fetch.sent >= REFETCH:
                    self._send_fetch(fetch)
                waiting.append(fetch)
        self._fetches = waiting
        if self._tails:
            self._live.tick(now)
            self._take_live(now)

    # -- live tails --------------------------------------------------------------

    def _follow(self, tail: Tail) -> None:
        if tail.topic not in self._tails:
            self._live.follow(tail.topic, int(time.time() * 1000))
        self._tails.setdefault(tail.topic, []).append(tail)
        if not self.active:
            self._activate()
        self._set_subscriptions(self._wanted())

    def _unfollow(self, tail: Tail) -> None:
        tails = self._tails.get(tail.topic, [])
        if tail in tails:
            tails.remove(tail)
        if not tails and self._tails.pop(tail.topic, None) is not None:
            self._live.unfollow(tail.topic)
        self.last_view = time.monotonic()
        self._set_subscriptions(self._wanted())

    def _heard_heads(self, msg: proto.Message, now: float) -> None:
        """A head of a followed topic's partition: one not met yet starts where rfc 20 says, one whose
        records were not all seen live fetches the rest (:class:`~.live.LiveStarts`)."""
        if isinstance(msg, proto.HeadMsg):
            if msg.subject in self._tails:
                self._live.head(msg.subject, msg.address, msg.sequence, now)
        elif isinstance(msg, proto.DirectHeadMsg):
            if msg.topic == self.address and msg.subject in self._tails:
                self._live.head(msg.subject, msg.address, msg.sequence, now)
        elif isinstance(msg, proto.DirectPartitionsMsg):
            if msg.topic == self.address:
                for info in msg.partitions:
                    if info.subject in self._tails:
                        self._live.head(info.subject, info.address, info.head, now)

    def _take_live(self, now: float) -> None:
        """Start the fetches :attr:`_live` asks for, and queue what it passed on."""
        live = self._live
        for fetching in live.fetches:
            future: Future[dict[str, Any]] = Future()
            future.add_done_callback(partial(self._tail_fetched, fetching))
            fetch = Fetch(fetching.topic, fetching.partition, fetching.start, fetching.end, now + TAIL_FETCH, future)
            self._fetches.append(fetch)
            self._send_fetch(fetch)
        live.fetches.clear()
        for passed in live.passed:
            entries = passed.entries
            for tail in self._tails.get(passed.topic, ()):
                room = max(0, min(len(entries), tail.room(now)))
                tail.skipped += passed.skipped + len(entries) - room
                tail.pending.extend((passed.partition, o, value, key) for o, value, key in entries[len(entries) - room:])
        live.passed.clear()

    def _tail_fetched(self, fetching: Fetching, done: Future[dict[str, Any]]) -> None:
        self._live.fetched(fetching, {o: (value, key) for o, value, _, key in done.result()["records"]})

    def _on_live(self, msg: proto.Message, now: float) -> None:
        """A live record or batch of a followed topic: its newest records, as many as each tail has room for
        this second, wait to be passed on (after the messages at hand, by :meth:`_deliver`).  Those that do
        not follow on in a started partition go through :attr:`_live` (a partition met now, a gap)."""
        split: Callable[[], list[bytes]]
        keys: list[bytes | None] | None = None
        if isinstance(msg, proto.DirectRecordsMsg):  # RECORDS or KEYED-RECORDS
            topic, partition, first, count = msg.subject, msg.address, msg.sequence, msg.count
            lengths, contents = msg.lengths, msg.contents
            split = lambda: split_contents(lengths, contents)  # noqa: E731
            keys = msg.key_list()
        else:
            assert isinstance(msg, proto.RecordMsg)
            topic, partition, first, count = msg.subject, msg.address, msg.sequence, 1
            content = msg.content
            split = lambda: [content]  # noqa: E731
        if topic not in self._tails:
            return
        if not self._live.follows_on(topic, partition, first, count):
            split_values = split()
            self._live.live(topic, partition, first, [
                (first + n, split_values[n], keys[n] if keys else None) for n in range(count)], now)
            self._take_live(now)
            return
        values: list[bytes] | None = None
        for tail in self._tails.get(topic, ()):
            room = min(count, tail.room(now))
            tail.skipped += count - max(0, room)
            if room <= 0:
                continue  # over this second's quota: not even split into records
            if values is None:
                values = split()
            tail.pending.extend((partition, first + n, values[n], keys[n] if keys else None)
                                for n in range(count - room, count))

    def _deliver(self, now: float) -> None:
        for tails in self._tails.values():
            for tail in tails:
                if tail.pending or (tail.skipped and now - tail.said >= 1.0):
                    tail.passed += len(tail.pending)
                    tail.deliver(tail.pending, tail.skipped)
                    tail.pending, tail.skipped, tail.said = [], 0, now
