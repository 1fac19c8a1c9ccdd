"""dafka-py benchmarks: throughput, latency and memory against the raw ceiling.

    python3 bench/run.py                      # defaults finish in a few minutes on 2 cores
    python3 bench/run.py --records 200000 --sizes 100 --json out.json

Every peer runs in its own process on 127.0.0.1 (ephemeral ports).  The
ceiling is raw pyzmq PUB/SUB between two processes sending the same two-frame
messages with no protocol, measured in the same run; every rate is also shown
as a ratio to it, because shared machines are noisy.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import re
import resource
import selectors
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import zmq

HERE = Path(__file__).resolve()
TOPIC = "bench"
STAMP_EVERY = 16  # latency is sampled on every 16th record
SPIN_BELOW = 0.0002  # a paced sender spins through the last 0.2 ms of a wait, sleeps through the rest


# ---------------------------------------------------------------------------
# helpers shared by the roles (each role is this file run with --role)
# ---------------------------------------------------------------------------


def peak_rss_mib() -> float:
    """Peak RSS of this process image (VmHWM).  ``ru_maxrss`` would not do: on
    Linux it survives execve and starts at the parent's size at fork."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


ADDRESS = ["127.0.0.1"]  # the roles' beacon/address (--address: a host of the impaired link)
# The interpreter the Cluster's roles run in: this one, or (--ab) another commit's venv (bench/ab_bench.py).
PYTHON = [sys.executable]


def config(sub: str, pub: str, **extra: object):
    from dafka.config import Config

    values: dict[str, object] = {
        "beacon/address": ADDRESS[0],
        "beacon/bind_address": ADDRESS[0],
        "beacon/sub_address": sub,
        "beacon/pub_address": pub,
    }
    values.update(extra)
    return Config.load(overrides=values)


