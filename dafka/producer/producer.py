"""The public producer: one partition of one topic.

``send`` runs in the caller's thread: it encodes the RECORD and writes it to
the data socket under a lock, so the per-record path never crosses threads.
A background loop thread owns everything else (ACKs, FETCH answers, HEADs,
discovery) and takes the same lock whenever it touches the data socket or the
state.
"""

from __future__ import annotations

import functools
import logging
import operator
import threading
import time
from collections import deque
from typing import Any, Callable, Generic, Sequence, TypeVar, overload

import zmq

from .. import protocol as proto
from ..config import ConfigError, ConfigLike, as_config
from ..core import heap
from ..core.addresses import is_tagged_producer, new_address
from ..core.loop import Loop
from ..core.sockets import ZERO_COPY_BYTES, connect, drain, queue_messages, read_subscriptions, wake_pipe
from ..core.sockets import raw_send as _raw_send
from ..discovery.beacon import CONNECT, Beacon
from ..discovery.links import DataSocket
from ..errors import BufferFull, Closed, FlushTimeout, PartitionClaimed, RecordTooLarge
from ..protocol import batching
from ..protocol.attributes import Attributes, record_attributes
from ..protocol.attributes import size as attributes_size
from ..protocol.attributes import sizes as attribute_sizes
from ..records import RecordMetadata
from .resume import ResumeState
from .state import ProducerState

V = TypeVar("V")  # what send takes: bytes, or what the value_serializer takes

log = logging.getLogger(__name__)

# After a peer connects to the data socket, when to look for its subscriptions (seconds after the
# handshake): they follow the handshake at once, and a new subscriber of our records gets a HEAD.
_SUBSCRIPTION_LOOKS = (0.001, 0.005, 0.025, 0.1)
# While records go out, the data socket is looked at for new subscriptions at most this often (seconds):
# the look costs a socket option read (about 1.3 us with pyzmq), too much for every record.
_SUBSCRIPTION_LOOK_INTERVAL = 0.001
# After a store reader subscribes to a resuming producer's GET-HEADS, when to ask again (seconds): its
# answer is lost if our SUB's subscription has not reached it yet.
_RESUME_ASKS = (0.05, 0.25)
_LINGER = b"L"  # on the wake-up pipe: a batch waits, send it after batching.LINGER
_clock = time.perf_counter


class SendHandle:
    """Returned by :meth:`Producer.send`: resolves once ``min_acks`` stores have
    ACKed the record (at once with ``min_acks = 0``).  Costs one small object."""

    __slots__ = ("_producer", "offset")

    def __init__(self, producer: Producer[Any], offset: int) -> None:
        self._producer = producer
        self.offset = offset

    @property
    def partition(self) -> str:
        """The partition the record went to: the producer's address."""
        return self._producer.address

    def done(self) -> bool:
        """Whether ``producer/min_acks`` stores have ACKed the record."""
        return self.offset <= self._producer._state.released

    def get(self, timeout: float | None = None) -> RecordMetadata:
        """Wait for the acks; raises :class:`FlushTimeout` after ``timeout`` seconds."""
        self._producer._wait_released(self.offset, timeout)
        return RecordMetadata(self._producer.topic, self._producer.address, self.offset)

    def __repr__(self) -> str:
        return f"<SendHandle {self._producer.topic}/{self.partition}@{self.offset} done={self.done()}>"




def _as_bytes(value: object, what: str = "value") -> bytes:
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"record {what} must be bytes (or set {what}_serializer), got {type(value).__name__}")


