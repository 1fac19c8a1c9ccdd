"""Harness for the fault scenarios: real peer processes (``roles.py``) on
loopback, started through the root ``processes`` fixture so that teardown
always kills them, plus a few network helpers."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import zmq

from faultcheck import ConsumerRun, ProducerLog
from helpers import Processes, free_port, script, wait_for  # noqa: F401 - free_port is the kit's too
from roles import rss_kib

ROLES = str(Path(__file__).with_name("roles.py"))


class Role:
    """One peer process."""

    def __init__(self, cluster: "Cluster", kind: str, name: str, proc: subprocess.Popen, base: Path,
                 log: Path | None = None, offsets: Path | None = None) -> None:
        self.cluster = cluster
        self.kind = kind
        self.name = name
        self.proc = proc
        self.base = base
        self.log = log
        self.offsets = offsets
        self.journal_snapshot: Path | None = None
        self.address = ""

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def out(self) -> Path:
        return self.base.with_suffix(".out")

    @property
    def err(self) -> Path:
        return self.base.with_suffix(".err")

    @property
    def stats_path(self) -> Path:
        return self.base.with_suffix(".stats.json")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stats(self) -> dict:
        try:
            return json.loads(self.stats_path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def stat(self, key: str, default=0):
        return self.stats().get(key, default)

    def fresh_stats(self, timeout: float = 10.0) -> dict:
        """The counters as of now: the first snapshot written after this call.

        A role rewrites its snapshot every 0.2 s (longer under load), so the one
        on disk may predate what another role's counters already show: a store
        whose snapshot was taken while it sent an answer says it served nothing
        although the requester has written every record (issue 24, part 5)."""
        since = time.time()
        return self.wait_stat(lambda s: s.get("time", 0) >= since, timeout, "a snapshot of its counters from now")

    def fresh_stat(self, key: str, default=0):
        return self.fresh_stats().get(key, default)

    def wait_stat(self, predicate, timeout: float = 20.0, what: str = "") -> dict:
        def ok():
            if not self.alive():
                final = self.stats() if self.proc.returncode == 0 else None
                if final and predicate(final):  # it finished meanwhile (a starved test process looked late)
                    return final
                pytest.fail(f"{self.kind} {self.name} exited with {self.proc.returncode} while waiting for "
                            f"{what}:\n{self.tail()}")
            s = self.stats()
            return s if s and predicate(s) else None
        return wait_for(ok, timeout, interval=0.05, what=f"{self.name}: {what}")

    def rss_kib(self) -> int:
        return rss_kib(self.pid)

    def wait_ready(self, timeout: float = 20.0) -> list[str]:
        def ready():
            if not self.alive():
                pytest.fail(f"{self.kind} {self.name} exited with {self.proc.returncode} before it was ready:\n"
                            f"{self.tail()}")
            try:
                for line in self.out.read_text().splitlines():
                    if line.startswith(("ready", "tower ")):
                        return line.split()
            except FileNotFoundError:
                pass
            return None
        words = wait_for(ready, timeout, interval=0.02, what=f"{self.kind} {self.name} ready")
        if words[0] == "ready":
            self.address = words[1]
        return words

    def send_signal(self, sig: int) -> None:
        if self.alive():
            os.kill(self.pid, sig)

    def kill(self) -> None:
        """SIGKILL and reap; a consumer's offsets journal is copied as the kill left it."""
        self.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self._snapshot()

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM, wait; returns the exit code (SIGKILL after ``timeout``, then fails)."""
        self.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.send_signal(signal.SIGKILL)
            self.proc.wait(5)
            pytest.fail(f"{self.kind} {self.name} ignored SIGTERM for {timeout}s:\n{self.tail()}")

    def wait_exit(self, timeout: float = 60.0) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{self.kind} {self.name} still running after {timeout}s:\n{self.tail()}")

    def _snapshot(self) -> None:
        if self.offsets is not None:
            self.journal_snapshot = self.offsets.with_name(f"{self.base.name}.journal-at-kill")
            if self.offsets.exists():
                shutil.copyfile(self.offsets, self.journal_snapshot)

    def tail(self, lines: int = 30) -> str:
        out = []
        for path in (self.out, self.err):
            try:
                text = path.read_text(errors="replace").splitlines()[-lines:]
            except FileNotFoundError:
                continue
            out.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(out)

    # -- logs --------------------------------------------------------------

    def producer_log(self) -> ProducerLog:
        return ProducerLog.read(self.log)

    def consumer_run(self) -> ConsumerRun:
        return ConsumerRun.read(self.log, self.journal_snapshot)

    def count_lines(self, prefix: str = "") -> int:
        try:
            with open(self.log, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return 0
        if not prefix:
            return data.count(b"\n")
        return data.count(b"\n" + prefix.encode()) + (1 if data.startswith(prefix.encode()) else 0)


class Cluster:
    """Starts roles against one tower (by default the root ``tower`` fixture)."""

    def __init__(self, processes: Processes, workdir: Path, tower_sub: str, tower_pub: str, **config) -> None:
        self.processes = processes
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.base_config = {
            "beacon/address": "127.0.0.1",
            "beacon/bind_address": "127.0.0.1",
            "beacon/sub_address": tower_sub,
            "beacon/pub_address": tower_pub,
            "producer/head_interval": 200,
            "consumer/fetch_retry": 300,
        }
        self.base_config.update(config)
        self.roles: list[Role] = []
        self.runs: dict[str, list[Role]] = {}  # consumer name -> its runs
        self._counter = 0

    def config(self, **extra) -> dict:
        values = dict(self.base_config)
        values.update({k.replace("__", "/"): v for k, v in extra.items()})
        return values

    def _start(self, kind: str, name: str, args: list[str], log: Path | None = None,
               offsets: Path | None = None) -> Role:
        self._counter += 1
        base = self.dir / f"{self._counter:02d}-{kind}-{name}"
        with open(base.with_suffix(".out"), "wb") as out, open(base.with_suffix(".err"), "wb") as err:
            proc = self.processes.start(
                [sys.executable, ROLES, kind, *args, "--stats", str(base.with_suffix(".stats.json"))],
                stdout=out, stderr=err, stdin=subprocess.DEVNULL,
            )
        role = Role(self, kind, name, proc, base, log, offsets)
        self.roles.append(role)
        return role

    def tower(self, name: str, sub_port: int, pub_port: int, *, host: str = "127.0.0.1") -> Role:
        role = self._start("tower", name, ["--sub", f"tcp://{host}:{sub_port}", "--pub", f"tcp://{host}:{pub_port}"])
        role.wait_ready()
        return role

    def store(self, name: str, db: Path | str | None = None, fail_writes_file: Path | None = None,
              ready: bool = True, **config) -> Role:
        db = Path(db) if db is not None else self.dir / f"{name}.db"
        args = ["--db", str(db), "--config", json.dumps(self.config(**config))]
        if fail_writes_file is not None:
            args += ["--fail-writes-file", str(fail_writes_file)]
        role = self._start("store", name, args)
        role.db = db
        if ready:
            role.wait_ready()
        return role

    def producer(self, name: str, topic: str, *, count: int = 0, rate: float = 0, size: int = 0,
                 hold: bool = False, wait_peers: int = 0, close_timeout: float = 30.0,
                 start_file: Path | None = None, pause_at: int = -1, resume_file: Path | None = None,
                 **config) -> Role:
        log = self.dir / f"{name}.producer.log"
        args = ["--topic", topic, "--log", str(log), "--count", str(count), "--rate", str(rate),
                "--size", str(size), "--wait-peers", str(wait_peers), "--close-timeout", str(close_timeout),
                "--config", json.dumps(self.config(**config))]
        if hold:
            args.append("--hold")
        if start_file is not None:
            args += ["--start-file", str(start_file)]
        if resume_file is not None:
            args += ["--pause-at", str(pause_at), "--resume-file", str(resume_file)]
        role = self._start("producer", name, args, log)
        role.wait_ready()
        return role

    def consumer(self, name: str, topic: str, *, offsets: bool = False, reset: str = "earliest",
                 group: str | None = None, slow_seconds: float = 0.0, slow_delay: float = 0.0, **config) -> Role:
        runs = self.runs.setdefault(name, [])
        log = self.dir / f"{name}.run{len(runs) + 1}.consumer.log"
        offsets_path = self.dir / f"{name}.offsets" if offsets else None
        args = ["--topic", topic, "--log", str(log), "--reset", reset, "--config", json.dumps(self.config(**config))]
        if offsets_path is not None:
            args += ["--offsets", str(offsets_path)]
        if group is not None:
            args += ["--group", group]
        if slow_seconds:
            args += ["--slow-seconds", str(slow_seconds)]
        if slow_delay:
            args += ["--slow-delay", str(slow_delay)]
        role = self._start("consumer", name, args, log, offsets_path)
        runs.append(role)
        role.wait_ready()
        return role

    def gateway(self, name: str, node_id: int, port: int, *args: str, timeout: float = 30.0) -> Role:
        """``dafka kafka --node-id N --port PORT`` on this cluster, with its config as ``-X`` keys."""
        self._counter += 1
        base = self.dir / f"{self._counter:02d}-gateway-{name}"
        flags = [x for key, value in self.base_config.items() for x in ("-X", f"{key}={value}")]
        with open(base.with_suffix(".out"), "wb") as out, open(base.with_suffix(".err"), "wb") as err:
            proc = self.processes.start([script("dafka"), "kafka", "--node-id", str(node_id), "--port", str(port),
                                         "--address", "127.0.0.1", "--verbose", *flags, *args],
                                        stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        role = Role(self, "gateway", name, proc, base)
        self.roles.append(role)

        def serving() -> bool:
            if not role.alive():
                pytest.fail(f"gateway {name} exited with {proc.returncode}:\n{role.tail()}")
            return b"serving Kafka on" in role.err.read_bytes()
        wait_for(serving, timeout, interval=0.05, what=f"gateway {name} serving")
        return role

    def kafka_producer(self, name: str, bootstrap: str, topic: str, partitions: int, *, rate: float,
                       size: int = 0) -> Role:
        """An idempotent confluent-kafka producer (roles.py kafka-producer); its logs, one a partition, are
        ``kafka_logs()``."""
        role = self._start("kafka-producer", name, ["--bootstrap", bootstrap, "--topic", topic, "--logdir",
                                                    str(self.dir), "--partitions", str(partitions),
                                                    "--rate", str(rate), "--size", str(size)])
        role.wait_ready()
        return role

    def kafka_logs(self) -> list[ProducerLog]:
        return [ProducerLog.read(path) for path in sorted(self.dir.glob("kafka-*.producer.log"))]

    def kafka_member(self, name: str, bootstrap: str, topic: str, group: str) -> Role:
        """A confluent-kafka group member (roles.py kafka-member); its deliveries are a consumer's runs."""
        runs = self.runs.setdefault(name, [])
        log = self.dir / f"{name}.run{len(runs) + 1}.consumer.log"
        role = self._start("kafka-member", name, ["--bootstrap", bootstrap, "--topic", topic, "--group", group,
                                                  "--log", str(log)], log)
        runs.append(role)
        role.wait_ready()
        return role

    def consumer_runs(self) -> dict[str, list[ConsumerRun]]:
        return {name: [r.consumer_run() for r in runs] for name, runs in self.runs.items()}

    def delivered(self, name: str) -> set[tuple[str, int]]:
        """Distinct (partition, offset) delivered so far by every run of consumer ``name``."""
        out = set()
        for role in self.runs.get(name, []):
            for address, offset, _ in ConsumerRun.read(role.log).deliveries:
                out.add((address, offset))
        return out

    def wait_delivered(self, name: str, expected: set[tuple[str, int]], timeout: float = 30.0) -> None:
        def done():
            for role in self.runs[name]:
                if not role.alive() and role.proc.returncode not in (0, -9):
                    pytest.fail(f"consumer {name} died with {role.proc.returncode}:\n{role.tail()}")
            return expected <= self.delivered(name)
        try:
            wait_for(done, timeout, interval=0.1, what=f"consumer {name} delivers {len(expected)} records")
        except BaseException:
            missing = expected - self.delivered(name)
            print(f"consumer {name} misses {len(missing)} records, e.g. {sorted(missing)[:10]}")
            for role in self.roles:  # what each peer counted, to tell where the records stopped
                print(f"{role.kind} {role.name} stats: {role.stats()}")
            raise

    def tails(self) -> str:
        return "\n".join(f"==== {r.kind} {r.name} (pid {r.pid}, rc {r.proc.poll()})\n{r.tail(15)}" for r in self.roles)


