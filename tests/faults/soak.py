"""The soak run: a whole cluster at steady work for an hour (issue 24).

A tower, 3 stores (retention by time and size, metrics on), 4 producers at
20,000 records/s in all with ``producer/min_acks = 2`` (two of 100 B records,
two of mostly 100 B with one record in 20 of 10 KB), 2 plain consumers, a
consumer group of 2 members, and a Spark streaming query with a 1 s trigger:
each a process of its own.  Every 10 s the run samples each process's RSS,
CPU and open descriptors, the consumers' end-to-end latency (p50/p99 of the
last 10 s) and lag, each store's disk use, LevelDB level sizes and answer
time (a GET-HEADS round trip), and writes them to ``soak.json``; at the end
``soak.png`` plots every series over time (matplotlib, the ``soak`` extra).

The run checks, and says which failed:
* nothing lost or repeated: each consumer got every acked record of every
  partition, in order, once (the group's members together);
* RSS grows by at most 10 % over the run once it is warm: the mean of the last
  10 minutes against that of the 10 minutes from 5 minutes after the stores'
  retention window has filled (minutes 15-25 with 10 minutes of retention:
  until retention deletes as much as comes, a store's database, and so its
  mapped tables, still grow);
* p99 latency in the last 10 minutes is at most 2x that of the same early
  window (each the median of the consumers' 10-second p99s);
* each store's disk stays within its retention bound;
* no process leaks descriptors.

A shorter run (``--minutes 5``: the pytest marker ``soak`` runs that, at
5,000 records/s) warms up for half of it, compares the p99 of its third and
fourth quarters (at most 2x + 100 ms: a shared machine's load moves it), and
reports RSS growth without judging it: in 5 minutes the stores still fill their retention window and Spark's JVM its heap.  On
demand::

    python tests/faults/soak.py --minutes 60 --out soak-out

Retention is 2 minutes in a run under 30 minutes, else 10 (:attr:`Soak.retention_ms` says why).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import struct
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
for folder in (HERE, HERE.parent, HERE.parents[1] / "bench"):  # as a script: helpers needs dafkabench
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

from dafka.metrics import directory_bytes  # noqa: E402  (what dafka_store_db_bytes reports)

TOPIC = "soak"
GROUP = "soakers"
HEADER = struct.Struct(">QQ")  # sequence, send time (ns since the epoch)
SAMPLE_EVERY = 10.0
RETENTION_MS = 120_000  # a run under 30 minutes: retention at work within its first minutes
SPARK_START_TIMEOUT = 300  # seconds for Spark's JVM and its query to come up before the load starts
LONG_RETENTION_MS = 600_000  # longer runs: longer than Spark's first micro-batch can take on 2 busy cores
RETENTION_BYTES = 1024 * 1024 * 1024  # per partition


# -- roles (each runs in a process of its own) -------------------------------------------------------

def _config(args, **extra):
    from dafka.config import Config

    values = {"beacon/address": "127.0.0.1", "beacon/bind_address": "127.0.0.1",
              "beacon/sub_address": args.tower_sub, "beacon/pub_address": args.tower_pub}
    values.update(extra)
    return Config.load(overrides=values)


def _stats_writer(path: str):
    def write(stats: dict) -> None:
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            json.dump(stats, f)
        os.replace(tmp, path)
    return write


def _stopper() -> types.SimpleNamespace:
    flag = types.SimpleNamespace(stop=False)

    def handler(*_):
        flag.stop = True
    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return flag


def role_producer(args) -> None:
    from dafka import Producer

    flag, write = _stopper(), _stats_writer(args.stats)
    producer = Producer(TOPIC, _config(args, **{"producer/min_acks": 2}))
    pad_small = b"." * (100 - HEADER.size)
    pad_big = b"#" * (10_000 - HEADER.size)
    seq = 0
    started = time.monotonic()
    next_stats = started
    while not flag.stop:
        due = int((time.monotonic() - started) * args.rate)
        while seq < due:
            big = args.big_every and seq % args.big_every == 0
            producer.send(HEADER.pack(seq, time.time_ns()) + (pad_big if big else pad_small))
            seq += 1
        now = time.monotonic()
        if now >= next_stats:
            write(dict(producer.stats(), address=producer.address))
            next_stats = now + 1.0
        time.sleep(0.005)
    producer.flush(60)
    write(dict(producer.stats(), address=producer.address, closed=True))
    producer.close()


def role_consumer(args) -> None:
    from dafka import Consumer

    flag, write = _stopper(), _stats_writer(args.stats)
    consumer = Consumer(TOPIC, group=args.group, config=_config(args, **{"consumer/offset/reset": "earliest"}))
    seen: dict[str, list[int]] = {}  # partition -> [first, last]
    # A group member may read a partition in several tenures (a handover away and back while the
    # members' views differ): each tenure is a span, and the check joins the members' spans.
    spans: dict[str, list[list[int]]] = {}
    repeated = lost = delivered = 0
    latencies: list[float] = []
    window = []
    next_stats = time.monotonic()
    next_window = next_stats + SAMPLE_EVERY
    while not flag.stop:
        for record in consumer.consume(5000, timeout=0.2):
            delivered += 1
            span = seen.get(record.partition)
            if span is None:
                seen[record.partition] = [record.offset, record.offset]
                if args.group:
                    spans[record.partition] = [[record.offset, record.offset]]
            elif record.offset == span[1] + 1:
                span[1] = record.offset
                if args.group:
                    spans[record.partition][-1][1] = record.offset
            elif args.group:
                spans[record.partition].append([record.offset, record.offset])  # a new tenure
                span[1] = max(span[1], record.offset)
            elif record.offset <= span[1]:
                repeated += 1
            else:
                lost += record.offset - span[1] - 1
                span[1] = record.offset
            if delivered % 10 == 0:
                latencies.append((time.time_ns() - HEADER.unpack_from(record.value)[1]) / 1e6)
        now = time.monotonic()
        if now >= next_window:
            window = sorted(latencies)
            latencies = []
            next_window = now + SAMPLE_EVERY
        if now >= next_stats:
            lags = consumer.lags()
            write({"delivered": delivered, "repeated": repeated, "lost": lost, "seen": seen, "spans": spans,
                   "lag_max": max(lags.values(), default=0),
                   "p50_ms": window[len(window) // 2] if window else None,
                   "p99_ms": window[int(len(window) * 0.99)] if window else None})
            next_stats = now + 1.0
    consumer.close()
    write({"delivered": delivered, "repeated": repeated, "lost": lost, "seen": seen, "spans": spans,
           "closed": True})


def role_spark(args) -> None:
    os.environ["PYSPARK_PYTHON"] = os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["PYTHONSAFEPATH"] = "1"
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession

    from dafka.spark import register

    flag, write = _stopper(), _stats_writer(args.stats)
    # A driver run for weeks (docs/spark.md): a fixed heap, resident from the start (as Kafka runs its brokers:
    # -Xms = -Xmx), else the JVM's RSS grows in steps for an hour as G1 commits heap up to -Xmx; and Spark's
    # status store (kept without a UI too) bounded, else it keeps the last 1,000 jobs, stages and SQL
    # executions: 16 minutes of 1 s micro-batches, each growing the old generation (74 -> 123 MiB in the
    # first 13 minutes of the 2026-11-27 runs, and the heap committed 181 -> 279 MiB with it).
    spark = (SparkSession.builder.master("local[1]").appName("dafka-soak")
             .config("spark.driver.memory", "512m")
             .config("spark.driver.extraJavaOptions", "-Xms512m -XX:+AlwaysPreTouch")
             .config("spark.ui.retainedJobs", "100").config("spark.ui.retainedStages", "100")
             .config("spark.sql.ui.retainedExecutions", "100")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "1")
             # a trigger that read nothing reports its progress within a second: how the soak knows the
             # query's streaming source is up before it starts the producers
             .config("spark.sql.streaming.noDataProgressEventInterval", "1000").getOrCreate())
    register(spark)
    totals = {"batches": 0, "rows": 0, "last_batch_s": None}

    def batch(df, batch_id) -> None:
        started = time.monotonic()
        totals["rows"] += df.count()
        totals["batches"] += 1
        totals["last_batch_s"] = time.monotonic() - started
        write(totals)

    def start():
        return (spark.readStream.format("dafka").option("topic", TOPIC).option("tower", args.tower_pub)
                .option("towerSub", args.tower_sub).option("startingOffsets", "latest").load()
                .writeStream.foreachBatch(batch).trigger(processingTime="1 second").start())

    query = start()
    while not flag.stop and query.isActive and query.lastProgress is None:
        time.sleep(0.2)  # its first trigger ran: the streaming source's Python worker connected back
    totals["ready"] = query.isActive
    write(totals)
    while not flag.stop:
        if query.isActive:
            time.sleep(0.5)
            continue
        error = query.exception()
        # A query starts its streaming source's Python worker, which must connect back to the JVM within
        # Spark's fixed 10 s.  The soak starts its load only once the query is up (Soak.start), but should
        # the query start again on two cores that 13 busy processes share, it can take longer (seen in
        # CI): that is the machine, not the connector, and nothing was read: start the query again.
        if error is None or "Python worker failed to connect back" not in str(error) or totals.get("restarts", 0) >= 3:
            break
        totals["restarts"] = totals.get("restarts", 0) + 1
        write(totals)
        print(f"soak: the Spark query's Python worker did not connect back in time; restart {totals['restarts']}",
              file=sys.stderr, flush=True)
        query = start()
    if query.isActive:
        query.stop()
    error = query.exception()
    spark.stop()
    if error is not None:
        raise error


ROLES = {"producer": role_producer, "consumer": role_consumer, "spark": role_spark}


# -- the orchestrator ------------------------------------------------------------------------------

def _proc_tree(pid: int) -> list[int]:
    """The process and its descendants.  A child is listed under the thread that started it: the JVM starts
    Spark's Python workers from threads other than its main one (the runs before 2026-11-27 13:50 read only
    the main thread's list, and sampled Spark without them)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            threads = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for thread in threads:
            try:
                with open(f"/proc/{p}/task/{thread}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
            except OSError:
                pass
    return out


def _is_jvm(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip() == "java"
    except OSError:
        return False


def _proc_sample(pids: list[int]) -> dict:
    """RSS (MiB), CPU seconds and open descriptors of processes together."""
    rss = cpu = fds = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            cpu += (int(fields[11]) + int(fields[12])) / tick
            with open(f"/proc/{p}/status") as f:
                rss += next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024
            fds += len(os.listdir(f"/proc/{p}/fd"))
        except (OSError, StopIteration):
            continue
    return {"rss_mib": rss, "cpu_s": cpu, "fds": fds}


def _scrape(port: int) -> dict[str, float]:
    import urllib.request

    out = {}
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("dafka_store_level_bytes"):
                level = line.split('level="', 1)[1].split('"', 1)[0]
                out[f"L{level}"] = float(line.rsplit(" ", 1)[1])
    return out


class Soak:
    def __init__(self, minutes: float, out: Path, rate: int = 20_000, big_every: int = 20) -> None:
        from faultkit import free_port

        self.minutes, self.out, self.rate, self.big_every = minutes, out, rate, big_every
        self.work = Path(tempfile.mkdtemp(prefix="dafka-soak-"))
        self.procs: dict[str, subprocess.Popen] = {}
        self.rows: list[dict] = []
        self.exited: dict[str, int] = {}  # processes that ended before the run did
        self.ports = {f"s{i}": free_port() for i in (1, 2, 3)}
        self.sub_port, self.pub_port = free_port(), free_port()
        self.tower = types.SimpleNamespace(sub_endpoint=f"tcp://127.0.0.1:{self.sub_port}",
                                           pub_endpoint=f"tcp://127.0.0.1:{self.pub_port}")

    def _start(self, name: str, args: list[str]) -> None:
        log = open(self.work / f"{name}.log", "wb")
        self.procs[name] = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def _role(self, name: str, role: str, *extra: str) -> None:
        self._start(name, [sys.executable, str(Path(__file__)), "role", role, "--stats",
                           str(self.work / f"{name}.json"), "--tower-sub", self.tower.sub_endpoint,
                           "--tower-pub", self.tower.pub_endpoint, *extra])

    def stats(self, name: str) -> dict:
        try:
            return json.loads((self.work / f"{name}.json").read_text())
        except (OSError, ValueError):
            return {}

    @property
    def retention_ms(self) -> int:
        """The 60-minute run's first showed why one length does not fit all: Spark took 3 minutes to plan
        and run its first micro-batch on the loaded machine, and the 2 minutes of retention deleted
        records it had planned to read (its query then stops with DataLoss, as Spark's Kafka source does)."""
        return RETENTION_MS if self.minutes < 30 else LONG_RETENTION_MS

    def start(self) -> None:
        self._start("tower", ["dafka_towerd", "--sub", f"tcp://127.0.0.1:{self.sub_port}",
                              "--pub", f"tcp://127.0.0.1:{self.pub_port}"])
        time.sleep(1.0)
        for name, port in self.ports.items():
            self._start(name, ["dafka_stored", "--db", str(self.work / f"{name}.db"), "--pub", self.tower.pub_endpoint,
                               "--sub", self.tower.sub_endpoint, "-X", "beacon/address=127.0.0.1",
                               "--retention-ms", str(self.retention_ms), "--retention-bytes", str(RETENTION_BYTES),
                               "--metrics-port", str(port)])
        time.sleep(2.0)
        for name in ("c1", "c2"):
            self._role(name, "consumer")
        for name in ("g1", "g2"):
            self._role(name, "consumer", "--group", GROUP)
        self._role("spark", "spark")
        # The load starts once Spark's query is up: its streaming source's Python worker must connect back
        # to the JVM within Spark's fixed 10 s, which two cores under the whole cluster's load did not
        # always give it (4 of 4 starts failed on a slow machine, issue 39).
        deadline = time.monotonic() + SPARK_START_TIMEOUT
        while "ready" not in self.stats("spark") and self.procs["spark"].poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        for i, name in enumerate(("p1", "p2", "p3", "p4")):
            self._role(name, "producer", "--rate", str(self.rate // 4),
                       *(["--big-every", str(self.big_every)] if i >= 2 else []))

    def answer_times(self, peer) -> dict[str, float]:
        """Each store reader's GET-HEADS round trip, in ms (one DIRECT-PARTITIONS each)."""
        from dafka import protocol as proto

        peer.pump()
        started = time.monotonic()
        peer.send(proto.GetHeadsMsg(TOPIC, peer.address))
        times: dict[str, float] = {}
        deadline = started + 5.0
        while len(times) < 3 and time.monotonic() < deadline:
            peer.pump()
            if peer.sub.poll(10):
                try:
                    msg = proto.decode(peer.sub.recv_multipart())
                except proto.MalformedMessage:
                    continue
                if type(msg) is proto.DirectPartitionsMsg and msg.address not in times:
                    times[msg.address] = (time.monotonic() - started) * 1000
        return times

    def sample(self, started: float, previous: dict, peer) -> dict:
        row = {"t": time.monotonic() - started, "proc": {}, "stores": {}, "consumers": {}, "producers": {}}
        for name, proc in self.procs.items():
            tree = _proc_tree(proc.pid)
            # A role with its children; Spark's JVM apart from the role and its Python workers (the JVM's
            # children), so that the plot and the check tell which of them grows.
            jvm = [p for p in tree if _is_jvm(p)] if name == "spark" else []
            for part, pids in ((name, [p for p in tree if p not in jvm]), ("spark-jvm", jvm)):
                if not pids:
                    continue
                s = _proc_sample(pids)
                last = previous.get(part)
                # (None once the process is gone: its CPU time reads 0)
                moved = last and s["cpu_s"] >= last["cpu_s"]
                s["cpu_pct"] = 100 * (s["cpu_s"] - last["cpu_s"]) / SAMPLE_EVERY if moved else None
                row["proc"][part] = s
        for name, port in self.ports.items():
            # (not Path.rglob and stat: LevelDB deletes a table as it compacts, which killed a 60-minute run)
            store = {"disk_mib": directory_bytes(str(self.work / f"{name}.db")) / 2**20}
            try:
                store.update(_scrape(port))
            except OSError:
                pass
            row["stores"][name] = store
        row["answer_ms"] = sorted(self.answer_times(peer).values())
        for name in ("c1", "c2", "g1", "g2"):
            s = self.stats(name)
            row["consumers"][name] = {k: s.get(k) for k in ("delivered", "p50_ms", "p99_ms", "lag_max")}
        for name in ("p1", "p2", "p3", "p4"):
            s = self.stats(name)  # what a producer holds until two stores ack it, and FETCH answers in flight
            row["producers"][name] = {k: s.get(k) for k in ("unacked", "buffered_bytes", "inflight_bytes")}
        row["spark"] = self.stats("spark")
        return row

    def run(self) -> dict:
        from dafka import protocol as proto
        from dafka.core.addresses import new_address
        from rawpeer import RawPeer

        self.start()
        address = new_address()
        peer = RawPeer(self.tower, address, [proto.subscription(proto.DIRECT_PARTITIONS, address, exact=True),
                                             proto.subscription(proto.DIRECT_HEAD, address, exact=True)])
        started = time.monotonic()
        previous: dict = {}
        try:
            while time.monotonic() - started < self.minutes * 60:
                time.sleep(max(0.0, started + (len(self.rows) + 1) * SAMPLE_EVERY - time.monotonic()))
                row = self.sample(started, previous, peer)
                previous = row["proc"]
                self.rows.append(row)
                for name, proc in self.procs.items():
                    if proc.poll() is not None and name not in self.exited:
                        self.exited[name] = proc.returncode
                        if name != "spark":
                            raise RuntimeError(f"{name} exited with {proc.returncode}: see {self.work / name}.log")
            return self.finish()
        finally:
            peer.close()
            self.stop_all()

    def stop_all(self) -> None:
        order = ["p1", "p2", "p3", "p4", "c1", "c2", "g1", "g2", "spark", "s1", "s2", "s3", "tower"]
        for name in order:
            proc = self.procs.get(name)
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(90 if name.startswith("p") else 30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            if name == "p4":
                time.sleep(5.0)  # the consumers take the last records

    def finish(self) -> dict:
        for name in ("p1", "p2", "p3", "p4"):
            self.procs[name].send_signal(signal.SIGTERM)
        for name in ("p1", "p2", "p3", "p4"):
            self.procs[name].wait(90)
        time.sleep(10.0)  # the consumers take the last records
        for name in ("c1", "c2", "g1", "g2"):
            self.procs[name].send_signal(signal.SIGTERM)
            self.procs[name].wait(30)
        return check(self)


def _window(rows: list[dict], start_s: float, end_s: float) -> list[dict]:
    return [r for r in rows if start_s <= r["t"] < end_s]


def group_anomalies(heads: dict[str, int], members: list[dict[str, list[list[int]]]]) -> list[str]:
    """What a consumer group lost or delivered twice: ``members`` holds each member's tenures
    (partition -> [[first, last], ...]), which together must cover every partition once, up to its head."""
    failures = []
    for partition, head in heads.items():
        # every tenure of every member: together they must cover the partition once, in order
        spans = sorted(tuple(span) for spans_of in members for span in spans_of.get(partition, ()))
        covered = -1
        for first, last in spans:
            if first > covered + 1:
                failures.append(f"group lost {partition} {covered + 1}..{first - 1}")
            if first <= covered:
                failures.append(f"group repeated {partition} {first}..{min(covered, last)}")
            covered = max(covered, last)
        if covered < head:
            failures.append(f"group lacks {partition} after {covered} (head {head})")
    return failures


def check(soak: Soak) -> dict:
    """The pass criteria; ``failures`` lists those that failed."""
    rows, total = soak.rows, soak.minutes * 60
    # An hour: the 10 minutes after the stores' retention window has filled and 5 more minutes (minutes
    # 15-25) against the last 10.  A store's RSS follows its database (LevelDB maps its tables), which grows
    # until retention deletes as much as comes (the 60-minute run of 2026-11-27: 93-99 MiB at 60-100 MiB on
    # disk in minutes 5-10, then 104-148 MiB at 110-175 MiB from minute 12 to 60, with no trend; judged
    # from minute 5, its stores "grew" 15-25 %).  A shorter run (CI's 5 minutes) warms up for half of it
    # (retention starts at 2 minutes), then compares its halves.
    if total >= 3600:
        warm = max(300.0, soak.retention_ms / 1000 + 300)
        early_window, late_window = (warm, warm + 600), (total - 600, total + 1)
    else:
        warm = total / 2
        early_window, late_window = (warm, warm + warm / 2), (total - warm / 2, total + 1)
    failures = []
    heads = {}
    for name in ("p1", "p2", "p3", "p4"):
        s = soak.stats(name)
        heads[s["address"]] = s["acked"] - 1  # every record up to it acked by two stores
    consumers = {}
    for name in ("c1", "c2"):
        s = soak.stats(name)
        consumers[name] = s
        for partition, head in heads.items():
            span = s["seen"].get(partition)
            if span is None or span[0] != 0 or span[1] < head:
                failures.append(f"{name} lacks records of {partition}: got {span}, head {head}")
        if s["lost"] or s["repeated"]:
            failures.append(f"{name}: {s['lost']} lost, {s['repeated']} repeated")
    group = [soak.stats("g1"), soak.stats("g2")]
    failures += group_anomalies(heads, [g.get("spans", {}) for g in group])
    after5 = _window(rows, warm, total + 1)
    growth = {}

    def mean_rss(name: str, window: tuple[float, float]) -> float | None:
        values = [r["proc"][name]["rss_mib"] for r in _window(rows, *window) if name in r["proc"]]
        return sum(values) / len(values) if values else None

    for name in dict.fromkeys(name for r in rows for name in r["proc"]):
        series = [r["proc"][name]["rss_mib"] for r in after5 if name in r["proc"]]
        early_rss, late_rss = mean_rss(name, early_window), mean_rss(name, late_window)
        if series and early_rss is not None and late_rss is not None:
            # the mean RSS of the first and of the last window, and the highest sample in between
            growth[name] = (round(early_rss), round(late_rss), round(max(series)))
        # Growth is the trend, the mean of the last 10 minutes against the early window: a compaction's
        # mapped tables make spikes of tens of MiB that the plot shows and that pass.  Only an hour shows
        # a steady state: in 5 minutes the stores still fill their retention window and Spark's JVM its
        # heap, so a shorter run reports the growth (rss_growth) without judging it.
        if total >= 3600 and name in growth and late_rss > 1.10 * early_rss + 2:  # 2 MiB: a small process's noise
            failures.append(f"{name} RSS grew {early_rss:.0f} -> {late_rss:.0f} MiB (minutes "
                            f"{early_window[0] / 60:g}-{early_window[1] / 60:g} against the last 10)")
        # Descriptors leak when their floor rises: the fewest a process held in the first and in the second
        # half of the measured time.  A single sample catches what is open for a moment, such as a Spark
        # task's peer, its ZeroMQ context and a connection to every peer (+171 in one CI run).
        fds = [r["proc"][name]["fds"] for r in after5 if name in r["proc"]]
        if len(fds) >= 2:
            half = len(fds) // 2
            floor_early, floor_late = min(fds[:half]), min(fds[half:])
            if floor_late > 1.10 * floor_early + 16:
                failures.append(f"{name} descriptors {floor_early:.0f} -> {floor_late:.0f} (the fewest held in "
                                "each half of the measured time)")

    def p99(window):
        values = [c["p99_ms"] for r in window for c in r["consumers"].values() if c.get("p99_ms") is not None]
        return sorted(values)[len(values) // 2] if values else None
    early, late = p99(_window(rows, *early_window)), p99(_window(rows, *late_window))
    # A short run's halves are 75 s each, on a CI machine whose two cores the 13 processes and Spark keep
    # busy: there a p99 follows the machine's load more than the cluster's state (CI, alone in the serial
    # phase, 2026-12-02: 147 ms early, 331 ms late; the same code here 41 and 57 ms).  It may grow by
    # 100 ms beyond the double; the hour's run judges the double alone.
    slack_ms = 0.0 if total >= 3600 else 100.0
    if early is None or late is None or late > 2 * max(early, 1.0) + slack_ms:
        failures.append(f"p99 latency: {early} ms early (from {early_window[0]:.0f} s), {late} ms late")
    # Retention: 2 partitions of at most RETENTION_BYTES of contents each... plus what LevelDB has not compacted away.
    bound_mib = 4 * RETENTION_BYTES / 2**20 * 2
    for r in rows:
        for name, store in r["stores"].items():
            if store["disk_mib"] > bound_mib:
                failures.append(f"{name} disk {store['disk_mib']:.0f} MiB at {r['t']:.0f} s > {bound_mib:.0f} MiB")
                break
    if "spark" in soak.exited:
        lines = (soak.work / "spark.log").read_text(errors="replace").strip().splitlines()
        # the Python error that ended it (the log ends with Java's stack)
        errors = [line for line in lines if re.match(r"[\w.]+(Error|Exception|Loss): ", line)]
        failures.append(f"the Spark query ended early ({soak.exited['spark']}): {(errors or lines or [''])[-1][:300]}")
    result = {"minutes": soak.minutes, "rows": rows, "failures": failures, "heads": heads, "rss_growth": growth,
              "delivered": {n: s.get("delivered") for n, s in consumers.items()},
              "group_delivered": sum(g.get("delivered", 0) for g in group), "spark": soak.stats("spark"),
              "p99_early_ms": early, "p99_late_ms": late, "work": str(soak.work)}
    soak.out.mkdir(parents=True, exist_ok=True)
    (soak.out / "soak.json").write_text(json.dumps(result, indent=1))
    plot(rows, soak.out / "soak.png")
    return result


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [r["t"] / 60 for r in rows]
    fig, axes = plt.subplots(5, 2, figsize=(14, 20), sharex=True)
    names = list(dict.fromkeys(name for r in rows for name in r["proc"]))
    for ax, key, title in ((axes[0][0], "rss_mib", "RSS (MiB)"), (axes[0][1], "cpu_pct", "CPU (% of a core)"),
                           (axes[1][0], "fds", "open descriptors")):
        for name in names:
            ax.plot(t, [r["proc"].get(name, {}).get(key) for r in rows], label=name)
        ax.set_title(title)
    axes[0][0].legend(fontsize=7, ncol=3)
    ax = axes[1][1]
    for name in ("c1", "c2", "g1", "g2"):
        ax.plot(t, [r["consumers"][name]["p99_ms"] for r in rows], label=f"{name} p99")
        ax.plot(t, [r["consumers"][name]["p50_ms"] for r in rows], ":", label=f"{name} p50")
    ax.set_title("end-to-end latency (ms)")
    ax.set_yscale("log")
    ax.legend(fontsize=7, ncol=2)
    ax = axes[2][0]
    for name in ("s1", "s2", "s3"):
        ax.plot(t, [r["stores"][name]["disk_mib"] for r in rows], label=name)
    ax.set_title("store disk use (MiB)")
    ax.legend(fontsize=7)
    ax = axes[2][1]
    for name in ("s1", "s2", "s3"):
        for level in ("L0", "L1", "L2", "L3"):
            ax.plot(t, [r["stores"][name].get(level, 0) / 2**20 for r in rows], label=f"{name} {level}")
    ax.set_title("LevelDB level sizes (MiB): a growing L0 is a compaction stall")
    ax.legend(fontsize=6, ncol=3)
    ax = axes[3][0]
    for name in ("c1", "c2", "g1", "g2"):
        ax.plot(t, [r["consumers"][name]["lag_max"] for r in rows], label=name)
    ax.set_title("consumer lag (records)")
    ax.legend(fontsize=7)
    ax = axes[3][1]
    ax.plot(t, [max(r["answer_ms"], default=None) for r in rows], label="slowest store")
    ax.plot(t, [min(r["answer_ms"], default=None) for r in rows], label="fastest store")
    ax.set_title("store answer time, GET-HEADS round trip (ms)")
    ax.legend(fontsize=7)
    ax = axes[4][0]
    for name in ("p1", "p2", "p3", "p4"):
        ax.plot(t, [(r.get("producers", {}).get(name, {}).get("buffered_bytes") or 0) / 2**20 for r in rows],
                label=name)
    ax.set_title("records a producer holds until two stores ack them (MiB)")
    ax.legend(fontsize=7)
    ax = axes[4][1]
    ax.plot(t, [r["spark"].get("rows") for r in rows], label="rows")
    ax.set_title("Spark: rows its micro-batches read")
    ax.legend(fontsize=7)
    for ax in axes[4]:
        ax.set_xlabel("minutes")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command")
    role = sub.add_parser("role")
    role.add_argument("role", choices=sorted(ROLES))
    role.add_argument("--stats", required=True)
    role.add_argument("--tower-sub", required=True)
    role.add_argument("--tower-pub", required=True)
    role.add_argument("--rate", type=int, default=5000)
    role.add_argument("--big-every", type=int, default=0, help="one record in this many is 10 KB (0: none)")
    role.add_argument("--group")
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--rate", type=int, default=20_000, help="records a second, all producers together")
    parser.add_argument("--big-every", type=int, default=20,
                        help="in two of the four producers, one record in this many is 10 KB (the rest 100 B)")
    parser.add_argument("--out", type=Path, default=Path("soak-out"))
    args = parser.parse_args(argv)
    if args.command == "role":
        ROLES[args.role](args)
        return 0
    result = Soak(args.minutes, args.out, args.rate, args.big_every).run()
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=1))
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