def cpu_seconds() -> float:
    """CPU time of this whole process (every thread: Python, libzmq I/O, LevelDB)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def emit(result: dict, cpu_since: float | None = None, records: int = 0) -> None:
    """Print the role's result; with ``cpu_since`` also the process's CPU
    microseconds per record since then, a figure that steal time and
    neighbours move far less than a rate."""
    result["rss_mib"] = round(peak_rss_mib(), 1)
    if cpu_since is not None and records:
        result["cpu_us"] = round((cpu_seconds() - cpu_since) / records * 1e6, 2)
    print(json.dumps(result), flush=True)


def payload(size: int, stamp: bool) -> bytes:
    body = b"x" * size
    if stamp:
        return time.monotonic_ns().to_bytes(8, "big") + body[8:]
    return body


# ---------------------------------------------------------------------------
# roles
# ---------------------------------------------------------------------------


def role_raw_pub(a: argparse.Namespace) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUB)
    sock.sndhwm = 0
    sock.connect(a.endpoint)
    time.sleep(0.5)
    frame1 = b"M" + TOPIC.encode() + b"\0\x01" + b"\x20" + b"P" * 32 + b"\x05bench" + bytes(8)
    body = b"x" * a.size
    send = sock.send
    cpu = cpu_seconds()
    started = time.perf_counter()
    for _ in range(a.records):
        send(frame1, zmq.SNDMORE)
        send(body)
    emit({"sent": a.records, "seconds": time.perf_counter() - started}, cpu, a.records)
    time.sleep(1)


def role_raw_sub(a: argparse.Namespace) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.SUB)
    sock.rcvhwm = 0
    sock.subscribe(b"M")
    sock.bind("tcp://127.0.0.1:*")
    print(sock.last_endpoint.decode(), flush=True)
    recv = sock.recv
    recv()
    recv()
    cpu = cpu_seconds()
    started = time.perf_counter()
    for _ in range(a.records - 1):
        recv()
        recv()
    emit({"received": a.records, "seconds": time.perf_counter() - started}, cpu, a.records - 1)


def role_producer(a: argparse.Namespace) -> None:
    phases = {"start": cpu_seconds()}  # the interpreter's start-up and this script's imports
    from dafka import Producer

    phases["import"] = cpu_seconds()
    extra: dict[str, object] = {"producer/min_acks": a.min_acks, **dict(kv.split("=", 1) for kv in a.set or ())}
    if a.hold:
        extra.update({"producer/max_unacked": a.records + 1, "producer/max_unacked_bytes": 1 << 40})
    producer = Producer(a.topic, config(a.sub, a.pub, **extra))
    time.sleep(a.warmup)
    deadline = time.monotonic() + 60
    while producer.stats()["peers_seen"] < a.wait_peers and time.monotonic() < deadline:
        time.sleep(0.005)
    body = b"x" * a.size
    stamp = a.stamp
    send = producer.send
    acks: list[float] = []  # --ack-latency: send to ack of every 100th record, seconds
    if a.keys or a.ack_latency:
        send = keyed_send(producer, a.keys, a.ack_latency, acks)
    cpu = phases["ready"] = cpu_seconds()
    if a.stay:
        print("sending", flush=True)  # for an orchestrator that acts mid-stream (bench/recovery_bench.py)
    started = time.perf_counter()
    if a.rate:
        interval = 1.0 / a.rate
        next_at = time.perf_counter()
        for _ in range(a.records):
            # Sleep through long waits, as an application sending now and then would: a
            # spinning thread keeps the GIL from the producer's loop thread for up to the
            # interpreter's switch interval (5 ms), which would delay its answers.
            wait = next_at - time.perf_counter()
            if wait > SPIN_BELOW:
                time.sleep(wait - SPIN_BELOW)
            while time.perf_counter() < next_at:
                pass
            send(payload(a.size, True))
            next_at += interval
    elif a.hold:
        for i in range(a.records):  # distinct objects, as real records would be
            send(i.to_bytes(8, "big") + body[8:])
    elif stamp:
        # Only the records the consumer samples (offset % STAMP_EVERY == 0) carry a send time.
        for i in range(a.records):
            send(body if i % STAMP_EVERY else payload(a.size, True))
    elif a.payload == "random":  # incompressible records (the store's snappy finds nothing to squeeze)
        pool = [os.urandom(a.size) for _ in range(1024)]
        for i in range(a.records):
            send(pool[i & 1023])
    else:
        for _ in range(a.records):
            send(body)
    sent = time.perf_counter() - started
    acked = None
    if a.min_acks:
        if not a.hold:
            producer.flush(timeout=600)
            acked = time.perf_counter() - started
    phases["sent"] = cpu_seconds()
    # CPU seconds of each phase of the process: the interpreter's start, importing dafka, creating
    # the producer and meeting its first peers, sending (and the acks).
    if acks:
        acks.sort()
        result_acks = {"ack_p50_ms": acks[len(acks) // 2] * 1e3, "ack_p99_ms": acks[int(len(acks) * 0.99)] * 1e3,
                       "ack_samples": len(acks)}
    else:
        result_acks = {}
    result = {**result_acks, "batches": producer.stats()["batches_sent"], "sent": a.records, "send_seconds": sent,
              "ack_seconds": acked, "send_started": started,
              "cpu_phases": {"interpreter": phases["start"], "import dafka": phases["import"] - phases["start"],
                             "discovery": phases["ready"] - phases["import"], "sending": phases["sent"] - phases["ready"]}}
    if a.hold:
        result["buffered"] = producer.stats()["buffered"]
    if a.linger:
        time.sleep(a.linger)  # its I/O thread still sends what send() queued
    emit(result, None if a.rate else cpu, a.records)
    if a.stay:
        sys.stdin.readline()  # its loop answers FETCHes until the orchestrator is done with it
    if a.hold:
        _close_quietly(producer)
    else:
        producer.close(timeout=30)


def keyed_send(producer, keys: int, ack_latency: bool, acks: list[float]):
    """``producer.send`` for keyed records, cycling over ``keys`` keys (0: none), and with ``ack_latency``
    the time from sending every 10th record to its ack appended to ``acks``."""
    record_keys = [b"key-%08d" % i for i in range(keys)] or [None]
    counter = itertools.count()

    def send(value: bytes) -> None:
        i = next(counter)
        key = record_keys[i % len(record_keys)]
        if ack_latency and i % 10 == 0:
            at = time.perf_counter()
            producer.send(value, key=key, on_delivery=lambda _m, _e: acks.append(time.perf_counter() - at))
        else:
            producer.send(value, key=key)
    return send


def _close_quietly(producer) -> None:
    from dafka import FlushTimeout

    try:
        producer.close(timeout=0)
    except FlushTimeout:
        pass


IDLE_STOP = 10.0  # a consumer role stops after this long without a record, and says what it got


class _NoLoss:
    records_lost = 0


def _loss_counter(state):
    """What counts the records a consumer went past (read without stats()' cost per batch); an older
    release (bench/ab_bench.py) has no such counter."""
    return state if hasattr(state, "records_lost") else _NoLoss()


class Progress:
    """What a consumer role has read so far, and where it stood when a SIGCONT
    resumed it (the recovery scenario stops it mid-stream): the signal handler
    runs in the main thread between two reads, so the count is at most one
    batch old."""

    def __init__(self) -> None:
        import signal

        self.count = 0
        self.resumed: tuple[float, int, float] | None = None  # (perf_counter, count, CPU seconds)
        signal.signal(signal.SIGCONT, self._on_resume)

    def _on_resume(self, *_: object) -> None:
        if self.resumed is None:
            self.resumed = (time.perf_counter(), self.count, cpu_seconds())

    def result(self, finished: float) -> dict:
        """The recovery figures: records read after the resume, their rate and CPU per record."""
        if self.resumed is None:
            return {}
        at, count, cpu = self.resumed
        after = self.count - count
        return {"recovered": after, "recovery_seconds": finished - at,
                "recovery_cpu_us": round((cpu_seconds() - cpu) / after * 1e6, 2) if after else None}


def role_consumer(a: argparse.Namespace) -> None:
    if a.api == "async":
        role_consumer_async(a)
        return
    from dafka import Consumer

    progress = Progress()
    created = time.monotonic()
    consumer = Consumer(a.topic, config=config(a.sub, a.pub, **{"consumer/offset/reset": a.reset,
                                                                  "consumer/bulk": a.bulk}))
    first = consumer.poll(60)
    if first is None:
        emit({"received": 0, "complete": False})
        return
    first_at = time.monotonic()
    latencies = []
    progress.count = 1
    cpu = cpu_seconds()
    started = time.perf_counter()
    stamp = a.stamp
    state = _loss_counter(consumer._state)
    if a.api == "poll":
        poll = consumer.poll
        while progress.count + state.records_lost < a.records:
            record = poll(IDLE_STOP)
            if record is None:
                break
            progress.count += 1
            if stamp and record.offset % STAMP_EVERY == 0:
                latencies.append(time.monotonic_ns() - int.from_bytes(record.value[:8], "big"))
    else:
        consume = consumer.consume
        while progress.count + state.records_lost < a.records:
            batch = consume(1000, IDLE_STOP)
            if not batch:
                break
            progress.count += len(batch)
            if stamp:
                now = time.monotonic_ns()
                latencies.extend(now - int.from_bytes(r.value[:8], "big") for r in batch
                                 if r.offset % STAMP_EVERY == 0 and r.offset >= a.latency_from)
    emit_consumer_result(a, progress, started, first_at - created, latencies, cpu, consumer)
    consumer.close()


def role_consumer_async(a: argparse.Namespace) -> None:
    """The consumer role read with ``async for`` over :class:`dafka.aio.AsyncConsumer`."""
    import asyncio

    from dafka.aio import AsyncConsumer

    progress = Progress()

    async def run() -> None:
        created = time.monotonic()
        settings = config(a.sub, a.pub, **{"consumer/offset/reset": a.reset, "consumer/bulk": a.bulk})
        async with AsyncConsumer(a.topic, config=settings) as consumer:
            try:
                await asyncio.wait_for(consumer.getone(), 60)
            except TimeoutError:
                emit({"received": 0, "complete": False})
                return
            first_at = time.monotonic()
            latencies = []
            progress.count = 1
            cpu = cpu_seconds()
            started = time.perf_counter()
            stamp, records = a.stamp, a.records
            state = _loss_counter(consumer._consumer._state)

            async def read() -> None:
                async for record in consumer:
                    progress.count += 1
                    if stamp and record.offset % STAMP_EVERY == 0:
                        latencies.append(time.monotonic_ns() - int.from_bytes(record.value[:8], "big"))
                    if progress.count + state.records_lost >= records:
                        return

            while progress.count + state.records_lost < records:  # async for, stopped after IDLE_STOP without a record
                before = progress.count
                try:
                    await asyncio.wait_for(read(), IDLE_STOP)
                except TimeoutError:
                    if progress.count == before:
                        break
            emit_consumer_result(a, progress, started, first_at - created, latencies, cpu, consumer)

    asyncio.run(run())


def emit_consumer_result(a: argparse.Namespace, progress: Progress, started: float, first_record: float,
                         latencies: list, cpu: float, consumer) -> None:
    finished = time.perf_counter()
    stats = consumer.stats()
    count, lost = progress.count, stats.get("records_lost", 0)
    result = {"received": count, "lost": lost, "complete": count + lost >= a.records,
              "seconds": finished - started, "first_record_ms": first_record * 1000, "started": started,
              "finished": finished, "fetches": stats["fetches_sent"], **progress.result(finished)}
    if latencies:
        latencies.sort()
        result["p50_ms"] = latencies[len(latencies) // 2] / 1e6
        result["p99_ms"] = latencies[int(len(latencies) * 0.99)] / 1e6
    emit(result, cpu, count - 1)


def role_refconsumer(a: argparse.Namespace) -> None:
    """The reference consumer's behaviour in raw frames (tests/refconsumer.py: FETCH only on a HEAD, a
    DIRECT-HEAD or a gap, through the reference's fetch filter), catching up from ``earliest``."""
    sys.path.insert(0, str(HERE.parents[1] / "tests"))
    from refconsumer import RefConsumer

    from dafka.core.addresses import new_address

    consumer = RefConsumer(a.sub, a.pub, new_address(), earliest=True)
    consumer.subscribe(a.topic)
    if not consumer.run(lambda: consumer.total() > 0, 60):
        emit({"received": 0})
        return
    cpu = cpu_seconds()
    started = time.perf_counter()
    first = consumer.total()
    done = consumer.run(lambda: consumer.total() >= a.records, 600)
    elapsed = time.perf_counter() - started
    emit({"received": consumer.total(), "complete": done, "seconds": elapsed, "foreign": consumer.foreign,
          "fetches": consumer.filter.sent, "filtered": consumer.filter.filtered}, cpu, consumer.total() - first)
    consumer.close()


def role_store(a: argparse.Namespace) -> None:
    from dafka.store import Store

    store = Store(config(a.sub, a.pub, **dict(kv.split("=", 1) for kv in a.set or ())), db=a.db).start()
    cpu = cpu_seconds()
    print("ready", flush=True)
    done = threading.Event()
    if a.progress:  # its counters, for an orchestrator that watches moves (bench/shard_bench.py)
        def report() -> None:
            while not done.wait(0.2):
                Path(a.progress + ".tmp").write_text(json.dumps({**store.stats(), "cpu_s": cpu_seconds() - cpu}))
                os.replace(a.progress + ".tmp", a.progress)
        threading.Thread(target=report, daemon=True).start()
    sys.stdin.readline()
    done.set()
    stats = store.stats()
    cpu_s = cpu_seconds() - cpu
    store.stop()
    # per record written or served: the store's CPU covers both
    emit({"store": stats, "cpu_s": cpu_s}, cpu, stats["records_written"] + stats["records_served"])


def role_partitions(a: argparse.Namespace) -> None:
    """``--producers`` producers (partitions) in one process, each sending ``--records`` records of
    ``--size`` random bytes (1,024 different ones in turn: what a store writes does not compress), acked
    by ``--min-acks`` stores: many partitions without a process each."""
    from dafka import Producer

    settings = config(a.sub, a.pub, **{"producer/min_acks": a.min_acks, **dict(kv.split("=", 1) for kv in a.set or ())})
    zmq.Context.instance().max_sockets = 64 * a.producers + 1024  # libzmq's default, 1,023, is 100 producers' worth
    producers = [Producer(a.topic, settings) for _ in range(a.producers)]
    time.sleep(a.warmup)
    deadline = time.monotonic() + 60
    while min(p.stats()["peers_seen"] for p in producers) < a.wait_peers and time.monotonic() < deadline:
        time.sleep(0.01)
    bodies = [os.urandom(a.size) for _ in range(1024)]
    sends = [p.send for p in producers]
    print("sending", flush=True)  # for an orchestrator that measures the stores' CPU while records flow
    cpu = cpu_seconds()
    started = time.perf_counter()
    # Each producer in turn sends a run of 128 records, as a process writing to its partitions in bursts: one
    # at a time each, the records of a producer would be as far apart as the others' sends take (about 20 us
    # with 16 producers), on the edge of batching.BURST_GAP, and how many go out in one RECORDS would depend
    # on how fast the process sends.
    for first in range(0, a.records, 128):
        run = [bodies[i % 1024] for i in range(first, min(first + 128, a.records))]
        for send in sends:
            for body in run:
                send(body)
    for producer in producers:
        producer.flush(timeout=600)
    finished = time.perf_counter()
    emit({"sent": a.records * a.producers, "send_started": started, "finished": finished,
          "partitions": [p.address for p in producers]}, cpu, a.records * a.producers)
    for producer in producers:
        producer.close(timeout=30)


def role_group_member(a: argparse.Namespace) -> None:
    """A member of consumer group ``bench``: reads its share, writing how many it has read to --progress,
    until a line on stdin (the orchestrator's, once the whole group has read every record)."""
    import select

    from dafka import Consumer

    consumer = Consumer(a.topic, group="bench", config=config(a.sub, a.pub, **{
        "consumer/offset/reset": "earliest"}))
    print(json.dumps({"member": consumer.address}), flush=True)
    progress = Path(a.progress)
    count = 0
    first = last = None
    cpu = None
    share = 0
    consume = consumer.consume
    while not select.select([sys.stdin], [], [], 0)[0]:
        batch = consume(1000, 0.2)
        if batch:
            if first is None:
                first, cpu = time.perf_counter(), cpu_seconds()
            count += len(batch)
            last = time.perf_counter()
            share = len(consumer.assignment())  # what it read while records came (not after others left)
            progress.write_text(str(count))
    emit({"received": count, "started": first, "finished": last, "partitions": share}, cpu, count)
    consumer.close()


ROLES = {
    "group-member": role_group_member,
    "partitions": role_partitions,
    "raw-pub": role_raw_pub,
    "raw-sub": role_raw_sub,
    "producer": role_producer,
    "consumer": role_consumer,
    "refconsumer": role_refconsumer,
    "store": role_store,
}


# ---------------------------------------------------------------------------
# the orchestrator
# ---------------------------------------------------------------------------


class Cluster:
    """A tower in this process; peers as child processes."""

    def __init__(self) -> None:
        from dafka.config import Config
        from dafka.towerd.tower import Tower

        self.tower = Tower(Config.load(overrides={
            "tower/sub_address": "tcp://127.0.0.1:*", "tower/pub_address": "tcp://127.0.0.1:*"})).start()
        self.procs: list[subprocess.Popen] = []

    def spawn(self, role: str, *args: str, stdin: bool = False) -> subprocess.Popen:
        cmd = [PYTHON[0], str(HERE), "--role", role, "--sub", self.tower.sub_endpoint,
               "--pub", self.tower.pub_endpoint, *args]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stdin=subprocess.PIPE if stdin else None, text=True)
        self.procs.append(proc)
        return proc

    def store(self, db: str, settings: list[str] = (), progress: str | None = None) -> subprocess.Popen:
        """A store process on ``db`` (``settings``: KEY=VALUE config; ``progress``: the file it writes its
        stats to), once it has started."""
        store = self.spawn("store", "--db", db, *(arg for kv in settings for arg in ("--set", kv)),
                           *(["--progress", progress] if progress else []), stdin=True)
        store.stdout.readline()
        return store

    @staticmethod
    def stop_store(store: subprocess.Popen) -> dict:
        """Stop a store process; its result (CPU per record, RSS)."""
        return stop_stayer(store, timeout=900)

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        self.tower.stop()


