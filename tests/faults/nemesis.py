"""A randomized nemesis run against a whole cluster, Jepsen style.

Two "hosts" joined by a link the nemesis controls (:class:`LossyProxy`
between two towers, as fault scenario 5): host A holds a tower process, three
stores (``producer/min_acks = 2``), four producers and consumer ``c1``, which
is SIGKILLed and restarted now and then with its offsets file; host B holds
an in-process tower and consumer ``c2``.  A seeded schedule of overlapping
faults runs against them:

* ``kill``: SIGKILL any role (a tower, a store, a producer, c1), restarted
  1-4 s later (a producer as a new partition: its unacked records may be lost);
* ``stop``: SIGSTOP any process, SIGCONT 1-5 s later;
* ``partition``: the link drops every message both ways for 2-10 s;
* ``lossy``: the link drops 10 % and duplicates 10 % of the messages for 3-10 s;
* ``disk``: a store's writes fail with "No space left on device" for 2-8 s;
* ``wipe``: a store is SIGKILLed, its database deleted, and it restarts empty
  and refills from the producers and its peer stores.

With ``kafka``, host A also runs two ``dafka kafka`` gateways (``g1``, ``g2``),
an idempotent confluent-kafka producer bootstrapped with both and a group of
two members (``m1``, ``m2``); ``kill`` and ``stop`` (unless ``gateway_stops``
is off) then take the gateways too, one at a time, and the checker reads the Kafka producer's logs against the
group's deliveries (every acked record, at least once: a member may read again
what a refused commit left) and against a reader of the whole topic at the end
(every acked record exactly once, in order: an idempotent producer stores none
twice).

At most one store is down (killed, stopped, full or wiped) at a time, so that
two stores can always ack.  At the end every fault is healed, the producers
stop (each waits for its acks), and after a quiet period the checker gives
the fault suite's table for each consumer: every record acked by two stores
delivered exactly once, in order per partition; nothing acked lost.  Records
sent but never acked are listed per producer, and allowed only for producers
the nemesis killed.

On demand (prints the seed, the schedule as it runs, and the tables)::

    python tests/faults/nemesis.py --seed 7 --duration 1800
"""

from __future__ import annotations

import argparse
import random
import shutil
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
for folder in (HERE, HERE.parent, HERE.parents[1] / "bench"):  # as a script: faultkit, helpers, lossy_proxy, dafkabench
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

from dafka.config import Config  # noqa: E402
from dafka.towerd.tower import Tower  # noqa: E402
from faultcheck import ConsumerRun, Report, check  # noqa: E402
from faultkit import Cluster, Role, free_port  # noqa: E402
from helpers import Processes, wait_for  # noqa: E402
from lossy_proxy import LossyProxy  # noqa: E402
from roles import kafka_record  # noqa: E402

TOPIC = "nemesis"
STORES = ("s1", "s2", "s3")
PRODUCERS = ("p1", "p2", "p3", "p4")
RATE = 200  # records a second per producer
VALUE_SIZE = 32
DEAD_MS = 5000  # store/dead_ms of sharded runs
KINDS = ("kill", "stop", "partition", "lossy", "disk", "wipe")
GATEWAYS = ("g1", "g2")  # node ids 1 and 2
MEMBERS = ("m1", "m2")
KAFKA_TOPIC, KAFKA_PARTITIONS, KAFKA_RATE = "nemesis-kafka", 4, 200
GATEWAY_RECOVERY = 8.0  # seconds after a gateway's fault before the next: its partitions taken back, groups settled


@dataclass
class Fault:
    at: float  # seconds after the start
    kind: str
    target: str
    duration: float

    def __str__(self) -> str:
        return f"{self.at:7.1f}s {self.kind:<9} {self.target:<6} for {self.duration:.1f}s"


