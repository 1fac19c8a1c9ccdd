"""The CDC scenario of bench/run.py: ``dafka cdc postgres`` against a private
PostgreSQL server (postgres.py), a tower and one store.

* **Sustained capture**: a server-side procedure commits N row changes as
  single-row transactions, then as 100-row transactions; the rate is from
  the first commit to the last change acked by the store (the connector's
  ``dafka_cdc_records_acked_total``), beside the writer's own rate, with the
  connector's CPU per change and the highest confirmed-LSN lag seen
  (``dafka_cdc_lag_bytes``, sampled every 50 ms).
* **Latency**: single-row inserts paced at 1,000/s, each carrying the
  writer's clock just before its commit; a consumer in this process takes
  the difference when the change arrives (p50, p99).
* **Bootstrap**: a table of R rows, read by a new connector in its slot's
  snapshot: rows per second from its first row read to the store's ack of
  the last, and the start-up before it (process, checks, the resume probe).

Run alone: ``python3 bench/run.py --only cdc`` (see run.py's --help).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

from . import postgres
from .cluster import Cluster
from .common import config, free_port, proc_cpu_seconds
from .postgres import PostgresServer


PROCEDURES = """
CREATE TABLE IF NOT EXISTS changes (id bigint PRIMARY KEY, v text, t double precision);
CREATE OR REPLACE PROCEDURE bench_commit(n int, per_txn int, start bigint) LANGUAGE plpgsql AS $$
DECLARE i int := 0;
BEGIN
  WHILE i < n LOOP
    INSERT INTO changes SELECT start + i + g, 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx', 0
      FROM generate_series(0, per_txn - 1) g;
    i := i + per_txn;
    COMMIT;
  END LOOP;
