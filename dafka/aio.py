"""The producer and consumer for asyncio applications, in aiokafka's shape.

    async with AsyncProducer("weather", config) as producer:
        metadata = await producer.send_and_wait(b"sunny")  # once producer/min_acks stores acked
        future = await producer.send(b"rain")              # a SendFuture of RecordMetadata
        await producer.flush()

    async with AsyncConsumer("weather", config=config, offsets_path="w.offsets") as consumer:
        async for record in consumer: ...
        record = await consumer.getone()
        batches = await consumer.getmany(timeout_ms=1000, max_records=500)

Both wrap the synchronous peers and keep their design, because it measured
best (bench/run.py, README):

* :class:`AsyncConsumer` does the protocol work in the event loop's thread, as
  :class:`dafka.Consumer` does it in the caller's: the same sockets, reactor,
  sans-I/O state and offsets journal.  While a read waits, the event loop
  watches the sockets' file descriptors (``add_reader``) and the reactor's
  next timer; no thread, no hop per record, no polling.
* :class:`AsyncProducer` publishes in the event loop's thread, like
  :meth:`dafka.Producer.send`; the producer's own thread handles ACKs and
  FETCHes and, when ACKs release records, schedules one callback on the event
  loop that resolves every awaited future of a released record at once.  A
  full buffer is awaited, never slept on.

Neither object is thread-safe: use each from its event loop's thread.
Cancelling any of their awaits leaves the object usable and loses nothing.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import time
from collections import deque
from itertools import groupby
from operator import itemgetter
from typing import Any, Callable, Generator, Generic, Iterable, Sequence, TypeVar, Unpack, overload

import zmq

from .records import PartitionKey
from .config import ConfigLike
from .consumer.consumer import Consumer, ConsumerOptions
from .consumer.state import RecordSink
from .errors import BufferFull, Closed, FlushTimeout
from .groups.membership import Callback, ConsumerRebalanceListener
from .producer.producer import Producer, SendHandle
from .protocol.attributes import Attributes
from .protocol.attributes import sizes as attribute_sizes
from .records import Record, RecordMetadata, TopicPartition

__all__ = ["AsyncConsumer", "AsyncProducer", "SendFuture", "TopicPartition"]

V = TypeVar("V")  # a record's value (see dafka.Producer and dafka.Consumer)

_topic_partition = itemgetter(0, 1)  # of a Record (a named tuple)


class _Wakeup:
    """Tasks waiting for "something may have changed", each on a future of its
    own, so that cancelling one waiter never disturbs another."""

    __slots__ = ("_futures",)

    def __init__(self) -> None:
        self._futures: set[asyncio.Future[None]] = set()

    async def wait(self, timeout: float | None) -> None:
        """Until :meth:`notify`, or ``timeout`` seconds (None: no limit)."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._futures.add(future)
        timer = None if timeout is None else loop.call_later(max(timeout, 0.0), _set_done, future)
        try:
            await future
        finally:
            self._futures.discard(future)
            if timer is not None:
                timer.cancel()

    def notify(self) -> None:
        futures = self._futures
        if futures:
            for future in futures:
                _set_done(future)
            futures.clear()