def schedule(seed: int, duration: float, stores: tuple[str, ...] = STORES, store_recovery: float = 4.0,
             gateways: tuple[str, ...] = (), gateway_stops: bool = True) -> list[Fault]:
    """The faults of a run: one every 1.5-5 s, overlapping, none starting in
    the last 5 s; at most one store down at a time, and ``store_recovery``
    seconds after a store's fault before the next store fault (sharded
    stores: a wiped store is a new one, and its old self's partitions are
    placed again only after store/dead_ms); ``gateways`` are killed and stopped (unless not
    ``gateway_stops``) too, one at a time."""
    rng = random.Random(seed)
    faults: list[Fault] = []
    busy: dict[str, float] = {}  # target -> when its fault (and a moment to recover) is over
    lengths = {"kill": (1, 4), "stop": (1, 5), "partition": (2, 10), "lossy": (3, 10), "disk": (2, 8),
               "wipe": (1, 2)}
    t = 2.0
    while t < duration - 5:
        free = {target for target in ("tower", *stores, *PRODUCERS, "c1", "c2", "link", *gateways)
                if busy.get(target, 0) <= t}
        store_down = any(busy.get(s, 0) > t for s in stores)
        kind = rng.choice(KINDS)
        if kind in ("disk", "wipe"):
            targets = [] if store_down else sorted(free & set(stores))
        elif kind == "kill":
            targets = sorted(free & {"tower", *PRODUCERS, "c1", *gateways, *([] if store_down else stores)})
        elif kind == "stop":
            targets = sorted(free & {"tower", *PRODUCERS, "c1", "c2", *(gateways if gateway_stops else ()),
                                     *([] if store_down else stores)})
        else:
            targets = ["link"] if "link" in free else []
        if not targets:
            t += 0.5
            continue
        target = rng.choice(targets)
        length = rng.uniform(*lengths[kind])
        if target in stores:  # back up and caught up before the next store fault
            for store in stores:
                busy[store] = max(busy.get(store, 0), t + length + store_recovery)
        elif target in gateways:  # one gateway serves while the other is down, and both again before the next
            for gateway in gateways:
                busy[gateway] = max(busy.get(gateway, 0), t + length + GATEWAY_RECOVERY)
        else:
            busy[target] = t + length + 1
        faults.append(Fault(round(t, 1), kind, target, round(length, 1)))
        t += rng.uniform(1.5, 5.0)
    return faults


