"""One Dafka peer per process, for the fault-injection scenarios.

Usage (every role takes ``--config JSON``, a dict of config overrides, and
``--stats FILE``, where it rewrites a small JSON of its counters a few times a
second)::

    python tests/faults/roles.py tower    --sub tcp://127.0.0.1:PORT --pub tcp://127.0.0.1:PORT
    python tests/faults/roles.py store    --db DIR [--fail-writes-file FILE]
    python tests/faults/roles.py producer --topic T --log FILE [--count N] [--rate R] [--hold]
    python tests/faults/roles.py consumer --topic T --log FILE [--offsets FILE] [--reset earliest]

Every role says what it does in a log, one line per event, each written with
a single ``write(2)`` on an ``O_APPEND`` descriptor, so the checker can read it
even after the process was SIGKILLed (the kernel keeps what was written):

* producer: ``address <ADDR>``, ``topic <T>``, ``sent <offset>`` (written
  *before* the record is handed to ``send``: a line for a record that never
  went out only counts as "unseen"), ``acked <offset>`` (from the
  ``on_delivery`` callback), and at the end ``close ok`` or
  ``close unacked <n>``.  SIGTERM stops sending and closes the producer with
  ``--close-timeout``; it exits 0 when everything was acked, else 3.
* consumer: ``<partition> <offset> <value>`` for each record ``poll``
  returned, written before the next ``poll`` (which is when the offsets
  journal commits the previous record).  A partition or value that is not a
  printable ASCII word is written as ``hex:<hex>``.  SIGTERM closes it (exit 0).
* store: ``ready <writer> <reader>`` on stdout, then ``Store.run_forever()``
  (which handles SIGTERM itself).  ``--fail-writes-file F`` makes every
  LevelDB write fail with "No space left on device" while F exists (the
  writer's ``_write_batch`` hook), for machines where a tmpfs cannot be
  mounted.
* tower: ``tower <sub> <pub>`` on stdout, then ``Tower.run()``.

Beside the dafka peers, two Kafka clients (confluent-kafka) of ``dafka kafka``
gateways, logging in the same formats, so that the same checker reads them:

* kafka-producer: idempotent, ``acks=all``; record ``n`` of partition ``p``
  goes to that partition explicitly, with :func:`value_for` of the address
  ``kafka/<p>`` and offset ``n``, and is logged in ``<logdir>/kafka-<p>.producer.log``
  as a dafka producer's: the producer's own count stands for the offset (Kafka
  offsets are the gateway's).  SIGTERM stops sending and flushes.
* kafka-member: a member of a consumer group that commits after each batch it
  logged; a record is logged as ``kafka/<p> <n> <value>``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time

PAD = b"x"


def value_for(address: str, offset: int, size: int = 0) -> bytes:
    """The content a producer role sends as record ``offset``: printable, no
    spaces, unique per partition and offset, padded to at least ``size`` bytes."""
    head = b"%s:%d:" % (address[:8].encode(), offset)
    return head + PAD * max(0, size - len(head))


def encode_value(value: bytes) -> str:
    """How a consumer role writes a value in its log."""
    if value and all(0x21 <= b <= 0x7E for b in value) and not value.startswith(b"hex:"):
        return value.decode("ascii")
    return "hex:" + value.hex()


def decode_value(text: str) -> bytes:
    return bytes.fromhex(text[4:]) if text.startswith("hex:") else text.encode("ascii")


def rss_kib(pid: int | str = "self") -> int:
    """VmRSS of a process in KiB (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class Log:
    """Append-only line log: one write(2) per line, safe across threads and SIGKILL."""

    def __init__(self, path: str | None) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) if path else -1

    def __call__(self, line: str) -> None:
        if self.fd >= 0:
            os.write(self.fd, (line + "\n").encode("utf-8", "surrogateescape"))


