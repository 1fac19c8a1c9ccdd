"""Stored records read back while the store runs: bulk, RFC 46 and reference consumers, Spark's reads, four
readers at once, fairness, and a producer's rate while consumers catch up."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .cluster import Cluster, result_of
from .common import RssSampler, TOPIC, rate_of


def scenario_bulk_reads(records: int, size: int, session, concurrency: bool) -> dict:
    """Store ``records`` records of ``size`` bytes, then read them all back
    while the store keeps running: a consumer with bulk answers, a consumer
    over the RFC 46 path (consumer/bulk = 0), the reference consumer's
    behaviour (raw frames), Spark via tower, via path through the running
    store and via path on a stopped store's copy.  With ``concurrency``,
    also: four bulk readers at once (the store's RSS), two consumers catching
    up beside a 4-task Spark read (fairness), and producer -> store acked
    alone and while two consumers catch up (live traffic)."""
    c = Cluster()
    db = tempfile.mkdtemp(prefix="dafka-bench-")
    copy = db + "-copy"
    out: dict = {"records": records, "size": size}
    n = str(records)
    sz = str(size)
    try:
        store = c.store(db)
        rss = RssSampler(store.pid)
        time.sleep(1.0)
        p = result_of(c.spawn("producer", "--records", n, "--size", sz, "--min-acks", "1"))
        out["ack_rate"] = records / p["ack_seconds"]
        store_rss = []
        if session is not None:
            # A copy of the stopped store's directory, for Spark's path read of a stopped store in
            # turn with the reads through the running one (the same JVM state for all: see spark_rates).
            store_rss.append(c.stop_store(store)["rss_mib"])
            rss.stop()
            shutil.copytree(db, copy)
            store = c.store(db)
            rss = RssSampler(store.pid)
            time.sleep(1.0)
        reads = {"bulk": ["--bulk", "1"], "rfc46": ["--bulk", "0"]}
        for name, extra in reads.items():
            r = result_of(c.spawn("consumer", "--records", n, "--size", sz, "--reset", "earliest", *extra))
            out[f"catchup_{name}"] = {"rate": rate_of(r), "received": r["received"], "cpu_us": r.get("cpu_us"),
                                      "rss_mib": r["rss_mib"]}
        r = result_of(c.spawn("refconsumer", "--records", n))
        out["catchup_reference"] = {"rate": rate_of(r), "received": r["received"], "complete": r.get("complete"),
                                    "foreign": r.get("foreign"), "cpu_us": r.get("cpu_us"),
                                    "fetches": r.get("fetches"), "filtered": r.get("filtered")}
        cores = os.cpu_count() or 1
        split = str(max(1, -(-records // cores)))
        out["spark_tasks"] = cores
        if session is not None:
            tower = {"tower": c.tower.pub_endpoint, "towerSub": c.tower.sub_endpoint,
                     "dafka.beacon/address": "127.0.0.1"}
            rates = spark_rates(session, records, store.pid, {
                "spark_path_rate": {"path": copy, "maxRecordsPerPartition": split},
                "spark_tower_rate": {"maxRecordsPerPartition": split, **tower},
                "spark_path_running_rate": {"path": db, "maxRecordsPerPartition": split},
            })
            out.update(rates)
        if concurrency:
            out.update(_concurrent_reads(c, records, session, rss))
        store_rss.append(c.stop_store(store)["rss_mib"])
        rss.stop()
        out["rss_mib"] = {"producer": p["rss_mib"], "store": max(store_rss)}
        return out
    finally:
        c.close()
        shutil.rmtree(db, ignore_errors=True)
        shutil.rmtree(copy, ignore_errors=True)


def _concurrent_reads(c: Cluster, records: int, session, rss: RssSampler) -> dict:
    n = str(records)
    out: dict = {}
    # Bounded memory: four bulk readers of every record at once.
    before = rss.reset()
    readers = [c.spawn("consumer", "--records", n, "--reset", "earliest") for _ in range(4)]
    results = [result_of(r) for r in readers]
    out["four_readers"] = {"rss_before_mib": before, "rss_peak_mib": rss.peak,
                           "growth_per_reader_mib": (rss.peak - before) / 4,
                           "rates": [rate_of(r) for r in results]}
    # Fairness: two consumers catch up while Spark reads with four tasks at once.
    if session is not None:
        consumers = [c.spawn("consumer", "--records", n, "--reset", "earliest") for _ in range(2)]
        began = time.perf_counter()
        tower = {"tower": c.tower.pub_endpoint, "towerSub": c.tower.sub_endpoint, "dafka.beacon/address": "127.0.0.1"}
        spark = spark_once(session, records, maxRecordsPerPartition=str(-(-records // 4)), **tower)
        spark_end = time.perf_counter()
        results = [result_of(r) for r in consumers]
        out["fairness"] = {
            "spark_seconds": spark_end - began, "spark_rate": spark,
            "consumers": [{"rate": rate_of(r), "first_record_ms": r.get("first_record_ms"),
                           "finished_after_spark_began_s": r.get("finished", began) - began} for r in results],
        }
    # Live traffic while two consumers catch up.
    alone = result_of(c.spawn("producer", "--topic", "live-alone", "--records", "300000", "--min-acks", "1"))
    consumers = [c.spawn("consumer", "--records", n, "--reset", "earliest") for _ in range(2)]
    time.sleep(0.3)
    busy = result_of(c.spawn("producer", "--topic", "live-busy", "--records", "300000", "--min-acks", "1"))
    results = [result_of(r) for r in consumers]
    out["live"] = {"alone_ack_rate": 300_000 / alone["ack_seconds"], "busy_ack_rate": 300_000 / busy["ack_seconds"],
                   "catchup_rates": [rate_of(r) for r in results]}
    return out


def spark_available() -> bool:
    import importlib.util

    if importlib.util.find_spec("pyspark") is None:
        return False
    return shutil.which("java") is not None or bool(os.environ.get("JAVA_HOME"))


def spark_session():
    """A local Spark session with the dafka data source.  Its JVM, and the Python workers the JVM starts, get
    PYTHONSAFEPATH (a worker must not import a dafka/ folder from its working directory); this process's
    environment is left as it was: the roles it starts later find bench/dafkabench beside run.py."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"  # else Spark resolves the hostname to a LAN address
    from pyspark.sql import SparkSession

    from dafka.spark import register

    safe_path = os.environ.get("PYTHONSAFEPATH")
    os.environ["PYTHONSAFEPATH"] = "1"  # (the JVM copies the environment when it starts)
    try:
        # local[4]: four tasks can run at once (the fairness scenario); the rate queries make one task per core.
        session = (SparkSession.builder.master("local[4]").appName("dafka-bench")
                   .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
                   .config("spark.driver.bindAddress", "127.0.0.1").getOrCreate())
    finally:
        if safe_path is None:
            del os.environ["PYTHONSAFEPATH"]
        else:
            os.environ["PYTHONSAFEPATH"] = safe_path
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    return session


def stop_spark(session) -> None:
    """Stop ``session`` and its JVM: SparkSession.stop() leaves the JVM running until this process exits
    (720 MiB and some 5 % of a core through every later scenario, the idle rows included).  The JVM ends
    when its stdin closes (pyspark's launch_gateway)."""
    from pyspark import SparkContext

    session.stop()
    gateway = SparkContext._gateway
    if gateway is None:
        return
    gateway.shutdown()
    proc = getattr(gateway, "proc", None)
    if proc is not None:
        proc.stdin.close()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    SparkContext._gateway = SparkContext._jvm = None


def _process_tree_cpu(store_pid: int | None) -> dict[int, tuple[str, float]]:
    """CPU seconds so far of this process and its descendants, by pid, with
    what each is: the Spark JVM, Spark's Python workers, the store, this
    process (the Spark driver's Python side and the tower) or another peer."""
    parents: dict[int, int] = {}
    stats: dict[int, tuple[str, float]] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            comm, rest = (entry / "stat").read_text().rsplit(")", 1)
        except OSError:
            continue  # gone meanwhile
        fields = rest.split()
        pid = int(entry.name)
        parents[pid] = int(fields[1])
        # with the CPU of its children that ended and were waited for (a Python worker Spark replaced)
        stats[pid] = (comm.split("(", 1)[1], sum(int(v) for v in fields[11:15]) / tick)
    me = os.getpid()
    out: dict[int, tuple[str, float]] = {}
    for pid, (comm, cpu) in stats.items():
        ancestor, kind = pid, None
        while ancestor not in (me, 0, 1) and ancestor in parents:
            ancestor = parents[ancestor]
        if pid == me:
            kind = "driver"
        elif ancestor != me:
            continue
        elif pid == store_pid:
            kind = "store"
        elif comm == "java":
            kind = "JVM"
        elif parents.get(pid) != me:
            kind = "Python workers"  # started by the JVM (pyspark.daemon and its forks)
        else:
            kind = "other"
        out[pid] = (kind, cpu)
    return out


def _machine_busy() -> tuple[float, float]:
    """(busy, all) CPU time of the machine so far, from /proc/stat."""
    ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)