@dataclass
class Nemesis:
    """The cluster and the faults' state; :meth:`run` applies a schedule."""

    workdir: Path
    processes: Processes
    stores: tuple[str, ...] = STORES
    replicas: int = 0  # store/replicas: 0, every store holds everything; else sharded stores (rfc 16)
    kafka: bool = False  # two Kafka gateways, an idempotent Kafka producer and a Kafka group (module docstring)
    log: list[str] = field(default_factory=list)
    killed_producers: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.tower_sub, self.tower_pub = free_port(), free_port()
        self.cluster = Cluster(self.processes, self.workdir / "a", f"tcp://127.0.0.1:{self.tower_sub}",
                               f"tcp://127.0.0.1:{self.tower_pub}",
                               **{"producer/min_acks": 2, "beacon/interval": 500, "beacon/timeout": 2000,
                                  "consumer/heads_interval": 500, "store/replicas": self.replicas,
                                  "store/dead_ms": DEAD_MS, "store/handoff_ms": 2000})
        self.tower = self.cluster.tower("t", self.tower_sub, self.tower_pub)
        self.tower_b = Tower(Config.load(overrides={"tower/sub_address": "tcp://127.0.0.1:*",
                                                    "tower/pub_address": "tcp://127.0.0.1:*"})).start()
        self.link_mode = "ok"
        self.rng = random.Random(0)
        self.link = LossyProxy((self.cluster.base_config["beacon/sub_address"],
                                self.cluster.base_config["beacon/pub_address"]),
                               (self.tower_b.sub_endpoint, self.tower_b.pub_endpoint), self._link_fault)
        self.side_b = Cluster(self.processes, self.workdir / "b", self.tower_b.sub_endpoint,
                              self.tower_b.pub_endpoint, **{"consumer/heads_interval": 500})
        self.fail_files = {name: self.workdir / f"{name}.full" for name in self.stores}
        self.roles: dict[str, Role] = {}
        for name in self.stores:
            self.roles[name] = self.cluster.store(name, fail_writes_file=self.fail_files[name])
        self.roles["c1"] = self.cluster.consumer("c1", TOPIC, offsets=True)
        self.roles["c2"] = self.side_b.consumer("c2", TOPIC)
        self.incarnations: dict[str, int] = {}
        self.producers: list[Role] = []
        for name in PRODUCERS:
            self._start_producer(name)
        self.gateway_ports = {name: free_port() for name in GATEWAYS} if self.kafka else {}
        if self.kafka:
            for name in GATEWAYS:
                self._start_gateway(name)
            self.bootstrap = ",".join(f"127.0.0.1:{port}" for port in self.gateway_ports.values())
            self.roles["kp"] = self.cluster.kafka_producer("kp", self.bootstrap, KAFKA_TOPIC, KAFKA_PARTITIONS,
                                                           rate=KAFKA_RATE, size=VALUE_SIZE)
            for name in MEMBERS:
                self.roles[name] = self.cluster.kafka_member(name, self.bootstrap, KAFKA_TOPIC, "nemesis")

    # -- the link ---------------------------------------------------------------

    def _link_fault(self, frames, direction) -> int:
        if self.link_mode == "partition":
            return 0
        if self.link_mode == "lossy":
            r = self.rng.random()
            return 0 if r < 0.10 else 2 if r < 0.20 else 1
        return 1

    # -- roles ------------------------------------------------------------------

    def _start_producer(self, name: str) -> None:
        n = self.incarnations[name] = self.incarnations.get(name, 0) + 1
        role = self.cluster.producer(f"{name}.{n}", TOPIC, rate=RATE, size=VALUE_SIZE)
        self.roles[name] = role
        self.producers.append(role)

    def _start_gateway(self, name: str) -> None:
        self.roles[name] = self.cluster.gateway(name, GATEWAYS.index(name) + 1, self.gateway_ports[name],
                                                "--num-partitions", str(KAFKA_PARTITIONS))

    def _restart(self, target: str) -> None:
        if target in GATEWAYS:
            self._start_gateway(target)
        elif target == "tower":
            self.tower = self.cluster.tower("t", self.tower_sub, self.tower_pub)
        elif target in self.stores:
            old = self.roles[target]
            self.roles[target] = self.cluster.store(target, db=old.db, fail_writes_file=self.fail_files[target])
        elif target == "c1":
            self.roles["c1"] = self.cluster.consumer("c1", TOPIC, offsets=True)
        else:
            self._start_producer(target)

    def _role(self, target: str) -> Role:
        return self.tower if target == "tower" else self.roles[target]

    def start(self, fault: Fault) -> None:
        self.log.append(f"start {fault}")
        if fault.kind == "kill":
            self._role(fault.target).kill()
            if fault.target in PRODUCERS:
                self.killed_producers.add(self.roles[fault.target].name)
        elif fault.kind == "stop":
            self._role(fault.target).send_signal(signal.SIGSTOP)
        elif fault.kind in ("partition", "lossy"):
            self.link_mode = fault.kind
        elif fault.kind == "disk":
            self.fail_files[fault.target].touch()
        elif fault.kind == "wipe":
            role = self.roles[fault.target]
            role.kill()
            shutil.rmtree(role.db, ignore_errors=True)

    def heal(self, fault: Fault) -> None:
        self.log.append(f"heal  {fault}")
        if fault.kind in ("kill", "wipe"):
            self._restart(fault.target)
        elif fault.kind == "stop":
            self._role(fault.target).send_signal(signal.SIGCONT)
        elif fault.kind in ("partition", "lossy"):
            self.link_mode = "ok"
        elif fault.kind == "disk":
            self.fail_files[fault.target].unlink(missing_ok=True)

    def run(self, faults: list[Fault], duration: float, say=print) -> None:
        """Apply ``faults`` (each healed after its duration) for ``duration`` seconds, then heal all."""
        started = time.monotonic()
        events = sorted([(f.at, 0, i, f) for i, f in enumerate(faults)]
                        + [(f.at + f.duration, 1, i, f) for i, f in enumerate(faults)])
        pending_heals = []
        for at, kind, _, fault in events:
            now = time.monotonic() - started
            if at > now:
                time.sleep(at - now)
            if kind == 0:
                self.start(fault)
                pending_heals.append(fault)
            elif fault in pending_heals:
                pending_heals.remove(fault)
                self.heal(fault)
            say(self.log[-1])
        left = duration - (time.monotonic() - started)
        if left > 0:
            time.sleep(left)

    # -- the end ----------------------------------------------------------------

    def finish(self, quiet: float = 3.0) -> tuple[list[Report], dict[str, int]]:
        """Stop the producers (each waits for its acks), wait for the
        consumers to deliver every acked record, and check."""
        for role in list(self.roles.values()):
            if role.kind in ("producer", "kafka-producer") and role.alive():
                role.stop(90)
        time.sleep(quiet)
        logs = [p.producer_log() for p in self.producers]
        acked = {(log.address, offset) for log in logs for offset in log.acked}
        for name, cluster in (("c1", self.cluster), ("c2", self.side_b)):
            try:
                wait_for(lambda c=cluster, n=name: acked <= c.delivered(n), 120, interval=0.5,
                         what=f"{name} delivers every acked record")
            except BaseException:
                print(self.cluster.tails(), self.side_b.tails(), sep="\n")
                raise
        stores = {name: self.roles[name].db for name in self.stores}
        kafka_reports = self._check_kafka() if self.kafka else []
        for name in ("c1", "c2", *self.stores):
            self.roles[name].stop(30)
        runs = {**self.cluster.consumer_runs(), **self.side_b.consumer_runs()}
        reports = []
        for name in ("c1", "c2"):
            reports.append(check(f"nemesis {name}", logs, {name: runs[name]}, stores if name == "c1" else None,
                                 stores_required=name == "c1", value_size=VALUE_SIZE))
        logs += self.cluster.kafka_logs()  # (never killed: a Kafka record sent and not acked is an anomaly)
        unacked = {log.path.rsplit("/", 1)[-1].split(".producer")[0]: len(log.sent - log.acked) for log in logs}
        return reports + kafka_reports, unacked

    def _check_kafka(self) -> list[Report]:
        """The group delivered every record the Kafka producer saw acked, at least once; then a reader of
        every partition from offset 0 gets each exactly once, in order, and nothing else."""
        import confluent_kafka

        logs = self.cluster.kafka_logs()
        acked = {(log.address, n) for log in logs for n in log.acked}
        try:
            wait_for(lambda: acked <= self.cluster.delivered("m1") | self.cluster.delivered("m2"), 120,
                     interval=0.5, what="the Kafka group delivers every acked record")
        except BaseException:
            print(self.cluster.tails())
            raise
        for name in MEMBERS:
            self.roles[name].stop(30)
        runs = self.cluster.consumer_runs()
        group = check("nemesis kafka group", logs, {name: runs[name] for name in MEMBERS}, required_consumers=[],
                      value_size=VALUE_SIZE)
        group.lost = len(acked - self.cluster.delivered("m1") - self.cluster.delivered("m2"))
        group.redelivered, group.dup = group.dup, 0  # (a group is at least once: a refused commit reads again)
        reader = confluent_kafka.Consumer({"bootstrap.servers": self.bootstrap, "group.id": "nemesis-reader",
                                           "enable.auto.commit": False})
        reader.assign([confluent_kafka.TopicPartition(KAFKA_TOPIC, p, 0) for p in range(KAFKA_PARTITIONS)])
        deliveries: list[tuple[str, int, bytes]] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not acked <= {(a, n) for a, n, _ in deliveries}:
            for msg in reader.consume(1000, 0.5):
                if msg.error() is None:
                    deliveries.append((*kafka_record(msg.value()), msg.value()))
        deliveries += [(*kafka_record(m.value()), m.value()) for m in reader.consume(1000, 1.0) if m.error() is None]
        reader.close()
        whole = check("nemesis kafka reader", logs, {"reader": [ConsumerRun("", deliveries)]}, value_size=VALUE_SIZE)
        return [group, whole]

    def close(self) -> None:
        self.link.close()
        self.tower_b.stop()


