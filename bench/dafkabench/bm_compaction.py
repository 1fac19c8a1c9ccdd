"""The compaction scenario of bench/run.py: compacted topics (rfc/dafka.md section 19).

* **Writes while compaction runs**: a producer process sends keyed records of
  100 B, cycling over ``keys`` keys, to one store with ``min_acks`` 1: at full
  speed (the acked rate), then paced at ``paced_rate`` a second (the time from
  send to ack of every 100th record: p50, p99).  The store compacts the topic
  or does not (``store/compaction/topics`` empty), in alternation, twice each,
  in the same run: the ratio of each figure with compaction to without, and
  the records compaction removed meanwhile.
* **Bootstrap of ``rows`` keys**: ``dafka cdc postgres`` publishes a table of
  ``rows`` rows (its first start) into a topic the store compacts.  A new
  consumer then reads every key from the store, from the beginning (the
  compacted topic's bootstrap), against SIGUSR1: the connector reads every row
  from PostgreSQL again and publishes it (from the signal to the store's ack of
  the last row).  PostgreSQL's own CPU is not counted.
* **Compaction throughput**: the re-snapshot superseded every one of those
  records; the store removes them: records removed a second of the passes'
  time (``compaction_ms``: first step to last, not the waits for a pass
  to be due) and the writer thread's CPU in compaction steps per record
  removed (``compaction_cpu_ms``), as the store's counters say.

Run alone: ``python3 bench/run.py --only compaction`` (``--compaction-records``,
``--compaction-keys``, ``--bootstrap-rows``).
"""

from __future__ import annotations

import json
import shutil
import signal
import tempfile
import time
from pathlib import Path
from . import bm_cdc
from .common import free_port
from .postgres import PostgresServer
from .cluster import Cluster, ceiling, guarded, result_of
from .common import proc_cpu_seconds

SIZE = 100
TOPIC = "keyed"


