"""The roles of a benchmark: each peer of a scenario is run.py run with ``--role NAME``, in a process of its
own.  A role prints one JSON line, its result (see common.emit)."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import threading
import time
from pathlib import Path
import zmq

from .common import ADDRESS, IDLE_STOP, SPIN_BELOW, STAMP_EVERY, TOPIC, config, cpu_seconds, emit, payload


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
        print("sending", flush=True)  # for an orchestrator that acts mid-stream (bench/dafkabench/bm_recovery.py)
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




class _NoLoss:
    records_lost = 0


def _loss_counter(state):
    """What counts the records a consumer went past (read without stats()' cost per batch); an older
    release (bench/dafkabench/ab.py) has no such counter."""
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
    """The reference consumer's behaviour in raw frames (refconsumer.py: FETCH only on a HEAD, a
    DIRECT-HEAD or a gap, through the reference's fetch filter), catching up from ``earliest``."""
    from .refconsumer import RefConsumer

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
    if a.progress:  # its counters, for an orchestrator that watches moves (bench/dafkabench/bm_shard.py)
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


def main(argv: list[str]) -> int:
    """Run the role that ``argv`` names (``--role NAME`` and its options); the scale scenario's roles are
    ``scale-*``, with options of their own (bm_scale.py)."""
    name = argv[argv.index("--role") + 1] if "--role" in argv[:-1] else ""
    if name.startswith("scale-"):
        from . import bm_scale

        rest = list(argv)
        rest[rest.index("--role") + 1] = name.removeprefix("scale-")
        bm_scale.main(rest)
        return 0
    ap = argparse.ArgumentParser(prog="run.py --role", description="A peer of a benchmark scenario.")
    ap.add_argument("--role", choices=sorted(ROLES), required=True)
    ap.add_argument("--sub")
    ap.add_argument("--pub")
    ap.add_argument("--endpoint")
    ap.add_argument("--db")
    ap.add_argument("--records", type=int, default=300_000)
    ap.add_argument("--size", type=int, default=100)
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
    ap.add_argument("--linger", type=float, default=0.0)
    ap.add_argument("--stay", action="store_true", help="producer role: after its result, stay until a line on stdin")
    ap.add_argument("--progress", help="group-member role: the file it writes its count of records to; store role: "
                                       "its stats, a few times a second")
    ap.add_argument("--producers", type=int, default=1, help="partitions role: producers in the process")
    a = ap.parse_args(argv)
    ADDRESS[0] = a.address
    ROLES[a.role](a)
    return 0