def table(seed: int, duration: float, faults: list[Fault], reports: list[Report], unacked: dict[str, int],
          killed: set[str]) -> str:
    kinds = {k: sum(1 for f in faults if f.kind == k) for k in KINDS}
    lines = [f"seed {seed}, {duration:.0f} s, {len(faults)} faults: "
             + ", ".join(f"{k} {n}" for k, n in kinds.items())]
    for r in reports:
        lines.append(f"  {r.scenario}: acked {r.acked}, delivered {r.delivered}, lost {r.lost}, dup {r.dup}, "
                     f"out of order {r.out_of_order}, corrupt {r.corrupt} (redelivered after kill {r.redelivered})")
        lines.extend("    " + d for d in r.details[:10])
    lines.append("  sent, never acked: " + ", ".join(
        f"{name} {n}{' (killed)' if name in killed else ''}" for name, n in unacked.items() if n))
    bad = [name for name, n in unacked.items() if n and name not in killed]
    if bad:
        lines.append(f"  ANOMALY: producers that were not killed left records unacked: {', '.join(bad)}")
    return "\n".join(lines)


def run(seed: int, duration: float, workdir: Path, processes: Processes, say=print, *,
        stores: tuple[str, ...] = STORES, replicas: int = 0, kafka: bool = False,
        gateway_stops: bool = True) -> tuple[list[Report], str]:
    """One run; with ``replicas``, sharded stores (``stores`` of them, each partition on ``replicas``); with
    ``kafka``, Kafka gateways and clients in the mix (``gateway_stops``: SIGSTOPs of gateways too)."""
    faults = schedule(seed, duration, stores, store_recovery=4.0 if not replicas else 4.0 + DEAD_MS / 1000 + 4.0,
                      gateways=GATEWAYS if kafka else (), gateway_stops=gateway_stops)
    say(f"nemesis: seed {seed}, {duration:.0f} s, {len(faults)} faults, {len(stores)} stores"
        + (f", store/replicas {replicas}" if replicas else "") + (", Kafka gateways" if kafka else ""))
    nemesis = Nemesis(workdir, processes, stores, replicas, kafka)
    try:
        nemesis.run(faults, duration, say)
        reports, unacked = nemesis.finish()
    finally:
        nemesis.close()
    text = table(seed, duration, faults, reports, unacked, nemesis.killed_producers)
    say(text)
    if any(n and name not in nemesis.killed_producers for name, n in unacked.items()):
        reports[0].lost += 1  # counted as an anomaly: a producer that closed normally must have every ack
    return reports, text


