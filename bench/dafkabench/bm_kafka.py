"""The Kafka gateway scenario of bench/run.py: `dafka kafka` against the native path, in the same run.

Per record size, on one cluster (a tower, a store process):

* **native**: run.py's producer role -> the store (``min_acks`` 1), then its
  consumer role reading the partition back from the store;
* **through the gateway**: confluent-kafka (librdkafka) producing the same
  records to the gateway (``acks=all``, ``linger.ms`` 5, idempotence on),
  then a confluent-kafka consumer reading them from offset 0, and run.py's
  consumer role reading those same records: a Kafka record has a timestamp,
  which a store keeps in an entry of its own, so this row is what the stores
  serve of them without the gateway;
* **latency**: a confluent-kafka producer paced at ``--kafka-rate`` records/s
  stamps each record, a confluent-kafka consumer at the end takes the
  difference (p50, p99, after the first second); once at librdkafka's default
  ``linger.ms`` (5 ms), once at 0 (a Produce request a record);
* **rebalance**: three confluent-kafka members of a group, stable; one
  leaves, and the time until both others have their new assignment;
* **failover**: two gateways, an idempotent producer and a group member at
  2,000 records/s; the group's coordinator SIGKILLed: the seconds to the
  first ack of a record produced after the kill to a partition it led, and
  to the group's first record after its rebalance;
* **secured**: produce and fetch again through a second gateway over TLS
  with SASL/SCRAM-SHA-512 (a self-signed certificate made by openssl), the
  ratio to the plain gateway's rates of the same run.

Each rate is printed beside the same run's raw pyzmq ceiling and the native
rate, as ratios, with the CPU per record of the gateway and of the client,
and the gateway's peak RSS.  The clients run in their own Python, from a
temporary folder: the checkout's top-level ``kafka/`` would shadow
kafka-python's package otherwise.  Without confluent-kafka the scenario says
so and is skipped.

Run alone: ``python3 bench/run.py --only kafka`` (see run.py's --help).
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
from pathlib import Path
from .cluster import Cluster, ScenarioFailed, ceiling, result_of
from .common import proc_cpu_seconds, RssSampler, rate_of

SERVING = re.compile(r"serving Kafka on ([0-9.]+):(\d+)")
TIMEOUT = 300.0  # seconds one client may take
WARM_RECORDS = 1000  # produced before the measured run (each PRODUCE client also sends one record first)

PRODUCE = """
import json, os, sys, time
import confluent_kafka
bootstrap, topic, n, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
security = json.loads(sys.argv[5]) if len(sys.argv) > 5 else {}
failed = []
p = confluent_kafka.Producer({**security, "bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
                              "enable.idempotence": True, "queue.buffering.max.messages": 1000000,
                              # a report for each failed record alone: no Python call a record delivered
                              "delivery.report.only.error": True, "on_delivery": lambda e, m: failed.append(str(e))})
value = b"x" * size
p.produce(topic, value, partition=0)
p.flush(30)
start, cpu = time.perf_counter(), time.process_time()
sent = 0
while sent < n:  # the client's batch call (produce_batch), as run.py's producer role sends its batches
    batch = [{"value": value} for _ in range(min(1000, n - sent))]
    while batch:
        queued = p.produce_batch(topic, batch, partition=0)
        sent += queued
        batch = [m for m in batch if "_error" in m]  # (the queue full: these again once it drained)
        for m in batch:
            del m["_error"]
        p.poll(0.001 if batch else 0)
left = p.flush(120)
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "left": left, "failed": len(failed),
                  "cpu_us": (time.process_time() - cpu) / n * 1e6}))
"""

CONSUME = """
import json, sys, time
import confluent_kafka
bootstrap, topic, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
security = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
c = confluent_kafka.Consumer({**security, "bootstrap.servers": bootstrap, "group.id": "bench", "enable.auto.commit": False,
                              "fetch.max.bytes": 52428800})
c.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
got, first, last, cpu, deadline = 0, None, None, time.process_time(), time.monotonic() + 120
while got < n and time.monotonic() < deadline:
    for m in c.consume(min(10000, n - got), 0.5):
        if m.error() is None:
            got += 1
            last = time.perf_counter()
            if first is None:
                first = last