class StatsFile:
    """Rewrite a JSON file atomically (write + rename)."""

    def __init__(self, path: str | None) -> None:
        self.path = path

    def write(self, stats: dict) -> None:
        if not self.path:
            return
        stats = dict(stats, pid=os.getpid(), rss_kib=rss_kib(), time=time.time())
        # (per thread: the periodic writer may still be writing when the role writes its last stats)
        tmp = f"{self.path}.{os.getpid()}.{threading.get_ident()}.tmp"
        with open(tmp, "w") as f:
            json.dump(stats, f)
        os.replace(tmp, self.path)

    def every(self, interval: float, source, stop: threading.Event) -> threading.Thread:
        def run() -> None:
            while not stop.wait(interval):
                try:
                    self.write(source())
                except Exception as exc:  # noqa: BLE001 - never let reporting kill a role
                    print(f"stats: {exc!r}", file=sys.stderr, flush=True)

        thread = threading.Thread(target=run, name="role-stats", daemon=True)
        thread.start()
        return thread


def _config(text: str | None):
    from dafka.config import Config

    return Config.load(overrides=json.loads(text) if text else {})


class _Stop:
    """A flag set by SIGTERM/SIGINT; the main loop looks at it."""

    def __init__(self) -> None:
        self.event = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.event.set())

    def __bool__(self) -> bool:
        return self.event.is_set()


# -----------------------------------------------------------------------------


def run_producer(args) -> int:
    from dafka import FlushTimeout, Producer

    stop = _Stop()
    log = Log(args.log)
    stats = StatsFile(args.stats)
    producer = Producer(args.topic, _config(args.config))
    log(f"address {producer.address}")
    log(f"topic {args.topic}")
    print(f"ready {producer.address}", flush=True)

    def delivered(metadata, error) -> None:
        if metadata is not None and error is None:
            log(f"acked {metadata.offset}")

    stopped_stats = threading.Event()
    stats.every(0.2, producer.stats, stopped_stats)
    def wait_for_file(path: str | None) -> None:
        while path and not os.path.exists(path) and not stop:
            time.sleep(0.02)

    wait_for_file(args.start_file)
    deadline = time.monotonic() + 20
    while producer.stats()["peers"] < args.wait_peers and time.monotonic() < deadline and not stop:
        time.sleep(0.01)
    address = producer.address
    started = time.monotonic()
    i = 0
    while (args.count <= 0 or i < args.count) and not stop:
        if i == args.pause_at and args.resume_file:
            paused = time.monotonic()
            wait_for_file(args.resume_file)
            started += time.monotonic() - paused  # the rate goes on from the resume
        if args.rate > 0:
            ahead = i / args.rate - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(min(ahead, 0.05))
                continue
        log(f"sent {i}")
        handle = producer.send(value_for(address, i, args.size), on_delivery=delivered)
        assert handle.offset == i, (handle.offset, i)
        i += 1
    log(f"done {i}")
    while args.hold and not stop:
        time.sleep(0.02)
    code = 0
    try:
        producer.close(timeout=args.close_timeout)
        log("close ok")
    except FlushTimeout as exc:
        log(f"close unacked {exc.unacked}")
        print(f"producer {address}: {exc}", file=sys.stderr, flush=True)
        code = 3
    stopped_stats.set()
    stats.write(producer.stats())
    return code


def run_consumer(args) -> int:
    from dafka import Consumer

    stop = _Stop()
    log = Log(args.log)
    stats = StatsFile(args.stats)
    config = _config(args.config)
    if args.reset:
        config = config.with_overrides({"consumer/offset/reset": args.reset})
    consumer = Consumer(*args.topic, config=config, offsets_path=args.offsets, group=args.group)
    print(f"ready {consumer.address}", flush=True)
    delivered = 0
    next_stats = 0.0
    slow_until = None
    while not stop:
        record = consumer.poll(args.poll)
        if record is not None:
            if slow_until is None:
                slow_until = time.monotonic() + args.slow_seconds
            if time.monotonic() < slow_until:
                time.sleep(args.slow_delay)
            # Logged before the next poll, which commits this record to the offsets journal.
            partition = encode_value(record.partition.encode("utf-8", "surrogateescape"))
            log(f"{partition} {record.offset} {encode_value(record.value)}")
            delivered += 1
        now = time.monotonic()
        if now >= next_stats:
            lags = consumer.lags()
            stats.write(dict(consumer.stats(), delivered=delivered, lag_max=max(lags.values(), default=0)))
            next_stats = now + 0.2
    consumer.close()
    stats.write(dict(consumer.stats(), delivered=delivered, closed=True))
    return 0


