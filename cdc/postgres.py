"""``dafka cdc postgres``: a PostgreSQL database's changes into a topic.

The I/O around :mod:`dafka.cdc.capture`: psycopg2's replication connection
(``LogicalReplicationConnection``; psycopg 3 does not speak the replication
protocol yet), the ``pgoutput`` plugin (built into PostgreSQL 10 and later:
nothing to install on the server, unlike wal2json), a publication and a slot
created when absent, the bootstrap read in the slot's exported snapshot, and
the resumable producer(s) the changes go out through.

Order of a start:

1. Checks, each failing with one line that names the setting to fix:
   ``wal_level``, the REPLICATION attribute, the tables, a slot in use.
2. The producers resume their partitions (``resume=True``): before anything
   is read, so that a cluster without stores fails before a slot exists.
3. No slot, or a slot whose bootstrap never finished (the state file says):
   the slot is created, and every row of the tables is read in its exported
   snapshot and published as ``op r`` at the slot's consistent point; once
   the stores acked them all, the state file records it.
4. Streaming from the slot's confirmed LSN.  The slot's confirmed LSN moves
   only as :class:`~dafka.cdc.connector.ConfirmRule` allows.  While nothing
   is pending it follows the server's WAL end, so WAL does not pile up while
   the tables are idle.  A lost connection (PostgreSQL restarted) is
   reopened, with a back-off, and streaming resumes at the confirmed LSN;
   the transactions after it come again and consumers drop what they
   applied (:mod:`dafka.cdc.apply`).
"""

from __future__ import annotations

import logging
import os
import select
import time
from contextlib import closing
from dataclasses import dataclass
from typing import Any

from dafka.config import Config

from . import pgoutput
from .capture import CaptureState
from .connector import SEND_BATCH, Capture, CdcError, ServerUnavailable, StateFile

log = logging.getLogger(__name__)

# Sessions read times in UTC and ISO format, bytea in hex, floats exactly (dafka.cdc.types).
SESSION_OPTIONS = "-c TimeZone=UTC -c DateStyle=ISO -c bytea_output=hex -c extra_float_digits=3"
FEEDBACK_INTERVAL = 1.0  # seconds between status updates to the server at the most
# What libpq says when the server is not there for now (refused, shutting down, starting up, recovering, too
# many clients, dropped us): tried again.  Anything else (authentication, a database that does not exist) is fatal.
_SERVER_AWAY = ("Connection refused", "the database system is", "server closed the connection",
                "too many clients", "timeout expired", "Is the server running")
SNAPSHOT_FETCH = 10_000  # rows per round trip of the bootstrap's cursor


@dataclass
class PostgresSource:
    dsn: str
    tables: list[str]  # schema.table
    topic: str
    name: str = ""  # the connector's name: slot, publication, partition address and state file derive from it
    slot: str = ""
    publication: str = ""
    topic_per_table: bool = False  # one topic per table, "<topic>.<schema>.<table>", instead of one
    state_dir: str = "."
    bootstrap: bool = True
    tombstones: bool = False  # a tombstone (the key, an empty value) after each delete

    def __post_init__(self) -> None:
        self.name = self.name or self.topic
        safe = "".join(ch if ch.isalnum() else "_" for ch in self.name.lower())
        self.slot = self.slot or f"dafka_{safe}"
        self.publication = self.publication or f"dafka_{safe}"
        self.tables = [t if "." in t else f"public.{t}" for t in self.tables]
        if not self.tables:
            raise CdcError("name at least one table to capture (--table SCHEMA.TABLE)")


class _Keepalive:
    """Calls ``send`` at most every :data:`FEEDBACK_INTERVAL` (a status update while the stream waits)."""

    def __init__(self, send: Any) -> None:
        self._send = send
        self._next = 0.0

    def __call__(self) -> None:
        now = time.monotonic()
        if now >= self._next:
            self._next = now + FEEDBACK_INTERVAL
            self._send()


def _psycopg2() -> Any:
    try:
        import psycopg2
        import psycopg2.extras
    except ImportError as exc:  # pragma: no cover - the cdc extra is missing
        raise CdcError("dafka cdc postgres needs psycopg2: pip install 'dafka[cdc]'") from exc
    return psycopg2


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _qualified(table: str) -> str:
    schema, _, name = table.partition(".")
    return f"{_ident(schema)}.{_ident(name)}"