def _set_done(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _bind(bound: asyncio.AbstractEventLoop | None, what: str) -> asyncio.AbstractEventLoop:
    """The running loop, which must be the one ``what`` is already bound to, if any."""
    loop = asyncio.get_running_loop()
    if bound is not None and bound is not loop:
        raise RuntimeError(f"this {what} is bound to another event loop")
    return loop


class AsyncConsumer(Generic[V]):
    """Read records of one or more topics from asyncio, in order per partition,
    once each: :class:`dafka.Consumer`'s guarantees, arguments and errors.

    ``async for record in consumer`` (ends when the consumer is closed),
    :meth:`getone`, :meth:`getmany`.  With ``offsets_path``, what a read
    returned counts as consumed when the next read starts (or at close), as
    with the sync consumer.

    Unlike aiokafka: the consumer is built (sockets bound, discovery started)
    in the constructor, so a bad config raises there, and reads start it
    implicitly; :meth:`getone`/:meth:`getmany` take no partitions to filter on;
    partitions are producers' addresses."""

    # Typed as AsyncConsumer[bytes] without a value_deserializer, else AsyncConsumer[what it returns].
    @overload
    def __init__(self: AsyncConsumer[bytes], *topics: str, value_deserializer: None = None,
                 **options: Unpack[ConsumerOptions]) -> None: ...

    @overload
    def __init__(self: AsyncConsumer[V], *topics: str, value_deserializer: Callable[[bytes], V],
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
        self._consumer: Consumer[V] = Consumer(
            *topics, config=config, address=address, value_deserializer=value_deserializer,
            key_deserializer=key_deserializer, offsets_path=offsets_path, ctx=ctx, group=group, listener=listener,
            on_assign=on_assign, on_revoke=on_revoke, enable_auto_commit=enable_auto_commit,
            auto_commit_interval_ms=auto_commit_interval_ms)
        # async for takes records straight off the ready queue while nothing is to be done per record.
        self._fast = value_deserializer is None and key_deserializer is None and offsets_path is None and group is None
        self._state = self._consumer._state
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sockets: list[zmq.Socket[Any]] = []
        self._fds: list[int] = []
        self._wakeup = _Wakeup()

    # -- life cycle -----------------------------------------------------------

    async def start(self) -> None:
        """Attach to the running event loop (reads do it too)."""
        self._attach()

    def _attach(self) -> None:
        if self._fds:
            _bind(self._loop, "consumer")
            return
        consumer = self._consumer
        if consumer._closed:
            raise Closed("consumer is closed")
        loop = self._loop = _bind(self._loop, "consumer")
        self._sockets = consumer._loop.sockets()
        for sock in self._sockets:
            fd: int = sock.getsockopt(zmq.FD)  # type: ignore[assignment]  # an int for ZMQ_FD
            loop.add_reader(fd, self._on_readable, sock)
            self._fds.append(fd)

    def _on_readable(self, sock: zmq.Socket[Any]) -> None:
        # A ZeroMQ socket's FD only signals that its state may have changed:
        # reading EVENTS takes that signal (the FD stays readable until then)
        # and the waiting reads drain the sockets until nothing is left.
        sock.getsockopt(zmq.EVENTS)
        self._wakeup.notify()

    def _readable(self) -> bool:
        """Whether a socket has a message although its FD may not say so:
        sending (the FETCHes the state asked for) also takes the signal."""
        return any(int(sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN for sock in self._sockets)

    async def stop(self) -> None:
        """Close at once, as :meth:`dafka.Consumer.close` does; a read waiting
        meanwhile raises :class:`Closed` (``async for`` ends)."""
        consumer = self._consumer
        if consumer._closed:
            return
        if self._loop is not None and not self._loop.is_closed():
            for fd in self._fds:
                self._loop.remove_reader(fd)
        self._fds.clear()
        self._sockets = []
        self._fast = False
        consumer.close()
        self._wakeup.notify()

    close = stop  # the sync API's name

    async def __aenter__(self) -> AsyncConsumer[V]:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- reading --------------------------------------------------------------

    async def getone(self) -> Record[V]:
        """The next record, waiting as long as it takes."""
        ready = await self._wait_ready(None)
        return self._consumer._take(ready, 1)[0]

    async def getmany(self, timeout_ms: int = 0, max_records: int | None = None) -> dict[TopicPartition, list[Record[V]]]:
        """The records ready now, up to ``max_records`` (None: all), waiting up
        to ``timeout_ms`` for the first; ``{}`` after the timeout.  Keyed by
        :class:`TopicPartition` (equal to the tuple ``(topic, partition)``),
        each list in offset order, as aiokafka's."""
        if max_records is not None and max_records < 1:
            raise ValueError(f"max_records must be at least 1, got {max_records}")
        ready = await self._wait_ready(max(timeout_ms, 0) / 1000.0)
        if not ready:
            return {}
        batches: dict[PartitionKey, list[Record[V]]] = {}
        # Records come in runs of one partition: grouped in C, as runs.
        for key, run in groupby(self._consumer._take(ready, max_records or len(ready)), _topic_partition):
            batch = batches.get(key)
            if batch is None:
                batches[key] = list(run)
            else:
                batch.extend(run)
        return {TopicPartition(*key): batch for key, batch in batches.items()}

    def __aiter__(self) -> AsyncConsumer[V]:
        return self

    async def __anext__(self) -> Record[V]:
        """The next record for ``async for`` (which ends when the consumer is closed)."""
        ready = self._state.ready
        if ready and self._fast:
            return ready.popleft()  # type: ignore[return-value]  # _fast: no deserializer, an AsyncConsumer[bytes]
        try:
            ready = await self._wait_ready(None)
        except Closed:
            raise StopAsyncIteration from None
        return self._consumer._take(ready, 1)[0]

    async def _wait_ready(self, timeout: float | None) -> deque[Record[bytes]]:
        """Commit what the previous read returned, then serve the consumer's
        sockets and timers until records are ready or ``timeout`` seconds
        pass; returns the ready queue (empty after the timeout).

        Records leave the queue only after this returns, with no await in
        between, so a cancelled read has taken nothing."""
        self._attach()
        ready = self._consumer._resume()
        if ready:
            return ready
        ready = self._consumer._state.ready
        await self.serve(ready.__len__, timeout)
        return ready

    async def serve(self, until: Callable[[], object], timeout: float | None) -> None:
        """Serve the consumer's sockets and timers until ``until()`` is true (checked after each burst of
        messages) or ``timeout`` seconds pass: what runs a consumer whose records go into sinks
        (:meth:`deliver_into`)."""
        self._attach()
        consumer = self._consumer
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            served = consumer._serve(0)
            if until():
                return
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return
            if served or self._readable():
                await asyncio.sleep(0)  # a burst that made no record ready: let other tasks run, then read on
            else:
                wait = None if deadline is None else deadline - now
                timer = consumer._loop.next_deadline()
                if timer is not None:
                    wait = timer - now if wait is None else min(wait, timer - now)
                await self._wakeup.wait(wait)
            if consumer._closed:
                raise Closed("consumer is closed")

    # -- the rest of the sync API ----------------------------------------------

    @property
    def address(self) -> str:
        """The consumer's address (the requester in its FETCHes)."""
        return self._consumer.address

    @property
    def connected(self) -> bool:
        """True once a tower has answered."""
        return self._consumer.connected

    def subscribe(self, *topics: str | Iterable[str]) -> None:
        """Add topics, as :meth:`dafka.Consumer.subscribe`."""
        self._consumer.subscribe(*topics)

    def deliver_into(self, topic: str, sink: RecordSink) -> None:
        """Subscribe to ``topic`` with its records put into ``sink``, as :meth:`dafka.Consumer.deliver_into`;
        :meth:`serve` runs the consumer meanwhile."""
        self._consumer.deliver_into(topic, sink)

    def subscription(self) -> list[str]:
        """The topics subscribed to."""
        return self._consumer.subscription()

    def seek(self, partition: str, offset: int, topic: str | None = None) -> None:
        """Deliver ``partition`` from ``offset`` on, as :meth:`dafka.Consumer.seek`."""
        self._consumer.seek(partition, offset, topic)

    def position(self, partition: str, topic: str | None = None) -> int | None:
        """The next offset to deliver of ``partition`` (None if unknown)."""
        return self._consumer.position(partition, topic)

    def positions(self) -> dict[PartitionKey, int]:
        """The next offset to deliver of every partition, by (topic, partition)."""
        return self._consumer.positions()

    def stats(self) -> dict[str, int]:
        """The sync consumer's counters (:meth:`dafka.Consumer.stats`)."""
        return self._consumer.stats()

    def assignment(self) -> set[TopicPartition]:
        """The partitions this consumer reads (with a group: those assigned to it)."""
        return self._consumer.assignment()

    async def commit(self, offsets: dict[PartitionKey, int] | None = None) -> None:
        """Commit for the group, as :meth:`dafka.Consumer.commit` (a coroutine, as in aiokafka)."""
        self._consumer.commit(offsets)

    async def committed(self, partition: str, topic: str | None = None) -> int | None:
        """The group's last commit of ``partition`` (None if none)."""
        return self._consumer.committed(partition, topic)


class SendFuture:
    """What :meth:`AsyncProducer.send` returns: a future of the record's
    :class:`RecordMetadata`, done once ``producer/min_acks`` stores have ACKed
    the record; after the producer closed without those ACKs it fails with
    :class:`Closed`.

    ``await`` it, or use ``done()``, ``result()``, ``exception()``,
    ``cancelled()``, ``cancel()``, ``add_done_callback(fn)`` (``fn`` gets the
    asyncio Future behind it) and ``remove_done_callback(fn)``.  It passes
    ``asyncio.isfuture``, so ``gather``, ``wait``, ``wait_for`` and ``shield``
    take it as they take a Future, without wrapping it in a Task.  The
    asyncio Future behind it is only created when one of those needs it: a
    Future per record, resolved from the producer's thread, costs more than
    the send itself (README, "asyncio"), so a record whose future nobody
    looks at costs one small object, as the sync :class:`dafka.SendHandle`
    does.  Cancelling it only stops the waiting: the record stays sent."""

    __slots__ = ("_producer", "offset", "_future")
    _asyncio_future_blocking = False  # asyncio.isfuture(): used as a Future, never wrapped in a Task

    def __init__(self, producer: AsyncProducer[Any], offset: int) -> None:
        self._producer = producer
        self.offset = offset
        self._future: asyncio.Future[RecordMetadata] | None = None

    @property
    def partition(self) -> str:
        """The partition the record went to: the producer's address."""
        return self._producer.address

    def future(self) -> asyncio.Future[RecordMetadata]:
        """The asyncio Future behind it (created now if needed)."""
        future = self._future
        if future is None:
            future = self._future = self._producer._future_of(self.offset)
        return future

    def __await__(self) -> Generator[Any, None, RecordMetadata]:
        return self.future().__await__()

    def get_loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the producer is bound to (asyncio's Future API)."""
        loop = self._producer._loop
        assert loop is not None  # a SendFuture exists only once a send bound the producer to its loop
        return loop

    def done(self) -> bool:
        """Whether the record is acked, failed or the future was cancelled."""
        if self._future is not None:
            return self._future.done()
        return self._producer._outcome(self.offset) is not None

    def cancelled(self) -> bool:
        """Whether the waiting was cancelled (the record stays sent)."""
        return self._future is not None and self._future.cancelled()

    def cancel(self, msg: Any = None) -> bool:
        """Stop waiting for the ACKs; the record stays sent."""
        return self.future().cancel(msg)

    def result(self) -> RecordMetadata:
        """The record's :class:`~dafka.RecordMetadata` once acked; raises as asyncio's ``Future.result``."""
        if self._future is not None:
            return self._future.result()
        outcome = self._producer._outcome(self.offset)
        if outcome is None:
            raise asyncio.InvalidStateError("the record is not acked yet")
        if isinstance(outcome, Closed):
            raise outcome
        return outcome

    def exception(self) -> BaseException | None:
        """The error the record failed with (:class:`~dafka.Closed`), or None."""
        if self._future is not None:
            return self._future.exception()
        outcome = self._producer._outcome(self.offset)
        if outcome is None:
            raise asyncio.InvalidStateError("the record is not acked yet")
        return outcome if isinstance(outcome, Closed) else None

    def add_done_callback(self, fn: Callable[[asyncio.Future[RecordMetadata]], object], *,
                          context: Any = None) -> None:
        """Call ``fn`` with the asyncio Future behind this one when it is done."""
        self.future().add_done_callback(fn, context=context)

    def remove_done_callback(self, fn: Callable[[asyncio.Future[RecordMetadata]], object]) -> int:
        """Remove ``fn`` from the callbacks; returns how many were removed."""
        return 0 if self._future is None else self._future.remove_done_callback(fn)

    # What asyncio.gather reads of a cancelled child, besides the public methods.
    @property
    def _cancel_message(self) -> Any:
        return self.future()._cancel_message  # type: ignore[attr-defined]

    def _make_cancelled_error(self) -> asyncio.CancelledError:
        error: asyncio.CancelledError = self.future()._make_cancelled_error()  # type: ignore[attr-defined]
        return error

    def __repr__(self) -> str:
        return f"<SendFuture {self._producer.topic}/{self.partition}@{self.offset} done={self.done()}>"



class AsyncProducer(Generic[V]):
    """Publish records to ``topic`` as one partition, from asyncio:
    :class:`dafka.Producer`'s guarantees, arguments and errors.

    :meth:`send` returns (once the record is published) a :class:`SendFuture`
    of its :class:`RecordMetadata`, done when ``producer/min_acks`` stores
    have ACKed it; :meth:`send_and_wait` waits for that too.  A full buffer
    of unacked records makes :meth:`send` wait, in order of the calls, up to
    ``producer/send_timeout`` and then raise :class:`BufferFull`.

    Unlike aiokafka: records have no partition argument (a producer is one
    partition); the producer starts in the constructor; the future is created
    lazily (:class:`SendFuture`)."""

    # Typed as AsyncProducer[bytes] without a value_serializer, else AsyncProducer[what it takes].
    @overload
    def __init__(
        self: AsyncProducer[bytes], topic: str, config: ConfigLike = None, *, address: str | None = None,
        value_serializer: None = None, ctx: zmq.Context[Any] | None = None, resume: bool = False,
        key_serializer: Callable[[Any], bytes] | None = None,
    ) -> None: ...

    @overload
    def __init__(
        self: AsyncProducer[V], topic: str, config: ConfigLike = None, *, address: str | None = None,
        value_serializer: Callable[[V], bytes], ctx: zmq.Context[Any] | None = None, resume: bool = False,
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
        key_serializer: Callable[[Any], bytes] | None = None,
    ) -> None:
        # The value serializer runs here, once per record, even when send waits for room and tries again.
        # (With resume=True the constructor waits for the stores' heads, as the sync Producer's does.)
        self._producer = Producer(topic, config, address=address, ctx=ctx, resume=resume,
                                  key_serializer=key_serializer)
        self.value_serializer = value_serializer
        self._loop: asyncio.AbstractEventLoop | None = None
        # The asyncio Futures of unacked records that someone asked for, by offset (a heap).
        self._pending: list[tuple[int, asyncio.Future[RecordMetadata]]] = []
        self._resolve_scheduled = False
        self._wakeup = _Wakeup()
        self._room = asyncio.Lock()  # sends waiting for room take turns
        self._waiting_for_room = 0

    @property
    def topic(self) -> str:
        """The topic this producer publishes to."""
        return self._producer.topic

    @property
    def address(self) -> str:
        """The producer's address: the partition its records land in."""
        return self._producer.address

    @property
    def connected(self) -> bool:
        """True once a tower has answered."""
        return self._producer.connected

    @property
    def next_offset(self) -> int:
        """The offset the next record sent gets (:attr:`dafka.Producer.next_offset`)."""
        return self._producer.next_offset

    def stats(self) -> dict[str, int]:
        """The sync producer's counters (:meth:`dafka.Producer.stats`)."""
        return self._producer.stats()

    # -- life cycle -------------------------------------------------------------

    async def start(self) -> None:
        """Attach to the running event loop (sends do it too)."""
        self._attach()

    def _attach(self) -> None:
        if self._producer._release_listener is not None:
            _bind(self._loop, "producer")
            return
        if self._producer._closed:
            raise Closed("producer is closed")
        self._loop = _bind(self._loop, "producer")
        self._producer._release_listener = self._on_release

    async def stop(self, timeout: float | None = None) -> None:
        """Wait for the acks (unless ``producer/terminate_unacked``), then stop,
        as :meth:`dafka.Producer.close` does: after ``timeout`` seconds (default
        ``producer/close_timeout``) it stops anyway and raises
        :class:`FlushTimeout` with the number of unacked records, whose
        futures fail with :class:`Closed`.  Cancelled while it waits, the
        producer stays open."""
        producer = self._producer
        if producer._closed:
            return
        config = producer.config
        if not config["producer/terminate_unacked"]:
            try:
                await self.flush(config["producer/close_timeout"] / 1000.0 if timeout is None else timeout)
            except FlushTimeout:
                pass  # the sync close below says how many are left
        try:
            producer.close(timeout=0)
        finally:
            producer._release_listener = None
            self._resolve()
            self._wakeup.notify()

    close = stop  # the sync API's name

    async def __aenter__(self) -> AsyncProducer[V]:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- sending ----------------------------------------------------------------

    async def send(self, value: V, key: Any = None, *, headers: Sequence[tuple[str, bytes | None]] | None = None,
                   timestamp_ms: int | None = None) -> SendFuture:
        """Publish one record (with ``key``, ``headers`` and ``timestamp_ms``, as :meth:`dafka.Producer.send`);
        returns its :class:`SendFuture`, done once ``producer/min_acks``
        stores have ACKed it (at once with 0).  Raises
        :class:`RecordTooLarge`, :class:`BufferFull` and :class:`Closed` as
        the sync ``send`` does.  Cancelled while it waits for room, it has
        sent nothing."""
        if self._producer._release_listener is None:
            self._attach()
        if self.value_serializer is not None:
            raw = self.value_serializer(value)
        else:
            raw = value  # type: ignore[assignment]  # an AsyncProducer[bytes]: bytes (the producer checks)
        if not self._waiting_for_room:
            try:
                return SendFuture(self, self._producer.send(raw, key=key, headers=headers, timestamp_ms=timestamp_ms,
                                                            timeout=0).offset)
            except BufferFull:
                pass
        send = functools.partial(self._producer.send, raw, key=key, headers=headers, timestamp_ms=timestamp_ms,
                                 timeout=0)
        return SendFuture(self, await self._send_when_room(send))

    async def send_many(self, values: Sequence[V], *, keys: Sequence[Any] | None = None,
                        attributes: Sequence[Attributes | None] | None = None) -> int:
        """Publish several records at once, in order, as :meth:`dafka.Producer.send_many` does (in as few
        RECORDS as fit, no Python step per record); returns the first one's offset (the others follow it).
        While the unacked buffer lacks room for them all, waits for it without blocking the loop
        (:class:`BufferFull` after ``producer/send_timeout``); a burst larger than the whole buffer goes
        record by record, as :meth:`send`.  Wait for the acks with ``SendFuture(producer, last offset)``.
        ``attributes``: each record's (:mod:`dafka.protocol.attributes`; None: none)."""
        if self._producer._release_listener is None:
            self._attach()
        raws: Sequence[bytes] = values if self.value_serializer is None \
            else [self.value_serializer(v) for v in values]  # type: ignore[assignment]  # bytes for [bytes]
        producer = self._producer
        state = producer._state
        size = sum(map(len, raws)) + (sum(len(k) for k in keys if k is not None) if keys is not None else 0)
        if attributes is not None:
            size += sum(attribute_sizes(attributes))
        if state.min_acks and (len(raws) > state.max_unacked or size > state.max_unacked_bytes):
            first = -1
            for i, raw in enumerate(raws):
                held = None if attributes is None else attributes[i]
                send = functools.partial(producer.send_many, [raw], keys=None if keys is None else [keys[i]],
                                         attributes=None if held is None else [held], timeout=0)
                offset = await self._send_when_room(send)
                first = offset if first < 0 else first
            return first
        async with self._room:  # behind the sends already waiting
            await self._room_for(len(raws), size)
            return producer.send_many(raws, keys=keys, timeout=0, attributes=attributes)

    async def wait_for_room(self, count: int, size: int) -> None:
        """Until the unacked buffer has room for ``count`` records of ``size`` bytes in all (keys included),
        as :meth:`send_many` waits (:class:`BufferFull` after ``producer/send_timeout``): what this task sends
        next, before it awaits anything else, then goes out at once."""
        if self._producer._release_listener is None:
            self._attach()
        async with self._room:
            await self._room_for(count, size)

    async def _room_for(self, count: int, size: int) -> None:
        producer = self._producer
        state = producer._state
        deadline = time.monotonic() + producer.send_timeout
        while not state.room_for(count, size):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise producer._buffer_full(producer.send_timeout)
            await self._wakeup.wait(remaining)

    async def send_and_wait(self, value: V, key: Any = None) -> RecordMetadata:
        """Publish one record and wait until ``producer/min_acks`` stores have ACKed it."""
        return await (await self.send(value, key))

    async def flush(self, timeout: float | None = None) -> None:
        """Wait until every record sent so far is acked by ``producer/min_acks``
        stores; :class:`FlushTimeout` after ``timeout`` seconds (None: no limit)."""
        producer = self._producer
        state = producer._state
        target = state.next_seq - 1
        deadline = None if timeout is None else time.monotonic() + timeout
        while state.released < target:
            if producer._closed:
                raise Closed("producer closed before the records were acked")
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise producer._flush_timeout(timeout or 0.0)
            self._attach()
            await self._wakeup.wait(remaining)
        self._resolve()  # every future of a record sent before the flush is done when it returns

    async def _send_when_room(self, send: Callable[[], SendHandle | int]) -> int:
        """Wait for room (behind the sends already waiting), then publish with ``send`` (the producer's,
        which raises :class:`BufferFull` at once without room); returns the record's offset.
        :class:`BufferFull` after ``producer/send_timeout``."""
        producer = self._producer
        timeout = producer.send_timeout
        deadline = time.monotonic() + timeout
        self._waiting_for_room += 1
        try:
            async with self._room:
                while True:
                    try:
                        sent = send()
                        return sent if isinstance(sent, int) else sent.offset
                    except BufferFull:
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            raise producer._buffer_full(timeout) from None
                    await self._wakeup.wait(remaining)
        finally:
            self._waiting_for_room -= 1

    # -- acks ---------------------------------------------------------------------

    def _outcome(self, offset: int) -> RecordMetadata | Closed | None:
        """What the record at ``offset`` came to: its metadata once acked,
        :class:`Closed` if the producer closed first, None while it waits."""
        producer = self._producer
        if offset <= producer._state.released:
            return RecordMetadata(producer.topic, producer.address, offset)
        if producer._closed:
            return Closed(f"producer closed before record {offset} was acked")
        return None

    def _future_of(self, offset: int) -> asyncio.Future[RecordMetadata]:
        """A new asyncio Future for the record at ``offset``, resolved now if
        its outcome is known, else by :meth:`_resolve` or at close."""
        if self._producer._release_listener is None:  # (a SendFuture of a record sent before this process)
            self._attach()
        loop = self._loop
        assert loop is not None
        future = loop.create_future()
        outcome = self._outcome(offset)
        if outcome is None:
            heapq.heappush(self._pending, (offset, future))
        elif isinstance(outcome, Closed):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
        return future

    def _on_release(self) -> None:
        """From the producer's thread: ACKs released records.  One callback is
        scheduled for any number of releases until it runs."""
        if self._resolve_scheduled:
            return
        self._resolve_scheduled = True
        try:
            self._loop.call_soon_threadsafe(self._resolve)  # type: ignore[union-attr]  # bound before any send
        except RuntimeError:
            pass  # the event loop is closed: nobody is left to wake

    def _resolve(self) -> None:
        """Settle the asyncio Futures whose outcome is known and wake the waiters."""
        self._resolve_scheduled = False  # before reading ``released``: a later release schedules again
        pending = self._pending
        while pending:
            outcome = self._outcome(pending[0][0])
            if outcome is None:
                break
            _, future = heapq.heappop(pending)
            if future.done():  # the caller cancelled it
                continue
            if isinstance(outcome, Closed):
                future.set_exception(outcome)
                # close() has already reported these records (FlushTimeout): spare
                # asyncio's "exception was never retrieved" log for each future.
                future.exception()
            else:
                future.set_result(outcome)
        self._wakeup.notify()
