"""A private PostgreSQL server for a benchmark or a test: ``initdb`` in a temp dir, ``wal_level = logical``,
a given port on 127.0.0.1, trust authentication on loopback.

PostgreSQL refuses to run as root, so as root the server runs as the ``postgres`` user (Debian's packages
create it).  :func:`missing` says why a server cannot run here (the benchmark skips its CDC rows with it,
tests/pgserver.py's tests skip or fail).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time


def bindir() -> str | None:
    """Where PostgreSQL's server programs are (the newest Debian version first), or None."""
    for path in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if os.path.exists(os.path.join(path, "postgres")):
            return path
    found = shutil.which("pg_config")
    if found:
        out = subprocess.run([found, "--bindir"], capture_output=True, text=True).stdout.strip()
        if os.path.exists(os.path.join(out, "postgres")):
            return out
    return None


def missing() -> str | None:
    """Why a private server cannot run here (no server programs, no psycopg2), or None."""
    if bindir() is None:
        return "PostgreSQL server binaries not found (apt-get install postgresql-15)"
    try:
        import psycopg2  # noqa: F401
    except ImportError:
        return "psycopg2 not installed (pip install '.[cdc]')"
    return None


class PostgresServer:
    def __init__(self, port: int, wal_level: str = "logical") -> None:
        reason = missing()
        if reason is not None:
            raise RuntimeError(reason)
        self.bindir = bindir()
        self.root = tempfile.mkdtemp(prefix="dafka-pg-")
        self.data = os.path.join(self.root, "data")
        self.port = port
        self.user = "postgres"
        self._as = []
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
            self._as = ["runuser", "-u", "postgres", "--"]
        self._run("initdb", "-D", self.data, "-U", self.user, "-A", "trust", "-E", "UTF8", "--no-sync")
        with open(os.path.join(self.data, "postgresql.conf"), "a") as conf:
            conf.write(f"\nlisten_addresses = '127.0.0.1'\nport = {self.port}\nunix_socket_directories = '{self.root}'\n"
                       f"wal_level = {wal_level}\nmax_replication_slots = 10\nmax_wal_senders = 10\nfsync = off\n"
                       "full_page_writes = off\nshared_buffers = 64MB\n")
            # (synchronous_commit stays on: a walsender sends only flushed WAL, and with it off a commit
            # waits for the WAL writer, up to wal_writer_delay, before any replica or connector sees it)
        self.start()

    def _run(self, tool: str, *args: str) -> str:
        result = subprocess.run([*self._as, os.path.join(self.bindir, tool), *args], capture_output=True, text=True,
                                timeout=120)
        if result.returncode:
            raise RuntimeError(f"{tool} failed: {result.stdout}{result.stderr}")
        return result.stdout

    def start(self) -> None:
        self._run("pg_ctl", "-D", self.data, "-l", os.path.join(self.root, "log"), "-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", self.data, "-m", mode, "-w", "-t", "60", "stop")

    def restart(self) -> None:
        # (-l: the new postmaster must not inherit our pipes, or waiting for them to close never ends)
        self._run("pg_ctl", "-D", self.data, "-l", os.path.join(self.root, "log"), "-m", "fast", "-w", "-t", "60",
                  "restart")

    def dsn(self, dbname: str = "postgres", user: str | None = None) -> str:
        return f"host=127.0.0.1 port={self.port} dbname={dbname} user={user or self.user}"

    def sql(self, statement: str, dbname: str = "postgres", params=None) -> list:
        import psycopg2

        conn = psycopg2.connect(self.dsn(dbname), options="-c TimeZone=UTC -c DateStyle=ISO -c bytea_output=hex "
                                "-c extra_float_digits=3")
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                cur.execute(statement, params)
                return cur.fetchall() if cur.description else []
        finally:
            conn.close()

    def close(self) -> None:
        try:
            self.stop("immediate")
        except (RuntimeError, subprocess.TimeoutExpired):
            pass
        shutil.rmtree(self.root, ignore_errors=True)

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.sql("SELECT 1")
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
