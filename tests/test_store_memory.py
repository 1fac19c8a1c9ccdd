"""The store's memory through a burst (issue 26): a store process with small
byte bounds stays under the bound they document, loses nothing, and gives the
burst's memory back once it is idle."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from helpers import loopback_config
from dafka import Consumer, Producer
from dafka.config import Config

MiB = 1024 * 1024
RECORDS = 1_000_000
PAD = b"." * 92
# Small bounds, so that a burst of 100 MB is many times what they allow.
BOUNDS = {
    "store/receive_bytes": 1 * MiB,
    "store/batch_bytes": 1 * MiB,
    "store/write_buffer_bytes": 1 * MiB,
    "store/cache_bytes": 1 * MiB,
}
# What the README's "Store memory" formula adds to the sum of the bounds: the
# Python objects and the LevelDB write batch of one staged batch (about 3 x
# batch_bytes for 100-byte records), a second memtable, the indexes of the open
# tables, libzmq's and glibc's working memory.
ALLOWANCE = 12 * MiB


def in_use_bound(config: dict) -> int:
    """The README's bound on the store's own (anonymous) memory beyond an idle store's, one producer."""
    return (2 * config["store/receive_bytes"] + 4 * config["store/batch_bytes"]
            + 2 * config["store/write_buffer_bytes"] + config["store/cache_bytes"] + ALLOWANCE)


def status_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field} for process {pid}")


class Sampler(threading.Thread):
    """A process's RssAnon and VmRSS every 10 ms; the peaks since :meth:`reset`."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.peak_anon = self.peak_rss = 0
        self._done = threading.Event()

    def reset(self) -> None:
        self.peak_anon = self.peak_rss = 0

    def run(self) -> None:
        while not self._done.wait(0.01):
            self.peak_anon = max(self.peak_anon, status_kib(self.pid, "RssAnon") * 1024)
            self.peak_rss = max(self.peak_rss, status_kib(self.pid, "VmRSS") * 1024)

    def stop(self) -> None:
        self._done.set()
        self.join(5)


def value(i: int) -> bytes:
    return b"%08d" % i + PAD


# A whole process's memory, measured: alone, after the parallel phase. Beside three other workers on 2 cores
# its starved store held +44.7 MiB of anonymous memory against a bound of +21 (CI, once in four runs this week).
@pytest.mark.serial
@pytest.mark.timeout(180)
def test_a_burst_stays_under_the_store_bounds_and_nothing_is_lost(tower, processes, tmp_path):
    settings = [arg for key, val in BOUNDS.items() for arg in ("-X", f"{key}={val}")]
    store = processes.start([
        sys.executable, "-P", "-m", "dafka.cli.stored", "--db", str(tmp_path / "db"),
        "--pub", tower.pub_endpoint, "--sub", tower.sub_endpoint, "-X", "beacon/address=127.0.0.1", *settings])
    config = loopback_config(tower, producer__min_acks=1)
    producer = Producer("burst", config)
    sampler = Sampler(store.pid)
    try:
        producer.send(value(0))
        producer.flush(timeout=30)  # the store is up and has ACKed
        time.sleep(2.0)  # ...and has released what it took (store/memory/idle_ms)
        base_anon = status_kib(store.pid, "RssAnon") * 1024
        base_rss = status_kib(store.pid, "VmRSS") * 1024
        sampler.start()
        for start in range(1, RECORDS, 10_000):
            producer.send_many([value(i) for i in range(start, min(start + 10_000, RECORDS))], timeout=60)
        producer.flush(timeout=120)
        peak_anon, peak_rss = sampler.peak_anon, sampler.peak_rss
        # The store gives the memory back store/memory/idle_ms (1 s) after its last write, and LevelDB
        # unmaps the tables its compactions merged when they end: 3 s on a quiet machine, but a fixed 3 s
        # failed beside a soak run (load average 16, RSS still 62 MiB against 15).  Wait for it, up to 60 s.
        idle_at = time.monotonic()
        returned = 1.25 * base_rss + 2 * MiB
        while (after_rss := status_kib(store.pid, "VmRSS") * 1024) > returned and time.monotonic() < idle_at + 60:
            time.sleep(0.5)
        returned_s = time.monotonic() - idle_at
    finally:
        sampler.stop()
        producer.close()
    assert store.poll() is None, store.stderr.read().decode()
    bound = in_use_bound(Config.load(overrides=BOUNDS))
    print(f"store: anon {base_anon / MiB:.0f} -> peak {peak_anon / MiB:.0f} MiB (bound +{bound / MiB:.0f}); "
          f"RSS {base_rss / MiB:.0f} -> peak {peak_rss / MiB:.0f} -> {after_rss / MiB:.0f} MiB {returned_s:.1f} s after")
    assert peak_anon - base_anon <= bound
    # LevelDB maps the tables it reads, compactions included: file pages, shared with the page cache,
    # at most one expanded compaction's inputs (25 x 2 MiB tables).
    assert peak_rss - base_rss <= bound + 50 * MiB
    assert after_rss <= returned

    # Nothing lost: every record, in order, read back from the store.
    with Consumer("burst", config=loopback_config(tower, consumer__offset__reset="earliest")) as consumer:
        received = 0
        deadline = time.monotonic() + 60
        while received < RECORDS and time.monotonic() < deadline:
            for record in consumer.consume(100_000, timeout=1.0):
                assert record.value == value(received)
                received += 1
        assert received == RECORDS


def test_store_compression_none_writes_plain_tables_that_a_snappy_store_reads_and_back(tmp_path):
    """``store/compression``: LevelDB flags each block with its compression, so a database written with
    either opens and reads with the other (and in the reference's LevelDB, which writes snappy)."""
    from dafka.config import Config
    from dafka.store.database import leveldb_options, open_db

    def table_bytes(path) -> int:
        return sum(f.stat().st_size for f in path.iterdir() if f.suffix in (".ldb", ".sst"))
    sizes = {}
    for first, then in (("none", "snappy"), ("snappy", "none")):
        path = tmp_path / first
        db = open_db(str(path), leveldb_options(Config().with_overrides({"store/compression": first})))
        for i in range(2000):
            db.put(b"r%06d" % i, b"x" * 1000)
        db.compact_range()  # (into tables, as the memtable's flush would)
        db.close()
        sizes[first] = table_bytes(path)
        db = open_db(str(path), leveldb_options(Config().with_overrides({"store/compression": then})))
        try:
            assert all(db.get(b"r%06d" % i) == b"x" * 1000 for i in range(2000))
        finally:
            db.close()
    assert sizes["none"] > 2_000_000 > 200_000 > sizes["snappy"]
