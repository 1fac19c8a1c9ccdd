"""The gateway's asyncio server: Kafka connections in, dafka peers out.

One task per connection reads a request, has :class:`~.mapping.Mapping`
answer it, does what the answer asks of the cluster, and writes the
response, one request at a time per connection, as a Kafka broker does.

* Producing: Kafka partition ``n`` of a topic is a
  :class:`dafka.aio.AsyncProducer` at :func:`~.mapping.address_of`, resumed
  (rfc 15): a restarted gateway goes on from the stores' head.
* Fetching: each connection that fetches has its own
  :class:`dafka.aio.AsyncConsumer` (reset ``earliest``), subscribed to the
  topics it reads and seeked to each partition's fetch offset; what it
  delivers waits in a per-partition buffer for the next Fetch.
* A topic is learnt once, by a survey of the cluster (:class:`dafka.survey.StatusPeer`):
  the partitions whose addresses are the gateway's numbering are its Kafka partitions.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from dafka.aio import AsyncConsumer, AsyncProducer, SendFuture
from dafka.config import Config
from dafka.errors import BufferFull, DafkaError, RecordTooLarge
from dafka.survey import StatusPeer

from . import errors
from .mapping import Answer, Appends, Mapping, Reads, TopicView, address_of
from .messages import Request, read_request, response_frame, unsupported_api_versions
from .wire import DecodeError

log = logging.getLogger(__name__)

SURVEY_SECONDS = 1.0  # how long a new topic's survey listens for the stores' heads
BUFFER_RECORDS = 50_000  # records a connection keeps per partition between two Fetches
FETCH_POLL_MS = 5  # how long one read of the connection's consumer waits while a Fetch long-polls
_SIZE = struct.Struct(">i")

Row = tuple[int, int, bytes | None, bytes | None]  # offset, unix ms, key, value


@dataclass
class Counters:
    connections: int = 0
    requests: int = 0
    malformed: int = 0
    records_in: int = 0
    records_out: int = 0


@dataclass
class _PartitionBuffer:
    next: int = -1  # the offset the consumer delivers next (-1: not seeked yet)
    rows: deque[Row] = field(default_factory=deque)


class _Reader:
    """One connection's reads: a dafka consumer and what it delivered, by (topic, partition address)."""

    def __init__(self, config: Config) -> None:
        self.consumer: AsyncConsumer[bytes] = AsyncConsumer(config=config.with_overrides(
            {"consumer/offset/reset": "earliest"}, source="kafka gateway"))
        self.buffers: dict[tuple[str, str], _PartitionBuffer] = {}
        self.topics: set[str] = set()

    def want(self, topic: str, address: str, offset: int) -> _PartitionBuffer:
        if topic not in self.topics:
            self.topics.add(topic)
            self.consumer.subscribe(topic)
        buf = self.buffers.setdefault((topic, address), _PartitionBuffer())
        if buf.rows and buf.rows[0][0] <= offset <= buf.rows[-1][0] + 1:
            while buf.rows and buf.rows[0][0] < offset:
                buf.rows.popleft()
            return buf
        if buf.next != offset:
            buf.rows.clear()
            buf.next = offset
            self.consumer.seek(address, offset, topic=topic)
        return buf

    async def pump(self, timeout_ms: int) -> None:
        got = await self.consumer.getmany(timeout_ms=timeout_ms)
        now = int(time.time() * 1000)
        for (topic, address), records in got.items():
            buf = self.buffers.get((topic, address))
            if buf is None:
                continue
            for r in records:
                if r.offset == buf.next:
                    buf.rows.append((r.offset, now, getattr(r, "key", None), r.value))
                    buf.next = r.offset + 1
            while len(buf.rows) > BUFFER_RECORDS:
                buf.rows.popleft()

    async def close(self) -> None:
        await self.consumer.stop()