END $$;
"""


def available() -> bool:
    return postgres.missing() is None


def _metric(port: int, name: str) -> float:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    match = re.search(rf"^{name}\{{[^}}]*\}} ([0-9.e+]+)$", body, re.M)
    return float(match.group(1)) if match else 0.0


class _Connector:
    """``dafka cdc postgres`` as a process, with its metrics endpoint."""

    def __init__(self, pg, db: str, tower, tables: list[str], topic: str, state_dir: str) -> None:
        self.port = free_port()
        dafka = shutil.which("dafka", path=os.path.dirname(sys.executable)) or shutil.which("dafka")
        args = [dafka, "cdc", "postgres", "--dsn", pg.dsn(db), "--topic", topic, "--state-dir", state_dir,
                "--sub", tower.sub_endpoint, "--pub", tower.pub_endpoint, "-X", "beacon/address=127.0.0.1",
                "--metrics-port", str(self.port)]
        for table in tables:
            args += ["--table", table]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 30
        while True:
            try:
                _metric(self.port, "dafka_cdc_changes_total")
                break
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"the connector did not start: {self.proc.stderr.read()[-2000:]}")
                time.sleep(0.05)

    def metric(self, name: str) -> float:
        return _metric(self.port, name)

    def wait_acked(self, n: float, timeout: float = 600, lag: list | None = None) -> float:
        """Wait until ``n`` records are acked; the time then.  Samples the LSN lag into ``lag``."""
        deadline = time.monotonic() + timeout
        while True:
            if self.metric("dafka_cdc_records_acked_total") >= n:
                return time.perf_counter()
            if lag is not None:
                lag.append(self.metric("dafka_cdc_lag_bytes"))
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {self.metric('dafka_cdc_records_acked_total'):.0f} of {n} acked")
            time.sleep(0.05)

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stderr.close()


def _sustained(pg, db: str, connector: _Connector, n: int, per_txn: int, start: int) -> dict:
    acked_before = connector.metric("dafka_cdc_records_acked_total")
    cpu = proc_cpu_seconds(connector.proc.pid)
    lag: list[float] = []
    began = time.perf_counter()
    pg.sql(f"CALL bench_commit({n}, {per_txn}, {start})", dbname=db)
    written = time.perf_counter()
    done = connector.wait_acked(acked_before + n, lag=lag)
    lag.append(connector.metric("dafka_cdc_lag_bytes"))
    return {"changes": n, "per_transaction": per_txn, "rate": n / (done - began), "writer_rate": n / (written - began),
            "cpu_us": round((proc_cpu_seconds(connector.proc.pid) - cpu) / n * 1e6, 2),
            "max_lag_bytes": max(lag), "final_lag_bytes": lag[-1]}


def _latency(pg, db: str, tower, rate: int, seconds: float, start: int) -> dict:
    import psycopg2

    from dafka import Consumer

    samples: list[float] = []
    n = int(rate * seconds)
    with Consumer("cdc", config=config(tower.sub_endpoint, tower.pub_endpoint)) as consumer:
        consumer.poll(0.5)  # subscribed before the first commit
        conn = psycopg2.connect(pg.dsn(db))
        conn.autocommit = True
        cur = conn.cursor()
        began = time.perf_counter()
        for i in range(n):
            due = began + i / rate
            while True:
                now = time.perf_counter()
                if now >= due:
                    break
                for record in consumer.consume(1000, timeout=min(0.001, due - now)):
                    samples.append(time.time() - json.loads(record.value)["after"]["t"])
            cur.execute("INSERT INTO changes VALUES (%s, 'l', %s)", (start + i, time.time()))
        deadline = time.monotonic() + 10
        while len(samples) < n and time.monotonic() < deadline:
            for record in consumer.consume(1000, timeout=0.1):
                samples.append(time.time() - json.loads(record.value)["after"]["t"])
        conn.close()
    samples.sort()
    return {"rate": rate, "changes": len(samples), "of": n,
            "p50_ms": samples[len(samples) // 2] * 1000 if samples else None,
            "p99_ms": samples[int(len(samples) * 0.99)] * 1000 if samples else None}


def run_all(records: int, bootstrap_rows: int, latency_seconds: float = 10.0) -> dict:
    """The whole scenario, printed; skipped without PostgreSQL or psycopg2."""
    if not available():
        print(f"\n== change data capture: skipped ({postgres.missing()}) ==")
        return {}
    result = _run(records, bootstrap_rows, latency_seconds)
    for line in report(result):
        print(line)
    return result


def _run(records: int, bootstrap_rows: int, latency_seconds: float) -> dict:
    pg = PostgresServer(free_port())
    cluster = Cluster()
    tower = cluster.tower
    work = tempfile.mkdtemp(prefix="dafka-bench-cdc-")
    store = cluster.store(os.path.join(work, "store"))
    result: dict = {}
    try:
        pg.sql("CREATE DATABASE bench")
        pg.sql(PROCEDURES, dbname="bench")
        connector = _Connector(pg, "bench", tower, ["public.changes"], "cdc", work)
        try:
            result["single_row"] = _sustained(pg, "bench", connector, records, 1, 0)
            result["txn_100"] = _sustained(pg, "bench", connector, records, 100, 10_000_000)
            result["latency"] = _latency(pg, "bench", tower, 1000, latency_seconds, 20_000_000)
        finally:
            connector.close()
        pg.sql(f"CREATE TABLE boot AS SELECT g AS id, md5(g::text) AS v, now() AS at FROM generate_series(1, "
               f"{bootstrap_rows}) g", dbname="bench")
        pg.sql("ALTER TABLE boot ADD PRIMARY KEY (id)", dbname="bench")
        began = time.perf_counter()
        connector = _Connector(pg, "bench", tower, ["public.boot"], "boot", work)
        try:
            cpu = proc_cpu_seconds(connector.proc.pid)
            while connector.metric("dafka_cdc_snapshot_rows_total") == 0:  # start-up: checks, the resume probe
                if connector.proc.poll() is not None or time.perf_counter() - began > 120:
                    raise RuntimeError("the bootstrap connector published no row")
                time.sleep(0.01)
            first = time.perf_counter()
            done = connector.wait_acked(bootstrap_rows)
            result["bootstrap"] = {"rows": bootstrap_rows, "rate": bootstrap_rows / (done - first),
                                   "startup_s": round(first - began, 2),
                                   "cpu_us": round((proc_cpu_seconds(connector.proc.pid) - cpu) / bootstrap_rows * 1e6, 2)}
        finally:
            connector.close()
    finally:
        cluster.stop_store(store)
        cluster.close()
        pg.close()
        shutil.rmtree(work, ignore_errors=True)
    return result


def report(r: dict) -> list[str]:
    lines = ["\n== change data capture: PostgreSQL -> dafka cdc postgres -> one store (acked) =="]
    for name, label in (("single_row", "single-row transactions"), ("txn_100", "100-row transactions")):
        s = r[name]
        lines.append(f"{label:<44} {s['rate']:>11,.0f} changes/s (writer {s['writer_rate']:,.0f}/s, "
                     f"{s['rate'] / s['writer_rate']:.2f}x); connector {s['cpu_us']} us/change; "
                     f"confirmed-LSN lag max {s['max_lag_bytes'] / 1024:,.0f} KiB, at the end {s['final_lag_bytes']:.0f} B")
    lat = r["latency"]
    lines.append(f"{'commit to consumer at 1,000 changes/s':<44} p50 {lat['p50_ms']:.1f} ms, p99 {lat['p99_ms']:.1f} ms "
                 f"({lat['changes']:,} of {lat['of']:,})")
    b = r["bootstrap"]
    lines.append(f"{'bootstrap of ' + format(b['rows'], ',') + ' rows':<44} {b['rate']:>11,.0f} rows/s; "
                 f"connector {b['cpu_us']} us/row; start-up before the first row {b['startup_s']:.1f} s")
    return lines
