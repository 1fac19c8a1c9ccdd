"""``dafka cdc mysql``: a MySQL or MariaDB database's row changes into a topic.

The I/O around :mod:`dafka.cdc.binlog`: ``mysql-replication`` (pure Python;
it reads the row-based binlog as a replica does), PyMySQL for the checks and
the bootstrap, and the resuming producers of :mod:`dafka.cdc.connector`.

MySQL has no replication slot: the connector keeps its place itself.  The
state file (``--state-dir``) holds the binlog position after the last
transaction whose every record ``producer/min_acks`` stores acked (the
same :class:`~dafka.cdc.capture.ConfirmRule` as PostgreSQL's slot); a
restart reads the binlog from there, and what comes again is dropped by
consumers by position.  The server must keep its binlogs that long
(``binlog_expire_logs_seconds``); a position that was purged is an error
that says so.

The bootstrap reads the tables in one ``START TRANSACTION WITH CONSISTENT
SNAPSHOT`` whose binlog position MariaDB reports
(``binlog_snapshot_file``/``_position``); on MySQL, which does not, the
position is read under a brief ``FLUSH TABLES WITH READ LOCK``.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import zlib
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlparse

from dafka.config import Config

from .binlog import BinlogState, file_of, position
from .connector import SEND_BATCH, Capture, CdcError, ServerUnavailable, StateFile

log = logging.getLogger(__name__)

SAVE_INTERVAL = 1.0  # seconds between saves of the acked position at the most
# The client's and server's error codes of a server that is not there for now (refused, gone away, lost,
# shutting down, too many connections): tried again.  Any other (access denied, unknown database) is fatal.
_SERVER_AWAY = frozenset({1040, 1053, 2002, 2003, 2006, 2013, 2055})


@dataclass
class MysqlSource:
    dsn: str  # mysql://user:password@host:port/
    tables: list[str]  # database.table
    topic: str
    name: str = ""
    topic_per_table: bool = False
    state_dir: str = "."
    bootstrap: bool = True
    server_id: int = 0  # the replica id the connector reads the binlog as (default: from the name)
    tombstones: bool = False  # a tombstone (the key, an empty value) after each delete

    def __post_init__(self) -> None:
        self.name = self.name or self.topic
        if not self.tables:
            raise CdcError("name at least one table to capture (--table DATABASE.TABLE)")
        for table in self.tables:
            if "." not in table:
                raise CdcError(f"--table {table}: name it with its database, DATABASE.TABLE")
        url = urlparse(self.dsn)
        if url.scheme not in ("mysql", "mariadb") or not url.hostname:
            raise CdcError(f"--dsn {self.dsn!r}: write it as mysql://USER:PASSWORD@HOST:PORT/")
        self.connection = {"host": url.hostname, "port": url.port or 3306, "user": unquote(url.username or "root"),
                           "password": unquote(url.password or "")}
        self.server_id = self.server_id or 1_000_000 + zlib.crc32(self.name.encode()) % 1_000_000_000


class MysqlCapture(Capture):
    """Runs the capture of ``source``; ``run()`` blocks until :meth:`stop`."""

    def __init__(self, source: MysqlSource, config: Config) -> None:
        try:
            import pymysql  # noqa: F401
            import pymysqlreplication  # noqa: F401
        except ImportError as exc:  # pragma: no cover - the cdc extra is missing
            raise CdcError("dafka cdc mysql needs mysql-replication: pip install 'dafka[cdc]'") from exc
        super().__init__(source, config)
        self._state_file = StateFile(os.path.join(source.state_dir, f"{source.name}.dafka-cdc-mysql.json"))
        self._stopping = threading.Event()
        self._stream: Any = None
        self._prefix = "binlog"
        self._resume_at = ("", 0)  # where the binlog is read from next: after the last transaction published

    # -- public --------------------------------------------------------------

    @property
    def label(self) -> str:
        return self.source.name

    def position(self, confirmed: int) -> str:
        file, pos = file_of(confirmed, self._prefix)
        return f"{file}:{pos}"

    def stop(self) -> None:
        """Stop (any thread, or a signal handler): ends a blocking binlog read at once."""
        self._stopping.set()
        stream = self._stream
        sock = getattr(getattr(stream, "_stream_connection", None), "_sock", None)
        if sock is not None:
            try:
                # Not close(): PyMySQL's reader holds the socket's file, so a close leaves the read blocked;
                # a shutdown makes it return, and the stream raises in the reading thread.
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already gone

    def _stopped_within(self, seconds: float) -> bool:
        return self._stopping.wait(seconds)

    def _capture(self) -> None:
        started = False
        while not self._stopping.is_set():
            try:
                if not started:  # the saved position, or a bootstrap (read again whole if the server went away)
                    self._resume_at = self._start_position()
                    started = True
                self._replicate(self._resume_at)
            except Exception as exc:  # noqa: BLE001 - reconnect on a lost server, stop on ours
                if self._stopping.is_set():
                    break
                if isinstance(exc, CdcError) and not isinstance(exc, ServerUnavailable):
                    raise
                self.stats.reconnects += 1
                where = "at %s:%d" % self._resume_at if started else "to start"
                log.warning("cdc: connection to MySQL lost (%s); reconnecting %s", exc, where)
                self._stopping.wait(1.0)

    # -- checks ------------------------------------------------------------------

    def _connect(self, **extra: Any) -> Any:
        import pymysql

        c = self.source.connection
        try:
            conn = pymysql.connect(host=c["host"], port=c["port"], user=c["user"], password=c["password"],
                                   autocommit=True, init_command="SET time_zone = '+00:00'", **extra)
        except pymysql.err.OperationalError as exc:
            why = CdcError if exc.args and exc.args[0] not in _SERVER_AWAY else ServerUnavailable
            raise why(f"cannot connect to MySQL (--dsn): {exc.args[-1]}") from exc
        return conn

    def _preflight(self, conn: Any) -> None:
        import pymysql

        with conn.cursor() as cur:
            cur.execute("SELECT @@log_bin, @@binlog_format, @@binlog_row_image, CURRENT_USER()")
            log_bin, fmt, image, user = cur.fetchone()
            if not log_bin:
                raise CdcError("log_bin is off: start the server with log_bin (e.g. log_bin = binlog) and server_id")
            if fmt != "ROW":
                raise CdcError(f"binlog_format is '{fmt}': set binlog_format = ROW")
            if image != "FULL":
                raise CdcError(f"binlog_row_image is '{image}': set binlog_row_image = FULL")
            cur.execute("SHOW VARIABLES LIKE 'binlog_row_metadata'")
            metadata = cur.fetchone()
            if metadata is not None and metadata[1] != "FULL":
                # Without it the binlog does not say which columns are binary, nor their names after an ALTER.
                raise CdcError(f"binlog_row_metadata is '{metadata[1]}': set binlog_row_metadata = FULL")
            try:
                cur.execute("SHOW BINARY LOGS")
            except pymysql.err.OperationalError as exc:
                if exc.args and exc.args[0] in _SERVER_AWAY:  # (a restart under way: tried again, not a grant)
                    raise ServerUnavailable(f"MySQL went away during the checks: {exc.args[-1]}") from exc
                raise CdcError(f"user {user} may not read the binlog: GRANT REPLICATION SLAVE, REPLICATION CLIENT "
                               f"ON *.* TO {user}") from exc
            keys: dict[str, list[str]] = {}
            kinds: dict[str, dict[str, str]] = {}
            for table in self.source.tables:
                schema, _, name = table.partition(".")
                cur.execute("SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = %s AND "
                            "table_name = %s", (schema, name))
                if not cur.fetchone()[0]:
                    raise CdcError(f"table {table} does not exist (--table)")
                cur.execute("SELECT column_name FROM information_schema.key_column_usage WHERE table_schema = %s AND "
                            "table_name = %s AND constraint_name = 'PRIMARY' ORDER BY ordinal_position", (schema, name))
                keys[table] = [r[0] for r in cur.fetchall()]
                kinds[table] = self._column_kinds(cur, schema, name)
            self.state = BinlogState(self.source.name, keys, kinds)

    @staticmethod
    def _column_kinds(cur: Any, schema: str, name: str) -> dict[str, str]:
        """The table's JSON and SET columns (MariaDB's JSON: a text column with a json_valid() check)."""
        cur.execute("SELECT column_name, data_type FROM information_schema.columns WHERE table_schema = %s AND "
                    "table_name = %s", (schema, name))
        kinds = {column: kind for column, kind in cur.fetchall() if kind in ("json", "set")}
        cur.execute("SELECT check_clause FROM information_schema.check_constraints WHERE constraint_schema = %s AND "
                    "table_name = %s", (schema, name))
        for (clause,) in cur.fetchall():
            if clause.lower().startswith("json_valid("):
                kinds[clause[len("json_valid("):].strip("`) ")] = "json"
        return kinds

    # -- where to start --------------------------------------------------------------

    def _start_position(self) -> tuple[str, int]:
        saved = self._state_file.load()
        if saved.get("file"):
            log.info("cdc: resuming the binlog at %s:%d", saved["file"], saved["pos"])
            self._prefix = saved["file"].rsplit(".", 1)[0]
            self._confirmed_at(position(saved["file"], saved["pos"]))
            return saved["file"], saved["pos"]
        if not self.source.bootstrap:
            with self._connect() as conn, conn.cursor() as cur:
                cur.execute("SHOW MASTER STATUS")
                file, pos = cur.fetchone()[:2]
            return file, pos
        return self._read_snapshot()

    def _read_snapshot(self) -> tuple[str, int]:
        """Every row of the tables, as op ``r``, in one consistent snapshot; returns its binlog position."""
        import pymysql.cursors

        state = self.state
        started = time.monotonic()
        conn = self._connect(cursorclass=pymysql.cursors.SSDictCursor)
        try:
            with conn.cursor() as cur:
                cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
                cur.execute("SHOW STATUS LIKE 'binlog_snapshot_%'")
                found = {r["Variable_name"].lower(): r["Value"] for r in cur.fetchall()}
            if "binlog_snapshot_file" in found:  # MariaDB: the snapshot's own position
                file, pos = found["binlog_snapshot_file"], int(found["binlog_snapshot_position"])
            else:  # MySQL: a brief global read lock around the snapshot's start
                conn.rollback()
                with conn.cursor() as cur:
                    cur.execute("FLUSH TABLES WITH READ LOCK")
                    cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
                    cur.execute("SHOW MASTER STATUS")
                    status = cur.fetchone()
                    cur.execute("UNLOCK TABLES")
                file, pos = status["File"], int(status["Position"])
            self._prefix = file.rsplit(".", 1)[0]
            replaced = [table for table in self.source.tables if self.out.has_records(table)]
            self.out.queue(state.begin_snapshot(file, pos, int(time.time() * 1000), replaced))
            for table in self.source.tables:
                schema, _, name = table.partition(".")
                with conn.cursor() as cur:
                    cur.execute(f"SELECT * FROM `{schema}`.`{name}`")
                    for row in cur:
                        if self.out.queue(state.snapshot_row(schema, name, row)) >= SEND_BATCH:
                            self.out.publish()
                        self.stats.snapshot_rows += 1
            self.out.queue(state.end_snapshot())
            self.out.publish()
            conn.commit()
        finally:
            conn.close()
        self.out.flush()
        self._save(file, pos)
        log.info("cdc: bootstrap of %d rows in %.1f s at %s:%d", self.stats.snapshot_rows,
                 time.monotonic() - started, file, pos)
        return file, pos

    def _save(self, file: str, pos: int) -> None:
        self._state_file.save({"name": self.source.name, "file": file, "pos": pos})
        self._confirmed_at(position(file, pos))

    # -- streaming ----------------------------------------------------------------------

    def _replicate(self, start: tuple[str, int]) -> None:
        """Read the binlog from ``start`` until stopped or the connection is lost (the next start is
        ``_resume_at``: after the last transaction published)."""
        from pymysqlreplication import BinLogStreamReader
        from pymysqlreplication.event import GtidEvent, MariadbGtidEvent, QueryEvent, RotateEvent, XidEvent
        from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

        src, state, stats, out = self.source, self.state, self.stats, self.out
        schemas = sorted({t.partition(".")[0] for t in src.tables})
        wanted = set(src.tables)
        stream = self._stream = BinLogStreamReader(
            connection_settings={**src.connection, "init_command": "SET time_zone = '+00:00'"},
            server_id=src.server_id, resume_stream=True, log_file=start[0], log_pos=start[1], blocking=True,
            only_events=[GtidEvent, MariadbGtidEvent, QueryEvent, RotateEvent, XidEvent, WriteRowsEvent,
                         UpdateRowsEvent, DeleteRowsEvent],
            only_schemas=schemas, slave_heartbeat=1.0)  # (file and position on MariaDB too: its GTIDs still come)
        log.info("cdc: reading the binlog from %s:%d", *start)
        gtid: str | None = None
        last_save = 0.0
        try:
            for event in stream:
                if self._stopping.is_set():
                    break
                file, next_pos = stream.log_file, stream.log_pos
                kind = type(event)
                if kind is GtidEvent or kind is MariadbGtidEvent:
                    # (MariaDB's GTID event is the group's BEGIN; MySQL's comes before a BEGIN query)
                    gtid = event.gtid
                    state.begin(file, next_pos, gtid, event.timestamp)
                elif kind is QueryEvent:
                    query = event.query.strip().upper() if isinstance(event.query, str) else ""
                    if query == "BEGIN":
                        if not state.txns.open:
                            state.begin(file, next_pos, gtid, event.timestamp)
                    elif state.txns.open:  # COMMIT of a non-transactional engine, or DDL: the group ends
                        self._commit(file, next_pos)
                elif kind is XidEvent:
                    self._commit(file, next_pos)
                elif kind in (WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent):
                    if f"{event.schema}.{event.table}" not in wanted:
                        continue
                    if not state.txns.open:  # (a row event outside BEGIN: never from a healthy server)
                        stats.unexpected += 1
                        continue
                    which = "insert" if kind is WriteRowsEvent else "update" if kind is UpdateRowsEvent else "delete"
                    if out.queue(state.rows(which, event.schema, event.table, event.rows)) >= SEND_BATCH:
                        out.publish()
                elif kind is RotateEvent:
                    self._prefix = event.next_binlog.rsplit(".", 1)[0]
                stats.changes, stats.transactions = state.txns.changes, state.txns.transactions
                stats.wal_end = max(stats.wal_end, position(file, next_pos))
                now = time.monotonic()
                if now - last_save >= SAVE_INTERVAL:
                    last_save = now
                    self._save_confirmed()
        finally:
            stream.close()
            self._stream = None
            state.txns.reset()
            out.publish()
        self._save_confirmed()

    def _commit(self, file: str, next_pos: int) -> None:
        """A transaction committed: publish it, and count it for the saved position."""
        self.out.queue(self.state.commit(file, next_pos))
        self.out.publish()
        self.rule.committed(position(file, next_pos), self.out.last_offset)
        self._resume_at = (file, next_pos)

    def _save_confirmed(self) -> None:
        """Save the position after the newest transaction the stores acked, if it moved."""
        confirmed = self.rule.acked(self.out.released)
        if confirmed > self.stats.confirmed_lsn:
            self._save(*file_of(confirmed, self._prefix))