seconds = (last or 0.0) - (first or 0.0)  # the first record to the last (not the wait after it)
c.close()
print(json.dumps({"received": got, "seconds": seconds, "cpu_us": (time.process_time() - cpu) / max(got, 1) * 1e6}))
"""

LATENCY = """
import json, struct, sys, threading, time
import confluent_kafka
bootstrap, topic, rate, seconds, linger = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
c = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": "lat", "enable.auto.commit": False,
                              "fetch.wait.max.ms": 100})
p = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all",
                              **({} if linger == "default" else {"linger.ms": int(linger)})})
p.produce(topic, b"warm", partition=0)
p.flush(30)
# from the partition's end as it is now: OFFSET_END would be resolved later, past the first records sent
low, high = c.get_watermark_offsets(confluent_kafka.TopicPartition(topic, 0), 10)
c.assign([confluent_kafka.TopicPartition(topic, 0, high)])
c.consume(1, 1.0)
n = int(rate * seconds)

def send():
    start = time.perf_counter()
    for i in range(n):
        while time.perf_counter() < start + i / rate:
            time.sleep(0.0002)
        p.produce(topic, struct.pack(">d", time.time()) + b"x" * 92, partition=0)
        p.poll(0)
    p.flush(30)

sender = threading.Thread(target=send)
sender.start()
lat, deadline = [], time.monotonic() + seconds + 30
while len(lat) < n and time.monotonic() < deadline:
    m = c.poll(0.2)  # (consume(n, timeout) would hold what came until n or the timeout)
    if m is not None and m.error() is None and len(m.value()) == 100:
        lat.append((time.time() - struct.unpack(">d", m.value()[:8])[0]) * 1000)
sender.join()
c.close()
kept = sorted(lat[rate:] or lat)
print(json.dumps({"received": len(lat), "sent": n, "p50_ms": kept[len(kept) // 2] if kept else None,
                  "p99_ms": kept[int(len(kept) * 0.99)] if kept else None}))
"""

REBALANCE = """
import json, sys, time
import confluent_kafka
bootstrap, topic = sys.argv[1], sys.argv[2]
creator = confluent_kafka.Producer({"bootstrap.servers": bootstrap})  # consumers do not create topics
creator.produce(topic, b"x")
creator.flush(30)
owned, changed = [set(), set(), set()], [0.0, 0.0, 0.0]

def member(i):
    def assign(consumer, partitions):
        owned[i] |= {p.partition for p in partitions}
        changed[i] = time.perf_counter()

    def revoke(consumer, partitions):
        owned[i] -= {p.partition for p in partitions}
        changed[i] = time.perf_counter()

    c = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": "rebalance",
                                  "partition.assignment.strategy": "cooperative-sticky",
                                  "heartbeat.interval.ms": 200, "session.timeout.ms": 6000})
    c.subscribe([topic], on_assign=assign, on_revoke=revoke)
    return c

members = [member(i) for i in range(3)]
deadline = time.monotonic() + 60
while time.monotonic() < deadline and not (all(owned) and sum(map(len, owned)) == 6):
    for m in members:
        m.poll(0.05)
stable = all(owned) and sum(map(len, owned)) == 6
left = time.perf_counter()
members[2].close()
while time.monotonic() < deadline and len(owned[0] | owned[1]) < 6:
    for m in members[:2]:
        m.poll(0.01)
ok = stable and len(owned[0] | owned[1]) == 6
for m in members[:2]:
    m.close()
print(json.dumps({"stable": stable, "ok": ok, "seconds": max(changed[:2]) - left if ok else None}))
"""


FAILOVER = """
import json, os, signal, struct, sys, threading, time
import confluent_kafka
bootstrap, topic, victim_pid, victim_node, group = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
rate, partitions = 2000, 4
p = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                              "linger.ms": 5, "topic.metadata.refresh.interval.ms": 1000})
c = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": True,
                              "auto.offset.reset": "earliest", "session.timeout.ms": 6000,
                              "heartbeat.interval.ms": 500, "topic.metadata.refresh.interval.ms": 1000})
state = {"killed": None, "victim": set(), "acked": None, "assigned": None, "read": None, "failed": 0}
stop = threading.Event()