def acked_keys(*producers: Role) -> set[tuple[str, int]]:
    out = set()
    for p in producers:
        log = p.producer_log()
        out.update((log.address, o) for o in log.acked)
    return out


# -----------------------------------------------------------------------------
# A raw peer for fuzzing and flooding


def addr() -> str:
    """A fresh 32-hex-character address."""
    return uuid.uuid4().hex.upper()


class FuzzPeer:
    """The raw sockets of the fuzzer (see the module docstring)."""

    def __init__(self, tower_sub: str, tower_pub: str) -> None:
        from dafka.discovery.beacon import Beacon

        ctx = zmq.Context.instance()
        self.address = addr()
        self.xpub = ctx.socket(zmq.XPUB)
        self.xpub.setsockopt(zmq.XPUB_VERBOSE, 1)
        self.xpub.sndhwm = 100_000
        self.xpub.linger = 0
        port = self.xpub.bind_to_random_port("tcp://127.0.0.1")
        self.beacon = Beacon(ctx, self.address, port, host="127.0.0.1", tower_sub=tower_sub, tower_pub=tower_pub,
                             interval_ms=200, name="fuzz").start()
        self.beacon_pub = ctx.socket(zmq.PUB)  # garbage beacons into the tower's XSUB
        self.beacon_pub.linger = 0
        self.beacon_pub.connect(tower_sub)
        self.xsubs: dict[str, zmq.Socket] = {}
        self.subscriptions: set[bytes] = set()

    def attach(self, name: str, endpoint: str) -> None:
        sock = zmq.Context.instance().socket(zmq.XSUB)
        sock.linger = 0
        sock.connect(endpoint)
        self.xsubs[name] = sock

    def drain(self) -> None:
        while True:
            try:
                self.subscriptions.add(self.xpub.recv(zmq.NOBLOCK))
            except zmq.Again:
                return

    def subscribed(self, prefix: bytes) -> bool:
        self.drain()
        return b"\x01" + prefix in self.subscriptions

    def close(self) -> None:
        self.beacon.stop()
        for sock in (self.xpub, self.beacon_pub, *self.xsubs.values()):
            sock.close(0)
