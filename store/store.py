"""The public store: one LevelDB database, a writer thread and a reader thread.

>>> with Store({"beacon/address": "127.0.0.1"}, db="/var/lib/dafka/storedb") as store:
...     store.run_forever()          # until SIGINT/SIGTERM or request_stop()

The writer and the reader each have their own address (a new one on every
start, like the reference), their own bound socket and their own beacon; each
runs one loop thread that owns its sockets.  They share the plyvel handle,
which is thread-safe (see store/database.py for why it can be reopened).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Any

import zmq

from dafka.records import PartitionKey
from dafka.discovery.beacon import Beacon
from dafka.metrics import directory_bytes
from dafka.config import ConfigLike, as_config
from dafka.core.addresses import new_address

from . import keys, running
from .database import SharedDB, leveldb_options, store_identity
from .errors import StoreError
from .reader import Reader
from .writer import Writer

log = logging.getLogger(__name__)


class Store:
    """Persist every record of every topic; answer FETCH, GET-HEADS and hellos.

    ``config`` is a :class:`~dafka.config.Config`, a dict of overrides, a ZPL
    file path or None; ``db`` overrides ``store/db``.  The database is opened
    (and locked) by the constructor; the threads start with :meth:`start`.
    ``store_id`` is the store's identity, kept in its database: the same after
    a restart (sharded stores place partitions by it, rfc section 16)."""

    def __init__(self, config: ConfigLike = None, *, db: str | os.PathLike[str] | None = None,
                 ctx: zmq.Context[Any] | None = None) -> None:
        self.config = as_config(config)
        self.path = os.fspath(db) if db is not None else self.config["store/db"]
        self._ctx = ctx or zmq.Context.instance()
        self.writer_address = new_address()
        self.reader_address = new_address()
        self._db = SharedDB(self.path, leveldb_options(self.config))
        assert self._db.db is not None
        self.store_id = store_identity(self._db.db)  # the same across restarts (rfc 16)
        self._started = False
        self._stopped = False
        self._stop_lock = threading.Lock()
        self._stop_requested = threading.Event()
        try:
            self._writer = Writer(self._ctx, self.config, self._db, self.writer_address,
                                  store_id=self.store_id, reader=self.reader_address)
            try:
                # One beacon thread announces both (the writer's): each idle wake-up serves the two.
                writer_beacon = self._writer.beacon
                assert isinstance(writer_beacon, Beacon)
                self._reader = Reader(self._ctx, self.config, self._db, self.reader_address, self.writer_address,
                                      beside=writer_beacon)
            except BaseException:
                self._writer.stop(0)
                raise
        except BaseException:
            self._db.close()
            raise
        self._reader.describe(self.describe)
        log.info(
            "store %s on %s: writer %s at %s, reader %s at %s", self.store_id,
            self.path, self.writer_address, self._writer.endpoint, self.reader_address, self._reader.endpoint,
        )

    # -- lifecycle ----------------------------------------------------------

    def start(self) -> "Store":
        """Start the writer and reader threads (and their beacons)."""
        if self._stopped:
            raise StoreError("store is stopped")
        if not self._started:
            self._started = True
            # A loop thread that ends (it failed) ends run_forever: nothing needs to look every so often.
            self._writer.on_end = self._reader.on_end = self._stop_requested.set
            self._writer.start()
            self._reader.start()
            self._advertise()
        return self

    def _advertise(self) -> None:
        """Leave the reader's endpoints in the directory, for readers of the
        directory to come through the store (store/running.py)."""
        try:
            running.write(self.path, running.RunningStore(
                os.getpid(), self.reader_address, self._reader.endpoint, self._reader.requests_endpoint,
                bool(self.config["security/curve"])))
        except OSError as exc:
            log.warning("store %s: cannot write %s (%s); a Spark path read of the directory will not find "
                        "the running store", self.path, running.FILE, exc)

    def stop(self, timeout: float = 5) -> None:
        """Write what is held, stop both threads, close the database.  Idempotent."""
        with self._stop_lock:
            if self._stopped:
                return
            self._stopped = True
            self._stop_requested.set()
            if self._started:
                running.remove(self.path)
            half = max(timeout / 2, 0.1)
            writer_ended = self._writer.stop(half)
            reader_ended = self._reader.stop(half)
            if writer_ended and reader_ended:
                self._db.close()
            else:
                # Closing the database under a running thread would crash the process.
                log.error("store %s: a thread did not stop within %.1f s; database left open", self.path, timeout)
            if self._writer.state.failed is not None:
                log.error("store %s stopped with %d records it could not write (never ACKed)",
                          self.path, self._writer.state.failed.records)

    def request_stop(self) -> None:
        """Ask :meth:`run_forever` to return; safe from a signal handler or any thread."""
        self._stop_requested.set()

    def run_forever(self, install_signal_handlers: bool = True) -> None:
        """Start if needed, serve until :meth:`request_stop` (or SIGINT/SIGTERM
        when called from the main thread with ``install_signal_handlers``) or
        until a loop thread dies, then :meth:`stop`.  Raises
        :class:`StoreError` if a thread died."""
        self.start()
        previous: dict[signal.Signals, Any] = {}
        if install_signal_handlers and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                previous[sig] = signal.signal(sig, lambda signum, frame: self.request_stop())
        try:
            self._stop_requested.wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.stop()
        error = self._writer.error or self._reader.error
        if error is not None:
            raise StoreError(f"store thread failed: {error!r}") from error

    def __enter__(self) -> "Store":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- reporting ----------------------------------------------------------

    @property
    def connected(self) -> bool:
        """True once a tower has answered both the writer's and the reader's beacon."""
        return self._writer.beacon.connected and self._reader.beacon.connected

    @property
    def writer_endpoint(self) -> str:
        """The writer's data socket endpoint (where ACKs and FETCHes come from)."""
        return self._writer.endpoint

    @property
    def reader_endpoint(self) -> str:
        """The reader's data socket endpoint (where FETCH answers come from)."""
        return self._reader.endpoint

    def heads(self) -> dict[PartitionKey, int]:
        """(subject, producer address) -> highest sequence written, for every partition."""
        return self._writer.state.heads()

    def describe(self) -> dict[str, Any]:
        """What the store's PEER-INFO says of it (rfc 17): identity, disk, partitions, placement."""
        s = self._writer.state
        try:
            topics = sorted({subject for subject, _ in list(s.partitions)})[:1000]
        except RuntimeError:  # the writer added a partition meanwhile: next time
            topics = []
        db = self._db.db
        topic_bytes = {}
        if db is not None:  # (None: the store is stopping)
            for topic in topics:
                prefix = keys.RECORD + keys.to_bytes(topic) + b"\0"
                topic_bytes[topic] = db.approximate_size(prefix, keys.prefix_end(prefix))
        return {"store": self.store_id, "path": self.path, "disk": directory_bytes(self.path), "topic_bytes": topic_bytes,
                "partitions": len(s.partitions), "records_written": s.records_written,
                "replicas": self.config["store/replicas"], "rack": self.config["store/rack"],
                "retention_ms": self.config["store/retention/ms"], "retention_bytes": self.config["store/retention/bytes"],
                "writer": self.writer_address, "reader": self.reader_address}

    def level_bytes(self) -> dict[int, int]:
        """LevelDB's size of each level that holds files (from ``leveldb.stats``): compaction at work."""
        db = self._db.db
        text = db.get_property(b"leveldb.stats") if db is not None else None
        out = {}
        for line in (text or b"").decode(errors="replace").splitlines():
            fields = line.split()
            if len(fields) >= 3 and fields[0].isdigit() and fields[1].isdigit():
                out[int(fields[0])] = int(float(fields[2]) * 1024 * 1024)  # "Size(MB)" is MiB
        return out

    def stats(self) -> dict[str, int]:
        """Counters of the writer and the reader: records written, ACKs, FETCH answers, bulk messages..."""
        w, r, s = self._writer, self._reader, self._writer.state
        failed = s.failed
        return {
            "records_written": s.records_written,
            "bytes_written": s.bytes_written,
            "acks_sent": s.acks_sent,
            "fetches_sent": s.fetches_sent,
            "duplicates": s.duplicates,
            "buffered": s.buffered,
            "dropped": s.dropped,
            "skipped": s.skipped,
            "unwritten": failed.records if failed is not None else 0,
            "write_errors": w.write_errors,
            "retention_deleted": w.retention_deleted,
            "compaction_deleted": w.compaction_deleted,
            "compaction_passes": w.compaction_passes,
            "compaction_dirty": w.compaction_dirty,
            "compaction_ms": int(w.compaction_seconds * 1000),
            "compaction_cpu_ms": int(w.compaction_cpu_seconds * 1000),
            "compaction_step_max_us": int(w.compaction_step_max * 1e6),
            "memory_releases": w.releases,
            "offsets_compacted": w.compacted,
            "offsets_expired": w.expired,
            "fetch_answers": r.fetches,
            "records_served": r.records_sent,
            "bytes_served": r.bytes_served,
            "fetches_received": r.fetches_received,
            "bulk_messages": r.bulk_messages,
            "paced_heads": r.paced,
            "tails_sent": r.tails_sent,
            "gaps_sent": r.gaps_sent,
            "fillers_sent": r.fillers_sent,
            "heads_sent": r.heads_sent,
            "hellos_sent": r.hellos_sent,
            "heads_at_sent": r.heads_at_sent,
            "answers_dropped": r.dropped,
            "answers_paused": r.paused,
            "answers_abandoned": r.abandoned,
            "fetches_unheard": r.unheard,
            "inflight_bytes": r.inflight_bytes,
            "malformed": s.malformed + r.malformed,
            "writer_malformed": s.malformed,
            "reader_malformed": r.malformed,
            "partitions": len(s.partitions),
            **w.shard_stats(),
            "writer_peers": w.peers,
            "reader_peers": r.peers,
        }

    def __repr__(self) -> str:
        return f"<Store {self.path} writer={self.writer_address} reader={self.reader_address}>"