def delivered(err, msg):
    if err is not None:
        state["failed"] += 1
        return
    sent = struct.unpack(">d", msg.value()[:8])[0]
    killed = state["killed"]
    if killed is not None and sent > killed and msg.partition() in state["victim"] and state["acked"] is None:
        state["acked"] = time.monotonic() - killed

def produce():
    i, start = 0, time.monotonic()
    while not stop.is_set():
        if i / rate > time.monotonic() - start:
            p.poll(0.001)
            continue
        p.produce(topic, struct.pack(">d", time.monotonic()) + b"x" * 92, partition=i % partitions,
                  on_delivery=delivered)
        p.poll(0)
        i += 1
    p.flush(60)

def assigned(consumer, parts):
    if state["killed"] is not None and state["assigned"] is None:
        state["assigned"] = time.monotonic()

thread = threading.Thread(target=produce)
thread.start()
c.subscribe([topic], on_assign=assigned)
deadline, steady = time.monotonic() + 60, None
while time.monotonic() < deadline and (steady is None or time.monotonic() < steady + 3):
    if c.consume(1000, 0.1) and steady is None:
        steady = time.monotonic()
deadline = time.monotonic() + 60  # (both gateways in the metadata, each leading some partitions: a loaded
while True:                        # machine's gateways may not have heard each other yet)
    meta = p.list_topics(topic, 30)
    state["victim"] = {i for i, part in meta.topics[topic].partitions.items() if part.leader == victim_node}
    if (state["victim"] and len(meta.brokers) == 2) or time.monotonic() > deadline:
        break
    time.sleep(0.5)
state["killed"] = time.monotonic()
os.kill(victim_pid, signal.SIGKILL)
deadline = time.monotonic() + 90
while time.monotonic() < deadline and (state["read"] is None or state["acked"] is None):
    for m in c.consume(1000, 0.1):
        if m.error() is None and state["assigned"] is not None and state["read"] is None:
            state["read"] = time.monotonic() - state["killed"]
stop.set()
thread.join()
c.close()
print(json.dumps({"produce_s": state["acked"], "group_s": state["read"], "victim_partitions": len(state["victim"]),
                  "failed": state["failed"]}))
"""


def available() -> bool:
    try:
        import confluent_kafka  # noqa: F401
    except ImportError:
        return False
    return True


def _client(code: str, cwd: str, *args: object) -> dict:
    proc = subprocess.run([sys.executable, "-c", code, *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          timeout=TIMEOUT)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"a Kafka client failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}")
    return json.loads(lines[-1])


class Gateway:
    """`dafka kafka --port 0` on a run.py Cluster's tower, with its CPU and RSS."""

    def __init__(self, cluster, log: Path, partitions: int = 1, *args: str) -> None:
        dafka = shutil.which("dafka", path=os.path.dirname(sys.executable)) or shutil.which("dafka")
        if dafka is None:
            raise RuntimeError("the dafka command is not installed: pip install .")
        self.log = log
        with open(log, "w") as out:
            self.proc = subprocess.Popen([dafka, "kafka", "--port", "0", "--num-partitions", str(partitions),
                                          "--sub", cluster.tower.sub_endpoint, "--pub", cluster.tower.pub_endpoint,
                                          *args],
                                         stdout=out, stderr=out)
        deadline = time.monotonic() + 60  # (a loaded machine: the parallel suite saw load averages of 15)
        while time.monotonic() < deadline:
            found = SERVING.findall(log.read_text())
            if found:
                self.bootstrap = "%s:%s" % found[-1]
                break
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        else:
            found = []
        if not found:
            self.close()
            raise RuntimeError(f"the gateway did not start: {log.read_text()[-500:]}")
        self.rss = RssSampler(self.proc.pid)

    def cpu(self) -> float:
        return proc_cpu_seconds(self.proc.pid)

    def close(self) -> None:
        if getattr(self, "rss", None) is not None:
            self.rss.stop()
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _through(gateway: Gateway, topic: str, records: int, size: int, work: str,
             security: dict | None = None) -> tuple[dict, dict]:
    """confluent-kafka producing ``records`` to ``topic`` through ``gateway``, then reading them from 0: the
    rates, and the CPU a record of the client and of the gateway. The topic is made and its producer resumed
    first, so that the gateway's CPU is the records' alone."""
    extra = (json.dumps(security),) if security else ()
    _client(PRODUCE, work, gateway.bootstrap, topic, WARM_RECORDS, size, *extra)
    before = gateway.cpu()
    produced = _client(PRODUCE, work, gateway.bootstrap, topic, records, size, *extra)
    produce = {"rate": records / produced["seconds"], "client_cpu_us": produced["cpu_us"],
               "gateway_cpu_us": (gateway.cpu() - before) / records * 1e6, "failed": produced["failed"] + produced["left"]}
    before = gateway.cpu()
    consumed = _client(CONSUME, work, gateway.bootstrap, topic, records + 2 + WARM_RECORDS, *extra)
    consume = {"rate": consumed["received"] / consumed["seconds"] if consumed["seconds"] else 0.0,
               "received": consumed["received"], "client_cpu_us": consumed["cpu_us"],
               "gateway_cpu_us": (gateway.cpu() - before) / max(consumed["received"], 1) * 1e6}
    return produce, consume