class ScenarioFailed(RuntimeError):
    """A role of a scenario timed out or printed no result: the scenario is reported as such, the run goes on."""


def result_of(proc: subprocess.Popen, timeout: float = 900) -> dict:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        role = proc.args[proc.args.index("--role") + 1] if "--role" in proc.args else proc.args
        raise ScenarioFailed(f"the {role} role did not finish in {timeout:.0f} s; it printed: {(out or '').strip()[-300:]!r}")
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if not lines:
        raise ScenarioFailed(f"benchmark process {proc.args} printed no result (exit {proc.returncode})")
    return json.loads(lines[-1])


def ceiling(records: int, size: int) -> dict:
    sub = subprocess.Popen([sys.executable, str(HERE), "--role", "raw-sub", "--records", str(records),
                            "--size", str(size)], stdout=subprocess.PIPE, text=True)
    endpoint = sub.stdout.readline().strip()
    pub = subprocess.Popen([sys.executable, str(HERE), "--role", "raw-pub", "--records", str(records),
                            "--size", str(size), "--endpoint", endpoint], stdout=subprocess.PIPE, text=True)
    r = result_of(sub)
    p = result_of(pub)
    return {"rate": r["received"] / r["seconds"], "rss_mib": r["rss_mib"],
            "cpu_us": {"sender": p.get("cpu_us"), "receiver": r.get("cpu_us")}}


def holding(records: int, size: int) -> list[str]:
    """Producer settings whose no-store ring holds a whole run: a consumer that
    falls behind can always fetch what it missed, so the rate measures it,
    not the ring's size (which a bench row that loses records would not say)."""
    return ["--set", f"producer/max_unacked={records + 1}", "--set", f"producer/max_unacked_bytes={records * (size + 64)}"]


def stop_stayer(proc: subprocess.Popen, timeout: float = 60) -> dict:
    """The result of a role that waits for a line on its stdin (a producer with --stay, a store), after
    sending it one."""
    try:
        proc.stdin.write("stop\n")
        proc.stdin.flush()
    except BrokenPipeError:
        pass  # it ended already
    return result_of(proc, timeout)


def consumer_row(r: dict) -> dict:
    """A consumer role's figures; a run that did not deliver every record says so."""
    out = {"rate": r["received"] / r["seconds"] if r.get("seconds") else 0.0, "received": r["received"],
           "p50_ms": r.get("p50_ms"), "p99_ms": r.get("p99_ms")}
    if not r.get("complete", True):
        out["incomplete"] = f"received {r['received']:,}, lost {r.get('lost', 0):,}, then nothing for {IDLE_STOP:.0f} s"
    return out


def scenario_direct(records: int, size: int, api: str = "consume") -> dict:
    c = Cluster()
    try:
        consumer = c.spawn("consumer", "--records", str(records), "--size", str(size), "--stamp",
                           "--reset", "earliest", "--api", api)
        time.sleep(0.5)
        producer = c.spawn("producer", "--records", str(records), "--size", str(size), "--stamp",
                           "--min-acks", "0", "--stay", *holding(records, size), stdin=True)
        r = result_of(consumer)
        p = stop_stayer(producer)
        return {**consumer_row(r), "send_rate": records / p["send_seconds"],
                "rss_mib": {"producer": p["rss_mib"], "consumer": r["rss_mib"]},
                "cpu_us": {"producer": p.get("cpu_us"), "consumer": r.get("cpu_us")}}
    finally:
        c.close()


def scenario_paced_latency(records: int, size: int, rate: int) -> dict:
    c = Cluster()
    try:
        consumer = c.spawn("consumer", "--records", str(records), "--size", str(size), "--stamp",
                           "--reset", "earliest")
        time.sleep(0.5)
        producer = c.spawn("producer", "--records", str(records), "--size", str(size), "--rate", str(rate),
                           "--min-acks", "0", "--linger", "3")
        r = result_of(consumer)
        result_of(producer)
        return {"rate": rate, "p50_ms": r.get("p50_ms"), "p99_ms": r.get("p99_ms")}
    finally:
        c.close()


def scenario_first_record_live() -> dict:
    c = Cluster()
    try:
        producer = c.spawn("producer", "--records", "200", "--size", "100", "--rate", "20", "--min-acks", "0",
                           "--warmup", "0.5", "--linger", "5")
        time.sleep(2.0)
        consumer = c.spawn("consumer", "--records", "1", "--reset", "latest")
        r = result_of(consumer)
        producer.kill()
        return {"first_record_ms": r["first_record_ms"]}
    finally:
        c.close()


def scenario_hold_unacked(records: int) -> dict:
    c = Cluster()
    try:
        producer = c.spawn("producer", "--records", str(records), "--size", "100", "--min-acks", "1", "--hold",
                           "--warmup", "0.2")
        p = result_of(producer)
        return {"records": records, "buffered": p["buffered"], "rss_mib": p["rss_mib"]}
    finally:
        c.close()