def spark_rates(session, records: int, store_pid: int | None, variants: dict[str, dict[str, str]]) -> dict:
    """Rows/s of a query that reads every row's value, for each variant (a
    name and the reader's options), in steady state: three runs of each
    first (Python workers started and kept for reuse, the JVM's JIT warmed),
    then three rounds that time every variant in turn, so that none gains
    from running later, when the JVM has compiled more; the median and best
    of each.  A ``limit(10)`` warm-up would not do: Spark abandons that
    worker, and every timed query would pay for starting a new one.

    Over each variant's timed runs, also the CPU each kind of process spent
    per row (the JVM, Spark's Python workers, the store ``store_pid``, this
    process) and how busy the machine's cores were: what a read costs in
    all, and who pays for it."""
    readers = {}
    for name, options in variants.items():
        reader = session.read.format("dafka").option("topic", TOPIC)
        for key, value in options.items():
            reader = reader.option(key, value)
        readers[name] = reader

    def timed(name: str) -> float:
        started = time.perf_counter()
        total = readers[name].load().selectExpr("count(*) AS n", "sum(length(value)) AS bytes").collect()[0]
        elapsed = time.perf_counter() - started
        if total["n"] != records:
            raise RuntimeError(f"Spark read {total['n']} rows, expected {records} ({name})")
        return records / elapsed

    for _ in range(3):
        for name in variants:
            timed(name)
    runs: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, dict[str, float]] = {name: {} for name in variants}
    busy = {name: [0, 0] for name in variants}
    for _ in range(3):
        for name in variants:
            before, busy_before = _process_tree_cpu(store_pid), _machine_busy()
            runs[name].append(timed(name))
            after, busy_after = _process_tree_cpu(store_pid), _machine_busy()
            for pid, (kind, seconds) in after.items():
                spent = seconds - before.get(pid, (kind, 0.0))[1]
                cpu[name][kind] = cpu[name].get(kind, 0.0) + spent
            busy[name][0] += busy_after[0] - busy_before[0]
            busy[name][1] += busy_after[1] - busy_before[1]
    cores = os.cpu_count() or 1
    out = {}
    for name in variants:
        rates = sorted(runs[name])
        per_row = {kind: seconds / (3 * records) * 1e6 for kind, seconds in sorted(cpu[name].items())}
        out[name] = {"median": rates[1], "best": rates[2], "runs": rates,
                     "cpu_us": {kind: us for kind, us in per_row.items() if us >= 0.005},
                     "busy_cores": busy[name][0] / max(1, busy[name][1]) * cores}
    return out


def spark_once(session, records: int, **options: str) -> float:
    """Rows/s of one run of the query (its workers already warm)."""
    reader = session.read.format("dafka").option("topic", TOPIC).options(**options)
    started = time.perf_counter()
    total = reader.load().selectExpr("count(*) AS n").collect()[0]["n"]
    if total != records:
        raise RuntimeError(f"Spark read {total} rows, expected {records}")
    return records / (time.perf_counter() - started)