def run_store(args) -> int:
    from dafka.store import Store

    config = _config(args.config)
    store = Store(config, db=args.db)
    if args.fail_writes_file:
        import plyvel

        writer = store._writer  # the documented test hook: Writer._write_batch
        real = writer._write_batch
        flag = args.fail_writes_file

        def write_batch(*a, **kw):
            if os.path.exists(flag):
                raise plyvel.IOError(b"IO error: injected: No space left on device")
            return real(*a, **kw)

        writer._write_batch = write_batch
    stats = StatsFile(args.stats)
    stop_stats = threading.Event()
    store.start()
    stats.every(0.2, store.stats, stop_stats)
    print(f"ready {store.writer_address} {store.reader_address}", flush=True)
    try:
        store.run_forever()
    finally:
        stop_stats.set()
    print("stopped", flush=True)
    return 0


def run_tower(args) -> int:
    from dafka.towerd.tower import Tower

    overrides = json.loads(args.config) if args.config else {}
    overrides.update({"tower/sub_address": args.sub, "tower/pub_address": args.pub})
    from dafka.config import Config

    tower = Tower(Config.load(overrides=overrides))

    def bye(*_):
        raise SystemExit(0)  # unwinds Tower.run(), whose finally closes the sockets

    signal.signal(signal.SIGTERM, bye)
    stats = StatsFile(args.stats)
    stop_stats = threading.Event()
    stats.every(0.2, lambda: {"relayed": tower.state.relayed, "malformed": tower.state.malformed,
                              "peers": len(tower.peers())}, stop_stats)
    print(f"tower {tower.sub_endpoint} {tower.pub_endpoint}", flush=True)
    try:
        tower.run()
    finally:
        stop_stats.set()
    return 0


def kafka_address(partition: int) -> str:
    """The name a Kafka partition's records go by in the logs (the checker's "address")."""
    return f"kafka/{partition}"


def kafka_record(value: bytes) -> tuple[str, int]:
    """(address, n) of a value the kafka-producer made with :func:`value_for`."""
    address, n, _ = value.split(b":", 2)
    return address.decode(), int(n)


def run_kafka_producer(args) -> int:
    import confluent_kafka

    stop = _Stop()
    logs = [Log(os.path.join(args.logdir, f"kafka-{p}.producer.log")) for p in range(args.partitions)]
    for p, log in enumerate(logs):
        log(f"address {kafka_address(p)}")
        log(f"topic {args.topic}")
    errors: list[str] = []

    def delivered(err, msg) -> None:
        address, n = kafka_record(msg.value())
        if err is None:
            logs[int(address.rsplit("/", 1)[1])](f"acked {n}")
        elif len(errors) < 20:
            errors.append(str(err))
            print(f"kafka-producer: {address} {n}: {err}", file=sys.stderr, flush=True)

    producer = confluent_kafka.Producer({"bootstrap.servers": args.bootstrap, "acks": "all",
                                         "enable.idempotence": True, "linger.ms": 5,
                                         "topic.metadata.refresh.interval.ms": 1000})
    print("ready kafka-producer", flush=True)
    started = time.monotonic()
    i = 0
    while not stop:
        ahead = i / args.rate - (time.monotonic() - started)
        if ahead > 0:
            producer.poll(min(ahead, 0.05))
            continue
        p, n = i % args.partitions, i // args.partitions
        logs[p](f"sent {n}")
        producer.produce(args.topic, value_for(kafka_address(p), n, args.size), partition=p, on_delivery=delivered)
        producer.poll(0)
        i += 1
    left = producer.flush(args.close_timeout)
    for p, log in enumerate(logs):
        log(f"done {(i - p + args.partitions - 1) // args.partitions}")
        log("close ok" if left == 0 else f"close unacked {left}")
    return 0 if left == 0 and not errors else 3