class KafkaGateway:
    def __init__(self, config: Config, *, address: str = "127.0.0.1", port: int = 9092,
                 advertise: tuple[str, int] | None = None, num_partitions: int = 1, auto_create: bool = True,
                 max_request_bytes: int = 100 * 1024 * 1024) -> None:
        self.config = config
        self.address, self.port = address, port
        self.advertise = advertise
        self.max_request_bytes = max_request_bytes
        self.num_partitions = num_partitions
        self.auto_create = auto_create
        self.mapping: Mapping | None = None
        self.counters = Counters()
        self.producers: dict[tuple[str, int], AsyncProducer[bytes]] = {}
        self.views: dict[str, TopicView] = {}
        self._resolving: dict[str, asyncio.Future[None]] = {}
        self._server: asyncio.base_events.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.address, self.port, limit=2 ** 20)
        bound = self._server.sockets[0].getsockname()
        self.port = bound[1]
        host, port = self.advertise or (self.address, self.port)
        self.mapping = Mapping(host, port, auto_create=self.auto_create, num_partitions=self.num_partitions,
                               max_request_records_bytes=self.max_request_bytes)
        log.info("kafka gateway on %s:%d (advertised %s:%d)", self.address, self.port, host, port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        for producer in self.producers.values():
            try:
                await producer.stop()
            except DafkaError as exc:
                log.warning("closing %s: %s", producer.address, exc)

    # -- topics ----------------------------------------------------------------------------

    async def _known(self, names: list[str] | None, create: list[str]) -> dict[str, TopicView]:
        for name in (names or []):
            if name not in self.views:
                await self._resolve(name, name in create)
        views = self.views if names is None else {n: self.views[n] for n in names if n in self.views}
        for view in views.values():  # only the topics this request names: their heads now
            view.heads = [self.producers[(view.name, i)].next_offset - 1 for i in range(view.count)]
        return views

    async def _resolve(self, name: str, create: bool) -> None:
        pending = self._resolving.get(name)
        if pending is None:
            pending = self._resolving[name] = asyncio.ensure_future(self._learn(name, create))
        try:
            await asyncio.shield(pending)
        finally:
            if pending.done():
                self._resolving.pop(name, None)

    async def _learn(self, name: str, create: bool) -> None:
        loop = asyncio.get_running_loop()
        found = await loop.run_in_executor(None, self._survey, name)
        count = 0
        while address_of(name, count) in found:
            count += 1
        if count == 0 and not create:
            return
        count = count or self.num_partitions
        producers = await asyncio.gather(*(loop.run_in_executor(None, self._producer, name, i) for i in range(count)))
        for i, producer in enumerate(producers):
            self.producers[(name, i)] = producer
        self.views[name] = TopicView(name, [p.next_offset - 1 for p in producers])
        log.info("topic %r: %d partition(s)", name, count)

    def _survey(self, topic: str) -> set[str]:
        peer = StatusPeer(self.config, topic)
        try:
            peer.start()
            peer.run(SURVEY_SECONDS)
            return {row["partition"] for row in peer.survey.partition_rows() if row["topic"] == topic}
        finally:
            peer.close()

    def _producer(self, topic: str, index: int) -> AsyncProducer[bytes]:
        return AsyncProducer(topic, self.config, address=address_of(topic, index), resume=True)

    # -- connections -----------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        self.counters.connections += 1
        peer = writer.get_extra_info("peername")
        fetches: _Reader | None = None
        try:
            while True:
                try:
                    size = _SIZE.unpack(await reader.readexactly(4))[0]
                except asyncio.IncompleteReadError:
                    return
                if not 0 < size <= self.max_request_bytes:
                    self.counters.malformed += 1
                    log.warning("kafka client %s: a request of %d bytes (socket.request.max.bytes %d): closed",
                                peer, size, self.max_request_bytes)
                    return
                frame = await reader.readexactly(size)
                try:
                    request = read_request(frame)
                except DecodeError as exc:
                    self.counters.malformed += 1
                    log.warning("kafka client %s: a malformed request (%s): closed", peer, exc)
                    return
                self.counters.requests += 1
                if request.body is None and request.api_key == 18:
                    writer.write(unsupported_api_versions(request.correlation_id))
                    await writer.drain()
                    continue
                if fetches is None and request.api_key == 1 and request.body is not None:
                    fetches = _Reader(self.config)
                body = await self._answer(request, fetches)
                if body is not None:
                    writer.write(response_frame(request.api, request.version, request.correlation_id, body))
                    await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            self._connections.discard(task)
            if fetches is not None:
                await fetches.close()
            writer.close()

    async def _answer(self, request: Request, fetches: _Reader | None) -> bytes | None:
        mapping = self.mapping
        assert mapping is not None
        if request.body is None or request.api is None:
            return None if request.api is None else mapping.unsupported(request)
        names = mapping.wanted_topics(request)
        views = await self._known(names, mapping.to_create(request, self.views))
        outcome = mapping.handle(request, views)
        if isinstance(outcome, Answer):
            return outcome.body
        if isinstance(outcome, Appends):
            return await self._produce(outcome, views)
        assert isinstance(outcome, Reads) and fetches is not None
        return await self._fetch(outcome, views, fetches)

    async def _produce(self, appends: Appends, views: dict[str, TopicView]) -> bytes | None:
        mapping = self.mapping
        assert mapping is not None
        results: dict[tuple[str, int], tuple[int, int]] = {key: (code, -1) for key, code in appends.refused.items()}
        waits: list[tuple[tuple[str, int], SendFuture]] = []
        for append in appends.appends:
            key = (append.topic, append.index)
            if results.get(key, (0, 0))[0]:
                continue
            producer = self.producers[key]
            try:
                first = await self._publish(producer, append.batch.records)
            except RecordTooLarge:
                results[key] = (errors.MESSAGE_TOO_LARGE, -1)
                continue
            except BufferFull:
                results[key] = (errors.REQUEST_TIMED_OUT, -1)
                continue
            self.counters.records_in += len(append.batch.records)
            if key not in results:
                results[key] = (0, first)
            waits.append((key, SendFuture(producer, first + len(append.batch.records) - 1)))
        if appends.acks == -1:
            for key, future in waits:
                try:
                    await asyncio.wait_for(asyncio.shield(future.future()), appends.timeout_ms / 1000.0)
                except asyncio.TimeoutError:
                    results[key] = (errors.REQUEST_TIMED_OUT, -1)
        if appends.acks == 0:
            return None
        return mapping.produce_response(appends.request, {key: results[key] for key in appends.order if key in results})

    async def _publish(self, producer: AsyncProducer[bytes], records: list[Any]) -> int:
        first = -1
        for r in records:
            future = await producer.send(r.value if r.value is not None else b"", key=r.key)
            if first < 0:
                first = future.offset
        return first

    async def _fetch(self, reads: Reads, views: dict[str, TopicView], fetches: _Reader) -> bytes:
        mapping = self.mapping
        assert mapping is not None
        deadline = time.monotonic() + reads.max_wait_ms / 1000.0
        buffers = {(r.topic, r.index): (r, fetches.want(r.topic, address_of(r.topic, r.index), r.offset))
                   for r in reads.reads}
        while True:
            found, size = self._take(buffers, reads.max_bytes)
            if size >= max(1, reads.min_bytes) or time.monotonic() >= deadline or not buffers:
                break
            await fetches.pump(min(FETCH_POLL_MS, max(1, int((deadline - time.monotonic()) * 1000))))
        self.counters.records_out += sum(len(v) for v in found.values())
        return mapping.fetch_response(reads, await self._known(list(views), []), found)

    @staticmethod
    def _take(buffers: dict[tuple[str, int], tuple[Any, _PartitionBuffer]],
              max_bytes: int) -> tuple[dict[tuple[str, int], list[Row]], int]:
        found: dict[tuple[str, int], list[Row]] = {}
        total = 0
        for key, (read, buf) in buffers.items():
            rows: list[Row] = []
            size = 0
            for row in buf.rows:
                if row[0] < read.offset:
                    continue
                n = len(row[3] or b"") + len(row[2] or b"") + 20
                if rows and (size + n > read.max_bytes or total + size + n > max_bytes):
                    break
                rows.append(row)
                size += n
            if rows:
                found[key] = rows
                total += size
        return found, total