def scenario_store_burst(records: int, settings: list[str] = ()) -> dict:
    """Issue 26's measure: one producer sends ``records`` 100-byte records to one store as fast as it can
    (min_acks 1); the store's RSS before the burst, its peak during it, and 5 s after the last ack, sampled
    every 20 ms; then a consumer reads them all back (catch-up).  ``settings`` (KEY=VALUE) configure the
    store.  The rates are given against the raw ceiling measured first, in the same run."""
    ceil = ceiling(min(records, 1_000_000), 100)
    c = Cluster()
    db = tempfile.mkdtemp(prefix="dafka-bench-burst-")
    try:
        store = c.store(db, settings)
        rss = RssSampler(store.pid)
        time.sleep(1.0)
        before = rss.reset()
        before_parts = rss.parts()
        p = result_of(c.spawn("producer", "--records", str(records), "--size", "100", "--min-acks", "1"),
                      timeout=1800)
        peak = rss.peak
        time.sleep(5.0)
        after = rss.current()
        after_parts = rss.parts()
        r = result_of(c.spawn("consumer", "--records", str(records), "--size", "100", "--reset", "earliest"),
                      timeout=1800)
        rss.stop()
        s = c.stop_store(store)
        out = {"records": records, "settings": list(settings), "rss_before_mib": before, "rss_peak_mib": peak,
               "rss_after_5s_mib": after, "rss_parts_before_mib": before_parts, "rss_parts_after_5s_mib": after_parts,
               "ack_rate": records / p["ack_seconds"], "catchup_rate": rate_of(r),
               "catchup_received": r["received"], "ceiling_rate": ceil["rate"],
               "cpu_us": {"store": s.get("cpu_us"), "producer": p.get("cpu_us"), "consumer": r.get("cpu_us")}}
        print(f"\n== one burst of {records:,} 100-byte records into one store (issue 26)"
              f"{' with ' + ' '.join(settings) if settings else ''} ==")
        print(f"store RSS: before {before:.0f} MiB, peak {peak:.0f} MiB (target <= 256), 5 s after the last ack "
              f"{after:.0f} MiB = {after / before:.2f}x before (target <= 1.25x)")
        print("  of which anonymous / mapped files: before " + " / ".join(
            f"{before_parts.get(k, 0):.0f}" for k in ("anon", "file")) + " MiB, after " + " / ".join(
            f"{after_parts.get(k, 0):.0f}" for k in ("anon", "file")) + " MiB")
        print(f"{'raw pyzmq PUB/SUB ceiling':<32} {fmt_rate(ceil['rate'], ceil['rate'])}")
        print(f"{'producer -> store, acked':<32} {fmt_rate(out['ack_rate'], ceil['rate']):<28} "
              f"{fmt_cpu(out['cpu_us'])}")
        print(f"{'consumer catch-up from store':<32} {fmt_rate(out['catchup_rate'], ceil['rate'])}")
        return out
    finally:
        c.close()
        shutil.rmtree(db, ignore_errors=True)


def store_available() -> bool:
    try:
        import dafka.store  # noqa: F401
        return hasattr(dafka.store, "Store")
    except ImportError:
        return False


def scenario_store(records: int, size: int, with_consumer: bool) -> dict:
    c = Cluster()
    db = tempfile.mkdtemp(prefix="dafka-bench-")
    try:
        store = c.store(db)
        consumer = None
        if with_consumer:
            consumer = c.spawn("consumer", "--records", str(records), "--size", str(size), "--reset", "earliest")
        time.sleep(1.0)
        producer = c.spawn("producer", "--records", str(records), "--size", str(size), "--min-acks", "1")
        p = result_of(producer)
        out = {"ack_rate": records / p["ack_seconds"], "send_rate": records / p["send_seconds"],
               "rss_mib": {"producer": p["rss_mib"]}, "cpu_us": {"producer": p.get("cpu_us")}}
        if consumer is not None:
            r = result_of(consumer)
            out["rate"] = r["received"] / r["seconds"]
            out["rss_mib"]["consumer"] = r["rss_mib"]
            out["cpu_us"]["consumer"] = r.get("cpu_us")
        # catch-up: a new consumer reads everything back from the store alone
        catchup = c.spawn("consumer", "--records", str(records), "--size", str(size), "--reset", "earliest")
        r = result_of(catchup)
        out["catchup_rate"] = r["received"] / r["seconds"] if r["received"] else 0.0
        out["catchup_received"] = r["received"]
        out["cpu_us"]["catchup consumer"] = r.get("cpu_us")
        out["first_record_from_store_ms"] = r.get("first_record_ms")
        # the same with async for: bound by the consumer, this compares the two APIs best
        r = result_of(c.spawn("consumer", "--records", str(records), "--size", str(size), "--reset", "earliest",
                              "--api", "async"))
        out["catchup_async_rate"] = r["received"] / r["seconds"] if r["received"] else 0.0
        out["catchup_async_cpu_us"] = r.get("cpu_us")
        s = c.stop_store(store)
        out["rss_mib"]["store"] = s["rss_mib"]
        out["cpu_us"]["store"] = s.get("cpu_us")
        return out
    finally:
        c.close()
        shutil.rmtree(db, ignore_errors=True)


class RssSampler:
    """The RSS of a process (``/proc/<pid>/status`` VmRSS), sampled every 20 ms
    in a thread of the orchestrator: a baseline, then the peak over a phase."""

    def __init__(self, pid: int) -> None:
        import threading

        self.pid = pid
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def current(self) -> float:
        try:
            with open(f"/proc/{self.pid}/status") as status:
                for line in status:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) / 1024.0
        except OSError:
            pass
        return 0.0

    def parts(self) -> dict[str, float]:
        """The RSS's parts (MiB): anonymous memory (the heap, the threads' stacks) and file pages
        mapped by the process (LevelDB maps the tables it reads; the kernel can take those back)."""
        out: dict[str, float] = {}
        try:
            with open(f"/proc/{self.pid}/status") as status:
                for line in status:
                    if line.startswith(("RssAnon:", "RssFile:", "RssShmem:")):
                        key, value = line.split()[:2]
                        out[key[3:-1].lower()] = int(value) / 1024.0
        except OSError:
            pass
        return out

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self.current())

    def reset(self) -> float:
        """Start a new phase; returns the RSS now."""
        self.peak = now = self.current()
        return now

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def rate_of(r: dict) -> float:
    return r["received"] / r["seconds"] if r.get("received") and r.get("seconds") else 0.0


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


def scenario_partitions(producers: int, total: int) -> dict:
    """``producers`` producer processes (one partition each) send ``total``
    100-byte records between them into one store and one consumer: records
    per second from the producers' launch (interpreter start, discovery and
    connections included) to the consumer's last record."""
    c = Cluster()
    db = tempfile.mkdtemp(prefix="dafka-bench-")
    each = total // producers
    total = each * producers
    try:
        store = c.store(db)
        consumer = c.spawn("consumer", "--records", str(total), "--reset", "earliest")
        time.sleep(1.0)
        launched = time.perf_counter()
        # Each producer sends once it sees every peer (the store's writer and reader, the consumer and the
        # other producers), so that the rate from the first send() is the protocol's, start-up costs apart.
        procs = [c.spawn("producer", "--records", str(each), "--min-acks", "1", "--warmup", "0",
                         "--wait-peers", str(producers + 2)) for _ in range(producers)]
        r = result_of(consumer)
        ps = [result_of(p) for p in procs]
        s = c.stop_store(store)
        phases = {name: sum(p["cpu_phases"][name] for p in ps) / len(ps) * 1000 for name in ps[0]["cpu_phases"]}
        return {"producers": producers, "records": total, "received": r["received"],
                "producer_cpu_ms": phases,
                "rate": r["received"] / (r["finished"] - launched) if r.get("finished") else 0.0,
                # from the first send() of any producer (perf_counter is the system's monotonic clock)
                "sending_rate": r["received"] / (r["finished"] - min(p["send_started"] for p in ps))
                if r.get("finished") else 0.0,
                "cpu_us": {"consumer": r.get("cpu_us"), "store": s.get("cpu_us"),
                           "producers (all)": sum(p["cpu_phases"]["sending"] for p in ps) / total * 1e6},
                "rss_mib": {"consumer": r["rss_mib"], "store": s["rss_mib"],
                            "producer (max)": max(p["rss_mib"] for p in ps)}}
    finally:
        c.close()
        shutil.rmtree(db, ignore_errors=True)