class PostgresCapture(Capture):
    """Runs the capture of ``source`` into the dafka cluster of ``config``.

    ``run()`` blocks until :meth:`stop` (from another thread or a signal
    handler); ``stats`` may be read meanwhile."""

    def __init__(self, source: PostgresSource, config: Config) -> None:
        super().__init__(source, config)
        self._stopping = False
        self._pg = _psycopg2()
        self.state = CaptureState(source.name, "")
        self._state_file = StateFile(os.path.join(source.state_dir, f"{source.slot}.dafka-cdc.json"))
        self._snapshot_requested = False

    # -- public ---------------------------------------------------------------

    def stop(self) -> None:
        self._stopping = True

    def _stopped_within(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while not self._stopping and time.monotonic() < deadline:
            time.sleep(0.05)
        return self._stopping

    @property
    def label(self) -> str:
        """What the metrics call this connector: its slot."""
        return self.source.slot

    def position(self, confirmed: int) -> str:
        return pgoutput.lsn_text(confirmed)

    def _capture(self) -> None:
        self._stream()

    # -- connections and checks ---------------------------------------------------

    def _connect(self, replication: bool = False) -> Any:
        pg = self._pg
        kwargs: dict[str, Any] = {"options": SESSION_OPTIONS}
        if replication:
            kwargs["connection_factory"] = pg.extras.LogicalReplicationConnection
        try:
            conn = pg.connect(self.source.dsn, **kwargs)
        except pg.OperationalError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            why = ServerUnavailable if any(text in str(exc) for text in _SERVER_AWAY) else CdcError
            raise why(f"cannot connect to PostgreSQL (--dsn): {first}") from exc
        if not replication:
            conn.autocommit = True
        return conn

    def _preflight(self, conn: Any) -> None:
        src = self.source
        with conn.cursor() as cur:
            cur.execute("SHOW wal_level")
            level = cur.fetchone()[0]
            if level != "logical":
                raise CdcError(f"wal_level is '{level}': set wal_level = logical in postgresql.conf "
                               "(ALTER SYSTEM SET wal_level = logical) and restart PostgreSQL")
            cur.execute("SELECT current_database(), current_user, rolreplication OR rolsuper FROM pg_roles "
                        "WHERE rolname = current_user")
            database, user, may_replicate = cur.fetchone()
            self.state.database = database
            if not may_replicate:
                raise CdcError(f"role {user} may not replicate: ALTER ROLE {user} REPLICATION (or connect as "
                               "another role in --dsn)")
            oids = {}
            for table in src.tables:
                schema, _, name = table.partition(".")
                cur.execute("SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                            "WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')", (schema, name))
                row = cur.fetchone()
                if row is None:
                    raise CdcError(f"table {table} does not exist in database {database} (--table)")
                cur.execute("SELECT has_table_privilege(%s, 'SELECT')", (row[0],))
                if not cur.fetchone()[0]:
                    raise CdcError(f"role {user} may not read table {table}: GRANT SELECT ON {table} TO {user}")
                oids[table] = row[0]
                cur.execute("SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND "
                            "a.attnum = ANY(i.indkey) WHERE i.indrelid = %s AND i.indisprimary", (row[0],))
                self.state.primary_keys[table] = [r[0] for r in cur.fetchall()]
            self._oids = oids
            cur.execute("SELECT active_pid, confirmed_flush_lsn - '0/0'::pg_lsn FROM pg_replication_slots "
                        "WHERE slot_name = %s", (src.slot,))
            row = cur.fetchone()
            if row is not None and row[0] is not None:
                raise CdcError(f"replication slot {src.slot} is in use by process {row[0]}: another connector "
                               "runs (stop it, or give this one another --slot)")
            if row is not None and row[1] is not None:
                self._confirmed_at(int(row[1]))
            cur.execute("SELECT t.oid, t.typelem FROM pg_type t WHERE t.typelem <> 0 AND t.typlen = -1")
            self.state.element_types = dict(cur.fetchall())
            cur.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (src.publication,))
            tables = ", ".join(_qualified(t) for t in src.tables)
            try:
                if cur.fetchone() is None:
                    cur.execute(f"CREATE PUBLICATION {_ident(src.publication)} FOR TABLE {tables}")
                else:
                    cur.execute(f"ALTER PUBLICATION {_ident(src.publication)} SET TABLE {tables}")
            except self._pg.Error as exc:
                raise CdcError(f"cannot create publication {src.publication} (--publication): "
                               f"{str(exc).strip().splitlines()[0]}") from exc

    # -- the bootstrap --------------------------------------------------------------

    def _bootstrapped(self) -> bool:
        return bool(self._state_file.load().get("bootstrapped"))

    def _mark_bootstrapped(self) -> None:
        self._state_file.save({"slot": self.source.slot, "bootstrapped": True})

    def _slot_present(self) -> bool:
        """Whether the slot exists now: asked on every (re)connection, since a
        server restart between dropping the slot and creating it again leaves
        none, and one between creating it and reading the answer leaves one."""
        with closing(self._connect()) as conn, conn.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (self.source.slot,))
            return cur.fetchone() is not None

    def _prepare_slot(self, repl: Any) -> None:
        src = self.source
        present = self._slot_present()
        if present and (self._bootstrapped() or not src.bootstrap):
            return
        if present:
            log.warning("cdc: slot %s exists but its bootstrap never finished: starting it again", src.slot)
            with closing(self._connect()) as conn, conn.cursor() as cur:
                cur.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                            "WHERE slot_name = %s", (src.slot,))
        with repl.cursor() as cur:
            cur.execute(f"CREATE_REPLICATION_SLOT {_ident(src.slot)} LOGICAL pgoutput"
                        + (" EXPORT_SNAPSHOT" if src.bootstrap else " NOEXPORT_SNAPSHOT"))
            _, consistent_point, snapshot, _ = cur.fetchone()
        self._confirmed_at(pgoutput.parse_lsn(consistent_point))
        log.info("cdc: slot %s created at %s", src.slot, consistent_point)
        if src.bootstrap:
            self._read_snapshot(snapshot, pgoutput.parse_lsn(consistent_point))
        self._mark_bootstrapped()

    def request_snapshot(self) -> None:
        """Publish every row again, as op ``r``, at the next transaction
        boundary (any thread; the CLI's SIGUSR1): consumers started after
        retention deleted the bootstrap then rebuild the tables from the
        topic."""
        self._snapshot_requested = True

    def _resnapshot(self, stream: Any) -> None:
        """Read the tables in the snapshot of a temporary slot, made now, while
        the main stream waits (and gets status updates, so that its walsender
        does not time out).  The main stream then delivers the transactions
        after the point it had reached: those that committed before the new
        snapshot's point come after its rows with lower positions, and
        consumers drop them; their effect is in the snapshot."""
        self._snapshot_requested = False
        keepalive = _Keepalive(lambda: stream.send_feedback(flush_lsn=self.rule.confirmed, reply=False))
        repl = self._connect(replication=True)
        try:
            with repl.cursor() as cur:
                cur.execute(f"CREATE_REPLICATION_SLOT {_ident(self.source.slot + '_snapshot')} TEMPORARY LOGICAL "
                            "pgoutput EXPORT_SNAPSHOT")
                _, point, snapshot, _ = cur.fetchone()
            log.info("cdc: snapshot again at %s", point)
            self._read_snapshot(snapshot, pgoutput.parse_lsn(point), keepalive)
        finally:
            repl.close()  # the temporary slot goes with its connection

    def _read_snapshot(self, snapshot: str, point: int, keepalive: "_Keepalive | None" = None) -> None:
        """Every row of the tables as seen by the slot's snapshot, as op ``r``.

        The rows stand at ``point - 1``: the slot streams every transaction
        whose commit record starts at ``point`` or later, and such a change
        must sort after the rows (no commit record starts at ``point - 1``)."""
        state = self.state
        conn = self._connect()
        conn.autocommit = False
        started = time.monotonic()
        try:
            with conn.cursor() as cur:
                cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
                cur.execute("SET TRANSACTION SNAPSHOT %s", (snapshot,))
                relations = [self._relation(cur, table) for table in self.source.tables]
            for rel in relations:
                state.on_relation(rel)
            replaced = [rel.oid for rel in relations if self.out.has_records(f"{rel.schema}.{rel.table}")]
            self.out.queue(state.begin_snapshot(point - 1, int(time.time() * 1000), replaced))
            for rel in relations:
                columns = ", ".join(f"{_ident(c.name)}::text" for c in rel.columns)
                with conn.cursor(name=f"dafka_snapshot_{rel.oid}") as cur:
                    cur.itersize = SNAPSHOT_FETCH
                    cur.execute(f"SELECT {columns} FROM {_qualified(rel.schema + '.' + rel.table)}")
                    for row in cur:
                        if self.out.queue(state.snapshot_row(rel.oid, list(row))) >= SEND_BATCH:
                            self.out.publish()
                        self.stats.snapshot_rows += 1
                        if keepalive is not None:
                            keepalive()
            self.out.queue(state.end_snapshot())
            self.out.publish()
            conn.commit()
        finally:
            conn.close()
        self.out.flush(keepalive)
        log.info("cdc: bootstrap of %d rows in %.1f s", self.stats.snapshot_rows, time.monotonic() - started)

    def _relation(self, cur: Any, table: str) -> pgoutput.Relation:
        """A table as a pgoutput RELATION would describe it: columns, types and the replica identity's key."""
        oid = self._oids[table]
        cur.execute("SELECT relreplident FROM pg_class WHERE oid = %s", (oid,))
        identity = cur.fetchone()[0]
        cur.execute("""
            SELECT a.attname, a.atttypid, a.atttypmod,
                   COALESCE(a.attnum = ANY(i.indkey), false)
            FROM pg_attribute a
            LEFT JOIN pg_index i ON i.indrelid = a.attrelid
                 AND (i.indisreplident OR (i.indisprimary AND NOT EXISTS (
                      SELECT 1 FROM pg_index r WHERE r.indrelid = a.attrelid AND r.indisreplident)))
            WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped
            ORDER BY a.attnum""", (oid,))
        columns = tuple(pgoutput.Column(name, type_oid, typmod, bool(key) or identity == "f")
                        for name, type_oid, typmod, key in cur.fetchall())
        schema, _, name = table.partition(".")
        return pgoutput.Relation(oid, schema, name, identity, columns)

    # -- streaming --------------------------------------------------------------

    def _stream(self) -> None:
        backoff = 0.5
        while not self._stopping:
            repl = None
            try:
                repl = self._connect(replication=True)
                self._prepare_slot(repl)
                self._replicate(repl)
                return
            except (ServerUnavailable, self._pg.OperationalError, self._pg.InterfaceError,
                    self._pg.DatabaseError) as exc:
                # (a server shutting down ends the COPY stream: psycopg2 says "no COPY in progress")
                if self._stopping:
                    return
                self.stats.reconnects += 1
                log.warning("cdc: replication connection lost (%s); reconnecting in %.1f s",
                            str(exc).strip().splitlines()[0] if str(exc).strip() else exc, backoff)
                self.state.reset()
            finally:
                try:
                    if repl is not None:
                        repl.close()
                except Exception:  # noqa: BLE001 - already broken
                    pass
            self._stopped_within(backoff)
            backoff = min(backoff * 2, 10.0)
            while not self._stopping:
                try:
                    self._connect().close()
                    break
                except ServerUnavailable:
                    self._stopped_within(min(backoff, 1.0))

    def _replicate(self, repl: Any) -> None:
        src, state, rule, stats = self.source, self.state, self.rule, self.stats
        cur = repl.cursor()
        cur.start_replication(slot_name=src.slot, decode=False,
                              options={"proto_version": "1", "publication_names": src.publication})
        log.info("cdc: streaming slot %s into %s", src.slot, src.topic)
        fd = repl.fileno()
        next_feedback = 0.0
        sent_confirmed = -1
        commits: list[int] = []  # end LSNs of the transactions whose records are held
        while not self._stopping:
            if self._snapshot_requested and not state.in_transaction:
                self._resnapshot(cur)
            msg = cur.read_message()
            if msg is not None:
                try:
                    outs = state.on_payload(msg.payload)
                except ValueError as exc:
                    stats.malformed, stats.unexpected = state.malformed, state.unexpected
                    raise CdcError(f"replication message at {pgoutput.lsn_text(msg.data_start)} cannot be "
                                   f"captured: {exc}") from exc
                held = self.out.queue(outs)
                if state.committed_lsn is not None:
                    commits.append(state.committed_lsn)
                if held < SEND_BATCH and len(commits) < SEND_BATCH:
                    continue  # more is waiting right now: publish it with these
            # The stream paused, or enough is held: publish, and only then count the commits.
            self.out.publish()
            if commits:  # (they all wait for the same records now: the last one says it all)
                rule.committed(commits[-1], self.out.last_offset)
                commits.clear()
            stats.changes, stats.transactions = state.changes, state.transactions
            now = time.monotonic()
            if msg is not None and now < next_feedback:
                continue
            stats.wal_end = max(stats.wal_end, cur.wal_end or 0)
            confirmed = rule.acked(self.out.released)
            if not state.in_transaction and not rule.pending and cur.wal_end:
                rule.idle(cur.wal_end)
                confirmed = rule.confirmed
            stats.confirmed_lsn = confirmed
            if confirmed != sent_confirmed or now >= next_feedback:
                cur.send_feedback(flush_lsn=confirmed, reply=False)
                sent_confirmed = confirmed
                next_feedback = now + FEEDBACK_INTERVAL
            if msg is None:
                select.select([fd], [], [], 0.05)
