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
* A topic is learnt by a survey of the cluster (:class:`dafka.discovery.survey.StatusPeer`):
  the partitions whose addresses are the gateways' numbering are its writable Kafka
  partitions; the others, written by dafka producers, follow them at the numbers
  the registry keeps (:mod:`~.numbering`), read-only.  A survey of the whole
  cluster every :data:`RESURVEY_SECONDS` finds new partitions and topics, and
  the heads of the foreign partitions (which the readers also move on as records
  come).
* Groups: :class:`~.groups.Coordinator` in the mapping; a JoinGroup or
  SyncGroup waits on a future that the answer of another member's request,
  or a timeout (a tick task), resolves.  A group's commits are kept in the
  cluster, in dafka's own offsets topic of the group (``__dafka_offsets.<group>``,
  rfc 14.6): each commit writes a snapshot of the group's offsets as one record
  of the gateway's partition there, resumed, so a restarted gateway reads it back.
* Idempotent producers: :class:`~.idempotence.Sequences` in the mapping
  checks each batch before it is published; a retried one gets its first
  answer again.  Each batch is noted in the partition's sequences partition,
  acked, before its records are published (one at a time a partition, under
  its lock), and read back when the partition is resumed: a restarted gateway,
  or the one a partition moved to, answers a retry of a batch the stores hold
  again, without a second append.
* Several gateways (:mod:`~.gateways`): each announces itself and hears the
  others; it resumes only the partitions, and coordinates only the groups, it
  leads, and lets go of those another one leads once it hears of it (stopping
  their producers, so that the new leader's resume, which waits for their
  beacons to go, rfc 15, can proceed).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import struct
import time
from dataclasses import dataclass
from collections.abc import Callable, Coroutine, Iterable
from itertools import groupby
from operator import attrgetter
from typing import Any, TypeVar

from dafka.records import PartitionKey, Record
from dafka.aio import AsyncConsumer, AsyncProducer, SendFuture
from dafka.config import Config
from dafka.errors import BufferFull, DafkaError, PartitionClaimed, RecordTooLarge
from dafka.protocol.commits import decode_commits, encode_commits, offsets_topic
from dafka.core.addresses import partition_address
from dafka.discovery.survey import StatusPeer, Survey

from . import errors
from .gateways import (
    ANNOUNCE_SECONDS, ANNOUNCE_TOPIC, REGISTRY_KEY, Gateways, Node, StallGuard, decode_announcement,
    encode_announcement, group_key, partition_key,
)
from .idempotence import (
    APPEND, DUPLICATE, PARTIAL, SEQUENCES_TOPIC, BatchEntry, decode_entry as decode_batch_entry,
)
from .mapping import (
    NODE_ID, Answer, Appends, Commit, Create, Held, Mapping, Reads, Replies, Seek, TopicView, address_of, index_of,
)
from .numbering import REGISTRY_NAME, REGISTRY_TOPIC, Numbers, decode_entry
from .messages import (
    API_VERSIONS, PRODUCE, SASL_AUTHENTICATE, SASL_HANDSHAKE, Request, encode_body, read_request, response_frame,
    unsupported_api_versions,
)
from .acl import ALLOW_ALL, ANONYMOUS, Access, Acl
from .sasl import MAX_SASL_BYTES, MECHANISMS, SaslServer, Users
from .fetch_buffer import PartitionBuffer, Segment
from .records import RecordFrames
from .wire import DecodeError

log = logging.getLogger(__name__)

GATEWAY_MEMBER = "kafka-gateway"  # the member named in the commit records the gateway writes
TICK_SECONDS = 0.05  # how often group timeouts are checked
LOAD_SECONDS = 5.0  # how long reading a group's last commit record back may take
SURVEY_SECONDS = 1.0  # how long a new topic's survey listens for the stores' heads
RESURVEY_SECONDS = 5.0  # the pause between two surveys of the whole cluster (--survey-interval-ms)
KEEP_SECONDS = 10.0  # how long a registry entry may take to be acked
SEQUENCES_TAIL = 5_000  # idempotent batches read back from a topic's sequences partition when it is learnt
BUFFER_RECORDS = 50_000  # records a connection keeps per partition between two Fetches
PIPELINE = 64  # Produce requests of one connection in flight at most (the next one waits to be read)
PUMP_WAIT_MS = 100  # how long one read of a connection's consumer waits for records
FORM_SECONDS = 3 * ANNOUNCE_SECONDS  # listened for this long to the others' announcements, a gateway claims partitions
DESCRIBED_GROUPS = 200  # groups a PEER-INFO describes at most (its body is at most 64 KiB)
_SIZE = struct.Struct(">i")

T = TypeVar("T")
Heads = dict[str, dict[str, int]]  # topic -> partition address -> head (-1: none known)


@dataclass
class Counters:
    connections: int = 0
    requests: int = 0
    malformed: int = 0
    records_in: int = 0
    records_out: int = 0
    duplicates: int = 0  # idempotent producers' retries answered without a second append
    authentication_failed: int = 0  # connections closed for failing SASL
    denied: int = 0  # topics and groups a request named that its principal may not use (kafka/acl.py)


class _Reader:
    """One connection's reads: a dafka consumer whose records go straight into a buffer by (topic, partition
    address), a store's answer as its frames came (:class:`_TopicSink`).

    A task serves the consumer all along, so the catch-up from the stores goes on between two Fetches and a
    live record is in the buffer when it comes; it pauses while a partition's buffer holds
    :data:`BUFFER_RECORDS` the client has not fetched past."""

    def __init__(self, config: Config, heads: dict[PartitionKey, int]) -> None:
        self.consumer: AsyncConsumer[bytes] = AsyncConsumer(config=config.with_overrides(
            {"consumer/offset/reset": "earliest", "consumer/store_times": 1}, source="kafka gateway"))
        self.heads = heads  # the gateway's, moved on as records come (a foreign partition's head)
        self.buffers: dict[PartitionKey, PartitionBuffer] = {}
        self.topics: set[str] = set()
        self.arrived = asyncio.Event()  # set when records came into a buffer
        self._room = asyncio.Event()
        self._room.set()
        self._pump: asyncio.Task[None] | None = None

    def want(self, topic: str, address: str, offset: int) -> PartitionBuffer:
        if topic not in self.topics:
            self.topics.add(topic)
            self.consumer.deliver_into(topic, _TopicSink(self, topic))
        if self._pump is None:
            self._pump = asyncio.ensure_future(self._run())
        buf = self.buffers.get((topic, address))
        if buf is None:
            buf = self.buffers[(topic, address)] = PartitionBuffer()
        if not buf.holds(offset) and buf.next != offset:
            buf.restart(offset)
            self.consumer.seek(address, offset, topic=topic)
        if all(b.records < BUFFER_RECORDS for b in self.buffers.values()):
            self._room.set()  # (the pump stops while any partition's buffer is full)
        return buf

    def added(self, key: PartitionKey, buf: PartitionBuffer) -> None:
        """Records came into ``buf``, a buffer of :attr:`buffers`."""
        if buf.next > self.heads.get(key, -1) + 1:
            self.heads[key] = buf.next - 1
        if buf.records >= BUFFER_RECORDS:
            self._room.clear()
        self.arrived.set()

    async def _run(self) -> None:
        full = self._full
        while True:
            await self._room.wait()
            await self.consumer.serve(full, PUMP_WAIT_MS / 1000.0)

    def _full(self) -> bool:
        return not self._room.is_set()

    async def wait(self, seconds: float) -> None:
        """Until the pump buffers more, or ``seconds``."""
        self.arrived.clear()
        try:
            await asyncio.wait_for(self.arrived.wait(), seconds)
        except asyncio.TimeoutError:
            pass

    async def close(self) -> None:
        if self._pump is not None:
            self._pump.cancel()
            await asyncio.gather(self._pump, return_exceptions=True)
        await self.consumer.stop()