def scenario_groups(members: int, partitions: int, total: int, size: int) -> dict:
    """``members`` members of one consumer group read ``partitions`` producers' ``total`` records
    between them, with a store (the producers keep each record until it acks it, so that a
    partition that moves is fetched where its new reader starts)."""
    c = Cluster()
    db = tempfile.mkdtemp(prefix="dafka-bench-")
    each = total // partitions
    total = each * partitions
    try:
        store = c.store(db)
        counts = [Path(db) / f"member-{n}.count" for n in range(members)]
        procs = [c.spawn("group-member", "--progress", str(count), stdin=True) for count in counts]
        for proc in procs:
            proc.stdout.readline()
        time.sleep(1.0)  # the members see each other and settle (join_wait 200 ms)
        # The producers see each other, the store's writer and reader, and each member's consumer (its
        # commits' producer starts with its first commit): they send once they see them all. (Counting two
        # peers a member, the producers waited out their 60 s at every member count.)
        producers = [c.spawn("producer", "--records", str(each), "--size", str(size), "--min-acks", "1",
                             "--warmup", "1", "--wait-peers", str(partitions + 1 + members))
                     for _ in range(partitions)]
        ps = [result_of(p) for p in producers]

        def read() -> int:
            return sum(int(count.read_text() or 0) for count in counts if count.exists())

        # The members read until the group has every record (a few twice while views settle), or nothing
        # more came for 30 s: however long the members take to meet the partitions on a busy machine.
        deadline, seen = time.monotonic() + 30, read()
        while seen < total and time.monotonic() < deadline:
            time.sleep(0.2)
            if (now_seen := read()) > seen:
                deadline, seen = time.monotonic() + 30, now_seen
        for proc in procs:
            proc.stdin.write("stop\n")
            proc.stdin.flush()
        rs = [result_of(p) for p in procs]
        c.stop_store(store)
        received = sum(r["received"] for r in rs)
        started = min(p["send_started"] for p in ps)
        finished = max(r["finished"] for r in rs if r.get("finished"))
        return {"members": members, "partitions": partitions, "records": total, "received": received,
                "rate": received / (finished - started), "shares": sorted(r["partitions"] for r in rs),
                "per_member": [r["received"] for r in rs],
                "cpu_us": {"member (mean)": sum(r["cpu_us"] * r["received"] for r in rs if r.get("cpu_us")) / received,
                           "producers (all)": sum(p["cpu_phases"]["sending"] for p in ps) / total * 1e6},
                "rss_mib": {"member (max)": max(r["rss_mib"] for r in rs)}}
    finally:
        c.close()
        shutil.rmtree(db, ignore_errors=True)


def scenario_module(name: str):
    """A scenario module beside this script (python -P, PYTHONSAFEPATH: the script's folder is not on the path)."""
    import importlib

    if str(HERE.parent) not in sys.path:
        sys.path.insert(0, str(HERE.parent))
    return importlib.import_module(name)


def scenario_cdc(records: int, bootstrap_rows: int, latency_seconds: float) -> dict:
    """bench/cdc_bench.py, with a store process of this file's store role (skipped without PostgreSQL)."""
    cdc_bench = scenario_module("cdc_bench")

    if not cdc_bench.available():
        print("\n== change data capture: skipped (no PostgreSQL server or psycopg2: pip install '.[cdc]') ==")
        return {}

    def store_process(tower, db: str) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, str(HERE), "--role", "store", "--sub", tower.sub_endpoint,
                                 "--pub", tower.pub_endpoint, "--db", db], stdout=subprocess.PIPE,
                                stdin=subprocess.PIPE, text=True)
        proc.stdout.readline()
        return proc

    result = cdc_bench.run(store_process, proc_cpu_seconds, records, bootstrap_rows, latency_seconds)
    for line in cdc_bench.report(result):
        print(line)
    return result


def scenario_mirror(a: argparse.Namespace) -> dict:
    """bench/mirror_bench.py with this file's roles."""
    mirror_bench = scenario_module("mirror_bench")

    sizes = [int(s) for s in a.sizes.split(",")]
    records = a.records if a.mirror_records is None else a.mirror_records
    catchup = a.catchup_records if a.mirror_catchup_records is None else a.mirror_catchup_records
    return mirror_bench.run_all(sys.modules[__name__], records, sizes, catchup, a.mirror_lag_seconds)


def scenario_kafka(a: argparse.Namespace) -> dict:
    """bench/kafka_bench.py: confluent-kafka through `dafka kafka` against the native path."""
    kafka_bench = scenario_module("kafka_bench")
    return kafka_bench.run_all(sys.modules[__name__], a.kafka_records, [int(s) for s in a.sizes.split(",")],
                               a.kafka_rate, a.kafka_latency_seconds)


def scenario_recovery(records: int, size: int, api: str) -> dict:
    """bench/recovery_bench.py: a consumer stopped 2 s mid-stream, and how fast it recovers."""
    recovery_bench = scenario_module("recovery_bench")

    return recovery_bench.scenario_recovery(sys.modules[__name__], records, size, api)


def guarded(scenario, *args, **kwargs) -> dict:
    """Run a scenario; one that does not finish is reported as such (``error``), and the run goes on."""
    try:
        return scenario(*args, **kwargs)
    except ScenarioFailed as exc:
        print(f"{scenario.__name__}{args}: did not finish: {exc}", file=sys.stderr, flush=True)
        return {"error": str(exc)}


def scenario_shards(a: argparse.Namespace) -> dict:
    """bench/shard_bench.py: sharded stores' capacity against S, and a rebalance."""
    return scenario_module("shard_bench").run_all(
        sys.modules[__name__], [int(s) for s in a.shard_stores.split(",") if s], a.shard_records,
        [int(s) for s in a.sizes.split(",")], a.shard_partitions)


def scenario_ui(a: argparse.Namespace) -> dict:
    """bench/ui_bench.py: the web console's page loads at scale, and its CPU (skipped without the ui extra)."""
    import importlib.util

    if importlib.util.find_spec("starlette") is None or importlib.util.find_spec("uvicorn") is None:
        print("\n== web console: skipped (pip install '.[ui]') ==")
        return {}
    return scenario_module("ui_bench").run_all(sys.modules[__name__], a.ui_partitions, a.ui_records, a.ui_seconds,
                                               a.ui_rate, idle_wait=a.ui_idle_wait, browser=bool(a.ui_browser))


def scenario_compaction(a: argparse.Namespace) -> dict:
    """bench/compaction_bench.py: writes with and without compaction, a CDC bootstrap from a compacted topic
    against SIGUSR1, and compaction's throughput."""
    return scenario_module("compaction_bench").run_all(sys.modules[__name__], a.compaction_records,
                                                       a.compaction_keys, a.bootstrap_rows)


def scenario_scale(a: argparse.Namespace) -> dict:
    """bench/scale_bench.py: discovery's cost against the number of peers."""
    scale_bench = scenario_module("scale_bench")

    return scale_bench.run_all(sys.modules[__name__], [int(p) for p in a.scale_peers.split(",")], a.scale_seconds)


def line_within(stream, timeout: float) -> str:
    """The next line of a child's pipe (text mode), or "" if nothing came within ``timeout`` seconds
    (or it closed)."""
    with selectors.DefaultSelector() as sel:
        sel.register(stream, selectors.EVENT_READ)
        if not sel.select(timeout):
            return ""
    return stream.readline()