def run_kafka_member(args) -> int:
    import confluent_kafka

    stop = _Stop()
    log = Log(args.log)
    consumer = confluent_kafka.Consumer({"bootstrap.servers": args.bootstrap, "group.id": args.group,
                                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                                         "session.timeout.ms": 6000, "heartbeat.interval.ms": 500,
                                         "topic.metadata.refresh.interval.ms": 1000})
    consumer.subscribe([args.topic])
    print("ready kafka-member", flush=True)
    refused = 0
    while not stop:
        batch = consumer.consume(500, 0.2)
        lines = []
        for msg in batch:
            if msg.error() is not None:
                continue
            address, n = kafka_record(msg.value())
            lines.append(f"{address} {n} {encode_value(msg.value())}")
        if lines:
            log("\n".join(lines))  # (one write: a kill keeps whole lines)
            try:
                consumer.commit(asynchronous=False)
            except confluent_kafka.KafkaException as exc:  # a coordinator lost or moved, a rebalance: at least once
                refused += 1
                print(f"kafka-member: commit refused: {exc}", file=sys.stderr, flush=True)
    consumer.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="role", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", help="JSON dict of config overrides")
    common.add_argument("--stats", help="JSON stats file, rewritten a few times a second")

    p = sub.add_parser("producer", parents=[common])
    p.add_argument("--topic", required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--count", type=int, default=0, help="records to send (0: until SIGTERM)")
    p.add_argument("--rate", type=float, default=0, help="records per second (0: as fast as possible)")
    p.add_argument("--size", type=int, default=0, help="pad record values to this many bytes")
    p.add_argument("--wait-peers", type=int, default=0, help="wait (up to 20 s) for this many peers first")
    p.add_argument("--hold", action="store_true", help="after sending, stay until SIGTERM")
    p.add_argument("--start-file", help="send nothing until this file exists")
    p.add_argument("--pause-at", type=int, default=-1, help="having sent this many records, wait for --resume-file")
    p.add_argument("--resume-file", help="see --pause-at")
    p.add_argument("--close-timeout", type=float, default=30.0)

    c = sub.add_parser("consumer", parents=[common])
    c.add_argument("--topic", required=True, action="append")
    c.add_argument("--log", required=True)
    c.add_argument("--offsets", help="offsets file (Consumer(offsets_path=...))")
    c.add_argument("--group", help="consumer group (Consumer(group=...)): commits on close")
    c.add_argument("--reset", choices=("earliest", "latest"))
    c.add_argument("--poll", type=float, default=0.2)
    c.add_argument("--slow-seconds", type=float, default=0.0, help="read slowly for this long after the first record")
    c.add_argument("--slow-delay", type=float, default=0.002, help="...sleeping this long after each record")

    s = sub.add_parser("store", parents=[common])
    s.add_argument("--db", required=True)
    s.add_argument("--fail-writes-file")

    t = sub.add_parser("tower", parents=[common])
    t.add_argument("--sub", required=True)
    t.add_argument("--pub", required=True)

    kp = sub.add_parser("kafka-producer", parents=[common])
    kp.add_argument("--bootstrap", required=True)
    kp.add_argument("--topic", required=True)
    kp.add_argument("--logdir", required=True)
    kp.add_argument("--partitions", type=int, required=True, help="records go to partitions 0 .. N-1 in turn")
    kp.add_argument("--rate", type=float, required=True, help="records per second")
    kp.add_argument("--size", type=int, default=0)
    kp.add_argument("--close-timeout", type=float, default=60.0)

    km = sub.add_parser("kafka-member", parents=[common])
    km.add_argument("--bootstrap", required=True)
    km.add_argument("--topic", required=True)
    km.add_argument("--group", required=True)
    km.add_argument("--log", required=True)

    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("dafka.store.sharding").setLevel(logging.INFO)  # moves of sharded stores: rare, telling
    return {"producer": run_producer, "consumer": run_consumer, "store": run_store, "tower": run_tower,
            "kafka-producer": run_kafka_producer, "kafka-member": run_kafka_member}[args.role](args)


if __name__ == "__main__":
    sys.exit(main())