def _secured_gateway(cluster, work: Path) -> tuple[Gateway, dict] | str:
    """A gateway over TLS with SASL/SCRAM-SHA-512 (a self-signed certificate made by openssl, one user),
    and the client settings that reach it; or why there is none."""
    if shutil.which("openssl") is None:
        return "no openssl to make a certificate"
    cert, key, users = work / "gateway.pem", work / "gateway.key", work / "users.json"
    made = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                           "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key),
                           "-out", str(cert)], capture_output=True, timeout=60)
    if made.returncode != 0:
        return f"openssl could not make a certificate: {made.stderr.decode(errors='replace')[-200:]}"
    dafka = shutil.which("dafka", path=os.path.dirname(sys.executable)) or shutil.which("dafka") or "dafka"
    subprocess.run([dafka, "kafka-user", "add", "bench", "--file", str(users), "--password-stdin"],
                   input=b"bench-password\n", capture_output=True, timeout=60, check=True)
    gateway = Gateway(cluster, work / "gateway-tls.log", 1, "--tls-cert", str(cert), "--tls-key", str(key),
                      "--sasl-users", str(users), "--sasl-mechanisms", "SCRAM-SHA-512")
    return gateway, {"security.protocol": "sasl_ssl", "ssl.ca.location": str(cert), "sasl.mechanisms": "SCRAM-SHA-512",
                     "sasl.username": "bench", "sasl.password": "bench-password"}


def failover(cluster, work: Path) -> dict:
    """Two gateways, four partitions, an idempotent confluent-kafka producer at 2,000 records/s and a group
    member; the gateway that coordinates the group (and leads some partitions) SIGKILLed: the seconds from
    the kill to the first ack of a record produced after it to a partition the dead one led, and to the
    group's first record after it was assigned its partitions again."""
    group = next(name for name in (f"failover-{i}" for i in range(100)) if _leader_of_two(name) == 1)
    gateways = [Gateway(cluster, work / f"gateway-failover-{node}.log", 4, "--node-id", str(node))
                for node in (1, 2)]
    try:
        time.sleep(2.0)  # each hears the other
        bootstrap = ",".join(g.bootstrap for g in gateways)
        try:
            return _client(FAILOVER, str(work), bootstrap, "bench-failover", gateways[0].proc.pid, 1, group)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            tails = "".join(f"\n-- gateway {i + 1}'s log ends:\n{g.log.read_text()[-1500:]}" for i, g in enumerate(gateways))
            raise RuntimeError(f"{exc}{tails}") from exc
    finally:
        for gateway in gateways:
            gateway.close()


def _leader_of_two(group: str) -> int:
    """The node id, of gateways 1 and 2, that coordinates ``group`` (the gateways' own hashing)."""
    from dafka.kafka.gateways import Gateways, Node, group_key

    view = Gateways(Node(1, "h", 1))
    view.on_announcement(Node(2, "h", 2), False, 0.0)
    return view.leader(group_key(group)).node_id