def start_tower(timeout: float = 60.0) -> tuple[subprocess.Popen, str, str]:
    """A dafka_towerd process on ports of its own choosing: (process, its sub endpoint, its pub endpoint).
    Ports picked beforehand (:func:`free_port`) may be taken by another program before the tower binds them,
    and a tower that could not bind leaves every peer of the scenario waiting for nothing."""
    proc = subprocess.Popen([sys.executable, "-c", "from dafka.towerd.main import main; main()",
                             "--sub", "tcp://127.0.0.1:*", "--pub", "tcp://127.0.0.1:*"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    line = line_within(proc.stderr, timeout)
    found = re.search(r"beacons in (\S+), out (\S+)", line)
    if found is None:
        proc.kill()
        proc.wait()
        raise RuntimeError(f"the tower did not start in {timeout:.0f} s: {line.strip() or 'it said nothing'}")
    return proc, found.group(1), found.group(2)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_cpu_seconds(pid: int) -> float:
    """CPU seconds of a process so far, all its threads together (user + system)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_cpu_and_wakeups(pid: int) -> tuple[float, int]:
    """CPU seconds and voluntary context switches (a thread went to sleep, to
    be woken later) of a process so far, all its threads together.  CPU from
    each thread's schedstat (nanoseconds): idle roles spend a few
    milliseconds a minute, which /proc's 10 ms ticks would round away."""
    schedstat = Path("/proc/self/schedstat").exists()  # a kernel without schedstats: ticks it is
    cpu = 0.0 if schedstat else proc_cpu_seconds(pid)
    switches = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            if schedstat:
                cpu += int((task / "schedstat").read_text().split()[0]) / 1e9
            for line in (task / "status").read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches"):
                    switches += int(line.split()[1])
        except (FileNotFoundError, ProcessLookupError):
            pass  # a thread that ended meanwhile (its time is lost: threads of idle roles live on)
    return cpu, switches


def scenario_idle(seconds: float) -> dict:
    """CPU and wake-ups of each role's daemon or console tool while nothing
    flows: a tower, a store, a producer that sent one record and waits on its
    stdin, and a consumer that got it; measured after a settling period."""
    db = tempfile.mkdtemp(prefix="dafka-bench-idle-")

    def tool(module: str, *args: str, stdin: bool = False) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", f"from {module} import main; main()", *args],
                                stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})  # the consumer's line comes at once

    procs = {}
    try:
        procs["tower"], tower_sub, tower_pub = start_tower()
        peer = ["--sub", tower_sub, "--pub", tower_pub, "-X", "beacon/address=127.0.0.1"]
        procs["store"] = tool("dafka.cli.stored", "--db", db, *peer)
        procs["consumer"] = tool("dafka.cli.consumer", "idle", "--from-beginning", "-q", *peer)
        procs["producer"] = tool("dafka.cli.producer", "idle", "-q", *peer, stdin=True)
        procs["producer"].stdin.write("one record\n")
        procs["producer"].stdin.flush()
        line = line_within(procs["consumer"].stdout, 60.0)  # (a bench never hangs)
        if not line.rstrip().endswith("one record"):
            raise ScenarioFailed(f"the idle scenario's consumer printed {line!r} within 60 s, not its record")
        time.sleep(10.0)  # settle: hellos, HEADs, retries and start-up work are over
        before = {role: proc_cpu_and_wakeups(p.pid) for role, p in procs.items()}
        time.sleep(seconds)
        out = {}
        for role, p in procs.items():
            cpu, switches = proc_cpu_and_wakeups(p.pid)
            out[role] = {"cpu_percent": (cpu - before[role][0]) / seconds * 100,
                         "wakeups_per_s": (switches - before[role][1]) / seconds}
        return {"seconds": seconds, "roles": out}
    finally:
        for p in procs.values():
            p.kill()
            p.wait()
        shutil.rmtree(db, ignore_errors=True)


def spark_available() -> bool:
    import importlib.util

    if importlib.util.find_spec("pyspark") is None:
        return False
    return shutil.which("java") is not None or bool(os.environ.get("JAVA_HOME"))


def spark_session():
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["PYTHONSAFEPATH"] = "1"
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"  # else Spark resolves the hostname to a LAN address
    from pyspark.sql import SparkSession

    from dafka.spark import register

    # local[4]: four tasks can run at once (the fairness scenario); the rate queries make one task per core.
    session = (SparkSession.builder.master("local[4]").appName("dafka-bench")
               .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1").getOrCreate())
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


# ---------------------------------------------------------------------------


def fmt_rate(rate: float | None, ceiling_rate: float) -> str:
    if not rate:
        return "n/a"
    return f"{rate:>10,.0f}/s  ({rate / ceiling_rate:4.2f}x)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--role", choices=sorted(ROLES))
    ap.add_argument("--records", type=int, default=300_000, help="records per throughput run")
    ap.add_argument("--catchup-records", type=int, default=1_000_000, help="records stored for catch-up")
    ap.add_argument("--hold-records", type=int, default=1_000_000, help="unacked records held for the RSS run")
    ap.add_argument("--burst-records", type=int,
                    help="records of the one-burst store memory run (default 10 x --catchup-records)")
    ap.add_argument("--burst-set", action="append", metavar="KEY=VALUE", default=[],
                    help="a config key of the store in the one-burst run (repeatable), e.g. to compare "
                         "store/block_bytes=4096 with the default")
    ap.add_argument("--sizes", default="100,1000", help="record sizes in bytes, comma-separated")
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    ap.add_argument("--skip", default="",
                    help="comma-separated scenarios to skip (recovery, store, bulk, partitions, groups, idle, hold, "
                         "spark, cdc, mirror, burst, scale, shards, ui, compaction, kafka)")
    ap.add_argument("--only", choices=("cdc", "mirror", "burst", "scale", "shards", "ui", "compaction", "kafka"),
                    help="run only this scenario (burst measures its own ceiling)")
    ap.add_argument("--ab", nargs="?", const="v0.2.0", metavar="REV",
                    help="same-run A/B: this checkout against REV (default: the last release, v0.2.0; 'pure': "
                         "this checkout without its compiled twins) in alternation, the ratio of every figure "
                         "(bench/ab_bench.py)")
    ap.add_argument("--ab-rounds", type=int, default=3, help="rounds of each side in an A/B run")
    ap.add_argument("--ab-scenarios", default="live,store,recovery",
                    help="scenarios of an A/B run, comma-separated: live, store, recovery")
    ap.add_argument("--mirror-records", type=int, help="records of each mirror throughput run (default --records)")
    ap.add_argument("--mirror-catchup-records", type=int,
                    help="records the mirror catches up on after a stop (default --catchup-records; 0: none)")
    ap.add_argument("--mirror-lag-seconds", type=float, default=10.0,
                    help="how long the mirror lag run over the impaired link sends 10,000 records/s (0: not run)")
    ap.add_argument("--kafka-records", type=int, default=100_000,
                    help="records of each Kafka gateway run (bench/kafka_bench.py), per size in --sizes")
    ap.add_argument("--kafka-rate", type=int, default=10_000,
                    help="records/s of the Kafka gateway's produce-to-consume latency run")
    ap.add_argument("--kafka-latency-seconds", type=float, default=10.0,
                    help="how long the Kafka gateway's latency run lasts (0: no latency nor rebalance run)")
    ap.add_argument("--cdc-records", type=int, default=100_000, help="row changes per sustained CDC run")
    ap.add_argument("--bootstrap-rows", type=int, default=1_000_000, help="rows of the CDC bootstrap run")
    ap.add_argument("--cdc-latency-seconds", type=float, default=10.0,
                    help="how long the CDC latency run commits 1,000 changes/s")
    ap.add_argument("--idle-seconds", type=float, default=60.0, help="how long the idle scenario measures")
    ap.add_argument("--scale-peers", default="100,500,2000,10000",
                    help="cluster sizes of the discovery scale scenario (simulated peers; see bench/scale_bench.py)")
    ap.add_argument("--scale-seconds", type=float, default=20.0, help="how long the scale scenario measures CPU at each size")
    ap.add_argument("--shard-stores", default="1,2,4,8",
                    help="store counts of the shards scenario (bench/shard_bench.py; empty: only its rebalance)")
    ap.add_argument("--shard-records", type=int, default=200_000, help="records of each row of the shards scenario")
    ap.add_argument("--shard-partitions", type=int, default=64,
                    help="partitions of the shards scenario (its capacity rows and its rebalance)")
    ap.add_argument("--compaction-records", type=int, default=500_000,
                    help="keyed records of each write run of the compaction scenario (bench/compaction_bench.py)")
    ap.add_argument("--compaction-keys", type=int, default=10_000, help="keys those records cycle over")
    ap.add_argument("--ui-partitions", type=int, default=3000, help="partitions the ui scenario's store holds")
    ap.add_argument("--ui-records", type=int, default=10_000_000, help="records the ui scenario's store holds")
    ap.add_argument("--ui-seconds", type=float, default=30.0, help="how long the ui scenario measures each CPU figure")
    ap.add_argument("--ui-rate", type=int, default=100_000, help="records a second of the ui scenario's loaded cluster")
    ap.add_argument("--ui-browser", type=int, choices=(0, 1), default=1,
                    help="the ui scenario loads pages in chromium where it is installed (0: over HTTP only)")
    ap.add_argument("--ui-idle-wait", type=float, default=35.0,
                    help="seconds the ui scenario waits for the console to stop listening (it does 30 s after a look)")
    # role options
    ap.add_argument("--sub")
    ap.add_argument("--pub")
    ap.add_argument("--endpoint")
    ap.add_argument("--db")
    ap.add_argument("--set", action="append", metavar="KEY=VALUE", help="store and producer roles: a config key (repeatable)")
    ap.add_argument("--reset", default="earliest")
    ap.add_argument("--address", default="127.0.0.1", help="the roles' beacon/address and bind address")
    ap.add_argument("--latency-from", type=int, default=0, help="consumer role: sample latency from this offset on")
    ap.add_argument("--topic", default=TOPIC)
    ap.add_argument("--bulk", type=int, choices=(0, 1), default=1, help="consumer/bulk of the consumer role")
    ap.add_argument("--api", choices=("consume", "poll", "async"), default="consume",
                    help="how the consumer role reads: consume() batches, poll() per record, or async for")
    ap.add_argument("--min-acks", type=int, default=0)
    ap.add_argument("--rate", type=int, default=0)
    ap.add_argument("--stamp", action="store_true")
    ap.add_argument("--keys", type=int, default=0, help="producer role: keyed records, cycling over this many keys")
    ap.add_argument("--ack-latency", action="store_true",
                    help="producer role: the time from send to ack of every 10th record (p50, p99)")
    ap.add_argument("--hold", action="store_true")
    ap.add_argument("--payload", choices=("repeat", "random"), default="repeat",
                    help="producer role: each record the same bytes (compressible), or random ones (not)")
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--wait-peers", type=int, default=0, help="producer role: wait until the towers report this many peers")
    ap.add_argument("--partitions", default="1,8,32,128", help="producer counts of the many-partitions scenario")
    ap.add_argument("--linger", type=float, default=0.0)
    ap.add_argument("--stay", action="store_true", help="producer role: after its result, stay until a line on stdin")
    ap.add_argument("--progress", help="group-member role: the file it writes its count of records to; store role: "
                                       "its stats, a few times a second")
    ap.add_argument("--producers", type=int, default=1, help="partitions role: producers in the process")
    ap.add_argument("--group-members", default="1,2,4", help="member counts of the consumer group scenario")
    a = ap.parse_args(argv)
    if a.role:
        ADDRESS[0] = a.address
        ROLES[a.role](a)
        return 0

    if a.ab:
        results = scenario_module("ab_bench").run_ab(sys.modules[__name__], a.ab, a.ab_rounds,
                                                     [int(s) for s in a.sizes.split(",")], a.records,
                                                     a.ab_scenarios.split(","))
        if a.json:
            Path(a.json).write_text(json.dumps(results, indent=2))
        return 0
    skip = set(filter(None, a.skip.split(",")))
    if a.burst_records is None:
        a.burst_records = a.catchup_records * 10
    if a.only:
        only = {"cdc": lambda: scenario_cdc(a.cdc_records, a.bootstrap_rows, a.cdc_latency_seconds),
                "mirror": lambda: scenario_mirror(a),
                "burst": lambda: scenario_store_burst(a.burst_records, a.burst_set),
                "scale": lambda: scenario_scale(a),
                "shards": lambda: scenario_shards(a),
                "ui": lambda: scenario_ui(a),
                "compaction": lambda: scenario_compaction(a),
                "kafka": lambda: scenario_kafka(a)}
        results = {a.only: only[a.only]()}
        if a.json:
            Path(a.json).write_text(json.dumps(results, indent=2))
        return 0
    results: dict = {"machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                                 "pyzmq": zmq.__version__, "libzmq": zmq.zmq_version()},
                     "records": a.records, "runs": {}}
    try:
        run_everything(a, skip, results)
    finally:  # what was measured is kept, whatever happened to the rest
        if a.json:
            Path(a.json).write_text(json.dumps(results, indent=2))
    return 0