class Producer(Generic[V]):
    """Publish records to ``topic`` as one partition.

    >>> with Producer("weather", {"beacon/address": "127.0.0.1"}) as p:
    ...     p.send(b"sunny").get(timeout=5)

    Each new producer is a new partition, counting from 0, unless it is given
    a stable ``address`` (:func:`dafka.partition_address` makes one from a
    name) and ``resume=True``: it then continues that partition, asking the
    stores for its head before the first record, which gets head + 1
    (rfc/dafka.md section 15).  The constructor waits for that, up to
    ``producer/resume_timeout``, and raises :class:`~dafka.ResumeError` when
    too few stores answer, or :class:`~dafka.PartitionClaimed` when another
    live process beacons the same address.  ``on_resume(head)``, if given, is
    called with the head before the producer claims the partition (beacons
    its address): an exception it raises ends the constructor, and nothing
    was claimed (a mirror uses it to leave a partition that is not its own).
    """

    # Typed as Producer[bytes] without a value_serializer, else Producer[what it takes].
    @overload
    def __init__(
        self: Producer[bytes], topic: str, config: ConfigLike = None, *, address: str | None = None,
        value_serializer: None = None, ctx: zmq.Context[Any] | None = None, resume: bool = False,
        on_resume: Callable[[int], None] | None = None, key_serializer: Callable[[Any], bytes] | None = None,
    ) -> None: ...

    @overload
    def __init__(
        self: Producer[V], topic: str, config: ConfigLike = None, *, address: str | None = None,
        value_serializer: Callable[[V], bytes], ctx: zmq.Context[Any] | None = None, resume: bool = False,
        on_resume: Callable[[int], None] | None = None, key_serializer: Callable[[Any], bytes] | None = None,
    ) -> None: ...

    @overload  # a serializer or None, known only at run time (a wrapper's)
    def __init__(
        self: Producer[Any], topic: str, config: ConfigLike = None, *, address: str | None = None,
        value_serializer: Callable[[Any], bytes] | None = None, ctx: zmq.Context[Any] | None = None,
        resume: bool = False, on_resume: Callable[[int], None] | None = None,
        key_serializer: Callable[[Any], bytes] | None = None,
    ) -> None: ...

    def __init__(
        self,
        topic: str,
        config: ConfigLike = None,
        *,
        address: str | None = None,
        value_serializer: Callable[[V], bytes] | None = None,
        ctx: zmq.Context[Any] | None = None,
        resume: bool = False,
        on_resume: Callable[[int], None] | None = None,
        key_serializer: Callable[[Any], bytes] | None = None,
    ) -> None:
        if resume and not address:
            raise ValueError("resume=True continues a partition: give its address= (dafka.partition_address(name))")
        self.config = as_config(config)
        c = self.config
        proto.subscription(proto.RECORD, topic)  # validates: no NUL
        if len(topic.encode()) > proto.MAX_STRING:
            raise ValueError(f"topic is longer than {proto.MAX_STRING} bytes")
        self.topic = topic
        self.address = address or new_address(producer=True)
        self.value_serializer = value_serializer
        self.key_serializer = key_serializer
        self.min_acks = c["producer/min_acks"]
        replicas = c["store/replicas"]
        if 0 < replicas < self.min_acks:
            raise ConfigError(f"{self.min_acks} is above store/replicas ({replicas}): with sharded stores only "
                              f"the {replicas} stores that hold a partition ACK its records",
                              key="producer/min_acks")
        self.max_record_bytes = c["producer/max_record_bytes"]
        self.send_timeout = c["producer/send_timeout"] / 1000.0
        self._state = ProducerState(
            self.address,
            topic,
            min_acks=self.min_acks,
            max_unacked=c["producer/max_unacked"],
            max_unacked_bytes=c["producer/max_unacked_bytes"],
            fetch_inflight_bytes=c["producer/fetch_inflight_bytes"],
            started=_clock(),
        )
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._trims = 0
        self._next_trim = 0.0
        self._callbacks: deque[tuple[int, Callable[[RecordMetadata | None, Exception | None], None]]] = deque()
        self._closed = False
        self._resumable = resume
        self._on_resume = on_resume
        self._resume: ResumeState | None = None  # while the constructor learns the partition's head
        self._fenced: PartitionClaimed | None = None  # another live process writes this partition
        # a sharded store said its store/replicas, below our min_acks: no record could ever be released
        self._misconfigured: ConfigError | None = None
        # Called from the loop thread, without the lock, whenever ACKs release records (dafka.aio).
        self._release_listener: Callable[[], None] | None = None
        self._stopping = threading.Event()
        self._ctx = ctx or zmq.Context.instance()
        self._pub = self._ctx.socket(zmq.XPUB)
        self._pub.setsockopt(zmq.XPUB_VERBOSER, 1)  # every (un)subscription: who reads RECORDS (dafka.protocol.batching)
        self._pub.sndhwm = queue_messages(c["producer/send_bytes"], c["producer/high_watermark"])
        self._pub.linger = 1000
        # A resuming producer asks for its head under a temporary address (dafka.producer.resume, rule 5),
        # tagged as a producer's: the next resume neither waits for it to connect nor, once it is gone, to expire.
        self._requester = new_address(producer=True) if resume else self.address
        self._data = DataSocket(self._ctx, c, self._pub, self._requester, "producer",
                                profiles=[(proto.ROLE_PRODUCER, topic)])
        self._peers: dict[str, tuple[zmq.Socket[Any], str]] = {}  # endpoint -> (its SUB, its sender)
        # With min_acks <= 1 it does not matter which store an ACK comes from:
        # one SUB serves every peer (P producers make P sockets, not P squared).
        self._shared_sub = self._peer_socket() if self.min_acks <= 1 else None
        self._loop = Loop()
        self._loop.add_reader(self._data.beacon.events, self._on_beacon)
        if self._shared_sub is not None:
            self._loop.add_reader(self._shared_sub, lambda sock: self._on_peer_message(sock, "store"))
        # The data socket is the caller's (send) as much as the loop's, so the loop
        # cannot poll it: it learns of a new connection from its monitor, and then
        # reads the subscriptions under the lock.  Later (un)subscriptions are looked
        # for as records go out and ACKs come in (at most every millisecond); while
        # all is idle, only the HEAD timer picks them up.
        self._monitor = self._pub.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
        self._connections = 0  # connections to the data socket so far (a peer that came and left counts too)
        self._connected_at = float("-inf")  # when the last one connected
        self._loop.add_reader(self._monitor, self._on_connection)
        self._wake, self._waker = wake_pipe(self._ctx, "producer")
        self._loop.add_reader(self._wake, self._drain_wake)
        self._lingering = False  # a batch waits for the loop to send it
        self._next_look = 0.0  # when to look for new subscriptions next as records go out
        self._loop.call_every(c["producer/head_interval"] / 1000.0, self._on_head_timer)
        self._data.beacon.start()
        self._thread = threading.Thread(target=self._run, name=f"dafka-producer-{self.address[:8]}", daemon=True)
        if resume:
            try:
                self._resume_partition()
            except BaseException:
                self._release_sockets()
                raise
        self._first_seq = self._state.next_seq  # its HEAD goes right after it (see send)
        self._thread.start()
        log.info("producer %s of topic %r on %s", self.address, topic, self._data.endpoint)

    # -- public API ---------------------------------------------------------

    @property
    def connected(self) -> bool:
        """True once a tower has answered."""
        return self._data.beacon.connected

    @property
    def endpoint(self) -> str:
        """The data socket's endpoint, as beaconed to the towers."""
        return self._data.endpoint

    @property
    def acked_offset(self) -> int:
        """The highest offset up to which every record is acked by
        ``producer/min_acks`` stores (-1: none yet); a cheap read, unlike :meth:`stats`."""
        return self._state.released

    @property
    def next_offset(self) -> int:
        """The offset the next record sent gets (after a resume: the partition's head + 1)."""
        return self._state.next_seq

    def send(
        self,
        value: V,
        *,
        key: Any = None,
        headers: Sequence[tuple[str, bytes | None]] | None = None,
        timestamp_ms: int | None = None,
        on_delivery: Callable[[RecordMetadata | None, Exception | None], None] | None = None,
        timeout: float | None = None,
    ) -> SendHandle:
        """Publish one record; thread-safe.

        ``key`` (bytes, or what ``key_serializer`` takes; None: no key) travels
        with the record to dafka-py consumers and stores (rfc section 18); a
        reference peer gets the value alone.  So do ``headers`` ((name, value)
        pairs, as kafka-python's) and ``timestamp_ms`` (unix milliseconds), the
        record's attributes (rfc section 18.4), which Kafka consumers of the
        gateway read as the record's.  Blocks while
        ``producer/max_unacked`` records (or bytes) wait for acks, up to
        ``timeout`` seconds (default ``producer/send_timeout``), then raises
        :class:`BufferFull`.  ``on_delivery(metadata, None)`` is called from
        the producer's thread once the record is acked."""
        if self.value_serializer is not None:
            raw = self.value_serializer(value)
        else:
            raw = value  # type: ignore[assignment]  # a Producer[bytes]: bytes, or checked below
        if type(raw) is not bytes:
            raw = _as_bytes(raw)
        raw_key = None if key is None else self._key_bytes(key)
        size = len(raw) if raw_key is None else len(raw) + len(raw_key)
        attributes = None
        if headers is not None or timestamp_ms is not None:
            attributes = record_attributes(headers, timestamp_ms)
            size += attributes_size(attributes)
        if size > self.max_record_bytes:
            raise RecordTooLarge(
                f"record of {size} bytes is over producer/max_record_bytes={self.max_record_bytes}; "
                "nothing was sent"
            )
        with self._lock:
            self._raise_unless_open()
            state = self._state
            now = _clock()
            plain = raw_key is None and attributes is None
            seq = state.publish(raw, now) if plain else state.publish_keyed(raw, raw_key, now, attributes)
            if seq < 0:
                seq = self._publish_when_room(raw, self.send_timeout if timeout is None else timeout, raw_key,
                                              attributes)
            audience = state.audience
            if audience.records and now >= audience.records_after:  # for who reads no batches (reference peers)
                if not plain and audience.batches:
                    # the batch first: a dafka-py consumer gets the RECORD too (PUB cannot leave it out), and
                    # takes whichever form comes first
                    self._send_batch()
                pub = self._pub
                _raw_send(pub, state.record_frame(seq), zmq.SNDMORE)
                _raw_send(pub, raw)
            first = seq == self._first_seq
            if audience.batches:
                if state.batch_due or first:  # (the first record goes at once, before its HEAD below)
                    self._send_batch()
                elif not self._lingering:
                    self._lingering = True  # the loop sends the batch if no record fills it first
                    self._waker.send(_LINGER, zmq.NOBLOCK)
            elif now >= self._next_look:
                self._look_for_subscriptions(now)  # (with batches, after a batch is sent)
            if on_delivery is not None:
                self._callbacks.append((seq, on_delivery))
            if first:
                # A HEAD at once after the first record: who reads only some partitions of the topic (a
                # consumer group's member) learns of this one now, not a head_interval later.
                self._pub.send(state.head_frame())
        return SendHandle(self, seq)

    def send_many(self, values: Sequence[V], *, keys: Sequence[Any] | None = None, timeout: float | None = None,
                  offset: int | None = None, attributes: Sequence[Attributes | None] | None = None) -> int:
        """Publish several records at once, in order; thread-safe.  Returns
        the offset of the first (the others follow it, consecutively).  With
        ``offset``, the first record must get exactly that offset: a mirror
        copies record *k* of a partition as record *k*, and anything else
        raises :class:`ValueError` before any record is sent.  ``keys``, if
        given, holds one key per value (None: that record has none), as
        :meth:`send`'s ``key``; ``attributes`` likewise (:func:`dafka.protocol.attributes`:
        a timestamp and encoded headers, as :meth:`send` makes them).

        For a caller that already holds a burst (a CDC connector draining its
        replication stream): the records go out in as few RECORDS messages as
        fit (rfc section 13), under one lock, so the stores ACK them together,
        whatever the time between the caller's records.  Waits for room like
        :meth:`send`; a record over ``producer/max_record_bytes`` raises
        :class:`RecordTooLarge` before any is sent."""
        raws: Sequence[bytes]
        if self.value_serializer is not None:
            raws = list(map(self.value_serializer, values))
        else:
            raws = values  # type: ignore[assignment]  # a Producer[bytes]: bytes, or checked below
        if set(map(type, raws)) - {bytes}:  # (tested in C: a mirror sends bytes, many at a time)
            raws = [raw if type(raw) is bytes else _as_bytes(raw) for raw in raws]
        raw_keys: list[bytes | None] | None = None
        if keys is not None:
            if len(keys) != len(raws):
                raise ValueError(f"{len(keys)} keys for {len(raws)} values: nothing was sent")
            raw_keys = [None if key is None else self._key_bytes(key) for key in keys]
            if all(key is None for key in raw_keys):
                raw_keys = None
        if attributes is not None:
            if len(attributes) != len(raws):
                raise ValueError(f"{len(attributes)} attributes for {len(raws)} values: nothing was sent")
            if all(a is None for a in attributes):
                attributes = None
        if not raws:
            return self._state.next_seq
        sizes = list(map(len, raws)) if raw_keys is None else \
            [len(raw) + (0 if key is None else len(key)) for raw, key in zip(raws, raw_keys)]
        if attributes is not None:
            sizes = list(map(operator.add, sizes, attribute_sizes(attributes)))
        largest = max(sizes)
        if largest > self.max_record_bytes:
            raise RecordTooLarge(f"record of {largest} bytes is over producer/max_record_bytes="
                                 f"{self.max_record_bytes}; nothing was sent")
        timeout = self.send_timeout if timeout is None else timeout
        total = sum(sizes)
        # Chunks of about one RECORDS each (batching.BURST_RECORDS records or BURST_BYTES bytes).
        step = max(1, min(batching.BURST_RECORDS, len(raws) * batching.BURST_BYTES // max(total, 1)))
        with self._lock:
            self._raise_unless_open()
            state = self._state
            if offset is not None and offset != state.next_seq:
                raise ValueError(f"partition {self.address} of topic {self.topic!r} is at offset {state.next_seq}, "
                                 f"not {offset}: nothing was sent")
            first_seq = state.next_seq
            now = _clock()
            for start in range(0, len(raws), step):
                chunk = raws[start:start + step]
                chunk_keys = None if raw_keys is None else raw_keys[start:start + step]
                chunk_attributes = None if attributes is None else attributes[start:start + step]
                seq = state.publish_many(chunk, sum(sizes[start:start + step]) if step < len(raws) else total, now,
                                         chunk_keys, chunk_attributes)
                if seq < 0:
                    # too little room for all: wait record by record
                    self._publish_one_by_one(chunk, now, timeout, chunk_keys, chunk_attributes)
                    continue
                audience = state.audience
                if chunk_keys is not None or chunk_attributes is not None:
                    self._send_batch()  # with keys, the batch before the RECORDs (see send)
                if audience.records and now >= audience.records_after:  # a RECORD each for reference peers
                    pub = self._pub
                    for i, value in enumerate(chunk, seq):
                        _raw_send(pub, state.record_frame(i), zmq.SNDMORE)
                        _raw_send(pub, value)
                self._send_batch()
            self._send_batch()
            if first_seq <= self._first_seq <= state.next_seq - 1:
                self._pub.send(state.head_frame())  # as after send()'s first record
            elif now >= self._next_look:
                self._look_for_subscriptions(now)
        return first_seq

    def _publish_one_by_one(self, values: Sequence[bytes], now: float, timeout: float,
                            keys: Sequence[bytes | None] | None,
                            attributes: Sequence[Attributes | None] | None = None) -> None:
        """With the lock held: publish ``values`` (with ``keys`` and ``attributes``), waiting for room as each
        needs it."""
        state = self._state
        audience = state.audience
        pub = self._pub
        none = [None] * len(values)
        for value, key, held in zip(values, keys or none, attributes or none):
            plain = key is None and held is None
            seq = state.publish(value, now) if plain else state.publish_keyed(value, key, now, held)
            if seq < 0:
                self._send_batch()  # what waits goes before the wait for room
                seq = self._publish_when_room(value, timeout, key, held)
            if audience.records and now >= audience.records_after:
                if not plain and audience.batches:
                    self._send_batch()  # the batch before the RECORD (see send)
                _raw_send(pub, state.record_frame(seq), zmq.SNDMORE)
                _raw_send(pub, value)
            if audience.batches and (len(state.batch) >= batching.MAX_RECORDS
                                     or state.batch_bytes >= batching.MAX_BYTES):
                self._send_batch()

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every record sent so far is acked by ``min_acks`` stores."""
        with self._cond:
            target = self._state.next_seq - 1
        self._wait_released(target, timeout)

    def close(self, timeout: float | None = None) -> None:
        """Flush (unless ``producer/terminate_unacked``), then stop.

        Never hangs: after ``timeout`` seconds (default ``producer/close_timeout``)
        it stops anyway and raises :class:`FlushTimeout` saying how many records
        were left unacked."""
        if self._closed:
            return
        error: FlushTimeout | ConfigError | None = None
        terminate = self.config["producer/terminate_unacked"]
        if not terminate:
            try:
                self.flush(self.config["producer/close_timeout"] / 1000.0 if timeout is None else timeout)
            except (FlushTimeout, ConfigError) as exc:  # (ConfigError: min_acks above the stores' replicas)
                error = exc
        self._announce(self.config["producer/close_linger"] / 1000.0)
        with self._cond:
            self._closed = True
            unacked = self._state.unacked if self.min_acks else 0
            self._cond.notify_all()
        self._stopping.set()
        try:
            self._waker.send(b"", zmq.NOBLOCK)
        except zmq.ZMQError:
            pass  # the loop has ended
        self._thread.join(5)
        head = self._state.head_frame()
        if head is not None:
            # A last HEAD: who missed the last records (a burst before its subscription arrived) learns
            # of them now, and fetches them from the stores, not when this producer's beacon expires.
            self._pub.send(head, zmq.NOBLOCK)
        self._release_sockets()
        if unacked and terminate:
            log.warning("producer %s closed with %d records unacked (terminate_unacked)", self.address, unacked)
        if isinstance(error, ConfigError):
            raise error
        if error is not None:
            raise FlushTimeout(
                f"producer {self.address} closed with {error.unacked} record(s) not acked by "
                f"{self.min_acks} store(s)", error.unacked,
            )

    def _announce(self, linger: float) -> None:
        """Before the last HEAD: wait, ``linger`` seconds at most, until every peer we know of (by beacon,
        those that connect to producers) has connected to the data socket and its subscriptions were read,
        so that each learns the partition while somebody can still answer for it (rfc 6.6).  A reference
        store learns a partition only from a HEAD that reaches it, and one that connects late would
        otherwise never hear of a short-lived producer's partition.  Connections are counted, not peers
        (a bound PUB socket cannot tell who connected): a peer that left without ever connecting stays
        known until its beacon expires, and close then waits the whole linger."""
        if self._state.next_seq == 0 or linger <= 0:
            return
        deadline = time.monotonic() + linger
        while self._connections < len(self._peers) and time.monotonic() < deadline and self._thread.is_alive():
            time.sleep(0.01)
        # its subscriptions are read at most _SUBSCRIPTION_LOOKS[-1] after the connection (then: a HEAD at once)
        settled = self._connected_at + _SUBSCRIPTION_LOOKS[-1] + 0.01
        remaining = min(settled, deadline) - time.monotonic()
        if remaining > 0:
            time.sleep(remaining)

    def _release_sockets(self) -> None:
        self._waker.close(0)
        self._pub.disable_monitor()
        self._monitor.close(0)
        self._wake.close(0)
        self._data.close()
        for sock in {sock for sock, _ in self._peers.values()}:
            sock.close(0)
        self._peers.clear()
        if self._shared_sub is not None:
            self._shared_sub.close(0)
        self._pub.close()

    def stats(self) -> dict[str, int]:
        """Counters: records sent and acked, unacked records and bytes, FETCH answers, peers..."""
        with self._cond:
            s = self._state
            return {
                "sent": s.next_seq,
                "acked": s.released + 1,
                "unacked": s.unacked,
                "buffered": len(s.buffer),
                "buffered_bytes": s.buffered_bytes,
                "peers": len(self._peers),  # connected to: every live peer but other dafka-py producers
                "peers_seen": len(self._data.beacon.peers()),  # every live peer the towers report
                "malformed": s.malformed,
                "sent_bytes": s.published_bytes,
                "fetches_received": s.fetches_received,
                "records_answered": s.records_answered,
                "tails_sent": s.tails_sent,  # DIRECT-TAILs: asked for records let go that no store held
                "fetches_unheard": s.settling.unheard_dropped,  # dropped: nobody subscribed to their answers
                "bytes_answered": s.ledger.bytes_sent,
                "inflight_bytes": s.ledger.total(),
                "batches_sent": s.batches_sent,
                "audience_records": int(s.audience.records),
                "audience_batches": int(s.audience.batches),
                "claimed": int(self._fenced is not None),
                "heap_trims": self._trims,  # times a drained unacked window gave its memory back
            }

    def __enter__(self) -> Producer[V]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- waiting ------------------------------------------------------------

    def _publish_when_room(self, value: bytes, timeout: float, key: bytes | None = None,
                           attributes: Attributes | None = None) -> int:
        """Wait (the lock released meanwhile) until the buffer takes ``value``;
        returns its sequence, or raises :class:`BufferFull` after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        state = self._state
        while True:
            now = _clock()
            seq = state.publish(value, now) if key is None and attributes is None \
                else state.publish_keyed(value, key, now, attributes)
            if seq >= 0:
                return seq
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._buffer_full(timeout)
            if self._closed:
                raise Closed("producer is closed")
            self._cond.wait(remaining)

    def _wait_released(self, offset: int, timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._state.released < offset:
                if self._closed:
                    raise Closed("producer closed before the record was acked")
                if self._misconfigured is not None:
                    raise self._misconfigured
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise self._flush_timeout(timeout or 0.0)
                self._cond.wait(remaining)

    def _buffer_full(self, waited: float) -> BufferFull:
        state = self._state
        return BufferFull(
            f"{state.unacked} records ({state.buffered_bytes} bytes) await acks from "
            f"{self.min_acks} store(s); waited {waited:.3g}s for room (producer/max_unacked="
            f"{state.max_unacked}, producer/max_unacked_bytes={state.max_unacked_bytes})"
        )

    def _flush_timeout(self, waited: float) -> FlushTimeout:
        unacked = self._state.next_seq - 1 - self._state.released
        return FlushTimeout(f"{unacked} record(s) not acked by {self.min_acks} store(s) after {waited:.3g}s", unacked)

    # -- resuming the partition (constructor, before the loop thread starts) ----

    def _resume_partition(self) -> None:
        """Learn the partition's head from the stores (dafka.producer.resume), running
        the loop in the caller's thread; the first record gets head + 1."""
        beacon = self._data.beacon
        started = time.monotonic()
        twin_wait = 1.5 * self.config["beacon/interval"] / 1000.0
        state = self._resume = ResumeState(self.address, self.topic, requester=self._requester,
                                           min_stores=self.min_acks, started=started,
                                           timeout=self.config["producer/resume_timeout"] / 1000.0,
                                           twin_wait=twin_wait, settle=self.config["beacon/timeout"] / 1000.0)
        try:
            while True:
                now = time.monotonic()
                # A reference tower never says it has replayed the live peers: by twin_wait, every live peer
                # has beaconed through it.
                replayed = beacon.replayed or (beacon.connected and now >= started + twin_wait)
                live = beacon.peers()
                peers = sum(1 for sender in live.values() if not is_tagged_producer(sender))
                twins = sorted(endpoint for endpoint, sender in live.items() if sender == self.address)
                head = state.decide(now, peers=peers, replayed=replayed, twins=twins)
                if head is not None:
                    break
                if state.asks_due:  # a twin went: its last records may be newer than the answers heard
                    state.asks_due = False
                    self._ask_heads()
                    self._ask_heads_again()
                self._loop.run_once(0.01)
                self._poll_subscriptions()
        finally:
            self._resume = None
        if self._on_resume is not None:
            self._on_resume(head)
        self._state.resume_after(head, _clock())
        self._loop.remove_reader(beacon.events)
        self._loop.add_reader(self._data.rebeacon(self.address).events, self._on_beacon)
        log.info("producer %s resumes topic %r after offset %d (%d store answer(s))", self.address, self.topic,
                 head, state.heads_seen)

    def _ask_heads(self) -> None:
        if self._resume is not None:
            self._pub.send_multipart(self._resume.ask(time.monotonic()))

    def _ask_heads_again(self) -> None:
        """Ask the stores again a little later (_RESUME_ASKS): an answer is lost while our own SUB to its
        store is not subscribed yet."""
        for delay in _RESUME_ASKS:
            self._loop.call_later(delay, self._ask_heads)

    def _fence(self, twins: list[str]) -> None:
        """Another live process beacons our address: stop writing the partition."""
        with self._cond:
            if self._fenced is None:
                self._fenced = PartitionClaimed(
                    f"partition {self.address} of topic {self.topic!r} is also beaconed by {', '.join(twins)}: "
                    "a partition has one writer, so this producer stopped sending")
                log.error("%s", self._fenced)
                self._cond.notify_all()

    # -- the loop thread ----------------------------------------------------

    def _run(self) -> None:
        backoff = 0.0  # while answers meet full queues and none go out: the wait before the next try
        try:
            state = self._state
            while not self._stopping.is_set():
                timeout = backoff if state.can_answer() else None
                if state.settling.waiting:  # FETCHes that wait for their requesters' subscriptions to settle
                    with self._lock:
                        due = state.settling.next_due()
                    if due is not None:
                        due = max(0.0, due - _clock())
                        timeout = due if timeout is None else min(timeout, due)
                self._loop.run_once(timeout)
                if state.settling.waiting:
                    with self._lock:
                        state.settle(_clock())
                if state.answering:
                    with self._lock:
                        sent = self._send_answers()
                    backoff = 0.0 if sent or not self._state.refused else min(max(2 * backoff, 0.001), 0.05)
        except Exception:
            log.exception("producer %s loop failed", self.address)
            raise

    def _send_answers(self) -> int:
        """One round of FETCH answers (with the lock held); returns how many
        messages went out.  The data socket drops nothing while it sends
        them (``XPUB_NODROP``): a message that finds its requester's queue
        full is refused, and its answer waits for a later round, where a
        dropped one would have been charged to the requester's budget for
        good (rfc 6.7).  Live records keep PUB's semantics, dropped for a
        full queue, so that one slow subscriber never holds back the rest."""
        pub = self._pub
        answers = self._state.fetch_answers()
        sent = 0
        pub.setsockopt(zmq.XPUB_NODROP, 1)
        try:
            frames = next(answers)
            while True:
                try:
                    _raw_send(pub, frames[0], zmq.SNDMORE | zmq.NOBLOCK if len(frames) > 1 else zmq.NOBLOCK)
                except zmq.Again:
                    frames = answers.send(False)
                    continue
                for frame in frames[1:-1]:
                    _raw_send(pub, frame, zmq.SNDMORE)
                if len(frames) > 1:
                    last = frames[-1]
                    _raw_send(pub, last, 0, len(last) < ZERO_COPY_BYTES)
                sent += 1
                frames = answers.send(True)
        except StopIteration:
            pass
        finally:
            pub.setsockopt(zmq.XPUB_NODROP, 0)
        return sent

    def _on_head_timer(self) -> None:
        if self._resumable and self._resume is None:  # (while resuming, the probe waits twins out)
            twins = self._data.beacon.twins()
            if twins:
                self._fence(twins)
        self._poll_subscriptions()
        with self._cond:
            frame = self._state.head_frame()
            if frame is not None:
                self._pub.send(frame)

    def _on_connection(self, monitor: zmq.Socket[Any]) -> None:
        """A peer connected to the data socket: its subscriptions follow."""
        while True:
            try:
                monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            self._connections += 1
            self._connected_at = time.monotonic()
            if self._resume is not None:
                self._resume.on_connection()
        for delay in _SUBSCRIPTION_LOOKS:
            self._loop.call_later(delay, self._poll_subscriptions)

    def _drain_wake(self, sock: zmq.Socket[Any]) -> None:
        if drain(sock, _LINGER):
            self._loop.call_later(batching.LINGER, self._send_lingering)

    def _send_lingering(self) -> None:
        with self._lock:
            self._lingering = False
            self._send_batch()

    def _send_batch(self) -> None:
        """With the lock held: the records waiting for a batch, as one KEYED-RECORDS and/or RECORDS."""
        messages = self._state.take_batch()
        if messages:
            pub = self._pub
            for frames in messages:
                last = len(frames) - 1
                for i, frame in enumerate(frames):
                    _raw_send(pub, frame, 0 if i == last else zmq.SNDMORE, len(frame) < ZERO_COPY_BYTES)
            self._look_if_due()
            # a burst's next record is timed from here: the send itself is no pause in the burst
            self._state.last_publish = _clock()

    def _key_bytes(self, key: Any) -> bytes:
        raw = key if self.key_serializer is None else self.key_serializer(key)
        return raw if type(raw) is bytes else _as_bytes(raw, "key")

    def _poll_subscriptions(self) -> None:
        with self._cond:
            self._read_subscriptions()

    def _read_subscriptions(self) -> None:
        """With the lock held: take in the (un)subscriptions the data socket
        received; a new subscriber of our records or HEADs gets a HEAD at once,
        so that it fetches what was published before its subscription arrived."""
        wants_head = False
        for sub in read_subscriptions(self._pub):
            if sub is None:
                self._state.malformed += 1
            elif not self._data.answer_info(sub):
                wants_head = self._state.on_subscription(sub, _clock()) or wants_head
                if self._resume is not None and sub.subscribe and sub.msg_id == proto.GET_HEADS:
                    # A store reader: ask every store now, and again while the way back may not be up yet.
                    self._pub.send_multipart(self._resume.on_store_reader(time.monotonic()))
                    self._ask_heads_again()
        answers = self._state.heads_at_out
        if answers:
            for frames in answers:  # (before the HEAD: the consumer knows where to start when it comes)
                self._pub.send(frames[0], zmq.NOBLOCK)
            answers.clear()
        if wants_head:
            self._pub.send(self._state.head_frame())
        if threading.get_ident() != self._thread.ident and (self._state.settling.waiting or self._state.answering):
            # (read by send() in the caller's thread) FETCHes taken in, or waiting to be: the loop answers them
            self._waker.send(b"", zmq.NOBLOCK)
        if not self._state.audience.batches:
            self._send_batch()  # nobody reads batches any more: what waits goes now

    def _look_for_subscriptions(self, now: float) -> None:
        """With the lock held: read the subscriptions if some arrived.  Called
        as records go out (at most every :data:`_SUBSCRIPTION_LOOK_INTERVAL`)
        and as ACKs come in, so that a peer subscribing on a connection already
        open (a group member taking a partition) hears at once of what it
        missed, not at the next HEAD timer."""
        self._next_look = now + _SUBSCRIPTION_LOOK_INTERVAL
        if self._pub.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            self._read_subscriptions()

    def _look_if_due(self) -> None:
        """With the lock held: :meth:`_look_for_subscriptions` unless it looked
        less than :data:`_SUBSCRIPTION_LOOK_INTERVAL` ago (``send()`` makes the
        same test inline, with the time it already has)."""
        now = _clock()
        if now >= self._next_look:
            self._look_for_subscriptions(now)

    def _peer_socket(self) -> zmq.Socket[Any]:
        sock = self._data.secure(self._ctx.socket(zmq.SUB))
        sock.linger = 0
        sock.rcvhwm = self.config["producer/high_watermark"]
        sock.setsockopt(zmq.SUBSCRIBE, proto.subscription(proto.ACK, self.address, exact=True))
        sock.setsockopt(zmq.SUBSCRIBE, proto.subscription(proto.FETCH, self.address, exact=True))
        if self.min_acks >= 2:  # sharded stores' heartbeats: their store/replicas (rfc 16)
            sock.setsockopt(zmq.SUBSCRIBE, proto.subscription(proto.STORE_MEMBER, exact=True))
        if self._requester != self.address:  # the stores' answers to the probe's GET-HEADS
            sock.setsockopt(zmq.SUBSCRIBE, proto.subscription(proto.DIRECT_HEAD, self._requester, exact=True))
            sock.setsockopt(zmq.SUBSCRIBE, proto.subscription(proto.DIRECT_PARTITIONS, self._requester, exact=True))
        return sock

    def _on_beacon(self, pipe: zmq.Socket[Any]) -> None:
        """Connect to every peer the tower reports: through one SUB each when
        ACKs must be counted per store (min_acks >= 2: an ACK's store is the
        connection it came on), else through the one shared SUB."""
        shared = self._shared_sub
        for event in Beacon.read_events(pipe):
            if event.kind == CONNECT:
                if event.endpoint in self._peers or is_tagged_producer(event.sender):
                    continue  # another dafka-py producer sends us nothing (rfc 5.5)
                if shared is not None:
                    if connect(shared, event.endpoint):
                        self._peers[event.endpoint] = (shared, event.sender)
                    continue
                sock = self._peer_socket()
                if not connect(sock, event.endpoint):
                    sock.close(0)
                    continue
                self._peers[event.endpoint] = (sock, event.sender)
                self._loop.add_reader(sock, functools.partial(self._on_peer_message, sender=event.sender))
            else:
                known = self._peers.pop(event.endpoint, None)
                if known is None:
                    continue
                if shared is not None:
                    try:
                        shared.disconnect(event.endpoint)
                    except zmq.ZMQError:
                        pass  # already gone
                    continue
                self._loop.remove_reader(known[0])
                known[0].close(0)
                with self._cond:
                    self._state.forget_store(known[1])

    def _on_peer_message(self, sock: zmq.Socket[Any], sender: str) -> None:
        released = False
        with self._cond:
            for _ in range(10_000):
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                try:
                    msg = proto.decode(frames)
                except proto.MalformedMessage as exc:
                    self._state.malformed += 1
                    log.debug("producer %s dropped a malformed frame: %s", self.address, exc)
                    continue
                if type(msg) is proto.AckMsg:
                    released = self._state.on_ack(sender, msg) or released
                elif type(msg) is proto.FetchMsg:
                    self._state.on_fetch(msg, _clock())
                elif type(msg) is proto.StoreMemberMsg:
                    self._on_store_member(msg)
                elif self._resume is not None:
                    self._resume.on_message(msg)
            self._look_if_due()
            if released:
                self._cond.notify_all()
                callbacks = self._due_callbacks()
        if released:
            if self._state.trim_due:
                self._trim_heap()
            if self._release_listener is not None:
                self._release_listener()
            for seq, callback in callbacks:
                try:
                    callback(RecordMetadata(self.topic, self.address, seq), None)
                except Exception:
                    log.exception("on_delivery callback failed")

    def _raise_unless_open(self) -> None:
        """With the lock held: why this producer takes no more records, if it takes none."""
        if self._closed or self._fenced is not None or self._misconfigured is not None:
            raise self._fenced or self._misconfigured or Closed("producer is closed")

    def _on_store_member(self, msg: proto.StoreMemberMsg) -> None:
        """With the lock held: a sharded store's heartbeat.  Only store/replicas stores hold a partition, so
        a min_acks above it could never be met: every send, send_many and flush raises from now on."""
        if 0 < msg.replicas < self.min_acks and self._misconfigured is None:
            self._misconfigured = ConfigError(
                f"{self.min_acks} is above the store/replicas of the sharded stores ({msg.replicas}, store "
                f"{msg.store}): only the {msg.replicas} stores that hold a partition ACK its records",
                key="producer/min_acks")
            log.error("producer %s: %s", self.address, self._misconfigured)
            self._cond.notify_all()

    def _trim_heap(self) -> None:
        """The unacked window drained after holding many bytes: give what it freed back to the system,
        at most once a second (a trim costs 10-20 ms)."""
        now = time.monotonic()
        if now < self._next_trim:
            return  # still due: the next ACK tries again
        self._state.trim_due = False
        self._next_trim = now + 1.0
        heap.trim()
        self._trims += 1

    def _due_callbacks(self) -> list[tuple[int, Callable[[RecordMetadata | None, Exception | None], None]]]:
        released = self._state.released
        due = []
        while self._callbacks and self._callbacks[0][0] <= released:
            due.append(self._callbacks.popleft())
        return due
