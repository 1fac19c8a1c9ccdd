"""A private MariaDB server for a test: a data directory in a temp dir, the
row-based binlog on, a free port on 127.0.0.1, run as the ``mysql`` user
(Debian's mariadb-server creates it).  Without MariaDB the tests skip, except
where ``DAFKA_REQUIRE_MYSQL=1`` (tox sets it; .ci/run installs Debian's
``mariadb-server``): there they fail."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time

import pytest

from helpers import free_port


def require_mysql() -> str:
    server = shutil.which("mariadbd") or shutil.which("mariadbd", path="/usr/sbin")
    problem = None
    if server is None or shutil.which("mariadb-install-db") is None:
        problem = "MariaDB server not found (apt-get install mariadb-server)"
    else:
        try:
            import pymysqlreplication  # noqa: F401
        except ImportError:
            problem = "mysql-replication not installed (pip install '.[cdc]')"
    if problem:
        if os.environ.get("DAFKA_REQUIRE_MYSQL") == "1":
            pytest.fail(problem)
        pytest.skip(problem)
    return server


class MysqlServer:
    def __init__(self, binlog_format: str = "ROW") -> None:
        server = require_mysql()
        self.root = tempfile.mkdtemp(prefix="dafka-mysql-")
        self.data = os.path.join(self.root, "data")
        self.socket = os.path.join(self.root, "mysqld.sock")
        # Its own tmpdir: two servers installed at once in the shared /tmp
        # collided over a temporary table's file ("Unknown table 'mysql.tmp_user_sys'").
        self.tmp = os.path.join(self.root, "tmp")
        os.mkdir(self.tmp)
        self.port = free_port()
        user = "mysql" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
        if os.geteuid() == 0:
            pw = pwd.getpwnam("mysql")
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
            os.chown(self.tmp, pw.pw_uid, pw.pw_gid)
        subprocess.run(["mariadb-install-db", f"--datadir={self.data}", f"--user={user}",
                        "--auth-root-authentication-method=normal", "--skip-test-db", f"--tmpdir={self.tmp}"],
                       check=True, capture_output=True, timeout=120)
        self.log = open(os.path.join(self.root, "log"), "w")
        self.args = [server, "--no-defaults", f"--datadir={self.data}", f"--socket={self.socket}", f"--port={self.port}",
                     f"--tmpdir={self.tmp}",
                     "--bind-address=127.0.0.1", f"--user={user}", "--server-id=1", "--log-bin=binlog",
                     f"--binlog-format={binlog_format}", "--binlog-row-image=FULL", "--binlog-row-metadata=FULL",
                     "--innodb-buffer-pool-size=64M",
                     "--innodb-flush-log-at-trx-commit=2", "--skip-name-resolve", f"--pid-file={self.root}/pid",
                     "--default-time-zone=+00:00"]
        self.proc: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(self.args, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            try:
                self.sql("SELECT 1")
                return
            except Exception:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"MariaDB did not start: {open(os.path.join(self.root, 'log')).read()[-3000:]}")
                time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(60)

    def restart(self) -> None:
        self.stop()
        self.start()

    def dsn(self, database: str = "", user: str = "root") -> str:
        return f"mysql://{user}@127.0.0.1:{self.port}/{database}"

    def sql(self, statement: str, database: str | None = None, params=None) -> list:
        import pymysql

        conn = pymysql.connect(host="127.0.0.1", port=self.port, user="root", database=database, autocommit=True)
        try:
            with conn.cursor() as cur:
                for part in [p for p in statement.split(";\n") if p.strip()]:
                    cur.execute(part, params)
                return list(cur.fetchall())
        finally:
            conn.close()

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        self.log.close()
        shutil.rmtree(self.root, ignore_errors=True)