def survived(name: str, scenario: Callable[[], dict]) -> dict:
    """A scenario of the full run: one that fails says why (its ``error``), and the run goes on."""
    try:
        return scenario()
    except Exception as exc:  # (a benchmark reports a failure, it does not end the run's other figures)
        print(f"\n== {name}: FAILED ({type(exc).__name__}: {exc}); the run goes on ==", flush=True)
        return {"error": f"{type(exc).__name__}: {exc}"}


def run_everything(a: argparse.Namespace, skip: set[str], results: dict) -> None:
    sizes = [int(s) for s in a.sizes.split(",")]
    for size in sizes:
        run: dict = {}
        run["ceiling"] = ceiling(a.records, size)
        run["direct"] = guarded(scenario_direct, a.records, size)
        run["direct_async"] = guarded(scenario_direct, a.records, size, api="async")  # next to consume(): less drift
        run["direct_poll"] = guarded(scenario_direct, a.records, size, api="poll")
        if "recovery" not in skip:
            for api in ("consume", "async"):
                run[f"recovery_{api}"] = guarded(scenario_recovery, a.records, size, api)
        run["paced"] = guarded(scenario_paced_latency, min(a.records, 20_000), size, 10_000)
        if "store" not in skip and store_available():
            run["store"] = guarded(scenario_store, a.records, size, with_consumer=False)
            run["store_consumer"] = guarded(scenario_store, a.records, size, with_consumer=True)
        results["runs"][size] = run
        print_table(size, run)
    if "store" not in skip and "bulk" not in skip and store_available():
        session = spark_session() if "spark" not in skip and spark_available() else None
        results["bulk"] = {}
        for size in sizes:
            bulk = scenario_bulk_reads(a.catchup_records, size, session, concurrency=size == sizes[0])
            results["bulk"][size] = bulk
            print_bulk(bulk, results["runs"][size]["ceiling"]["rate"])
        if session is not None:
            stop_spark(session)
    if "partitions" not in skip and "store" not in skip and store_available():
        ceiling_rate = results["runs"][sizes[0]]["ceiling"]["rate"]
        results["partitions"] = {}
        print(f"\n== many partitions: P producers send {a.catchup_records // 5:,} 100-byte records in all ==")
        for producers in (int(x) for x in a.partitions.split(",")):
            m = scenario_partitions(producers, a.catchup_records // 5)
            results["partitions"][producers] = m
            print(f"{'P=' + str(producers):<44} {fmt_rate(m['rate'], ceiling_rate):<28} {fmt_cpu(m['cpu_us'])}; "
                  f"RSS MiB " + ", ".join(f"{k} {v:.0f}" for k, v in m["rss_mib"].items()))
            print(f"{'':<44} from the first send(): {fmt_rate(m['sending_rate'], ceiling_rate)}")
            print(f"{'':<44} a producer's CPU ms: " + ", ".join(f"{k} {v:.0f}" for k, v in m["producer_cpu_ms"].items()))
    if "groups" not in skip:
        ceiling_rate = results["runs"][sizes[0]]["ceiling"]["rate"]
        results["groups"] = {}
        print(f"\n== consumer group: M members read 8 producers' {a.records:,} {sizes[0]}-byte records ==")
        for members in (int(x) for x in a.group_members.split(",")):
            g = scenario_groups(members, 8, a.records, sizes[0])
            results["groups"][members] = g
            print(f"{'M=' + str(members):<44} {fmt_rate(g['rate'], ceiling_rate):<28} {fmt_cpu(g['cpu_us'])}; "
                  f"{g['received']:,} of {g['records']:,} records, partitions per member {g['shares']}, "
                  f"RSS MiB member {g['rss_mib']['member (max)']:.0f}")
    if "idle" not in skip:
        results["idle"] = guarded(scenario_idle, a.idle_seconds)
        print(f"\n== idle for {a.idle_seconds:.0f} s (daemons and console tools, nothing flowing) ==")
        if "error" in results["idle"]:
            print(f"did not finish: {results['idle']['error']}")
        for role, r in results["idle"].get("roles", {}).items():
            print(f"{role:<44} CPU {r['cpu_percent']:.3f} %, {r['wakeups_per_s']:.1f} wake-ups/s")
    results["first_record_live"] = survived("first record", scenario_first_record_live)
    if "first_record_ms" in results["first_record_live"]:
        print(f"consumer start to first record, live producer: "
              f"{results['first_record_live']['first_record_ms']:.1f} ms")
    stored = "store" not in skip and store_available()
    for name, wanted, scenario in (
            ("cdc", True, lambda: scenario_cdc(a.cdc_records, a.bootstrap_rows, a.cdc_latency_seconds)),
            ("mirror", stored, lambda: scenario_mirror(a)),
            ("burst", stored, lambda: scenario_store_burst(a.burst_records, a.burst_set)),
            ("scale", True, lambda: scenario_scale(a)),
            ("shards", stored, lambda: scenario_shards(a)),
            ("ui", stored, lambda: scenario_ui(a)),
            ("compaction", stored, lambda: scenario_compaction(a)),
            ("kafka", stored, lambda: scenario_kafka(a))):
        if name not in skip and wanted:
            results[name] = survived(name, scenario)
    if "hold" not in skip:
        results["hold"] = h = survived("hold", lambda: scenario_hold_unacked(a.hold_records))
        if "buffered" in h:
            print(f"producer holding {h['buffered']:,} unacked 100-byte records: peak RSS {h['rss_mib']:.0f} MiB")


def print_bulk(b: dict, ceiling_rate: float) -> None:
    print(f"\n== {b['records']:,} stored {b['size']}-byte records, read back while the store runs ==")
    print(f"{'producer -> store, acked':<44} {fmt_rate(b['ack_rate'], ceiling_rate)}")
    rfc46 = b["catchup_rfc46"]["rate"]
    for name, label in (("bulk", "consumer catch-up, bulk answers"), ("rfc46", "consumer catch-up, RFC 46 answers"),
                        ("reference", "reference consumer (raw frames) catch-up")):
        r = b[f"catchup_{name}"]
        note = f"{r['received']:,} records"
        if name == "reference":
            note += (f", {r['rate'] / rfc46:.2f}x RFC 46 consumer, {r['fetches']} FETCHes ({r['filtered']} "
                     f"filtered), {r['foreign']} foreign messages")
        if r.get("cpu_us") is not None:
            note += f", CPU {r['cpu_us']:.2f} us/record"
        print(f"{label:<44} {fmt_rate(r['rate'], ceiling_rate):<28} {note}")
    path = b.get("spark_path_rate")
    for key, label in (("spark_path_rate", "Spark via path, a stopped store's copy (median)"),
                       ("spark_tower_rate", "Spark via tower (median of 3)"),
                       ("spark_path_running_rate", "Spark via path, running store (median)")):
        rate = b.get(key)
        if rate is not None:
            vs = f", {rate['median'] / path['median']:.2f}x path" if path and key != "spark_path_rate" else ""
            print(f"{label:<44} {fmt_rate(rate['median'], ceiling_rate):<28} best {rate['best']:,.0f}/s, "
                  f"{b['spark_tasks']} tasks{vs}; {fmt_cpu(rate.get('cpu_us', {}))}; "
                  f"{rate.get('busy_cores', 0):.2f} of {os.cpu_count()} cores busy")
    if "four_readers" in b:
        f = b["four_readers"]
        print(f"{'4 bulk readers at once: store RSS':<44} {'':<28} {f['rss_before_mib']:.0f} -> "
              f"{f['rss_peak_mib']:.0f} MiB, {f['growth_per_reader_mib']:.1f} MiB per reader; rates "
              + ", ".join(f"{r:,.0f}/s" for r in f["rates"]))
    if "fairness" in b:
        f = b["fairness"]
        print(f"{'Spark (4 tasks) + 2 consumers at once':<44} {fmt_rate(f['spark_rate'], ceiling_rate):<28} "
              + "; ".join(f"consumer {c['rate']:,.0f}/s, first record {c['first_record_ms']:.0f} ms, done "
                          f"{c['finished_after_spark_began_s']:.2f} s after Spark began" for c in f["consumers"])
              + f"; Spark took {f['spark_seconds']:.2f} s")
    if "live" in b:
        lv = b["live"]
        print(f"{'producer -> store acked, alone':<44} {fmt_rate(lv['alone_ack_rate'], ceiling_rate)}")
        print(f"{'  ... while 2 consumers catch up':<44} {fmt_rate(lv['busy_ack_rate'], ceiling_rate):<28} "
              f"{lv['busy_ack_rate'] / lv['alone_ack_rate']:.2f}x alone; catch-up "
              + ", ".join(f"{r:,.0f}/s" for r in lv["catchup_rates"]))
    print(f"{'peak RSS (MiB)':<44} {'':<28} " + ", ".join(f"{k} {v:.0f}" for k, v in b["rss_mib"].items()))


def fmt_cpu(cpu: dict) -> str:
    """CPU microseconds per record of each process, e.g. "CPU/rec producer 2.1 us, consumer 2.9 us"."""
    shown = [f"{name} {value:.2f}" for name, value in cpu.items() if value is not None]
    return "CPU us/record: " + ", ".join(shown) if shown else ""


def vs_consume(rate: float, consume_rate: float, cpu: float | None, consume_cpu: float | None) -> str:
    """async for against consume() in the same run: rate and the consumer's CPU per record."""
    note = f"{rate / consume_rate:.2f}x consume()" if consume_rate else ""
    if cpu and consume_cpu:
        note += f"; consumer CPU {cpu:.2f} us/record, {cpu / consume_cpu:.2f}x consume()'s"
    return note


def print_table(size: int, run: dict) -> None:
    ceiling_rate = run["ceiling"]["rate"]
    rows = [("raw pyzmq PUB/SUB ceiling", fmt_rate(ceiling_rate, ceiling_rate), fmt_cpu(run["ceiling"]["cpu_us"]))]

    def add(name: str, r: dict, rate: float | None, note: str) -> None:
        """A row, or what stopped it: a scenario that did not finish, or one that delivered less."""
        if "error" in r:
            rows.append((name, "did not finish", r["error"]))
        else:
            rows.append((name, fmt_rate(rate, ceiling_rate), f"{r['incomplete']}; {note}" if r.get("incomplete") else note))

    d = run["direct"]
    add("producer -> consumer (consume())", d, d.get("rate"),
        f"p50 {d['p50_ms']:.1f} ms, p99 {d['p99_ms']:.1f} ms at full load" if d.get("p50_ms") else "")
    if "error" not in d:
        rows.append(("  producer send()", fmt_rate(d["send_rate"], ceiling_rate), fmt_cpu(d["cpu_us"])))
    dp = run["direct_poll"]
    add("  ... read with poll() per record", dp, dp.get("rate"), fmt_cpu(dp.get("cpu_us", {})))
    da = run["direct_async"]
    add("  ... read with dafka.aio async for", da, da.get("rate"),
        vs_consume(da["rate"], d["rate"], da["cpu_us"]["consumer"], d["cpu_us"]["consumer"])
        if "error" not in da and "error" not in d else "")
    for api, label in (("consume", "consume()"), ("async", "async for")):
        r = run.get(f"recovery_{api}")
        if r is not None:
            add(f"stopped 2 s, recovers ({label})", r, r.get("rate"),
                fmt_cpu(r.get("cpu_us", {})) + (f"; steady consumer {r['steady']['rate']:,.0f}/s" if "steady" in r else ""))
    p = run["paced"]
    if p.get("p50_ms") is not None:
        rows.append(("latency at 10,000 rec/s", "", f"p50 {p['p50_ms']:.2f} ms, p99 {p['p99_ms']:.2f} ms"))
    if "store" in run:
        s = run["store"]
        add("producer -> store, acked", s, s.get("ack_rate"), fmt_cpu(s.get("cpu_us", {})))
        sc = run["store_consumer"]
        add("producer -> consumer, store running", sc, sc.get("rate"), fmt_cpu(sc.get("cpu_us", {})))
        if "error" not in s:
            rows.append(("consumer catch-up from store", fmt_rate(s["catchup_rate"], ceiling_rate),
                         f"{s['catchup_received']:,} records"))
            rows.append(("  ... read with dafka.aio async for", fmt_rate(s["catchup_async_rate"], ceiling_rate),
                         vs_consume(s["catchup_async_rate"], s["catchup_rate"], s["catchup_async_cpu_us"],
                                    s["cpu_us"]["catchup consumer"])))
            if s.get("first_record_from_store_ms") is not None:
                rows.append(("start to first record (store only)", "", f"{s['first_record_from_store_ms']:.1f} ms"))
            rows.append(("peak RSS (MiB)", "", ", ".join(f"{k} {v:.0f}" for k, v in s["rss_mib"].items())))
    if "error" not in d:
        rows.append(("peak RSS direct (MiB)", "", ", ".join(f"{k} {v:.0f}" for k, v in d["rss_mib"].items())))
    print(f"\n== {size}-byte records ==")
    for name, rate, note in rows:
        print(f"{name:<38} {rate:<28} {note}")


if __name__ == "__main__":
    sys.exit(main())