def run_size(records: int, size: int, rate: int, latency_seconds: float, out: dict) -> dict:
    """Fills ``out`` as it goes: a part that fails leaves the others' figures."""
    out.update(size=size, records=records)
    out["ceiling"] = ceiling(records, size)["rate"]
    cluster = Cluster()
    db = tempfile.mkdtemp(prefix="dafka-bench-kafka-")
    work = tempfile.mkdtemp(prefix="dafka-bench-kafka-clients-")
    gateway = None
    try:
        store = cluster.store(db)
        time.sleep(1.0)
        p = result_of(cluster.spawn("producer", "--records", str(records), "--size", str(size), "--min-acks", "1"))
        out["native_produce"] = {"rate": records / p["ack_seconds"], "cpu_us": p.get("cpu_us")}
        r = result_of(cluster.spawn("consumer", "--records", str(records), "--size", str(size),
                                        "--reset", "earliest"))
        out["native_catchup"] = {"rate": rate_of(r), "cpu_us": r.get("cpu_us")}
        gateway = Gateway(cluster, Path(work) / "gateway.log")
        out["kafka_produce"], out["kafka_consume"] = _through(gateway, f"bench-{size}", records, size, work)
        out["gateway_rss_mib"] = gateway.rss.peak
        # the same records read by a dafka-py consumer: what a store serves of records with timestamps (a
        # Kafka producer's), an entry more a record in LevelDB, with no gateway on the way
        r = result_of(cluster.spawn("consumer", "--records", str(records + WARM_RECORDS + 2), "--size", str(size),
                                    "--reset", "earliest", "--topic", f"bench-{size}"))
        out["native_catchup_kafka_records"] = {"rate": rate_of(r), "cpu_us": r.get("cpu_us")}
        if latency_seconds > 0 and size == 100:
            # librdkafka's default linger.ms (5 ms since 1.5, as the Java client's since 4.0), then 0: a Produce
            # request a record, what the gateway's cost a request bounds
            for name, linger in (("latency", "default"), ("latency_linger_0", "0")):
                before = gateway.cpu()
                out[name] = _client(LATENCY, work, gateway.bootstrap, "bench-latency", rate, latency_seconds, linger)
                out[name].update(rate=rate, gateway_cpu_us=(gateway.cpu() - before) / max(out[name]["received"], 1) * 1e6)
            gateway.close()
            gateway = Gateway(cluster, Path(work) / "gateway-6.log", partitions=6)
            out["rebalance"] = _client(REBALANCE, work, gateway.bootstrap, "bench-rebalance")
            gateway.close()
            gateway = None
            try:  # (a part that fails says why; the secured part still runs)
                out["failover"] = failover(cluster, Path(work))
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                out["failover"] = {"error": str(exc)[-4000:]}
        if gateway is not None:
            gateway.close()
        gateway = None
        secured = _secured_gateway(cluster, Path(work))
        if isinstance(secured, str):
            out["secured"] = {"skipped": secured}
        else:
            gateway, security = secured
            produce, consume = _through(gateway, f"bench-tls-{size}", records, size, work, security)
            out["secured"] = {"produce": produce, "consume": consume}
        cluster.stop_store(store)
        return out
    finally:
        if gateway is not None:
            gateway.close()
        cluster.close()
        shutil.rmtree(db, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


def report(results: list[dict]) -> list[str]:
    lines = ["", "== Kafka gateway (confluent-kafka through `dafka kafka`, against the native path, same run) =="]
    for r in results:
        if "error" in r:
            lines.append(f"  {r['size']} B: did not finish: {r['error']}")
        if "kafka_consume" not in r:
            continue
        ceiling_rate = r["ceiling"]
        np_, nc = r["native_produce"], r["native_catchup"]
        kp, kc = r["kafka_produce"], r["kafka_consume"]

        def row(name: str, rate: float, native: float, cpu: str) -> str:
            return (f"  {r['size']:>5} B  {name:<28} {rate:>10,.0f}/s  {rate / ceiling_rate:5.2f}x ceiling  "
                    f"{rate / native if native else 0:5.2f}x native  {cpu}")

        lines.append(row("native producer -> store", np_["rate"], np_["rate"], f"producer {np_['cpu_us']:.2f} us"))
        lines.append(row("kafka producer -> store", kp["rate"], np_["rate"],
                         f"gateway {kp['gateway_cpu_us']:.2f} us, client {kp['client_cpu_us']:.2f} us"
                         + (f", {kp['failed']} FAILED" if kp["failed"] else "")))
        lines.append(row("native catch-up", nc["rate"], nc["rate"], f"consumer {nc['cpu_us']:.2f} us"))
        lines.append(row("kafka consumer from 0", kc["rate"], nc["rate"],
                         f"gateway {kc['gateway_cpu_us']:.2f} us, client {kc['client_cpu_us']:.2f} us"
                         + ("" if kc["received"] >= r["records"] else f", ONLY {kc['received']:,} RECEIVED")))
        same = r.get("native_catchup_kafka_records")
        if same:
            lines.append(row("native catch-up, kafka records", same["rate"], nc["rate"],
                             f"consumer {same['cpu_us']:.2f} us; the kafka consumer {kc['rate'] / same['rate']:.2f}x it"))
        lines.append(f"  {r['size']:>5} B  gateway peak RSS {r['gateway_rss_mib']:.0f} MiB; raw ceiling {ceiling_rate:,.0f}/s")
        sec = r.get("secured", {})
        if "skipped" in sec:
            lines.append(f"  {r['size']:>5} B  over TLS with SASL/SCRAM: skipped ({sec['skipped']})")
        elif "consume" in sec:
            sp, sc = sec["produce"], sec["consume"]
            lines.append(row("kafka producer, TLS + SCRAM", sp["rate"], np_["rate"],
                             f"{sp['rate'] / kp['rate']:.2f}x plain; gateway {sp['gateway_cpu_us']:.2f} us, "
                             f"client {sp['client_cpu_us']:.2f} us"))
            lines.append(row("kafka consumer, TLS + SCRAM", sc["rate"], nc["rate"],
                             f"{sc['rate'] / kc['rate'] if kc['rate'] else 0:.2f}x plain; gateway "
                             f"{sc['gateway_cpu_us']:.2f} us, client {sc['client_cpu_us']:.2f} us"))
        for name, linger in (("latency", "librdkafka's default linger.ms"), ("latency_linger_0", "linger.ms 0")):
            if name in r:
                lat = r[name]
                lines.append(f"  produce-to-consume, {lat['sent']:,} records at {lat['rate']:,}/s, {linger}: "
                             f"p50 {lat['p50_ms']:.1f} ms, p99 {lat['p99_ms']:.1f} ms ({lat['received']:,} received; "
                             f"gateway {lat['gateway_cpu_us']:.1f} us a record)")
        if "rebalance" in r:
            rb = r["rebalance"]
            lines.append("  3-member group, one leaves: " + (f"rebalanced in {rb['seconds'] * 1000:.0f} ms"
                                                              if rb["ok"] else "DID NOT REBALANCE"))
        if "error" in r.get("failover", {}):
            lines.append(f"  two gateways, the group's coordinator SIGKILLed: did not finish: {r['failover']['error']}")
        elif "failover" in r:
            fo = r["failover"]

            def seconds(value: float | None) -> str:
                return "NEVER" if value is None else f"{value:.1f} s"
            lines.append(f"  two gateways, the group's coordinator SIGKILLed: first ack on the other "
                         f"{seconds(fo['produce_s'])} (of {fo['victim_partitions']} partitions it led), the group's "
                         f"first record after its rebalance {seconds(fo['group_s'])}"
                         + (f", {fo['failed']} records FAILED" if fo["failed"] else ""))
    return lines


def run_all(records: int, sizes: list[int], rate: int = 10_000,
            latency_seconds: float = 10.0) -> dict:
    if not available():
        print("\n== Kafka gateway: skipped (no confluent-kafka: pip install '.[test]') ==")
        return {}
    results = []
    for size in sizes:
        out: dict = {}
        results.append(out)
        try:
            run_size(records, size, rate, latency_seconds, out)
        except (RuntimeError, subprocess.TimeoutExpired, ScenarioFailed) as exc:
            out.update(size=size, error=str(exc)[-300:])
    for line in report(results):
        print(line)
    return {"kafka": results}