class KafkaGateway:
    def __init__(self, config: Config, *, address: str = "127.0.0.1", port: int = 9092,
                 advertise: tuple[str, int] | None = None, num_partitions: int = 1, auto_create: bool = True,
                 max_request_bytes: int = 100 * 1024 * 1024, initial_rebalance_delay: float = 3.0,
                 survey_interval: float = RESURVEY_SECONDS, tls: ssl.SSLContext | None = None,
                 users: Users | None = None, sasl_mechanisms: tuple[str, ...] = MECHANISMS,
                 acl: Acl | None = None, node_id: int = NODE_ID) -> None:
        """``tls``: serve Kafka over TLS with this server context (None: plaintext). ``users``: require SASL
        (``sasl_mechanisms``) against these credentials (None: no authentication). ``acl``: what each
        principal may do (None: everything). ``node_id``: this gateway's broker id, one a live gateway."""
        self.node_id = node_id
        self.gateways: Gateways | None = None
        self.config = config
        self.address, self.port = address, port
        self.advertise = advertise
        self.max_request_bytes = max_request_bytes
        self.num_partitions = num_partitions
        self.auto_create = auto_create
        self.initial_rebalance_delay = initial_rebalance_delay
        self.survey_interval = survey_interval  # 0: a topic is surveyed once, when a request first names it
        self.tls = tls
        self.users = users
        self.sasl_mechanisms = sasl_mechanisms if users is not None else ()
        self.acl = acl
        self.tower_reached = False  # a survey reached the tower (the cluster is there)
        self.mapping: Mapping | None = None
        self.counters = Counters()
        self.stall = StallGuard()
        self.producers: dict[tuple[str, int], AsyncProducer[bytes]] = {}
        self.views: dict[str, TopicView] = {}
        self._resolving: dict[str, asyncio.Future[None]] = {}
        self._server: asyncio.base_events.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._ticker: asyncio.Task[None] | None = None
        self._offset_producers: dict[str, AsyncProducer[bytes]] = {}
        self._loaded: dict[str, asyncio.Future[None]] = {}  # groups whose commits were read back
        self.numbers = Numbers()
        # (topic, address) -> head, of the partitions this gateway does not write (foreign ones, others' own)
        self.heard_heads: dict[tuple[str, str], int] = {}
        self.cluster_topics: Heads = {}  # the last survey of the whole cluster
        self._surveyed = asyncio.Event()
        self._watcher: asyncio.Task[None] | None = None
        self._registry: AsyncProducer[bytes] | None = None
        self._registry_read = False  # the numbers given so far read back (retried until they are)
        self._registry_next = 0  # the registry's offset read up to
        self._formed = asyncio.Event()  # set once this gateway heard the others long enough to claim anything
        self._announced = asyncio.Event()  # set (and replaced) at each batch of the others' announcements
        self._numbering = asyncio.Lock()
        self._sequence_producers: dict[tuple[str, int], AsyncProducer[bytes]] = {}  # a partition's sequences'
        self._acquiring: dict[tuple[str, int], asyncio.Future[AsyncProducer[bytes]]] = {}  # partitions resuming
        self._announcer: asyncio.Task[None] | None = None
        self.failed = asyncio.Event()  # set when the gateway stopped serving for good (``failure``: why)
        self.failure: str | None = None
        self._appending: dict[tuple[str, int], asyncio.Lock] = {}  # one append at a time a partition
        self._background: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.address, self.port, limit=2 ** 20, ssl=self.tls)
        bound = self._server.sockets[0].getsockname()
        self.port = bound[1]
        host, port = self.advertise or (self.address, self.port)
        self.gateways = Gateways(Node(self.node_id, host, port))
        self.mapping = Mapping(host, port, auto_create=self.auto_create, num_partitions=self.num_partitions,
                               max_request_records_bytes=self.max_request_bytes,
                               initial_rebalance_delay=self.initial_rebalance_delay, gateways=self.gateways)
        self._ticker = asyncio.ensure_future(self._tick())
        self._watcher = asyncio.ensure_future(self._watch())
        self._announcer = asyncio.ensure_future(self._announce())
        log.info("kafka gateway on %s:%d (advertised %s:%d)", self.address, self.port, host, port)

    async def _tick(self) -> None:
        """Group timeouts: sessions that lapsed, rebalances whose time is up; and the loop's stalls."""
        while True:
            await asyncio.sleep(TICK_SECONDS)
            assert self.mapping is not None
            self._watch_stall()
            self._deliver(self.mapping.tick(time.monotonic()))

    def _watch_stall(self) -> bool:
        """After a stall of this gateway's loop (:class:`~.gateways.StallGuard`), let go of every partition
        it writes, the groups' commits and the registry: the ones it leads are resumed again at the stores'
        heads once any other writer is gone (rfc 15).  True when there was one."""
        if not self.stall.observe(time.monotonic()) or self.gateways is None or len(self.gateways.live()) < 2:
            return False  # (a lone gateway's partitions have no other writer to fear)
        log.warning("kafka gateway: its loop stood still for %.1f s; another gateway may have taken its "
                    "partitions over: it lets go of them, and resumes those it leads", self.stall.longest)
        self._drop_claimed(everything=True)
        return True

    @staticmethod
    def _deliver(replies: Replies) -> None:
        for token, body in replies.replies:
            future = token
            assert isinstance(future, asyncio.Future)
            if not future.done():
                future.set_result(body)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in (self._ticker, self._watcher, self._announcer):
            if task is not None:
                task.cancel()
        await asyncio.gather(*(t for t in (self._announcer,) if t is not None), return_exceptions=True)
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        registry = [self._registry] if self._registry is not None else []
        for producer in [*self.producers.values(), *self._offset_producers.values(), *registry,
                         *self._sequence_producers.values()]:
            try:
                await producer.stop()
            except DafkaError as exc:
                log.warning("closing %s: %s", producer.address, exc)

    # -- what metrics read (from another thread: copies, no iteration over live dicts) -----------

    def group_members(self) -> dict[str, int]:
        """Members of each Kafka group the gateway coordinates."""
        assert self.mapping is not None
        return {name: len(group.members) for name, group in list(self.mapping.coordinator.groups.items())}

    def group_lags(self) -> list[tuple[str, str, int, int]]:
        """(group, topic, Kafka partition, records after the group's commit) for every commit kept."""
        assert self.mapping is not None
        out = []
        for group, offsets in list(self.mapping.offsets.items()):
            for (topic, index), (offset, _) in list(offsets.items()):
                view = self.views.get(topic)
                if view is not None and index < view.count and offset >= 0:
                    out.append((group, topic, index, max(0, self._head(view, index) + 1 - offset)))
        return out

    def describe(self) -> dict[str, Any]:
        """What the gateway's PEER-INFO says of it (rfc 17, ``application_details``): its listener, and each
        Kafka group it coordinates or keeps commits of, with its state, members, and each partition's
        commit and lag (at most :data:`DESCRIBED_GROUPS` groups)."""
        assert self.mapping is not None
        host, port = self.advertise or (self.address, self.port)
        groups = dict(list(self.mapping.coordinator.groups.items()))
        lags: dict[str, list[dict[str, Any]]] = {}
        for group_id, topic, index, lag in self.group_lags():
            offset = self.mapping.offsets.get(group_id, {}).get((topic, index), (-1, None))[0]
            lags.setdefault(group_id, []).append({"topic": topic, "partition": index,
                                               "address": self._address(topic, index) or "", "committed": offset,
                                               "lag": lag})
        rows = []
        for name in sorted(set(groups) | set(lags))[:DESCRIBED_GROUPS]:
            group = groups.get(name)
            parts = sorted(lags.get(name, []), key=lambda r: (r["topic"], r["partition"]))
            rows.append({"group": name, "state": group.state if group else "Empty",
                         "protocol": group.protocol if group else "", "generation": group.generation if group else 0,
                         "members": len(group.members) if group else 0, "lag": sum(r["lag"] for r in parts),
                         "partitions": parts})
        return {"listener": f"{host}:{port}", "kafka_groups": rows}

    # -- several gateways ------------------------------------------------------------------

    async def _announce(self) -> None:
        """Announce this gateway every :data:`ANNOUNCE_SECONDS`, hear the others', and move what a change of
        who is live moves.  Its announcements come from a resumed producer of its node id's address: a
        second live process with the same node id cannot start one (rfc 15), and is stopped."""
        assert self.gateways is not None
        gateways, me = self.gateways, self.gateways.me
        loop = asyncio.get_running_loop()
        consumer: AsyncConsumer[bytes] = AsyncConsumer(config=self.config.with_overrides(
            {"consumer/offset/reset": "latest"}, source="kafka gateway"))
        consumer.subscribe(ANNOUNCE_TOPIC)
        formed_at = time.monotonic() + FORM_SECONDS
        producer = None
        try:
            while producer is None:
                try:
                    producer = await loop.run_in_executor(None, lambda: AsyncProducer(
                        ANNOUNCE_TOPIC, self.config, address=partition_address(f"kafka-gateway:{me.node_id}"),
                        resume=True))
                except PartitionClaimed:
                    self._fail(f"node id {me.node_id} is another live gateway's: give each gateway its own --node-id")
                    return
                except DafkaError as exc:  # too few stores yet: alone until they come
                    log.warning("kafka gateway node %d: not announced (%s); trying again", me.node_id, exc)
                    self._formed.set()  # (no store: nothing to write anyway, and a stuck gateway helps nobody)
                    await asyncio.sleep(ANNOUNCE_SECONDS)
            due = 0.0
            while True:
                now = time.monotonic()
                if now >= formed_at and not self._formed.is_set():
                    log.info("kafka gateway node %d: hears %d other gateway(s)", me.node_id, len(gateways.live()) - 1)
                    self._formed.set()
                if now >= due:
                    topics = {name: view.count for name, view in self.views.items() if not view.foreign}
                    try:
                        await producer.send(encode_announcement(me, topics=topics))
                    except DafkaError as exc:
                        log.warning("kafka gateway node %d: an announcement not sent (%s)", me.node_id, exc)
                    due = now + ANNOUNCE_SECONDS
                got = await consumer.getmany(timeout_ms=max(1, int((due - time.monotonic()) * 1000)))
                now = time.monotonic()
                changed = False
                for records in got.values():
                    for record in records:
                        try:
                            node, leaving, topics = decode_announcement(record.value)
                        except ValueError as exc:
                            self.counters.malformed += 1
                            log.warning("a gateway announcement that is not one (%s): dropped", exc)
                            continue
                        changed |= gateways.on_announcement(node, leaving, now, topics)
                        for name, count in topics.items():
                            view = self.views.get(name)
                            if view is not None and not view.foreign and view.count < count:
                                self._in_background(self._grow(name, count))
                if got:
                    self._announced.set()
                    self._announced = asyncio.Event()
                if gateways.expire(now) or changed:
                    log.info("kafka gateways live: %s", ", ".join(f"{n.node_id} at {n.host}:{n.port}"
                                                                  for n in gateways.live()))
                    self._leaders_changed()
                self._drop_claimed()
        finally:
            if producer is not None:
                try:
                    await producer.send(encode_announcement(me, leaving=True))
                    await producer.stop()
                except DafkaError as exc:
                    log.warning("kafka gateway node %d: its leaving not announced (%s)", me.node_id, exc)
            await consumer.stop()

    def _fail(self, why: str) -> None:
        """Stop serving for good: ``failure`` says why (dafka kafka exits with it)."""
        log.error("%s", why)
        self.failure = why
        if self._server is not None:
            self._server.close()
        self.failed.set()

    def _leaders_changed(self) -> None:
        """Who is live changed: let go of the partitions and groups another gateway leads now, and take
        those this one leads now."""
        mapping = self.mapping
        assert mapping is not None
        for key in [k for k in self.producers if not mapping.leads(*k)]:
            self._in_background(self._let_go(key))
        for name, view in list(self.views.items()):
            if not view.foreign:
                for i in range(view.count):
                    if mapping.leads(name, i) and (name, i) not in self.producers and (name, i) not in self._acquiring:
                        self._in_background(self._take_over((name, i)))
        for group in set(mapping.coordinator.groups) | set(self._offset_producers) | set(self._loaded):
            if not mapping.leads_group(group):
                mapping.loading.discard(group)
                producer = self._hand_over_group(group)
                if producer is not None:
                    self._in_background(producer.stop())
                log.info("group %r: coordinated by node %d now", group, mapping.gateways.leader(group_key(group)).node_id)

    async def _let_go(self, key: tuple[str, int]) -> None:
        """Stop writing a partition another gateway leads now, once its append under way is done."""
        assert self.mapping is not None
        async with self._appending.setdefault(key, asyncio.Lock()):
            producer = self.producers.get(key)
            if producer is None or self.mapping.leads(*key):
                return
            noted = self._forget_partition(key, producer)
            for stopping in (producer, noted):
                try:
                    await stopping.stop()
                except DafkaError as exc:
                    log.warning("%s/%d: letting go: %s", key[0], key[1], exc)
        log.info("%s/%d: led by node %d now: let go", key[0], key[1],
                 self.mapping.gateways.leader(partition_key(*key)).node_id)

    def _forget_partition(self, key: tuple[str, int], producer: AsyncProducer[bytes]) -> AsyncProducer[bytes]:
        """Take ``producer``, this gateway's of ``key``, and its sequences producer (returned, for the caller to
        stop) out of its tables: the head it reached kept as heard, the partition unsure in its view, and its
        idempotent batches left to whoever resumes it, who reads them back from the notes."""
        assert self.mapping is not None
        del self.producers[key]
        noted = self._sequence_producers.pop(key)
        self._heard(key[0], producer.address, producer.next_offset - 1)
        view = self.views.get(key[0])
        if view is not None:
            view.unsure.add(key[1])
        self.mapping.sequences.forget(key)
        return noted

    def _hand_over_group(self, group: str) -> AsyncProducer[bytes] | None:
        """Forget a group this gateway no longer answers for: its waiting requests get NOT_COORDINATOR, its
        commits are read back from the cluster next time; returns its offsets producer, for the caller to stop."""
        assert self.mapping is not None
        self._deliver(self.mapping.hand_over(group))
        self._loaded.pop(group, None)
        return self._offset_producers.pop(group, None)

    def _claimed(self, key: tuple[str, int]) -> None:
        """Another live process writes this partition (a gateway that took it over while this one was stopped
        or unheard, and the other way round): rfc 15 stopped this gateway's producer of it.  Drop it and its
        sequences producer at once, so that their beacons go and the gateway that leads the partition now
        resumes it; that is this one again when its view says so (its resume waits the other's beacon out)."""
        assert self.mapping is not None
        producer = self.producers.get(key)
        if producer is None:
            return
        noted = self._forget_partition(key, producer)
        leads = self.mapping.leads(*key)
        log.warning("%s/%d: let go (written by another gateway too, or after a stall)%s", key[0], key[1],
                    ": resumed again once any other writer is gone" if leads else "")

        async def stop() -> None:
            await _stop_now(producer, noted)
            if self.mapping is not None and self.mapping.leads(*key):
                await self._take_over(key)
        self._in_background(stop())

    def _drop_claimed(self, everything: bool = False) -> None:
        """Let go of every producer that saw another writer of its partition (rfc 15 stopped it), or of all
        of them (``everything``: after a stall), at once: a fenced producer beacons on until it is stopped,
        and nobody can resume its partition meanwhile.  A Kafka partition: :meth:`_claimed`.  A group's
        offsets partition: the group is handed over (its members join again, and its commits are read back,
        what another gateway committed included).  The partition registry: read back again, and resumed by
        its leader when it next numbers partitions."""
        assert self.mapping is not None

        def claimed(producer: AsyncProducer[bytes] | None) -> bool:
            return producer is not None and (everything or bool(producer.stats()["claimed"]))
        for key, producer in list(self.producers.items()):
            if claimed(producer) or claimed(self._sequence_producers.get(key)):
                self._claimed(key)
        for group, producer in list(self._offset_producers.items()):
            if claimed(producer):
                log.warning("group %r: its commits let go (written by another gateway too, or after a stall): "
                            "handed over", group)
                self._in_background(_stop_now(self._hand_over_group(group)))
        if claimed(self._registry):
            assert self._registry is not None
            log.warning("the partition registry: let go (written by another gateway too, or after a stall)")
            registry, self._registry = self._registry, None
            self._registry_read = False
            self._in_background(_stop_now(registry))

    async def _take_over(self, key: tuple[str, int]) -> None:
        """Resume a partition this gateway leads now (its last leader's beacon gone first, rfc 15)."""
        try:
            await self._partition(key)
            log.info("%s/%d: taken over", key[0], key[1])
        except DafkaError as exc:
            log.warning("%s/%d: not taken over yet (%s): at the next Produce", key[0], key[1], exc)

    # -- topics ----------------------------------------------------------------------------

    async def _known(self, names: list[str] | None, create: list[str]) -> dict[str, TopicView]:
        if names is None:  # every topic of the cluster: as the last survey found them
            await self._surveyed.wait()
            for name, found in list(self.cluster_topics.items()):
                if name not in self.views and not name.startswith("__"):
                    await self._resolve(name, False, found=found)
        for name in (names or []):
            if name not in self.views:
                await self._resolve(name, name in create)
        views = self.views if names is None else {n: self.views[n] for n in names if n in self.views}
        for view in views.values():  # only the topics this request names: their heads now
            view.heads = [self._head(view, i) for i in range(view.count)]
        return views

    def _head(self, view: TopicView, index: int) -> int:
        producer = self.producers.get((view.name, index))
        if producer is not None:
            return producer.next_offset - 1
        address = view.address(index)
        return -1 if address is None else self.heard_heads.get((view.name, address), -1)

    async def _resolve(self, name: str, create: bool, partitions: int = 0, found: dict[str, int] | None = None) -> None:
        pending = self._resolving.get(name)
        if pending is None:
            pending = self._resolving[name] = asyncio.ensure_future(self._learn(name, create, partitions, found))
        try:
            await asyncio.shield(pending)
        except DafkaError as exc:  # (the next request that names the topic tries again)
            log.warning("topic %r: %s", name, exc)
        finally:
            if pending.done():
                self._resolving.pop(name, None)

    async def _learn(self, name: str, create: bool, partitions: int = 0, found: dict[str, int] | None = None) -> None:
        """Find a topic's partitions in the cluster (``found``: as a survey found them, address -> head), or
        create it (``partitions``: how many, 0: the gateway's --num-partitions), and resume the producers of
        the partitions this gateway leads.  A topic that dafka producers write is never created: its
        partitions are numbered instead.

        A request that may create the topic has the partitions it would create resumed while the survey
        runs (a resume waits 1.5 beacon intervals for a twin, rfc 15): its first answer comes a second
        sooner; what the survey shows is not wanted is stopped."""
        assert self.mapping is not None
        loop = asyncio.get_running_loop()
        resuming: dict[int, asyncio.Future[AsyncProducer[bytes]]] = {}
        if found is None:
            if create:
                resuming = {i: loop.run_in_executor(None, self._producer, name, i)
                            for i in range(partitions or self.num_partitions) if self.mapping.leads(name, i)}
            try:
                found = await loop.run_in_executor(None, self._survey, name)
            except BaseException:
                self._discard(list(resuming.values()))
                raise
        count = 1 + max((i for a in found if (i := index_of(name, a)) is not None), default=-1)
        if count and not self.gateways_say(name):  # (an empty partition is in no store: its creator says it)
            await self._announcements(2)
        count = max(count, self.gateways_say(name))
        foreign = _foreign(name, found)
        if count == 0 and not foreign:
            if not create:
                self._discard(list(resuming.values()))
                return
            count = partitions or self.num_partitions
        led = [] if foreign else [i for i in range(count) if self.mapping.leads(name, i)]
        # (one resumed while the survey ran whose leader changed meanwhile beacons as a twin until stopped)
        self._discard([f for i, f in resuming.items() if i not in led])
        for i in range(count):
            if (name, i) not in self.producers:
                self._heard(name, address_of(name, i), found.get(address_of(name, i), -1))
        if foreign:  # read-only: its gateway partitions (written before) are not resumed
            await self._number(name, foreign, count)
        else:
            # One partition not resumable yet (its last writer still beacons it: PartitionClaimed after the resume
            # timeout) must not take the topic away: its view answered UNKNOWN_TOPIC_OR_PART for every partition
            # meanwhile, which desynchronised an idempotent librdkafka producer's sequences for good (nemesis).
            resumed = await asyncio.gather(*(self._partition((name, i), resuming.get(i)) for i in led),
                                           return_exceptions=True)
            for i, result in zip(led, resumed):
                if isinstance(result, DafkaError):
                    log.warning("%s/%d: not resumed yet (%s): at the next Produce", name, i, result)
                elif isinstance(result, BaseException):
                    raise result
        self.views[name] = self._view(name, count)
        log.info("topic %r: %d partition(s), %d written by dafka producers", name, self.views[name].count,
                 len(foreign))

    def gateways_say(self, topic: str) -> int:
        """How many partitions the other live gateways say ``topic`` has (0: none)."""
        return self.gateways.partitions(topic) if self.gateways is not None else 0

    async def _announcements(self, rounds: int) -> None:
        """Until the others' announcements came ``rounds`` times (or as long as they take when on time)."""
        if self.gateways is None or len(self.gateways.live()) < 2:
            return
        for _ in range(rounds):
            try:
                await asyncio.wait_for(self._announced.wait(), 2 * ANNOUNCE_SECONDS)
            except asyncio.TimeoutError:
                return

    async def _grow(self, name: str, count: int) -> None:
        """Another gateway says ``name`` has more partitions than this one knows: take its view, and resume
        the partitions this one leads of them."""
        assert self.mapping is not None
        view = self.views.get(name)
        if view is None or view.foreign or view.count >= count:
            return
        self.views[name] = self._view(name, count)
        log.info("topic %r: %d partition(s), as another gateway says", name, count)
        await asyncio.gather(*(self._take_over((name, i)) for i in range(count) if self.mapping.leads(name, i)))

    def _heard(self, topic: str, address: str, head: int) -> None:
        """A head of a partition this gateway does not write, as a survey or a reader found it."""
        if head > self.heard_heads.get((topic, address), -1):
            self.heard_heads[(topic, address)] = head

    async def _partition(self, key: tuple[str, int],
                         resumed: asyncio.Future[AsyncProducer[bytes]] | None = None) -> AsyncProducer[bytes]:
        """The producer of a gateway partition this gateway leads, resumed once (``resumed``: already under way)."""
        producer = self.producers.get(key)
        if producer is not None:
            if resumed is not None:
                self._discard([resumed])
            return producer
        pending = self._acquiring.get(key)
        if pending is None:
            pending = self._acquiring[key] = asyncio.ensure_future(self._resume_partition(key, resumed))
            pending.add_done_callback(lambda _: self._acquiring.pop(key, None))
        elif resumed is not None:
            self._discard([resumed])
        return await asyncio.shield(pending)

    async def _resume_partition(self, key: tuple[str, int],
                                resumed: asyncio.Future[AsyncProducer[bytes]] | None) -> AsyncProducer[bytes]:
        """Resume a partition and its sequences partition, and read its idempotent batches back."""
        assert self.mapping is not None
        loop = asyncio.get_running_loop()
        topic, index = key
        # resumed while the view forms: whether this gateway leads it is checked once both are done
        results = await asyncio.gather(resumed or loop.run_in_executor(None, self._producer, topic, index),
                                       loop.run_in_executor(None, self._sequences_producer, topic, index),
                                       return_exceptions=True)
        await self._formed.wait()
        producers = [r for r in results if isinstance(r, AsyncProducer)]
        failed = next((r for r in results if isinstance(r, BaseException)), None)
        if failed is None:
            try:
                await self._restore_sequences(key, producers[1], producers[0])
            except DafkaError as exc:
                failed = exc
            if failed is None and not self.mapping.leads(topic, index):
                leader = self.mapping.gateways.leader(partition_key(topic, index)).node_id
                failed = DafkaError(f"{topic}/{index} is led by node {leader} now: let go")
        if failed is not None:
            for producer in producers:  # each one stopped, whatever another's stop raised (a leftover beacons)
                try:
                    await producer.stop()
                except DafkaError as exc:
                    log.warning("%s/%d: a resume in vain: %s", topic, index, exc)
            raise failed
        self.producers[key], self._sequence_producers[key] = producers
        view = self.views.get(topic)
        if view is not None:
            view.unsure.discard(index)
        return producers[0]

    def _sequences_producer(self, topic: str, index: int) -> AsyncProducer[bytes]:
        return AsyncProducer(SEQUENCES_TOPIC + topic, self.config,
                             address=partition_address(f"kafka-sequences:{topic}:{index}"), resume=True)

    async def _restore_sequences(self, key: tuple[str, int], noted: AsyncProducer[bytes],
                                 producer: AsyncProducer[bytes]) -> None:
        """The idempotent batches noted last in a partition's sequences partition, back into the sequences
        (those whose records the partition holds: a gateway that died between a note and its records
        noted a batch that is not there, whose retry must be appended)."""
        assert self.mapping is not None
        head = noted.next_offset - 1
        if head < 0:
            return
        topic, index = key
        values = await self._read_back(SEQUENCES_TOPIC + topic, noted.address, max(0, head - SEQUENCES_TAIL + 1), head)
        entries = self._decoded(values, decode_batch_entry, f"{topic}/{index}'s sequences")
        taken = self.mapping.sequences.restore(topic, [e for e in entries if e.partition == index],
                                               {index: producer.next_offset - 1})
        log.info("%s/%d: %d idempotent batch(es) read back", topic, index, taken)

    def _discard(self, resuming: list[asyncio.Future[AsyncProducer[bytes]]]) -> None:
        """Stop the producers of partitions resumed in vain, once resumed."""
        async def stop(future: asyncio.Future[AsyncProducer[bytes]]) -> None:
            try:
                producer = await future
            except DafkaError:
                return
            await producer.stop()
        for future in resuming:
            self._in_background(stop(future))

    def _in_background(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` as a task the gateway holds until it ends (asyncio keeps only a weak reference)."""
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _view(self, name: str, writable: int) -> TopicView:
        """A topic's view: its ``writable`` gateway partitions, then the foreign ones the registry numbered."""
        slots = self.numbers.slots(name, [address_of(name, i) for i in range(writable)])
        if len(slots) == writable:
            view = TopicView(name, [-1] * writable)
        else:
            view = TopicView(name, [-1] * len(slots), addresses=slots, writable=writable)
        view.heads = [self._head(view, i) for i in range(view.count)]
        view.unsure = {i for i in range(min(writable, view.count)) if (name, i) not in self.producers}
        return view

    async def _number(self, topic: str, foreign: dict[str, int], writable: int) -> None:
        """Give the foreign partitions of ``topic`` that have none their Kafka numbers, kept in the registry
        (acked by ``producer/min_acks`` stores) before any client can see them."""
        for address, head in foreign.items():
            self._heard(topic, address, head)
        assert self.mapping is not None
        async with self._numbering:
            leads = self.mapping.gateways.leads(REGISTRY_KEY)
            await self._read_registry(again=not leads)
            entries = self.numbers.assign(topic, foreign, writable)
            if not entries:
                return
            if not leads:  # the registry has one writer: its leader numbers them at its next survey
                log.info("topic %r: %d foreign partition(s) wait for node %d to number them", topic, len(entries),
                         self.mapping.gateways.leader(REGISTRY_KEY).node_id)
                return
            registry = self._registry
            assert registry is not None
            first = await registry.send_many([e.encode() for e in entries], keys=[e.key for e in entries])
            try:
                await asyncio.wait_for(asyncio.shield(SendFuture(registry, first + len(entries) - 1).future()),
                                       KEEP_SECONDS)
            except asyncio.TimeoutError:
                raise DafkaError(f"{len(entries)} partition number(s) were not acked in {KEEP_SECONDS:.0f} s: "
                                 "not given") from None
            for entry in entries:
                self.numbers.take(entry)
            log.info("topic %r: foreign partitions numbered %s", topic,
                     ", ".join(f"{e.address} = {e.number}" for e in entries))

    async def _read_registry(self, again: bool = False) -> None:
        """Read the partition numbers given so far back from the cluster before giving any: once while this
        gateway leads the registry (it writes it, resumed), and ``again`` for what its leader added since."""
        assert self.mapping is not None
        if self._registry_read and not again:
            return
        loop = asyncio.get_running_loop()
        address = partition_address(REGISTRY_NAME)
        resuming = None
        if self._registry is None and (self.mapping.gateways.leads(REGISTRY_KEY) or not self._formed.is_set()):
            # resumed while the view forms, kept if this gateway leads it then
            resuming = loop.run_in_executor(None, lambda: AsyncProducer(REGISTRY_TOPIC, self.config, address=address,
                                                                        resume=True))
        await self._formed.wait()
        if self.mapping.gateways.leads(REGISTRY_KEY):
            if self._registry is None:
                self._registry_read = False  # (what another leader wrote meanwhile: all read again)
                self._registry = await (resuming or loop.run_in_executor(None, lambda: AsyncProducer(
                    REGISTRY_TOPIC, self.config, address=address, resume=True)))
            head = self._registry.next_offset - 1
        else:
            if resuming is not None:
                self._discard([resuming])
            if self._registry is not None:  # another gateway leads it now
                registry, self._registry = self._registry, None
                await registry.stop()
            head = (await loop.run_in_executor(None, self._survey, REGISTRY_TOPIC)).get(address, -1)
        first = self._registry_next if self._registry_read else 0
        values = await self._read_back(REGISTRY_TOPIC, address, first, head)
        for entry in self._decoded(values, decode_entry, "the partition registry"):
            self.numbers.take(entry)
        self._registry_next = max(first, head + 1)
        self._registry_read = True

    def _decoded(self, values: list[bytes], decode: Callable[[bytes], T], what: str) -> list[T]:
        """The records read back from ``what`` that ``decode`` takes; the others counted malformed, skipped."""
        out = []
        for value in values:
            try:
                out.append(decode(value))
            except ValueError as exc:
                self.counters.malformed += 1
                log.warning("%s holds a record that is not an entry (%s): skipped", what, exc)
        return out

    async def _read_back(self, topic: str, address: str, first: int, head: int) -> list[bytes]:
        """The values of a partition's records from ``first`` to ``head``, from the stores (compaction's gaps
        skipped; a DafkaError if ``head`` is not read in :data:`LOAD_SECONDS`)."""
        if head < first:
            return []
        consumer: AsyncConsumer[bytes] = AsyncConsumer(config=self.config.with_overrides(
            {"consumer/offset/reset": "earliest"}, source="kafka gateway"))
        values: list[bytes] = []
        expected = first
        try:
            consumer.subscribe(topic)
            consumer.seek(address, first, topic=topic)
            deadline = time.monotonic() + LOAD_SECONDS
            while time.monotonic() < deadline:
                got = await consumer.getmany(timeout_ms=100)
                for tp, records in got.items():
                    if tuple(tp) != (topic, address):
                        continue
                    for r in records:
                        if expected <= r.offset <= head:
                            values.append(r.value)
                            expected = r.offset + 1
                if expected > head:
                    return values
        finally:
            await consumer.stop()
        raise DafkaError(f"{topic} {address}: read back to {expected - 1} of {head} in {LOAD_SECONDS:.0f} s")

    async def _watch(self) -> None:
        """Survey the whole cluster now and then: its topics, the heads of foreign partitions, and new
        foreign partitions of the topics known, which get their numbers (clients see them once their
        metadata is refreshed, as partitions added to a Kafka topic).  After the first survey, every topic
        that has gateway partitions is learnt in the background, as a Kafka broker loads its partitions at
        start: a resume waits out the old beacons of its partition (rfc 15), up to ``beacon/timeout``, which
        a client's first metadata request after a restart would otherwise wait for (kcat gives up at 5 s)."""
        loop = asyncio.get_running_loop()

        async def read_registry() -> None:
            try:
                async with self._numbering:
                    await self._read_registry()
            except DafkaError as exc:
                log.warning("the partition registry: %s (read again when a topic needs it)", exc)
        # the registry read back at once (once the gateway heard the others), so that a topic's first request
        # does not wait for it
        self._in_background(read_registry())
        first = True
        while True:
            self.cluster_topics = await loop.run_in_executor(None, self._survey_all)
            self._surveyed.set()
            if first:  # the topics Kafka producers write, resumed at once: a restarted gateway is ready for them
                first = False
                for name, found in self.cluster_topics.items():
                    if address_of(name, 0) in found and name not in self.views:
                        self._in_background(self._resolve(name, False, found=found))
            if self.survey_interval <= 0:
                return
            for (name, address), head in [((n, a), h) for n, found in self.cluster_topics.items()
                                          for a, h in found.items()]:
                self._heard(name, address, head)  # (a head this gateway writes is its producer's, never this)
            for name, view in list(self.views.items()):
                foreign = _foreign(name, self.cluster_topics.get(name, {}))
                if not foreign:
                    continue
                writable = view.writable if view.foreign else view.count
                try:
                    await self._number(name, foreign, writable)
                except DafkaError as exc:
                    log.warning("topic %r: %s", name, exc)
                    continue
                self.views[name] = self._view(name, writable)
            assert self.mapping is not None
            gateways = self.mapping.gateways
            if len(gateways.live()) > 1 and gateways.leads(REGISTRY_KEY):  # what the others' clients wait for
                for name, found in list(self.cluster_topics.items()):
                    foreign = _foreign(name, found)
                    if foreign and name not in self.views and not name.startswith("__"):
                        try:
                            await self._number(name, foreign, sum(1 for a in found if index_of(name, a) is not None))
                        except DafkaError as exc:
                            log.warning("topic %r: %s", name, exc)
            await asyncio.sleep(self.survey_interval)

    def _survey(self, topic: str) -> dict[str, int]:
        return self._surveyed_heads(topic).get(topic, {})

    def _held_at(self, topic: str, since_ms: int) -> dict[str, int]:
        """What each partition of ``topic`` held at ``since_ms`` (HEADS-AT of its producers and stores)."""
        return self._run_survey(topic, since_ms).held_at()

    def _survey_all(self) -> Heads:
        return self._surveyed_heads(None)

    def _surveyed_heads(self, topic: str | None) -> Heads:
        found: Heads = {}
        for row in self._run_survey(topic).partition_rows():
            heads = [h for h in (row["store_head"], row["producer_head"]) if h is not None]
            found.setdefault(row["topic"], {})[row["partition"]] = max(heads, default=-1)
        return found

    def _run_survey(self, topic: str | None, held_at_ms: int | None = None) -> Survey:
        """What a survey peer (``dafka status``'s) learns of ``topic`` (None: every one) in
        :data:`SURVEY_SECONDS` once it reached the tower (at most ``beacon/timeout`` later)."""
        peer = StatusPeer(self.config, topic, held_at_ms=held_at_ms)
        try:
            peer.start()
            if peer.wait_connected(self.config["beacon/timeout"] / 1000.0):
                self.tower_reached = True
            else:
                log.warning("survey of %s: no tower reached in %d ms", topic or "the cluster",
                            self.config["beacon/timeout"])
            peer.run(SURVEY_SECONDS)
            return peer.survey
        finally:
            peer.close()

    def _producer(self, topic: str, index: int) -> AsyncProducer[bytes]:
        return AsyncProducer(topic, self.config, address=address_of(topic, index), resume=True)

    # -- connections -----------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One connection: requests read in order, answered in order.  Produce requests are pipelined (each
        is published as it comes, and its answer waits for its acks while the next ones are read), as a
        client with several requests in flight needs: answered one by one, a connection would carry one
        Produce per store round trip.  Any other request waits until every earlier one is answered."""
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        self.counters.connections += 1
        peer = writer.get_extra_info("peername")
        fetches: _Reader | None = None
        answers: asyncio.Queue[tuple[Request, asyncio.Future[bytes | None]]] = asyncio.Queue(PIPELINE)
        sender = asyncio.ensure_future(self._send_answers(answers, writer))
        sasl = SaslServer(self.users or {}, self.sasl_mechanisms)
        raw_tokens = False  # after a SaslHandshake v0: the tokens come as bare frames
        access = Access(ANONYMOUS, self.acl)  # the SASL user's once authenticated
        try:
            while True:
                try:
                    size = _SIZE.unpack(await reader.readexactly(4))[0]
                except asyncio.IncompleteReadError:
                    return
                before_login = self.users is not None and not sasl.authenticated
                limit = MAX_SASL_BYTES if before_login else self.max_request_bytes
                if not 0 < size <= limit:
                    if before_login:
                        self.counters.authentication_failed += 1
                        log.warning("kafka client %s: a frame of %d bytes before authenticating (at most %d): closed",
                                    peer, size, limit)
                    else:
                        self.counters.malformed += 1
                        log.warning("kafka client %s: a request of %d bytes (socket.request.max.bytes %d): closed",
                                    peer, size, limit)
                    return
                frame = await reader.readexactly(size)
                if raw_tokens:
                    code, message, reply = sasl.authenticate(frame)
                    if code:
                        self._refused_login(peer, sasl, message)
                        return
                    writer.write(_SIZE.pack(len(reply)) + reply)
                    await writer.drain()
                    raw_tokens = not sasl.authenticated
                    if sasl.principal is not None:
                        access = Access(sasl.principal, self.acl)
                    continue
                try:
                    request = read_request(frame)
                except DecodeError as exc:
                    self.counters.malformed += 1
                    log.warning("kafka client %s: a malformed request (%s): closed", peer, exc)
                    return
                self.counters.requests += 1
                if request.api_key in (SASL_HANDSHAKE.key, SASL_AUTHENTICATE.key) and request.body is not None:
                    await answers.join()
                    said, raw_tokens, failed = self._sasl_answer(request, sasl)
                    writer.write(response_frame(request.api, request.version, request.correlation_id, said))
                    await writer.drain()
                    if failed is not None:
                        self._refused_login(peer, sasl, failed)
                        return
                    if sasl.principal is not None:
                        access = Access(sasl.principal, self.acl)
                    continue
                if before_login and request.api_key != API_VERSIONS.key:
                    self.counters.authentication_failed += 1
                    log.warning("kafka client %s: %s before authenticating (the listener requires SASL): closed",
                                peer, request.api.name if request.api is not None else f"API {request.api_key}")
                    return
                if request.api is PRODUCE and request.body is not None:
                    await answers.put((request, asyncio.ensure_future(self._answer(request, fetches, access))))
                    continue
                await answers.join()  # every earlier answer is out
                if sender.done():
                    return  # it failed: the connection is gone
                if request.body is None and request.api_key == 18:
                    writer.write(unsupported_api_versions(request.correlation_id))
                    await writer.drain()
                    continue
                if fetches is None and request.api_key == 1 and request.body is not None:
                    fetches = _Reader(self.config, self.heard_heads)
                body = await self._answer(request, fetches, access)
                if body is not None:
                    writer.write(response_frame(request.api, request.version, request.correlation_id, body))
                    await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        except asyncio.CancelledError:  # the gateway closes (asyncio's streams log a cancelled handler's as an error)
            return
        finally:
            self._connections.discard(task)
            sender.cancel()
            while not answers.empty():
                answers.get_nowait()[1].cancel()
            await asyncio.gather(sender, return_exceptions=True)
            if fetches is not None:
                await fetches.close()
            writer.close()

    def _sasl_answer(self, request: Request, sasl: SaslServer) -> tuple[bytes, bool, str | None]:
        """A SaslHandshake's or SaslAuthenticate's answer, whether raw tokens follow (a SaslHandshake v0 that
        succeeded), and why the connection must go (None: it goes on)."""
        assert request.body is not None and request.api is not None
        if request.api is SASL_HANDSHAKE:
            mechanism = request.body["mechanism"]
            code = sasl.handshake(mechanism)
            body = {"error_code": code, "mechanisms": list(self.sasl_mechanisms)}
            return (encode_body(SASL_HANDSHAKE, request.version, body), code == 0 and request.version == 0,
                    f"mechanism {mechanism!r} not offered" if code else None)
        code, message, reply = sasl.authenticate(request.body["auth_bytes"])
        if code == 0 and sasl.authenticated:
            log.info("kafka client authenticated as %r (%s)", sasl.principal, sasl.mechanism)
        body = {"error_code": code, "error_message": message, "auth_bytes": reply, "session_lifetime_ms": 0}
        return encode_body(SASL_AUTHENTICATE, request.version, body), False, (message or "refused") if code else None

    def _refused_login(self, peer: Any, sasl: SaslServer, message: str | None) -> None:
        self.counters.authentication_failed += 1
        log.warning("kafka client %s: SASL %s refused%s: closed", peer, sasl.mechanism or "handshake",
                    f" ({message})" if message else "")

    @staticmethod
    async def _send_answers(answers: asyncio.Queue[tuple[Request, asyncio.Future[bytes | None]]],
                            writer: asyncio.StreamWriter) -> None:
        """Write the pipelined answers, in the order of their requests (a failed one closes the connection)."""
        try:
            while True:
                request, answer = await answers.get()
                try:
                    body = await answer
                    if body is not None:
                        writer.write(response_frame(request.api, request.version, request.correlation_id, body))
                        await writer.drain()
                finally:
                    answers.task_done()
        except Exception as exc:  # the connection goes; the reader, waiting on the queue, must not wait for ever
            if isinstance(exc, (ConnectionError, DafkaError)):
                log.warning("kafka connection closed: %s", exc)
            else:
                log.exception("kafka connection closed: answering a request failed")
            writer.close()
            while not answers.empty():
                answers.get_nowait()[1].cancel()
                answers.task_done()

    async def _answer(self, request: Request, fetches: _Reader | None, access: Access = ALLOW_ALL) -> bytes | None:
        mapping = self.mapping
        assert mapping is not None
        if request.body is None or request.api is None:
            return None if request.api is None else mapping.unsupported(request)
        names = mapping.wanted_topics(request)
        views = await self._known(names, mapping.to_create(request, self.views, access))
        for group in mapping.groups_read(request):
            await self._load(group)
        token: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        denied = access.denied
        outcome = mapping.handle(request, views, time.monotonic(), token, access)
        self.counters.denied += access.denied - denied
        if isinstance(outcome, Answer):
            return outcome.body
        if isinstance(outcome, Appends):
            return await self._produce(outcome, views)
        if isinstance(outcome, Replies):
            self._deliver(outcome)
            try:
                return await token
            finally:
                mapping.forget_request(token)
        if isinstance(outcome, Commit):
            return mapping.commit_response(outcome, await self._commit(outcome))
        if isinstance(outcome, Create):
            return mapping.create_response(outcome, await self._create(outcome))
        if isinstance(outcome, Seek):
            loop = asyncio.get_running_loop()
            found = await asyncio.gather(*(loop.run_in_executor(None, self._held_at, topic, ms)
                                           for topic, ms in outcome.moments))
            held: Held = dict(zip(outcome.moments, found))
            return mapping.list_offsets(request, views, held, access)
        assert isinstance(outcome, Reads) and fetches is not None
        return await self._fetch(outcome, views, fetches)

    # -- groups' commits -------------------------------------------------------------------

    async def _offsets_producer(self, group: str) -> AsyncProducer[bytes]:
        """The gateway's partition of the group's offsets topic (resumed: it goes on after a restart)."""
        producer = self._offset_producers.get(group)
        if producer is None:
            await self._formed.wait()
            producer = await asyncio.get_running_loop().run_in_executor(None, lambda: AsyncProducer(
                offsets_topic(group), self.config, address=partition_address(f"kafka-offsets:{group}"), resume=True))
            assert self.mapping is not None
            first = self._offset_producers.get(group)
            if first is not None or not self.mapping.leads_group(group):
                # another request resumed it first, or the group moved while the resume waited: a producer
                # kept here would beacon its partition on, and its coordinator could never resume it
                await _stop_now(producer)
                if first is not None:
                    return first
                raise DafkaError(f"group {group!r}: its offsets partition is another gateway's now")
            self._offset_producers[group] = producer
        return producer

    async def _load(self, group: str) -> None:
        """Read a group's commits back from its last snapshot in the cluster, once (a restarted gateway, or the
        group's new coordinator); another gateway's group is not read (its requests get NOT_COORDINATOR)."""
        assert self.mapping is not None
        if not self.mapping.leads_group(group):
            return
        pending = self._loaded.get(group)
        if pending is None:
            pending = self._loaded[group] = asyncio.ensure_future(self._read_commits(group))
        await asyncio.shield(pending)

    async def _read_commits(self, group: str) -> None:
        """The group's last commit record, read back; while its offsets partition cannot be resumed (another
        gateway still writes it: a coordinator that moved, a gateway that stood still), the group answers
        NOT_COORDINATOR, and the read is tried again every second until it is done or the group moves."""
        assert self.mapping is not None
        try:
            producer = await self._offsets_producer(group)
        except DafkaError as exc:
            log.warning("group %r: its commits not read back yet (%s): NOT_COORDINATOR meanwhile", group, exc)
            self.mapping.loading.add(group)
            self._in_background(self._load_again(group))
            return
        self.mapping.loading.discard(group)
        head = producer.next_offset - 1
        if head < 0 or group in self.mapping.offsets:
            return
        try:
            for value in await self._read_back(offsets_topic(group), producer.address, head, head):
                self._take_commits(group, value)
        except DafkaError as exc:
            log.warning("group %r: its last commit record was not read back: %s", group, exc)

    async def _load_again(self, group: str) -> None:
        """A second later, read the group's commits again if they still could not be (:meth:`_read_commits`)."""
        await asyncio.sleep(1.0)
        assert self.mapping is not None
        if group in self.mapping.loading and self._loaded.get(group) is not None and self._loaded[group].done():
            del self._loaded[group]
            await self._load(group)

    def _take_commits(self, group: str, value: bytes) -> None:
        assert self.mapping is not None
        try:
            _, offsets = decode_commits(value)
        except ValueError as exc:
            log.warning("group %r: its last commit record is not one (%s)", group, exc)
            return
        kept = self.mapping.offsets.setdefault(group, {})
        for (topic, address), offset in offsets.items():
            index = index_of(topic, address)
            if index is None:
                index = self.numbers.number(topic, address)
            if index is not None and (topic, index) not in kept:
                kept[(topic, index)] = (offset, None)

    async def _commit(self, commit: Commit) -> int:
        """Keep a group's commits: a snapshot of them all, acked by ``producer/min_acks`` stores."""
        assert self.mapping is not None
        failed = 0
        groups = commit.forget or [commit.group]
        for group in groups:
            await self._load(group)
            kept: dict[tuple[str, int], tuple[int, str | None]]
            if commit.forget:  # an empty snapshot: the group's commits are gone
                self.mapping.offsets.pop(group, None)
                kept = {}
            elif commit.offsets:
                kept = self.mapping.offsets.setdefault(group, {})
                kept.update(commit.offsets)
            else:
                continue
            snapshot = {(t, address): offset for (t, i), (offset, _) in kept.items()
                        if offset >= 0 and (address := self._address(t, i)) is not None}
            try:
                producer = await self._offsets_producer(group)
                sent = await producer.send(encode_commits(GATEWAY_MEMBER, snapshot, snapshot=True))
                await asyncio.wait_for(asyncio.shield(sent.future()), 10.0)
            except (DafkaError, asyncio.TimeoutError) as exc:
                log.warning("group %r: its commits were not kept (%s)", group, exc)
                failed = errors.COORDINATOR_NOT_AVAILABLE
        return failed

    def _address(self, topic: str, index: int) -> str | None:
        view = self.views.get(topic)
        return view.address(index) if view is not None else address_of(topic, index)

    # -- admin -----------------------------------------------------------------------------

    async def _create(self, create: Create) -> dict[str, tuple[int, str]]:
        failed: dict[str, tuple[int, str]] = {}
        for name, partitions in create.topics.items():
            if name in self.views:
                failed[name] = (errors.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists")
            elif not create.validate_only:
                await self._resolve(name, True, partitions)
                log.info("topic %r created with %d partition(s)", name, partitions)
        return failed

    async def _produce(self, appends: Appends, views: dict[str, TopicView]) -> bytes | None:
        mapping = self.mapping
        assert mapping is not None
        self._watch_stall()  # (a request read just after a stall goes to no producer of before it)
        stalls = self.stall.count
        results: dict[tuple[str, int], tuple[int, int]] = {key: (code, -1) for key, code in appends.refused.items()}
        waits: list[tuple[tuple[str, int], SendFuture]] = []
        for append in appends.appends:
            key = (append.topic, append.index)
            if results.get(key, (0, 0))[0]:
                continue
            count = append.batch.count
            lock = self._appending.get(key)
            if lock is None:
                lock = self._appending[key] = asyncio.Lock()
            async with lock:
                producer = self.producers.get(key)
                if producer is None or not mapping.leads(*key):  # moved here (resumed now), or away meanwhile
                    try:
                        producer = await self._partition(key) if mapping.leads(*key) else None
                    except DafkaError as exc:  # e.g. its last leader still writes it (PartitionClaimed)
                        log.warning("%s/%d: not resumed (%s)", key[0], key[1], exc)
                    if producer is None:
                        results[key] = (errors.NOT_LEADER_OR_FOLLOWER, -1)
                        continue
                code, first, again = await self._append(key, producer, append.batch, appends.timeout_ms / 1000.0)
            if code:
                results[key] = (code, -1)
                continue
            if again:  # a retry: the same answer, once what it got is kept
                self.counters.duplicates += 1
            else:
                self.counters.records_in += count
            results.setdefault(key, (0, first))
            waits.append((key, SendFuture(producer, first + count - 1)))
        if appends.acks == -1:
            for key, future in waits:
                try:
                    await asyncio.wait_for(asyncio.shield(future.future()), appends.timeout_ms / 1000.0)
                except asyncio.TimeoutError:
                    results[key] = (errors.REQUEST_TIMED_OUT, -1)
                except DafkaError:  # its producer let go meanwhile (Closed): the client retries at the leader
                    results[key] = (errors.NOT_LEADER_OR_FOLLOWER, -1)
        if self._watch_stall() or self.stall.count != stalls:  # its acks may be for another writer's records
            results = {key: (errors.NOT_LEADER_OR_FOLLOWER, -1) if code == 0 else (code, first)
                       for key, (code, first) in results.items()}
        if appends.acks == 0:
            return None
        return mapping.produce_response(appends.request, {key: results[key] for key in appends.order if key in results},
                                        appends.messages)

    async def _append(self, key: tuple[str, int], producer: AsyncProducer[bytes], batch: Any,
                      timeout: float) -> tuple[int, int, bool]:
        """One batch into its partition, under the partition's lock: (Kafka error code, the first record's
        offset, whether it was a retry answered again).  An idempotent batch is noted in the topic's
        sequences partition, acked, before its records go, once the unacked buffer has room for them; a
        record over ``producer/max_record_bytes`` (refused then) voids its note."""
        assert self.mapping is not None
        sequences = self.mapping.sequences
        count = batch.count
        pid, epoch, base = batch.producer_id, batch.producer_epoch, batch.base_sequence
        action, value = sequences.check(key, pid, epoch, base, count)
        if action == DUPLICATE:
            return 0, value, True
        partial_offset = -1
        rest = batch
        if action == PARTIAL:  # its first records are stored (its gateway died while they went out): the rest
            partial_offset, present, rest = sequences.take_partial(key, pid, batch)
            log.info("%s/%d: a retried batch found %d of its %d records stored: the rest appended", key[0], key[1],
                     present, count)
        elif action != APPEND:
            return value, -1, False
        entry = None
        if pid >= 0:
            try:
                await producer.wait_for_room(rest.count, rest.body_bytes)  # (at least the records' bytes)
                entry = BatchEntry(key[1], pid, epoch, rest.base_sequence, rest.count, producer.next_offset)
                noted = await self._sequence_producers[key].send(entry.encode())
                await asyncio.wait_for(asyncio.shield(noted.future()), timeout)
            except PartitionClaimed:
                self._claimed(key)
                return errors.NOT_LEADER_OR_FOLLOWER, -1, False
            except (DafkaError, asyncio.TimeoutError) as exc:
                log.warning("%s/%d: an idempotent batch was not noted (%s): not appended", key[0], key[1], exc)
                return errors.REQUEST_TIMED_OUT, -1, False
        try:
            first = await producer.send_many(rest.values, keys=rest.keys, attributes=rest.record_attributes)
        except PartitionClaimed:
            if entry is not None:  # its offsets may be the other writer's: the note must not answer a retry
                try:
                    await self._sequence_producers[key].send(entry.voided().encode())
                except DafkaError as exc:
                    log.warning("%s/%d: a note not voided (%s)", key[0], key[1], exc)
            self._claimed(key)
            return errors.NOT_LEADER_OR_FOLLOWER, -1, False
        except (RecordTooLarge, BufferFull) as exc:
            if entry is not None:  # the note must not stand for the records that take these offsets
                await self._sequence_producers[key].send(entry.voided().encode())
            return (errors.MESSAGE_TOO_LARGE if isinstance(exc, RecordTooLarge) else errors.REQUEST_TIMED_OUT), -1, False
        if partial_offset >= 0:
            first = partial_offset
        sequences.record(key, pid, epoch, base, count, first)
        return 0, first, False

    async def _fetch(self, reads: Reads, views: dict[str, TopicView], fetches: _Reader) -> bytes:
        mapping = self.mapping
        assert mapping is not None
        deadline = time.monotonic() + reads.max_wait_ms / 1000.0
        buffers = {(r.topic, r.index): (r, fetches.want(r.topic, address, r.offset))
                   for r in reads.reads if (address := views[r.topic].address(r.index)) is not None}
        while True:
            found, size = self._take(buffers, reads.max_bytes)
            if size >= max(1, reads.min_bytes) or time.monotonic() >= deadline or not buffers:
                break
            await fetches.wait(deadline - time.monotonic())
        self.counters.records_out += sum(len(segment) for segments in found.values() for segment in segments)
        return mapping.fetch_response(reads, await self._known(list(views), []), found)

    @staticmethod
    def _take(buffers: dict[tuple[str, int], tuple[Any, PartitionBuffer]],
              max_bytes: int) -> tuple[dict[tuple[str, int], list[Segment]], int]:
        found: dict[tuple[str, int], list[Segment]] = {}
        total = 0
        for key, (read, buf) in buffers.items():
            rows, size = buf.take(read.offset, min(read.max_bytes, max_bytes - total))
            if rows:
                found[key] = rows
                total += size
        return found, total


class _TopicSink:
    """Where a reader's consumer delivers a topic's records (a :class:`~dafka.consumer.state.FrameSink`):
    into the buffer of their partition, if a Fetch asked for it; a message's records as its frames came, a
    record delivered alone as a row.  A record without a timestamp, its own or its store's, gets the time
    it came."""

    def __init__(self, reader: _Reader, topic: str) -> None:
        self.reader, self.topic = reader, topic

    def add_frames(self, partition: str, msg: RecordFrames, skip: int) -> None:
        key = (self.topic, partition)
        buf = self.reader.buffers.get(key)
        if buf is not None:
            buf.add_frames(msg, skip, int(time.time() * 1000))
            self.reader.added(key, buf)

    def append(self, record: Record[bytes]) -> None:
        self.extend((record,))

    def extend(self, records: Iterable[Record[bytes]]) -> None:
        now = int(time.time() * 1000)
        for (topic, address), run in groupby(records, _partition_of):
            buf = self.reader.buffers.get((topic, address))
            if buf is not None:
                # in order from the seek on; a compacted partition's skip offsets (rfc 19)
                buf.add([(r.offset, now if r.timestamp is None else r.timestamp, r.key, r.value, r.headers)
                         for r in run])
                self.reader.added((topic, address), buf)


_partition_of = attrgetter("topic", "partition")


async def _stop_now(*producers: AsyncProducer[bytes] | None) -> None:
    """Stop producers that another process's twin fenced, without waiting for acks: they may not write, and
    must stop beaconing their partitions."""
    for producer in producers:
        if producer is not None:
            try:
                await producer.stop(timeout=0)
            except DafkaError:
                pass


def _foreign(topic: str, found: dict[str, int]) -> dict[str, int]:
    """The partitions of a survey of ``topic`` (address -> head) that no gateway numbers: dafka producers'."""
    return {address: head for address, head in found.items() if index_of(topic, address) is None}
