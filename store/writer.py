"""The store writer: one thread that owns the writer's sockets and writes to LevelDB.

It binds a PUB (FETCH and ACK go out on it) advertised by its own beacon, and
connects one SUB to every peer the beacon reports, subscribed to ``M`` and
``H`` (every RECORD and HEAD), ``D<writer>`` (answers to its FETCHes) and
``T<writer>`` (the DIRECT-TAIL extension).  Each wake-up drains up to
:data:`DRAIN` messages into one WriteBatch, writes it, and only then sends
one ACK per partition in it.  The protocol logic is
:class:`~dafka.store.writer_state.WriterState`; retention is
:mod:`dafka.store.retention`.
"""

from __future__ import annotations

import logging
import time
from itertools import islice

import plyvel
import zmq

from dafka.protocol import batching
from dafka.core import heap
from dafka import protocol as proto
from dafka.protocol import bulk as bulk_answers
from dafka.config import Config, ConfigError
from dafka.core.loop import Loop
from dafka.protocol.packing import put_all
from dafka.core.sockets import drain_records, queue_messages

from . import cleaner, compaction, keys, memory, retention
from .database import SharedDB
from .errors import StoreError
from dafka.discovery.placement import Placement
from .role import RoleThread
from .sharding import ShardedWriterState
from .writer_state import Partition, WriterState

log = logging.getLogger(__name__)

DRAIN = 100_000  # records drained into one batch per wake-up at most (and store/batch_bytes)...
DRAIN_STEP = 32  # ...taken at most this many messages at a time
TICK = 0.1  # seconds between fetch-retry checks
HOUSEKEEPING = 1.0  # seconds between write retries / retention passes
BACKLOG_PASS = 0.05  # ...or while a pass left work for the next one
COMPACTION_STEP = 0.005  # ...or while a compaction pass goes on: a step of store/compaction/budget keys, once no
# record waits
COMPACTION_STEP_WRITING = 0.05  # ...every 50 ms while records come (the last came less than WRITING ago): the
# steps' CPU, and LevelDB's work on their deletions, stay a small share of what writes need
WRITING = 0.1
FETCH_RETRY = 1.0  # seconds before a FETCH without progress is repeated


# After a store reader connects (it subscribes to GET-HEADS on our data socket), our GET-HEADS rounds:
# seconds from then.  The first finds what the stores hold; the others make up for a lost message.
HEADS_ROUNDS = (0.0, 1.0, 5.0)
_READER_ARRIVED = b"\x01" + proto.GET_HEADS
STORE_MEMBERS = proto.subscription(proto.STORE_MEMBER, exact=True)  # every sharded store's heartbeat
_STORE_ARRIVED = b"\x01" + STORE_MEMBERS
DELETE_BUDGET = 100_000  # keys of handed-over partitions deleted per heartbeat at most


