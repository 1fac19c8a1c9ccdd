"""The public consumer.

All of its protocol work happens inside :meth:`Consumer.poll`, in the caller's
thread, like kafka-python's: records go from the socket to the user with no
hop between threads.  Only discovery runs in the background (the beacon
thread), and its events wait in an inproc pipe until the next poll.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any, Callable, Generic, Iterable, Iterator, TypedDict, TypeVar, Unpack, overload

import zmq

from ..records import PartitionKey
from .. import protocol as proto
from ..config import ConfigLike, as_config
from ..core.addresses import new_address
from ..core.loop import Loop, Timer
from ..core.sockets import drain_records, queue_messages
from ..discovery.links import DataSocket, PeerLinks
from ..errors import Closed
from ..groups.membership import Callback, ConsumerRebalanceListener, Membership
from ..protocol.commits import offsets_topic
from ..records import Record, TopicPartition, deserialized
from .offsets import OffsetJournal
from .state import ConsumerState, RecordSink

V = TypeVar("V")  # a record's value: bytes, or what the value_deserializer returns


class ConsumerOptions(TypedDict, total=False):
    """The keyword arguments of :class:`Consumer` (and :class:`dafka.aio.AsyncConsumer`) beside
    ``value_deserializer``, for type checkers (the constructors list them with their defaults)."""

    config: ConfigLike
    address: str | None
    key_deserializer: Callable[[bytes], Any] | None
    offsets_path: str | None
    ctx: zmq.Context[Any] | None
    group: str | None
    listener: ConsumerRebalanceListener | None
    on_assign: Callback | None
    on_revoke: Callback | None
    enable_auto_commit: bool | None
    auto_commit_interval_ms: int | None

log = logging.getLogger(__name__)

# Records moved from the socket into the ready queue per wake-up at most, taken DRAIN_STEP messages
# at a time (RECORDS and DIRECT-RECORDS carry many): a consumer that falls behind leaves its backlog
# in libzmq's queue, in the messages it came in, instead of turning it all into Records at once (at
# 1000 bytes a record, hundreds of MiB of new objects whose page faults slowed it further).
DRAIN = 4096
DRAIN_STEP = 4
_TICK = 0.1  # seconds between fetch-retry checks


class Consumer(Generic[V]):
    """Read records of one or more topics, in order per partition.

    >>> with Consumer("weather", config={"consumer/offset/reset": "earliest"}) as c:
    ...     record = c.poll(timeout=5)

    With ``group``, the consumer is a member of that consumer group: the
    members share the topics' partitions, each read by one of them, and a
    partition that moves resumes from the group's last commit (rfc/dafka.md
    section 14).  ``listener`` (a :class:`ConsumerRebalanceListener`), or
    ``on_assign`` and ``on_revoke``, are told of the partitions that move;
    ``enable_auto_commit`` and ``auto_commit_interval_ms`` default to
    ``consumer/group/auto_commit`` and ``consumer/group/auto_commit_interval``.
    """

    # Typed as Consumer[bytes] without a value_deserializer, else Consumer[what it returns].
    @overload
    def __init__(self: Consumer[bytes], *topics: str, value_deserializer: None = None,
                 **options: Unpack[ConsumerOptions]) -> None: ...

    @overload
    def __init__(self: Consumer[V], *topics: str, value_deserializer: Callable[[bytes], V],
                 **options: Unpack[ConsumerOptions]) -> None: ...

    @overload  # a deserializer or None, known only at run time (a wrapper's)
    def __init__(self: Consumer[Any], *topics: str, value_deserializer: Callable[[bytes], Any] | None = None,
                 **options: Unpack[ConsumerOptions]) -> None: ...

    def __init__(
        self,
        *topics: str,
        config: ConfigLike = None,
        address: str | None = None,
        value_deserializer: Callable[[bytes], V] | None = None,
        key_deserializer: Callable[[bytes], Any] | None = None,
        offsets_path: str | None = None,
        ctx: zmq.Context[Any] | None = None,
        group: str | None = None,
        listener: ConsumerRebalanceListener | None = None,
        on_assign: Callback | None = None,
        on_revoke: Callback | None = None,
        enable_auto_commit: bool | None = None,
        auto_commit_interval_ms: int | None = None,
    ) -> None:
        self.config = as_config(config)
        c = self.config
        self.address = address or new_address()
        self.value_deserializer = value_deserializer
        self.key_deserializer = key_deserializer
        self._plain = value_deserializer is None and key_deserializer is None  # records go out as they come
        self._ctx = ctx or zmq.Context.instance()
        self._group = None
        if group is not None:
            if offsets_path:
                raise ValueError("offsets_path and group exclude each other: a group keeps its offsets in the stores")
            if listener is not None:
                on_assign, on_revoke = listener.on_partitions_assigned, listener.on_partitions_revoked
            interval = c["consumer/group/auto_commit_interval"] if auto_commit_interval_ms is None \
                else auto_commit_interval_ms
            if interval < 1:
                raise ValueError(f"auto_commit_interval_ms must be at least 1, got {interval}")
            self._group = Membership(
                self, _group_name(group), on_assign=on_assign, on_revoke=on_revoke,
                auto_commit=bool(c["consumer/group/auto_commit"] if enable_auto_commit is None else enable_auto_commit),
                auto_commit_interval=interval / 1000.0,
            )
        self._journal = OffsetJournal(offsets_path) if offsets_path else None
        self._state = ConsumerState(
            self.address,
            reset=c["consumer/offset/reset"],
            fetch_retry=c["consumer/fetch_retry"] / 1000.0,
            max_buffered=c["consumer/max_buffered"],
            max_buffered_bytes=c["consumer/max_buffered_bytes"],
            fetch_max_bytes=c["consumer/fetch_max_bytes"],
            positions=self._journal.positions if self._journal else None,
            bulk=c["consumer/bulk"],
            batches=c["consumer/batches"],
            heads_interval=c["consumer/heads_interval"] / 1000.0,
            group=self._group.state if self._group else None,
            store_times=c["consumer/store_times"],
        )
        self._lock = threading.RLock()  # re-entered by rebalance callbacks that commit or ask the assignment
        self._closed = False
        self._last: list[Record[Any]] = []  # what the previous poll/consume returned (offsets file only)
        self._xpub = self._ctx.socket(zmq.XPUB)
        self._xpub.setsockopt(zmq.XPUB_VERBOSE, 1)
        self._xpub.sndhwm = c["consumer/high_watermark"]
        self._xpub.linger = 0
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.rcvhwm = queue_messages(c["consumer/receive_bytes"], c["consumer/high_watermark"])
        self._backlog = 0  # messages read since the receive queue was last found empty
        # libzmq takes a pipe for full once its reader is between half its high-water mark and all of it
        # behind (the reader gives credit back every half): a backlog of that size may have overflowed.
        self._full_queue = max(1, self._sub.rcvhwm // 2)
        self._sub.linger = 0
        for prefix in self._state.own_subscriptions():
            self._sub.setsockopt(zmq.SUBSCRIBE, prefix)
        if self._group is not None:
            for prefix in self._state.subscribe(self._group.offsets_topic, sink=self._group.inbox):
                self._sub.setsockopt(zmq.SUBSCRIBE, prefix)
        # What it is, for scoped discovery (rfc 5.6): a consumer of its topics (of none yet: it still needs the
        # stores), a member of its group, a reader of the group's offsets topic.
        profiles = [(proto.ROLE_CONSUMER, t) for t in topics] or [(proto.ROLE_CONSUMER, "")]
        if self._group is not None:
            profiles += [(proto.ROLE_GROUP, _group_name(group or "")), (proto.ROLE_CONSUMER, self._group.offsets_topic)]
        self._data = DataSocket(self._ctx, c, self._xpub, self.address, "consumer", profiles=profiles)
        self._links = PeerLinks(self._data.secure(self._sub))
        self._loop = Loop()
        self._loop.add_reader(self._sub, self._on_sub)
        self._loop.add_reader(self._xpub, self._on_subscriptions)
        self._loop.add_reader(self._data.beacon.events, self._on_beacon)
        self._tick_timer: Timer | None = None  # the fetch-retry tick, scheduled only while a partition awaits records
        self._data.beacon.start()
        if topics:
            self.subscribe(*topics)
        log.info("consumer %s on %s", self.address, self._data.endpoint)

    # -- public API ---------------------------------------------------------

    @property
    def connected(self) -> bool:
        """True once a tower has answered."""
        return self._data.beacon.connected

    def subscribe(self, *topics: str | Iterable[str]) -> None:
        """Add topics (exact names) to the subscription."""
        names: list[str] = []
        for t in topics:
            names.extend([t] if isinstance(t, str) else list(t))
        with self._lock:
            self._check_open()
            for topic in names:
                self._subscribe_topic(topic)
            self._flush_out()

    def deliver_into(self, topic: str, sink: RecordSink) -> None:
        """Subscribe to ``topic`` with its records put into ``sink`` rather than returned: every partition
        from its earliest record, or from where :meth:`seek` says, outside any group.  For what is built on
        a consumer, as the Kafka gateway's reader: a :class:`~dafka.consumer.state.FrameSink` takes the
        records of a message as its frames came."""
        with self._lock:
            self._check_open()
            self._subscribe_topic(topic, sink)
            self._flush_out()

    def _subscribe_topic(self, topic: str, sink: RecordSink | None = None) -> None:
        """With the lock held: ``topic`` subscribed (into ``sink``, if given) and announced."""
        for prefix in self._state.subscribe(topic, sink=sink):
            self._sub.setsockopt(zmq.SUBSCRIBE, prefix)
        self._data.add_profile(proto.ROLE_CONSUMER, topic)

    def subscription(self) -> list[str]:
        """The topics subscribed to (without the group's offsets topic)."""
        return [t for t in self._state.topics if t not in self._state.sinks]

    def assignment(self) -> set[TopicPartition]:
        """The partitions this member of a group reads now (without a group: every one met)."""
        with self._lock:
            if self._group is not None:
                return self._group.assignment()
            return {TopicPartition(*key) for key in self._state.partitions if key[0] not in self._state.sinks}

    def commit(self, offsets: dict[PartitionKey, int] | None = None) -> None:
        """Commit, for the group, the position of every partition this member
        reads (the offset after the last record returned), or the given
        ``{(topic, partition): next offset}``: a member that takes one of
        them over resumes there.  Needs a group."""
        with self._lock:
            self._check_open()
            if self._group is None:
                raise ValueError("commit needs a consumer group (Consumer(..., group=NAME)); "
                                 "without one, offsets_path keeps the positions")
            self._group.commit(offsets={(k[0], k[1]): v for k, v in offsets.items()} if offsets else None)
            self._flush_out()

    def committed(self, partition: str, topic: str | None = None) -> int | None:
        """The group's last committed offset of a partition as this member knows it (None: none)."""
        with self._lock:
            if self._group is None:
                return None
            return self._group.state.committed.get((topic or self._topic_of(partition), partition))

    def poll(self, timeout: float | None = None) -> Record[V] | None:
        """The next record, or None after ``timeout`` seconds (None: wait forever)."""
        with self._lock:
            ready = self._state.ready
            if not ready or self._closed or self._journal is not None or self._group is not None:
                ready = self._wait_ready(timeout)
                if not ready:
                    return None
            raw = ready.popleft()
            record: Record[V]
            if self._plain:
                record = raw  # type: ignore[assignment]  # a Consumer[bytes]
            else:
                record = deserialized(raw, self.value_deserializer, self.key_deserializer)
            if self._journal is not None:
                self._last = [record]
            return record

    def consume(self, max_records: int = 500, timeout: float | None = None) -> list[Record[V]]:
        """Up to ``max_records`` records in one call, waiting up to ``timeout``
        seconds (None: forever) for the first; an empty list after the
        timeout.  Like confluent-kafka's ``consume``: for throughput, it spares
        :meth:`poll`'s cost per call.  With an offsets file the whole batch
        counts as consumed when the caller comes back, as a record from
        :meth:`poll` does."""
        if max_records < 1:
            raise ValueError(f"max_records must be at least 1, got {max_records}")
        with self._lock:
            ready = self._wait_ready(timeout)
            return self._take(ready, max_records) if ready else []

    def _wait_ready(self, timeout: float | None) -> deque[Record[bytes]]:
        """With the lock held: commit what the previous call returned, then
        run the loop until records are ready or ``timeout`` passes; returns
        the ready queue (empty after a timeout)."""
        ready = self._resume()
        if not ready:
            deadline = None if timeout is None else time.monotonic() + timeout
            while not ready:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    break
                self._serve(remaining)
        return ready

    # -- the steps of a read, shared with dafka.aio.AsyncConsumer -------------

    def _resume(self) -> deque[Record[bytes]]:
        """The start of every read: raise :class:`Closed` if closed, commit
        what the previous read returned; returns the ready queue."""
        if self._closed:
            raise Closed("consumer is closed")
        if self._journal is not None:
            self._commit_last()
        if self._group is not None:
            self._group.before_read()
        return self._state.ready

    def _serve(self, timeout: float | None) -> int:
        """Serve the sockets and due timers once, waiting up to ``timeout``
        seconds, and publish what the state asks; returns how many sockets
        had something to read."""
        served = self._loop.run_once(timeout)
        self._flush_out()
        return served

    def _take(self, ready: deque[Record[bytes]], max_records: int) -> list[Record[V]]:
        """Up to ``max_records`` records off ``ready``, deserialized, and
        remembered for the offsets file (committed by the next read)."""
        if len(ready) <= max_records:
            records = list(ready)
            ready.clear()
        else:
            popleft = ready.popleft
            records = [popleft() for _ in range(max_records)]
        out: list[Record[V]]
        if self._plain:
            out = records  # type: ignore[assignment]  # a Consumer[bytes]
        elif self.key_deserializer is None:
            decode = self.value_deserializer
            assert decode is not None
            out = [Record(r.topic, r.partition, r.offset, decode(r.value)) if r.key is None
                   else deserialized(r, decode, None) for r in records]
        else:
            out = [deserialized(r, self.value_deserializer, self.key_deserializer) for r in records]
        if self._journal is not None:
            self._last = out
        return out

    def __iter__(self) -> Iterator[Record[V]]:
        while not self._closed:
            record = self.poll(1.0)
            if record is not None:
                yield record

    def seek(self, partition: str, offset: int, topic: str | None = None) -> None:
        """Deliver ``partition`` from ``offset`` on (``topic`` needed only when
        several subscribed topics could hold that partition)."""
        with self._lock:
            self._check_open()
            topic = topic or self._topic_of(partition)
            self._state.drop_ready(topic, partition)
            self._state.seek(topic, partition, offset)
            self._flush_out()

    def position(self, partition: str, topic: str | None = None) -> int | None:
        """The offset of the next record :meth:`poll` will return for ``partition``."""
        with self._lock:
            topic = topic or self._topic_of(partition)
            for r in self._state.ready:
                if (r.topic, r.partition) == (topic, partition):
                    return r.offset
            return self._state.positions().get((topic, partition))

    def positions(self) -> dict[PartitionKey, int]:
        """Next offset to return for every known (topic, partition)."""
        with self._lock:
            return self._positions()

    def _positions(self) -> dict[PartitionKey, int]:
        sinks = self._state.sinks
        positions = {key: offset for key, offset in self._state.positions().items() if key[0] not in sinks}
        for r in reversed(self._state.ready):
            positions[(r.topic, r.partition)] = r.offset
        return positions

    def stats(self) -> dict[str, int]:
        """Counters: partitions, records ready and delivered, FETCHes sent, malformed messages dropped..."""
        return {
            "partitions": len(self._state.partitions),
            "ready": len(self._state.ready),
            "malformed": self._state.malformed,
            "records_lost": self._state.records_lost,
            "compacted_skipped": self._state.compacted_skipped,
            "peers": len(self._links),
            "heads_asked": self._state.heads_asked,
            "delivered": self._state.delivered,
            "delivered_bytes": self._state.delivered_bytes,
            "fetches_sent": self._state.fetches_sent,
            "probes": self._state.probes,
            **(self._group.stats() if self._group is not None else {}),
        }

    def lags(self) -> dict[PartitionKey, int]:
        """(topic, partition) -> records known to exist past the position
        (the known head minus the next offset), like Kafka's records-lag."""
        sinks = self._state.sinks
        return {key: max(0, p.head - p.next + 1) for key, p in list(self._state.partitions.items())
                if key[0] not in sinks}

    def heads(self) -> dict[PartitionKey, int]:
        """(topic, partition) -> the highest offset known to exist (from HEADs,
        the stores' answers and the records themselves)."""
        sinks = self._state.sinks
        return {key: p.head for key, p in list(self._state.partitions.items()) if key[0] not in sinks}

    def close(self) -> None:
        """Commit (with a group or an offsets file), leave the group and close the sockets; idempotent."""
        with self._lock:
            if self._closed:
                return
            if self._group is not None:
                self._group.close()
            self._closed = True
            self._commit_last()
            if self._journal is not None:
                self._journal.close()
            self._data.close()
            self._sub.close(0)
            self._xpub.close(0)

    def __enter__(self) -> Consumer[V]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ----------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise Closed("consumer is closed")

    def _topic_of(self, partition: str) -> str:
        topics = [t for (t, p) in self._state.positions() if p == partition]
        if len(topics) == 1:
            return topics[0]
        if len(self._state.topics) == 1:
            return self._state.topics[0]
        raise ValueError(f"say which topic partition {partition} belongs to")

    def _commit_last(self) -> None:
        """The records returned by the previous poll or consume are consumed
        now that the caller came back for more: record their positions."""
        last = self._last
        if last and self._journal is not None:
            ends: dict[PartitionKey, int] = {}
            for r in last:
                ends[(r.topic, r.partition)] = r.offset + 1
            for (topic, partition), offset in ends.items():
                self._journal.record(topic, partition, offset)
        self._last = []

    def _flush_out(self) -> None:
        if self._group is not None:
            self._group.settle()
            changes = self._state.sub_changes
            if changes:
                for add, prefix in changes:
                    self._sub.setsockopt(zmq.SUBSCRIBE if add else zmq.UNSUBSCRIBE, prefix)
                changes.clear()
        out = self._state.out
        if out:
            for frames in out:
                self._xpub.send_multipart(frames)
            out.clear()
        state = self._state
        starting = state.latest.due() if state.latest.waiting else None  # a partition ``latest`` waits to start
        if state.awaiting or state.quiet_watch or state.heads_due is not None or starting is not None:
            # the fetch-retry tick while partitions await records or a quiet moment, else the tail watch's next turn
            when = time.monotonic() + _TICK if state.awaiting or state.quiet_watch else \
                min(t for t in (state.heads_due, starting) if t is not None)
            if self._tick_timer is None or when < self._tick_timer.when:
                if self._tick_timer is not None:
                    self._tick_timer.cancel()
                self._tick_timer = self._loop.call_later(max(0.0, when - time.monotonic()), self._tick)

    def _on_beacon(self, pipe: zmq.Socket[Any]) -> None:
        gone = self._links.on_beacon(pipe)
        self._state.on_peers(self._links.senders(), gone, time.monotonic())

    def _tick(self) -> None:
        self._tick_timer = None
        self._state.tick(time.monotonic())
        self._flush_out()

    def _on_sub(self, sock: zmq.Socket[Any]) -> None:
        state = self._state
        state.now = time.monotonic()
        ready = state.ready
        while True:
            read = drain_records(sock, DRAIN_STEP, state)
            self._backlog += read
            if read < DRAIN_STEP:  # the queue is empty
                if self._backlog >= self._full_queue:
                    # It was full: senders dropped what came next, and maybe no later message shows it.
                    state.probe()
                self._backlog = 0
                return
            if len(ready) >= DRAIN:
                return

    def _on_subscriptions(self, sock: zmq.Socket[Any]) -> None:
        while True:
            try:
                frame = sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            if frame[1:2] == proto.PEER_INFO:
                try:
                    self._data.answer_info(proto.decode_subscription(frame))
                except proto.MalformedMessage:
                    self._state.on_subscription(frame)  # counted there
                continue
            self._state.on_subscription(frame)


def _group_name(group: str) -> str:
    """A group name that fits the wire: a topic of the offsets topic's name, a GROUP-MEMBER's topic."""
    if not group or "\0" in group:
        raise ValueError(f"group name must be non-empty without NUL, got {group!r}")
    if len(offsets_topic(group).encode()) > 255:
        raise ValueError(f"group name {group!r} is too long: at most {255 - len(offsets_topic(''))} bytes")
    return group