def _stats(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _wait_stats(path: Path, predicate, timeout: float, what: str) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        stats = _stats(path)
        if stats and predicate(stats):
            return stats
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {timeout:.0f} s (store: {stats})")
        time.sleep(0.05)


def writes(compacted: bool, records: int, keys: int, paced_rate: int,
           settings: tuple[str, ...] = ()) -> dict:
    """One round: a fresh store, compacting ``TOPIC`` or not (``settings``: more of its config, KEY=VALUE); a
    full-speed run, then a paced one."""
    c = Cluster()
    base = tempfile.mkdtemp(prefix="dafka-bench-compaction-")
    progress = Path(base, "stats.json")
    try:
        store = c.store(f"{base}/db", [f"store/compaction/topics={TOPIC if compacted else ''}", *settings],
                        progress=str(progress))
        time.sleep(1.0)
        common = ["--topic", TOPIC, "--size", str(SIZE), "--min-acks", "1", "--keys", str(keys)]
        full = result_of(c.spawn("producer", "--records", str(records), *common))
        paced = result_of(c.spawn("producer", "--records", str(min(paced_rate * 10, records)), "--rate",
                                      str(paced_rate),
                                      "--ack-latency", *common))
        stats = _stats(progress)
        ended = c.stop_store(store)
        written = ended["store"]["records_written"]
        return {"ack_rate": records / full["ack_seconds"], "producer_cpu_us": full.get("cpu_us"),
                "store_cpu_us": ended["cpu_s"] / written * 1e6 if written else None,
                "ack_p50_ms": paced["ack_p50_ms"], "ack_p99_ms": paced["ack_p99_ms"],
                "removed": stats.get("compaction_deleted", 0), "passes": stats.get("compaction_passes", 0),
                "step_max_ms": stats.get("compaction_step_max_us", 0) / 1000}
    finally:
        c.close()
        shutil.rmtree(base, ignore_errors=True)


def bootstrap(rows: int) -> dict:
    """The CDC bootstrap from the compacted topic against SIGUSR1, then compaction's throughput."""
    if not bm_cdc.available():
        return {"skipped": "no PostgreSQL server or psycopg2 (pip install '.[cdc]')"}
    c = Cluster()
    pg = PostgresServer(free_port())
    base = tempfile.mkdtemp(prefix="dafka-bench-compaction-cdc-")
    progress = Path(base, "stats.json")
    out: dict = {"rows": rows}
    try:
        store = c.store(f"{base}/db", ["store/compaction/topics=boot"], progress=str(progress))
        pg.sql("CREATE DATABASE bench")
        pg.sql(f"CREATE TABLE boot AS SELECT g AS id, md5(g::text) AS v, now() AS at FROM generate_series(1, "
               f"{rows}) g", dbname="bench")
        pg.sql("ALTER TABLE boot ADD PRIMARY KEY (id)", dbname="bench")
        connector = bm_cdc._Connector(pg, "bench", c.tower, ["public.boot"], "boot", base)
        try:
            connector.wait_acked(rows)
            consumer = c.spawn("consumer", "--records", str(rows), "--size", "0", "--topic", "boot",
                               "--reset", "earliest")
            r = result_of(consumer)
            out["from_stores"] = {"rate": r["received"] / r["seconds"], "seconds": r["seconds"],
                                  "received": r["received"], "consumer_cpu_us": r.get("cpu_us"), "database_rows": 0}
            cpu = proc_cpu_seconds(connector.proc.pid)
            before = _stats(progress)
            began = time.perf_counter()
            connector.proc.send_signal(signal.SIGUSR1)
            done = connector.wait_acked(2 * rows)
            out["sigusr1"] = {"rate": rows / (done - began), "seconds": done - began, "database_rows": rows,
                              "connector_cpu_us": (proc_cpu_seconds(connector.proc.pid) - cpu) / rows * 1e6}
        finally:
            connector.close()
        # every record of the first snapshot is superseded by the second: the store removes them, in passes
        # that may start while the second is written (the store's counters: the passes' time and CPU alone)
        target = before.get("compaction_deleted", 0) + rows
        _wait_stats(progress, lambda s: s.get("compaction_deleted", 0) >= target, 900, "compaction of the snapshot")
        end = _wait_stats(progress, lambda s: s["compaction_passes"] > before["compaction_passes"] and
                          s["compaction_deleted"] >= target, 60, "the pass to end")
        removed = end["compaction_deleted"] - before["compaction_deleted"]
        seconds = (end["compaction_ms"] - before["compaction_ms"]) / 1000
        out["compaction"] = {"removed": removed, "seconds": seconds, "rate": removed / seconds,
                             "store_cpu_us": (end["compaction_cpu_ms"] - before["compaction_cpu_ms"]) / removed * 1e3,
                             "passes": end["compaction_passes"] - before["compaction_passes"]}
        c.stop_store(store)
    finally:
        c.close()
        pg.close()
        shutil.rmtree(base, ignore_errors=True)
    return out


def run_all(records: int, keys: int, rows: int, paced_rate: int = 2_000) -> dict:
    result: dict = {"records": records, "keys": keys, "paced_rate": paced_rate, "rounds": []}
    result["ceiling"] = ceiling(min(records, 300_000), SIZE)
    for compacted in (False, True, False, True):
        result["rounds"].append({"compacted": compacted, **guarded(writes, compacted, records, keys,
                                                                       paced_rate)})
    result["bootstrap"] = guarded(bootstrap, rows)
    for line in report(result):
        print(line)
    return result


def _mean(rounds: list[dict], compacted: bool, key: str) -> float | None:
    values = [r[key] for r in rounds if r["compacted"] == compacted and key in r]
    return sum(values) / len(values) if values else None


def report(r: dict) -> list[str]:
    ceiling_rate = r["ceiling"]["rate"]
    lines = [f"\n== compacted topics: {r['records']:,} keyed records of {SIZE} B over {r['keys']:,} keys, one store, "
             f"min_acks 1 (ceiling {ceiling_rate:,.0f}/s, sender {r['ceiling']['cpu_us']['sender']} us) =="]
    for row in r["rounds"]:
        if "error" in row:
            lines.append(f"{'compacted' if row['compacted'] else 'not compacted':<14} {row['error']}")
            continue
        lines.append(f"{'compacted' if row['compacted'] else 'not compacted':<14} acked {row['ack_rate']:>9,.0f}/s "
                     f"({row['ack_rate'] / ceiling_rate:.2f}x), producer {row['producer_cpu_us']} us/record, store "
                     f"{row['store_cpu_us']:.2f} us/record written (compaction included); at "
                     f"{r['paced_rate']:,}/s ack p50 {row['ack_p50_ms']:.2f} ms, p99 {row['ack_p99_ms']:.2f} ms; "
                     f"removed {row['removed']:,} in {row['passes']} passes, longest step {row['step_max_ms']:.1f} ms")
    rate_on, rate_off = _mean(r["rounds"], True, "ack_rate"), _mean(r["rounds"], False, "ack_rate")
    p99_on, p99_off = _mean(r["rounds"], True, "ack_p99_ms"), _mean(r["rounds"], False, "ack_p99_ms")
    cpu_on, cpu_off = _mean(r["rounds"], True, "store_cpu_us"), _mean(r["rounds"], False, "store_cpu_us")
    if rate_on and rate_off and p99_on and p99_off and cpu_on and cpu_off:
        # the store's CPU per record is the steadier figure: on a busy machine two identical rounds' rates differ
        lines.append(f"{'with / without':<14} acked rate {rate_on / rate_off:.2f}x (target >= 0.90), "
                     f"ack p99 {p99_on / p99_off:.2f}x (target <= 2), store CPU per record {cpu_on / cpu_off:.2f}x")
    b = r["bootstrap"]
    if "error" in b or "skipped" in b:
        lines.append(f"bootstrap: {b.get('error') or b.get('skipped')}")
        return lines
    s, u, k = b["from_stores"], b["sigusr1"], b["compaction"]
    lines.append(f"bootstrap of {b['rows']:,} keys, from the compacted topic: {s['rate']:>9,.0f} keys/s "
                 f"({s['seconds']:.1f} s), consumer {s['consumer_cpu_us']} us/key; rows read from PostgreSQL: 0")
    lines.append(f"bootstrap of {b['rows']:,} keys, SIGUSR1 re-snapshot:    {u['rate']:>9,.0f} keys/s "
                 f"({u['seconds']:.1f} s), connector {u['connector_cpu_us']:.1f} us/row; rows read from "
                 f"PostgreSQL: {u['database_rows']:,}")
    lines.append(f"compaction: {k['removed']:,} superseded records removed at {k['rate']:,.0f}/s "
                 f"({k['seconds']:.1f} s of passes, {k['passes']} of them), compaction CPU {k['store_cpu_us']:.2f} us "
                 "per record removed")
    return lines