def main(argv: list[str] | None = None) -> int:
    import tempfile

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=None, help="the schedule's seed (default: random, printed)")
    ap.add_argument("--duration", type=float, default=90.0, help="seconds of faults before healing")
    ap.add_argument("--stores", type=int, default=len(STORES), help="store processes")
    ap.add_argument("--replicas", type=int, default=0, help="store/replicas: sharded stores (0: each holds all)")
    ap.add_argument("--kafka", action="store_true", help="two Kafka gateways, a Kafka producer and a Kafka group too")
    ap.add_argument("--no-gateway-stops", action="store_true",
                    help="with --kafka: kill gateways, never SIGSTOP them (see tests/faults/test_nemesis.py)")
    a = ap.parse_args(argv)
    seed = a.seed if a.seed is not None else random.randrange(1 << 31)
    processes = Processes()
    workdir = Path(tempfile.mkdtemp(prefix=f"dafka-nemesis-{seed}-"))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        reports, _ = run(seed, a.duration, workdir, processes,
                         stores=tuple(f"s{n + 1}" for n in range(a.stores)), replicas=a.replicas, kafka=a.kafka,
                         gateway_stops=not a.no_gateway_stops)
    finally:
        processes.cleanup()
    anomalies = sum(r.anomalies for r in reports)
    print(f"anomalies: {anomalies} (work files in {workdir})")
    return 1 if anomalies else 0


if __name__ == "__main__":
    sys.exit(main())