class Writer(RoleThread):
    def __init__(self, ctx: zmq.Context, config: Config, db: SharedDB, address: str,
                 name: str = "store-writer", *, store_id: str = "", reader: str = "") -> None:
        self._shared = db
        self._reopen_needed = False
        self._ctx = ctx
        self._sync = bool(config["store/sync"])
        self.retention_ms = config["store/retention/ms"]
        self.retention_bytes = config["store/retention/bytes"]
        self._retains = self.retention_ms >= 0 or self.retention_bytes >= 0
        self._compacts = bool(config["store/offsets/compact"])
        # compacted topics (rfc 19, store/cleaner.py): one pass at a time, a step each housekeeping
        self._compaction = cleaner.Topics(config["store/compaction/topics"])
        self.tombstone_ms = config["store/compaction/tombstone_ms"]
        self.compaction_budget = config["store/compaction/budget"]
        self._pass: cleaner.Pass | None = None
        self._pass_started = 0.0
        self._records_came = float("-inf")  # when the writer socket last had messages (monotonic)
        self.compaction_deleted = 0  # records of compacted topics deleted as superseded (or old tombstones)
        self.compaction_passes = 0
        self.compaction_seconds = 0.0  # passes' wall time, first step to last (not the waits for one to be due)
        self.compaction_cpu_seconds = 0.0  # the writer thread's CPU in compaction steps, their deletions included
        self.compaction_step_max = 0.0  # the longest step (seconds): how long a record may have waited for one
        self.offsets_retention_ms = config["store/offsets/retention_ms"]
        self.compacted = 0  # offsets-topic records deleted as superseded
        self.expired = 0  # offsets-topic partitions deleted whole
        self._offsets_known = (-1, False)  # (partitions, whether one is of an offsets topic) at the last look
        # Looking for expired offsets partitions reads each one's newest stamp: once a minute is enough.
        self._expiry_every = max(0.1, min(60.0, self.offsets_retention_ms / 2000))
        self._next_expiry = 0.0
        self.verbose = bool(config["store/verbose"])
        hwm = config["store/high_watermark"]
        self.batch_bytes = config["store/batch_bytes"]
        idle_ms = config["store/memory/idle_ms"]
        self.idle_release = idle_ms / 1000 if idle_ms >= 0 else None
        self.releases = 0
        self._written_since_release: float | None = None  # when the last write since the last release was
        heap.limit_arenas()  # a store starved of CPU stays within its bounds (dafka.core.heap.ARENAS)
        if self.idle_release is not None:
            heap.mmap_large_blocks()
        self.heartbeat_every = config["beacon/interval"] / 1000
        self.state = self._new_state(config, address, store_id, reader)
        self.sharded = isinstance(self.state, ShardedWriterState)
        self.moved_records = 0  # records deleted after their partition was handed over
        self.under_replicated = 0  # partitions with fewer than store/replicas live, full copies (at the last beat)
        self.filling = 0  # partitions taken up and not yet held whole (at the last beat)
        self._deleting: list[Partition] = []  # handed over, their records still in the database
        self.write_errors = 0
        self.retention_deleted = 0
        self._heads_rounds: list = []  # the pending GET-HEADS rounds' timers
        self.last_error: str | None = None
        self._load()
        # An XPUB: each store reader that connects subscribes to GET-HEADS, and gets ours (rfc 7.1).
        self._pub = ctx.socket(zmq.XPUB)
        self._pub.setsockopt(zmq.XPUB_VERBOSE, 1)
        self._pub.sndhwm = hwm
        self._pub.linger = 500  # let the last ACKs out on stop
        self._sub = ctx.socket(zmq.SUB)
        self._sub.rcvhwm = queue_messages(config["store/receive_bytes"], hwm)
        self._sub.linger = 0
        # A sharded store subscribes to the records of the partitions it holds only (ShardedWriterState).
        prefixes = [] if self.sharded else [proto.subscription(proto.RECORD)]
        prefixes += [
            proto.subscription(proto.HEAD),
            proto.subscription(proto.DIRECT_RECORD, address, exact=True),
            proto.subscription(proto.DIRECT_TAIL, address, exact=True),
            proto.subscription(proto.DIRECT_GAP, address, exact=True),
            proto.subscription(proto.DIRECT_HEAD, address, exact=True),
        ]
        if config["store/bulk"]:
            prefixes += bulk_answers.subscriptions(address, keys=True)
        if config["store/batches"] and not self.sharded:
            prefixes.append(batching.WRITER_SUBSCRIPTION)
        if self.sharded:
            prefixes.append(STORE_MEMBERS)
        for prefix in prefixes:
            self._sub.setsockopt(zmq.SUBSCRIBE, prefix)
        self._apply_subscriptions()
        super().__init__(ctx, config, self._pub, self._sub, address, name)

    def _new_state(self, config: Config, address: str, store_id: str, reader: str) -> WriterState:
        """The writer's protocol state: sharded (rfc 16) with store/replicas > 0."""
        receive_bytes = config["store/receive_bytes"]
        replicas = config["store/replicas"]
        if replicas <= 0:
            return WriterState(address, fetch_retry=FETCH_RETRY, max_pending_bytes=receive_bytes)
        if replicas > 255:
            raise ConfigError("at most 255 (STORE-MEMBER carries it in one byte)", key="store/replicas")
        if config["store/dead_ms"] <= config["beacon/timeout"]:
            raise ConfigError(f"must be longer than beacon/timeout ({config['beacon/timeout']} ms), so that a "
                              f"store that restarts is not placed anew", key="store/dead_ms")
        if not store_id or not reader:
            raise StoreError("a sharded store writer needs the store's identity and its reader's address")
        placement = Placement(store_id, config["store/rack"], replicas, dead_after=config["store/dead_ms"] / 1000,
                              handoff=config["store/handoff_ms"] / 1000,
                              alive_after=config["beacon/timeout"] / 1000)
        # Before it has heard the other stores, a store would think it owns everything: it places nothing
        # for three beacon intervals (beacon, connection, and their STORE-MEMBERs answering ours).
        settle = min(3 * self.heartbeat_every, config["beacon/timeout"] / 1000)
        return ShardedWriterState(address, placement, reader=reader, settle=settle, started=time.monotonic(),
                                  batches=bool(config["store/batches"]), fetch_retry=FETCH_RETRY,
                                  max_pending_bytes=receive_bytes)

    def _apply_subscriptions(self) -> None:
        """(Un)subscribe what a sharded state asked for: the live records of the partitions it holds."""
        changes = getattr(self.state, "sub_changes", None)
        if changes:
            sub = self._sub
            for subscribe, prefix in changes:
                sub.setsockopt(zmq.SUBSCRIBE if subscribe else zmq.UNSUBSCRIBE, prefix)
            changes.clear()

    # -- startup ------------------------------------------------------------

    def _load(self) -> None:
        """Rebuild the heads (and, for byte retention, the sizes) from the database."""
        state = self.state
        for key, value in self._db.iterator(prefix=keys.HEAD):
            try:
                parsed = keys.parse_key(key)
            except ValueError:
                log.warning("store: ignoring a malformed head key %r", key)
                continue
            if len(value) != keys.SEQ_BYTES:
                log.warning("store: ignoring head key %r with a %d-byte value", key, len(value))
                continue
            state.load(parsed.subject, parsed.address, keys.seq_of(value))
        if self.retention_bytes >= 0:
            for key, value in self._db.iterator(prefix=keys.STAMP):
                try:
                    stamp = keys.decode_stamp(key, value)
                    parsed = keys.parse_key(key)
                except ValueError:
                    continue
                p = state.partitions.get((parsed.subject, parsed.address))
                if p is not None:
                    p.total_bytes += stamp.nbytes
        if state.partitions:
            log.info("store: %d partitions in the database", len(state.partitions))

    # -- the thread -----------------------------------------------------------

    def _run(self) -> None:
        loop = Loop()
        loop.add_reader(self._sub, self._on_sub)
        loop.add_reader(self._pub, lambda sock: self._on_subscriptions(sock, loop))
        loop.add_reader(self._data.beacon.events, self._links.on_beacon)
        loop.add_reader(self._wake, self._on_wake)
        state = self.state
        next_tick = next_housekeeping = time.monotonic() + TICK
        next_heartbeat = time.monotonic() if self.sharded else float("inf")
        try:
            # Timers run only while they have work: fetch retries while a
            # partition waits for records, write retries while writes fail,
            # retention when configured, one memory release after writes.
            # An idle store does not wake up.
            while not self._stopping:
                now = time.monotonic()
                timeout = max(0.0, next_tick - now) if state.awaiting else None
                if state.failed is not None or self._retains or self._has_offsets() or self._compaction:
                    wait = max(0.0, next_housekeeping - now)
                    timeout = wait if timeout is None else min(timeout, wait)
                if self._written_since_release is not None:
                    wait = max(0.0, self._written_since_release + self.idle_release - now)
                    timeout = wait if timeout is None else min(timeout, wait)
                if self.sharded:
                    wait = max(0.0, next_heartbeat - now)
                    timeout = wait if timeout is None else min(timeout, wait)
                loop.run_once(timeout)
                now = time.monotonic()
                if now >= next_heartbeat:
                    self._heartbeat(now)
                    next_heartbeat = now + self.heartbeat_every
                if self._written_since_release is not None and \
                        now >= self._written_since_release + self.idle_release:
                    self._release_memory()
                if state.awaiting and now >= next_tick:
                    self._tick()
                    next_tick = now + TICK
                elif not state.awaiting:
                    next_tick = now  # the first gap is looked at after its fetch_retry, from the tick
                if now >= next_housekeeping and self._pass is not None and self._records_wait():
                    pass  # records wait: written first, the compaction step after them
                elif now >= next_housekeeping:
                    more = self._housekeeping()
                    next_housekeeping = now + (self._compaction_step(now) if self._pass is not None else
                                               BACKLOG_PASS if more else HOUSEKEEPING)
            self._commit()
            if self.state.failed is not None:
                self._write(self.state.failed)
                self._flush_out()
        except BaseException as exc:  # noqa: BLE001 - logged and reported by Store
            self.error = exc
            log.exception("store writer %s failed", self.address)
        finally:
            for sock in self._sockets:
                sock.close()

    def _compaction_step(self, now: float) -> float:
        """Seconds until the next compaction step: fewer steps while records come."""
        return COMPACTION_STEP_WRITING if now - self._records_came < WRITING else COMPACTION_STEP

    def _on_sub(self, sock: zmq.Socket) -> None:
        state = self.state
        state.now = self._records_came = time.monotonic()
        # store/batch_bytes: each step takes as many messages as the bytes left allow, at the mean size so far.
        limit = self.batch_bytes
        received = step = drain_records(sock, 1, state)
        while step and state.staged < DRAIN:
            staged = state.staged_bytes
            if staged >= limit:
                break
            step = min(DRAIN_STEP, max(1, (limit - staged) * received // (staged + 1)))
            taken = drain_records(sock, step, state)
            received += taken
            if taken < step:
                break
        self._commit()

    def _commit(self) -> None:
        """Write the open batch, then send its ACKs (and any FETCH)."""
        batch = self.state.take_batch(int(time.time() * 1000))
        if batch is not None:
            self._write(batch)
        self._flush_out()

    def _write(self, batch) -> None:
        state = self.state
        try:
            self._write_checked(batch.keys, batch.values)
        except (plyvel.Error, OSError, StoreError) as exc:
            self.write_errors += 1
            self.last_error = str(exc)
            if state.failed is None:
                log.error(
                    "store writer %s: cannot write to the database (%s); ACKs stop, reads go on, "
                    "retrying every %.0f s with %d records held",
                    self.address, exc, HOUSEKEEPING, batch.records,
                )
            state.batch_failed(batch)
        else:
            state.batch_written(batch)
            newest = self._shared.newest_stamps
            for p, _ in batch.acks:
                newest[p.key_prefix] = p.stamp_first
            if self.idle_release is not None:
                self._written_since_release = time.monotonic()

    def _release_memory(self) -> None:
        """The writer has been idle for store/memory/idle_ms since its last write (see store/memory.py)."""
        self._written_since_release = None
        started = time.monotonic()
        try:
            memory.release(self._db)
        except plyvel.Error as exc:
            log.warning("store writer %s: could not write the memtable out (%s)", self.address, exc)
        self.releases += 1
        log.debug("store writer %s: memory released in %.1f ms", self.address, (time.monotonic() - started) * 1000)

    @property
    def _db(self) -> plyvel.DB:
        return self._shared.db

    def _write_checked(self, put_keys: list[bytes], put_values: list[bytes], deletes: list[bytes] = ()) -> None:
        """Write, reopening the database first if the last write failed (see
        store/database.py: a handle that saw a failed write loses later ones)."""
        if self._reopen_needed:
            self._shared.reopen()
            self._reopen_needed = False
            log.warning("store writer %s: database reopened after a write error", self.address)
        try:
            self._write_batch(put_keys, put_values, deletes)
        except BaseException:
            self._reopen_needed = True
            raise

    def _write_batch(self, put_keys: list[bytes], put_values: list[bytes], deletes: list[bytes] = ()) -> None:
        """The one place that writes to LevelDB (tests replace it to simulate a full disk)."""
        wb = self._db.write_batch(sync=self._sync)
        put_all(wb.put, put_keys, put_values)
        for key in deletes:
            wb.delete(key)
        wb.write()

    def _on_subscriptions(self, sock: zmq.Socket, loop: Loop) -> None:
        """A store reader (a GET-HEADS subscriber) connected: ask the stores
        for their heads now, and twice more in case a message was lost.  A
        sharded store (a ``Y`` subscriber) connected: send it our STORE-MEMBER."""
        reader_arrived = store_arrived = False
        while True:
            try:
                frame = sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            reader_arrived = reader_arrived or frame == _READER_ARRIVED
            store_arrived = store_arrived or frame == _STORE_ARRIVED
            if frame[1:2] == proto.PEER_INFO:
                try:
                    self._data.answer_info(proto.decode_subscription(frame))
                except proto.MalformedMessage:
                    pass
        if reader_arrived:
            for timer in self._heads_rounds:
                timer.cancel()
            self._heads_rounds = [loop.call_later(delay, self._ask_heads) for delay in HEADS_ROUNDS]
        if store_arrived and self.sharded:
            self.state.heartbeat()
            self._flush_out()

    def _heartbeat(self, now: float) -> None:
        """A sharded store's beat: its STORE-MEMBER, placing again if its view changed, and deleting the
        partitions it handed over."""
        state = self.state
        state.now = now
        state.place(now)
        state.heartbeat()
        self._flush_out()
        self.under_replicated = len(state.under_replicated(now))
        self.filling = len(state.filling)
        self._deleting.extend(state.released)
        state.released.clear()
        if self._deleting:
            self._delete_handed_over()

    def _ask_heads(self) -> None:
        self.state.ask_heads()
        self._flush_out()

    def _flush_out(self) -> None:
        if self.sharded:
            self._apply_subscriptions()
        out = self.state.out
        if out:
            send = self._pub.send
            for frames in out:
                send(frames[0])
            out.clear()

    def _delete_handed_over(self) -> None:
        """Delete the partitions handed over, about :data:`DELETE_BUDGET` keys a beat: their head and stamps
        first (the reader no longer reports or serves them), then their records."""
        budget = DELETE_BUDGET
        while self._deleting and budget > 0:
            p = self._deleting[0]
            records = list(islice(self._db.iterator(start=p.key_prefix, stop=keys.prefix_end(p.key_prefix),
                                                    include_value=False), budget))
            stamps = list(self._db.iterator(start=p.stamp_prefix, stop=keys.prefix_end(p.stamp_prefix),
                                            include_value=False))
            if records:  # the keys and attributes of these records (rfc 18), if they had any
                first, last = records[0][-8:], records[-1][-8:]
                for prefix in (p.record_keys_prefix, p.record_attributes_prefix):
                    stamps += self._db.iterator(start=prefix + first,
                                                stop=prefix + (keys.seq_of(last) + 1).to_bytes(8, "big"),
                                                include_value=False)
            try:
                self._write_checked([], [], [p.head_key, *stamps, *records])
            except (plyvel.Error, OSError, StoreError) as exc:
                self.write_errors += 1
                self.last_error = str(exc)
                log.error("store writer %s: cannot delete %s/%s, handed over (%s); will retry",
                          self.address, p.subject, p.address, exc)
                return
            self._shared.forget(p.key_prefix)
            self.moved_records += len(records)
            done = len(records) < budget  # the partition's last records went
            budget -= len(records) + 1
            if done:
                self._deleting.pop(0)
                log.info("store writer %s: deleted %s/%s, handed over", self.address, p.subject, p.address)

    def _tick(self) -> None:
        self.state.tick(time.monotonic())
        self._flush_out()

    def _housekeeping(self) -> bool:
        """Write retries, retention, offsets compaction; True if a pass left work for the next."""
        state = self.state
        if state.failed is not None:
            self._write(state.failed)
            self._flush_out()
            return False
        if self.retention_ms >= 0 or self.retention_bytes >= 0:
            self._retention()
        more = bool(self._compaction) and self._compact_step()
        return (self._compacts and self._compact_offsets()) or more

    def _records_wait(self) -> bool:
        """Records came in: a compaction step does not start, or ends early, and they are written first."""
        return bool(self._sub.getsockopt(zmq.EVENTS) & zmq.POLLIN)

    @property
    def compaction_dirty(self) -> int:
        """Records of compacted topics written since their partition's last pass ended (Kafka's dirty part):
        0 once every compacted partition is compacted up to its head."""
        topics = self._compaction
        if not topics:
            return 0
        return sum(p.written - p.cleaned for p in list(self.state.partitions.values())
                   if p.written >= 0 and p.subject in topics)

    def _compact_step(self) -> bool:
        """One step of a compaction pass (store/cleaner.py), a new pass if one is due; True while one goes on."""
        cpu, started = time.thread_time(), time.perf_counter()
        try:
            return self._compact_step_timed()
        finally:
            self.compaction_cpu_seconds += time.thread_time() - cpu
            took = time.perf_counter() - started
            if took > self.compaction_step_max:
                self.compaction_step_max = took

    def _compact_step_timed(self) -> bool:
        now_ms = int(time.time() * 1000)
        cleaning = self._pass
        if cleaning is not None and self.state.partitions.get(
                (cleaning.partition.subject, cleaning.partition.address)) is not cleaning.partition:
            cleaning = self._pass = None  # the partition went (handed over, deleted)
        if cleaning is None:
            p = cleaner.due(list(self.state.partitions.values()), self._compaction, now_ms)
            if p is None:
                return False
            cleaning = self._pass = cleaner.Pass(p, cleaner.tombstone_limit(self._db, p, now_ms, self.tombstone_ms))
            self._pass_started = time.monotonic()
        deletes = cleaning.step(self._db, self.compaction_budget, self._records_wait)
        if deletes:
            try:
                self._write_checked([], [], deletes)
            except (plyvel.Error, OSError, StoreError) as exc:
                self.write_errors += 1
                self.last_error = str(exc)
                self._pass = None  # started again, from what is in the database
                log.error("store writer %s: compaction could not delete records (%s); will retry", self.address, exc)
                return False
            self.compaction_deleted += len(deletes) // cleaner.KEYS_PER_RECORD
        if cleaning.done:
            cleaning.finish(now_ms, self.tombstone_ms)
            self._pass = None
            self.compaction_passes += 1
            self.compaction_seconds += time.monotonic() - self._pass_started
            p = cleaning.partition
            log.log(logging.INFO if self.verbose else logging.DEBUG,
                    "store: compacted %s/%s up to %d: %d records deleted, %d keyed kept",
                    p.subject, p.address, cleaning.end, cleaning.deleted, cleaning.kept)
        return True

    def _has_offsets(self) -> bool:
        """True if the offsets topics need the housekeeping timer: some partition of one is in the database."""
        partitions = self.state.partitions
        count, found = self._offsets_known
        if count != len(partitions):
            found = self._compacts and any(compaction.is_offsets(p) for p in list(partitions.values()))
            self._offsets_known = (len(partitions), found)
        return found

    def _compact_offsets(self) -> bool:
        """rfc 14.6: superseded commit records go, then partitions of members long gone (store/compaction.py).
        True if the budget of one pass was used up."""
        partitions = [p for p in self.state.partitions.values() if compaction.is_offsets(p)]
        if not partitions:
            return False
        now_ms, now = int(time.time() * 1000), time.monotonic()
        cuts = compaction.plan(self._db, partitions, now_ms)
        gone = []
        if now >= self._next_expiry:
            self._next_expiry = now + self._expiry_every
            gone = compaction.expired(self._db, partitions, now_ms, self.offsets_retention_ms, now)
        if not cuts and not gone:
            return False
        if not self._write_cuts(cuts, "offsets compaction",
                                [key for p in gone for key in compaction.partition_keys(self._db, p)]):
            return False
        for cut in cuts:
            self.compacted += cut.deleted
        for p in gone:
            self.state.forget(p)
            self._shared.forget(p.key_prefix)
            self.expired += 1
            log.info("store: deleted %s/%s, a consumer group member silent for %d ms",
                     p.subject, p.address, self.offsets_retention_ms)
        return sum(cut.deleted for cut in cuts) >= retention.DEFAULT_BUDGET

    def _write_cuts(self, cuts: list[retention.Cut], what: str, deletes: list[bytes] = ()) -> bool:
        """Write the deletions (and stamp rewrites) of ``cuts``, and ``deletes``, in one batch, then update the
        partitions' bookkeeping; False (logged, retried by the next pass) if the write failed."""
        puts = [kv for cut in cuts for kv in cut.puts]
        try:
            self._write_checked([k for k, _ in puts], [v for _, v in puts],
                                [key for cut in cuts for key in cut.deletes] + list(deletes))
        except (plyvel.Error, OSError, StoreError) as exc:
            self.write_errors += 1
            self.last_error = str(exc)
            log.error("store writer %s: %s could not delete records (%s); will retry", self.address, what, exc)
            return False
        newest = self._shared.newest_stamps
        for cut in cuts:
            retention.applied(cut)
            p = cut.partition
            self._shared.floors[p.key_prefix] = p.floor
            if p.stamp_first < 0:
                newest.pop(p.key_prefix, None)  # its newest stamp was moved: the next batch starts one
        return True

    def _retention(self) -> None:
        cuts = retention.plan(
            self._db, list(self.state.partitions.values()), int(time.time() * 1000),
            self.retention_ms, self.retention_bytes,
        )
        if not cuts:
            return
        if not self._write_cuts(cuts, "retention"):
            return
        for cut in cuts:
            self.retention_deleted += cut.deleted
            log.log(
                logging.INFO if self.verbose else logging.DEBUG,
                "store: retention deleted %d records of %s/%s; oldest kept is now %d",
                cut.deleted, cut.partition.subject, cut.partition.address, cut.new_tail,
            )

    # -- reporting (any thread) -------------------------------------------------

    def shard_stats(self) -> dict[str, int]:
        """Sharded stores' counters (rfc 16), all 0 for a store that holds everything."""
        state = self.state
        if not isinstance(state, ShardedWriterState):
            return {"sharded": 0, "under_replicated": 0, "filling": 0, "moves_in": 0, "moves_out": 0,
                    "moved_records_deleted": 0}
        return {"sharded": 1, "under_replicated": self.under_replicated, "filling": self.filling,
                "moves_in": state.moves_in, "moves_out": state.moves_out,
                "moved_records_deleted": self.moved_records}

