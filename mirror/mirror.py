"""The mirror: a source site's topics copied into a target site, partition for
partition, offset for offset (rfc/mirror.md).

One consumer reads the source (its bulk answers make a catch-up fast); one
resumable producer per partition writes the target under the partition's own
address, each record at its own offset.  The decisions are
:class:`~dafka.mirror.state.MirrorState`'s; this module owns the peers:

* the consumer runs in the caller's thread (:meth:`Mirror.run`), and so do
  the copies: no record crosses a thread;
* a new partition's producer learns its head from the target stores in a
  worker thread (that takes about 1.5 x ``beacon/interval``), meanwhile the
  partition's records are dropped, and read again from head + 1;
* with prefixes or every topic, a survey peer (:mod:`dafka.discovery.survey`) looks
  for new topics in the source every ``scan_interval`` seconds.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from itertools import groupby
from operator import itemgetter
from typing import Any, Sequence

import zmq

from dafka.discovery import peer_info
from dafka.protocol.attributes import Attributes, record_attributes
from dafka.config import Config
from dafka.consumer.consumer import Consumer
from dafka.errors import BufferFull, DafkaError, PartitionClaimed, ResumeError
from dafka.config import ConfigLike, as_config
from dafka.producer.producer import Producer
from dafka.discovery.survey import StatusPeer

from .provenance import MalformedProvenance, Provenance, mirror_address
from .state import PROVENANCE_TOPIC, STOPPED, Key, MirrorState, Partition, Phase, Selection

log = logging.getLogger(__name__)

_KEY = itemgetter(0, 1)  # a Record's (topic, partition)
_VALUES = itemgetter(3)
BATCH = 8192  # records taken from the consumer per turn
TICK = 0.2  # seconds between looks at acks, heads and conflicts
RETRY = 2.0  # seconds before a partition whose target stores did not answer is tried again
# A source position no partition reaches: the consumer neither fetches nor delivers a partition seeked
# there (every record is below it), which is how a partition waits while its target head is learnt.
PARKED = 2**62


class MirrorError(DafkaError):
    """The mirror cannot start or go on: a site unreachable, its own
    provenance unreadable.  The message says which site and what to check."""


class _NotOurs(Exception):
    """Raised by the resume hook: the target holds the partition, and not from this mirror."""

    def __init__(self, head: int) -> None:
        super().__init__(head)
        self.head = head


@dataclass
class MirrorStats:
    """What the I/O side counts (what was copied is :attr:`MirrorState.copied`)."""

    bytes: int = 0  # content bytes published into the target
    malformed_provenance: int = 0
    resume_failures: int = 0


class Mirror:
    """Copy ``selection``'s topics from the ``source`` site into the ``target``.

    >>> mirror = Mirror({"beacon/pub_address": "tcp://a:5557", "beacon/sub_address": "tcp://a:5556"},
    ...                 {"beacon/pub_address": "tcp://b:5557", "beacon/sub_address": "tcp://b:5556"},
    ...                 Selection(topics=("orders",)), name="a-to-b")
    >>> mirror.start(); mirror.run()   # until mirror.stop() (from another thread or a signal)

    ``name`` must stay the same across restarts: the mirror's provenance
    partition derives from it.  ``source_site`` names the source in the
    provenance records (default: its tower's address).
    """

    def __init__(self, source: ConfigLike, target: ConfigLike, selection: Selection, *, name: str,
                 source_site: str | None = None, conflict_grace: float = 10.0, scan_interval: float = 2.0,
                 resume_workers: int = 32, tower_timeout: float = 10.0) -> None:
        if not name:
            raise ValueError("a mirror needs a name (its provenance partition derives from it)")
        self.source: Config = as_config(source).with_overrides({"consumer/offset/reset": "earliest"}, source="mirror")
        self.target: Config = as_config(target)
        self.name = name
        self.site = source_site or str(self.source["beacon/pub_address"])
        self.selection = selection
        self.state = MirrorState(selection, conflict_grace=conflict_grace)
        self.stats = MirrorStats()
        self.scan_interval = scan_interval
        self.tower_timeout = tower_timeout
        self._ctx = zmq.Context()
        self._producers: dict[Key, Producer[bytes]] = {}
        self._pool = ThreadPoolExecutor(resume_workers, thread_name_prefix="dafka-mirror-resume")  # (each waits)
        self._resuming: dict[Future[Producer[bytes]], Partition] = {}
        self._retry_at: dict[Key, float] = {}
        self._stop = threading.Event()
        self._new_topics: set[str] = set()
        self._topics_lock = threading.Lock()
        self._scanner: threading.Thread | None = None
        self._provenance: Producer[bytes] | None = None
        self._consumer: Consumer[bytes] | None = None
        self._lock = threading.Lock()  # the producers dict, read by metrics scrapes

    @property
    def _source_consumer(self) -> Consumer[bytes]:
        assert self._consumer is not None, "the mirror is not started"
        return self._consumer

    @property
    def _own_provenance(self) -> Producer[bytes]:
        assert self._provenance is not None, "the mirror is not started"
        return self._provenance

    # -- start ---------------------------------------------------------------------

    def start(self) -> None:
        """Join both sites: take over the mirror's provenance partition in the
        target, read what it says, and subscribe to the source.  Raises
        :class:`MirrorError` naming the site that does not answer."""
        peer_info.set_application("mirror", self.describe)
        try:
            self._provenance = Producer(PROVENANCE_TOPIC, self.target, address=mirror_address(self.name),
                                        resume=True, ctx=self._ctx)
        except (ResumeError, PartitionClaimed) as exc:
            raise MirrorError(f"the target site ({self.target['beacon/pub_address']}): {exc}") from None
        self._read_own_provenance(self._provenance.acked_offset)
        consumer = self._consumer = Consumer(config=self.source, ctx=self._ctx)
        if self.state.resume_owned():
            self._resume_owned()
        deadline = time.monotonic() + self.tower_timeout
        while not consumer.connected:
            if time.monotonic() >= deadline:
                raise MirrorError(f"the source site: no tower answers at {self.source['beacon/pub_address']} "
                                  f"(after {self.tower_timeout:g} s; check beacon/pub_address and beacon/sub_address)")
            time.sleep(0.01)
        consumer.subscribe(PROVENANCE_TOPIC, *self.selection.topics)
        if self.selection.prefixes or self.selection.every:
            self._scanner = threading.Thread(target=self._scan_topics, name="dafka-mirror-topics", daemon=True)
            self._scanner.start()
        log.info("mirror %s: %s -> %s, %d partition(s) owned in the target", self.name,
                 self.source["beacon/pub_address"], self.target["beacon/pub_address"], len(self.state.owned))

    def _resume_owned(self) -> None:
        """Resume the partitions this mirror owns, all at once, before the
        source is read: each is then read from its head in the target + 1."""
        timeout = self.target["producer/resume_timeout"] / 1000.0 + 5.0
        self._start_resumes(time.monotonic())
        for future in list(self._resuming):
            try:
                future.exception(timeout)
            except TimeoutError:
                break  # (left to the loop)
        self._finish_resumes(time.monotonic())

    def _read_own_provenance(self, head: int) -> None:
        """Which partitions this mirror wrote into the target: records 0..head
        of its provenance partition, from the target stores."""
        if head < 0:
            return
        own = mirror_address(self.name)
        timeout = self.target["producer/resume_timeout"] / 1000.0
        config = self.target.with_overrides({"consumer/offset/reset": "earliest"}, source="mirror")
        deadline = time.monotonic() + timeout
        with Consumer(PROVENANCE_TOPIC, config=config, ctx=self._ctx) as reader:
            seen = -1
            while seen < head:
                if time.monotonic() >= deadline:
                    raise MirrorError(f"the target site ({self.target['beacon/pub_address']}): its stores hold "
                                      f"records 0..{head} of this mirror's provenance but gave {seen + 1} in "
                                      f"{timeout:g} s (producer/resume_timeout)")
                for record in reader.consume(1000, timeout=0.1):
                    if record.partition == own and record.offset > seen:
                        seen = record.offset
                        self._on_provenance(record.value, own=True)

    def _on_provenance(self, value: bytes, *, own: bool) -> None:
        try:
            record = Provenance.decode(value)
        except MalformedProvenance as exc:
            self.stats.malformed_provenance += 1
            log.warning("mirror %s: a malformed provenance record was dropped: %s", self.name, exc)
            return
        key = (record.topic, record.partition)
        if own:
            self.state.on_own_provenance(key)
        else:
            self.state.on_source_provenance(key, record.source, time.monotonic())

    # -- the loop --------------------------------------------------------------------

    def run(self) -> None:
        """Copy until :meth:`stop`; then close everything (see :meth:`close`)."""
        if self._consumer is None:
            self.start()
        consumer = self._source_consumer
        state = self.state
        producers = self._producers
        next_tick = 0.0
        try:
            while not self._stop.is_set():
                records = consumer.consume(BATCH, timeout=0.05)
                now = time.monotonic()
                for (topic, partition), group in groupby(records, _KEY):
                    run = list(group)
                    if topic == PROVENANCE_TOPIC:
                        for record in run:
                            self._on_provenance(record.value, own=False)
                        continue
                    copy = state.on_records(topic, partition, run[0][2], list(map(_VALUES, run)), now)
                    if copy is not None:
                        # the records' keys and attributes go with them (rfc 18), when any has some
                        copied = run[copy.first - run[0][2]:]
                        keys = [r.key for r in copied]
                        held = [None if r.timestamp is None and not r.headers else
                                record_attributes(r.headers, r.timestamp) for r in copied]
                        self._copy(producers[(topic, partition)], copy.partition, copy.first, copy.values,
                                   keys if any(k is not None for k in keys) else None,
                                   held if any(a is not None for a in held) else None)
                if state.to_resume:
                    self._start_resumes(now)
                if self._resuming:
                    self._finish_resumes(now)
                if now >= next_tick:
                    next_tick = now + TICK
                    self._tick(now)
        finally:
            self.close()

    def _copy(self, producer: Producer[bytes], p: Partition, first: int, values: Sequence[bytes],
              keys: Sequence[bytes | None] | None = None,
              held: Sequence[Attributes | None] | None = None) -> None:
        try:
            producer.send_many(values, keys=keys, offset=first, attributes=held)
        except PartitionClaimed as exc:
            self._drop_producer(p.key)
            self.state.on_claimed(p.key, str(exc))
            return
        except BufferFull as exc:
            # The target stores stopped acking; what was sent stays sent: read the rest again from there.
            self.state.rewind(p.key, producer.stats()["sent"])
            self._source_consumer.seek(p.address, p.next, topic=p.topic)
            log.warning("mirror %s: %s/%s waits for the target stores: %s", self.name, p.topic, p.address, exc)
            return
        self.stats.bytes += sum(map(len, values))

    def _tick(self, now: float) -> None:
        state = self.state
        heads = self._source_consumer.heads()
        for key, producer in self._producers.items():
            state.on_acked(key, producer.acked_offset)
            head = heads.get(key)
            if head is not None:
                state.on_source_head(key, head, now)
        for conflict in state.tick(now):
            self._drop_producer(conflict.partition.key)
        self._source_twins()
        with self._topics_lock:
            topics, self._new_topics = self._new_topics, set()
        if topics:
            log.info("mirror %s: new topic(s) in the source: %s", self.name, ", ".join(sorted(topics)))
            self._source_consumer.subscribe(*sorted(topics))

    def _source_twins(self) -> None:
        """A partition beaconed by two live processes in the source: two
        writers, whose records a consumer would merge.  Stop copying it."""
        endpoints: dict[str, int] = {}
        for sender in self._source_consumer._data.beacon.peers().values():
            endpoints[sender] = endpoints.get(sender, 0) + 1
        for key, p in list(self.state.partitions.items()):
            if endpoints.get(p.address, 0) > 1 and p.phase not in STOPPED:
                self._drop_producer(key)
                self.state.conflict(p, f"{endpoints[p.address]} live processes write it in the source")

    # -- target partitions -------------------------------------------------------------

    def _start_resumes(self, now: float) -> None:
        for p in self.state.take_resumes():
            if self._retry_at.get(p.key, 0.0) > now:
                self.state.to_resume.append(p)  # (parked since its first try)
                continue
            # Parked: the source is not read while the head is learnt (what it gave would be dropped and read
            # again, over a slow link twice the bytes); the seek to head + 1 unparks it.
            self._source_consumer.seek(p.address, PARKED, topic=p.topic)
            self._resuming[self._pool.submit(self._resume, p.key)] = p

    def _resume(self, key: Key) -> Producer[bytes]:
        """In a worker thread: the partition's producer in the target, once it
        knows the head; raises _NotOurs when the target holds the partition
        from another writer (the producer then never beaconed its address)."""
        owned = key in self.state.owned

        def check(head: int) -> None:
            if head >= 0 and not owned:
                raise _NotOurs(head)

        return Producer(key[0], self.target, address=key[1], resume=True, on_resume=check, ctx=self._ctx)

    def _finish_resumes(self, now: float) -> None:
        for future in [f for f in self._resuming if f.done()]:
            p = self._resuming.pop(future)
            key = p.key
            try:
                producer = future.result()
            except _NotOurs as exc:
                self.state.on_resumed(key, exc.head, now)
                continue
            except PartitionClaimed as exc:
                self.state.on_claimed(key, str(exc))
                continue
            except (ResumeError, zmq.ZMQError) as exc:
                self._resume_failed(key, now, exc)
                continue
            if self._stop.is_set():
                producer.close()
                continue
            resumed = self.state.on_resumed(key, producer.acked_offset, now)
            if resumed.claim:
                try:
                    self._own_provenance.send(Provenance(key[0], key[1], self.site, self.name).encode()).get(
                        timeout=self.target["producer/send_timeout"] / 1000.0)
                except DafkaError as exc:  # (the target's stores stopped acking: nothing is copied before it)
                    self._close_quietly(producer)
                    self._resume_failed(key, now, exc)
                    continue
                self.state.on_own_provenance(key)
            with self._lock:
                self._producers[key] = producer
            assert resumed.seek is not None  # the producer resumed: its on_resume check found the partition ours
            log.info("mirror %s: copies %s/%s from offset %d", self.name, key[0], key[1], resumed.seek)
            self._source_consumer.seek(key[1], resumed.seek, topic=key[0])

    def _resume_failed(self, key: Key, now: float, exc: Exception) -> None:
        self.stats.resume_failures += 1
        self._retry_at[key] = now + RETRY
        log.warning("mirror %s: %s/%s: the target did not answer, trying again in %g s: %s", self.name,
                    key[0], key[1], RETRY, exc)
        self.state.on_resume_failed(key)

    def _drop_producer(self, key: Key) -> None:
        with self._lock:
            producer = self._producers.pop(key, None)
        if producer is not None:
            self._close_quietly(producer)

    @staticmethod
    def _close_quietly(producer: Producer[bytes]) -> None:
        try:
            producer.close(timeout=0)
        except DafkaError:
            pass  # (unacked records of a partition left alone stay where they are)

    # -- topics ------------------------------------------------------------------------

    def _scan_topics(self) -> None:
        """In its own thread: the source's topics, from a survey peer."""
        peer = StatusPeer(self.source, None)
        known: set[str] = set()
        try:
            peer.start()
            while not self._stop.is_set():
                peer.run(self.scan_interval)
                peer.get_heads()
                survey = peer.survey
                topics = {topic for topic, _ in survey.store_heads} | {topic for topic, _ in survey.producer_heads}
                wanted = {t for t in topics - known if self.selection.wants(t)}
                known |= topics
                if wanted:
                    with self._topics_lock:
                        self._new_topics |= wanted
        except Exception:
            log.exception("mirror %s: the topic scan failed", self.name)
        finally:
            peer.close()

    # -- stop --------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask :meth:`run` to return (thread- and signal-safe)."""
        self._stop.set()

    def close(self) -> None:
        """Flush and close every producer (up to ``producer/close_timeout``), then the consumer."""
        self._stop.set()
        self._pool.shutdown(wait=True, cancel_futures=True)
        for future in list(self._resuming):
            if future.done() and future.exception() is None:
                future.result().close()
        self._resuming.clear()
        with self._lock:
            producers, self._producers = list(self._producers.values()), {}
        deadline = time.monotonic() + self.target["producer/close_timeout"] / 1000.0  # (for all of them)
        for producer in producers:
            try:
                producer.close(timeout=max(0.0, deadline - time.monotonic()))
            except DafkaError as exc:
                log.warning("mirror %s: %s", self.name, exc)
        if self._provenance is not None:
            self._provenance.close()
            self._provenance = None
        if self._consumer is not None:
            self._consumer.close()
        if self._scanner is not None:
            self._scanner.join(self.scan_interval + 5)
        self._ctx.destroy(linger=0)  # (every socket is closed by now)

    # -- reading -------------------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        """What the mirror's PEER-INFO says of it (rfc 17): its name, its source site and its partitions
        (at most 1,000 of them, the most lagging first)."""
        rows = sorted(self.partitions(), key=lambda r: -r["lag"])
        return {"name": self.name, "source": self.site, "copied": self.state.copied, "conflicts": self.state.conflicts,
                "gaps": self.state.gaps, "partitions": len(rows), "rows": rows[:1000]}

    def partitions(self) -> list[dict[str, Any]]:
        """Every source partition met: its phase, next offset, acked offset, lag."""
        now = time.monotonic()
        return [{"topic": p.topic, "partition": p.address, "phase": p.phase.value, "next": p.next,
                 "acked": p.acked, "source_head": p.source_head, "lag": p.lag(),
                 "lag_seconds": self.state.lag_seconds(p, now), "reason": p.reason}
                for p in list(self.state.partitions.values())]

    @property
    def consumer(self) -> Consumer[bytes] | None:
        """The source's consumer (None before :meth:`start`)."""
        return self._consumer

    def producers(self) -> list[Producer[bytes]]:
        """The producers copying into the target site, one per partition."""
        with self._lock:
            return list(self._producers.values())

    def copying(self) -> int:
        """How many partitions are being copied now."""
        return sum(1 for p in list(self.state.partitions.values()) if p.phase is Phase.COPYING)
