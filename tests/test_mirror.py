"""The mirror between two sites, each a real tower and real stores on
loopback: the copy, restarts, failover of consumers and groups, both
directions, conflicts, reference consumers, metrics, status and the CLI's
errors.  The faults (kill -9, an impaired link) are in
tests/faults/test_mirror_faults.py."""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import zmq

from prometheus_client import CollectorRegistry

from dafka import Consumer, Producer, metrics, partition_address
from dafka.mirror import Mirror, Selection
from dafka.mirror.state import Phase
from dafka.discovery.links import DataSocket
from dafka.protocol.attributes import record_attributes
from dafka.store import Store, keys
from dafka.towerd.tower import Tower
from helpers import free_port, loopback_config, script, secure_config, wait_for
from dafkabench.refconsumer import RefConsumer

pytestmark = pytest.mark.mirror

FAST = {"beacon__interval": 200, "beacon__timeout": 1000, "producer__head_interval": 200,
        "consumer__fetch_retry": 300, "consumer__heads_interval": 300}


class Site:
    """A tower and ``stores`` stores on loopback."""

    def __init__(self, name: str, workdir: Path, stores: int = 1, **config) -> None:
        self.name = name
        self.tower = Tower(loopback_config()).start()
        self.extra = {**FAST, **config}
        self.stores = [Store(self.config(), db=str(workdir / f"{name}-store{i}")).start() for i in range(stores)]

    def config(self, **extra):
        return loopback_config(self.tower, **{**self.extra, **extra})

    def head(self, topic: str, partition: str) -> int:
        return max(store.heads().get((topic, partition), -1) for store in self.stores)

    def stop(self) -> None:
        for store in self.stores:
            store.stop()
        self.tower.stop()


@pytest.fixture
def sites(tmp_path):
    made: list[Site] = []

    def make(name: str, **kwargs) -> Site:
        site = Site(name, tmp_path, **kwargs)
        made.append(site)
        return site

    yield make
    for site in made:
        site.stop()


class Running:
    """A mirror running in a thread."""

    def __init__(self, source: Site, target: Site, selection: Selection, name: str = "m", **kwargs) -> None:
        self.mirror = Mirror(source.config(), target.config(), selection, name=name, **kwargs)
        self.mirror.start()
        self.thread = threading.Thread(target=self.mirror.run, name="mirror-test")
        self.thread.start()

    def stop(self) -> None:
        self.mirror.stop()
        self.thread.join(30)
        assert not self.thread.is_alive()

    def __enter__(self) -> "Running":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def produce(site: Site, topic: str, values: list[bytes], **kwargs) -> Producer:
    producer = Producer(topic, site.config(), **kwargs)
    for value in values:
        producer.send(value)
    producer.flush(10)
    return producer


def wait_copied(target: Site, topic: str, partition: str, head: int, timeout: float = 20.0) -> None:
    wait_for(lambda: target.head(topic, partition) >= head, timeout, interval=0.05,
             what=f"the target holds {topic}/{partition} up to {head}")


def stored(store: Store, topic: str) -> dict[tuple[str, int], bytes]:
    """(partition, offset) -> value of every record of ``topic`` in a running store's database."""
    out = {}
    with store._db.lock:
        for key, value in store._db.db.iterator(prefix=keys.RECORD):
            parsed = keys.parse_key(key)
            if parsed.subject == topic:
                out[(parsed.address, parsed.seq)] = value
    return out


def contents(site: Site, topic: str) -> dict[tuple[str, int], bytes]:
    return stored(site.stores[0], topic)


def read(config, topic: str, count: int, timeout: float = 20.0, **kwargs) -> list:
    """Exactly ``count`` records (fewer if they do not come in time), from the earliest on."""
    out = []
    with Consumer(topic, config=config.with_overrides({"consumer/offset/reset": "earliest"}), **kwargs) as c:
        deadline = time.monotonic() + timeout
        while len(out) < count and time.monotonic() < deadline:
            out.extend(c.consume(min(500, count - len(out)), timeout=0.2))
    return out


def test_mirror_copies_each_partition_at_the_same_offsets_and_resumes_after_a_restart(sites):
    a, b = sites("a"), sites("b", stores=2, producer__min_acks=2)
    p1 = produce(a, "orders", [b"one-%d" % i for i in range(3000)])
    p2 = produce(a, "orders", [b"two-%d" % i for i in range(1000)])
    with Running(a, b, Selection(topics=("orders",)), name="a-to-b") as run:
        wait_copied(b, "orders", p1.address, 2999)
        wait_copied(b, "orders", p2.address, 999)
        for i in range(3000, 4000):
            p1.send(b"one-%d" % i)
        p1.flush(10)
        wait_copied(b, "orders", p1.address, 3999)
        wait_for(lambda: run.mirror.state.copied >= 5000, 10, what="the acks counted")
    # Stopped: records sent meanwhile are copied by the next start, from the target's head on.
    for i in range(4000, 5000):
        p1.send(b"one-%d" % i)
    p1.flush(10)
    with Running(a, b, Selection(topics=("orders",)), name="a-to-b") as run:
        assert run.mirror.state.owned == {("orders", p1.address), ("orders", p2.address)}
        wait_copied(b, "orders", p1.address, 4999)
        wait_for(lambda: run.mirror.state.copied >= 1000, 10, what="the acks counted")
        partitions = {r["partition"]: r for r in run.mirror.partitions()}
        assert partitions[p1.address]["phase"] == "copying" and partitions[p1.address]["lag"] == 0
    p1.close()
    p2.close()
    source = contents(a, "orders")
    assert len(source) == 6000
    for store in b.stores:  # both target stores: the same records, same offsets, same bytes
        assert stored(store, "orders") == source


def test_keys_and_attributes_are_mirrored_with_their_records(sites):
    a, b = sites("a"), sites("b")
    producer = Producer("keyed", a.config())
    values, record_keys = [b"v%d" % i for i in range(200)], [None if i % 4 == 0 else b"k%d" % (i % 9) for i in range(200)]
    held = [None if i % 3 == 0 else record_attributes([("i", b"%d" % i)] if i % 2 else None, 1_000 + i)
            for i in range(200)]
    producer.send_many(values, keys=record_keys, attributes=held)
    producer.flush(10)
    try:
        with Running(a, b, Selection(topics=("keyed",)), name="keys"):
            wait_copied(b, "keyed", producer.address, 199)
        got = read(b.config(), "keyed", 200)
        assert [(r.value, r.key) for r in got] == list(zip(values, record_keys))
        assert [(r.timestamp, r.headers) for r in got] == [
            (None, ()) if i % 3 == 0 else (1_000 + i, (("i", b"%d" % i),) if i % 2 else ()) for i in range(200)]
    finally:
        producer.close()


def test_a_consumer_with_an_offsets_file_fails_over_to_the_other_site(sites, tmp_path):
    a, b = sites("a"), sites("b")
    offsets = str(tmp_path / "offsets")
    producer = produce(a, "orders", [b"v%d" % i for i in range(2000)])
    with Running(a, b, Selection(topics=("orders",))):
        first = read(a.config(), "orders", 1200, offsets_path=offsets)
        wait_copied(b, "orders", producer.address, 1999)
    a.stop()  # site A is gone
    seen = {r.offset for r in first}
    with Consumer("orders", config=b.config(), offsets_path=offsets) as c:
        rest = []
        deadline = time.monotonic() + 20
        while len(seen) + len(rest) < 2000 and time.monotonic() < deadline:
            rest.extend(c.consume(1000, timeout=0.2))
    producer.close()
    offsets_seen = sorted([r.offset for r in first] + [r.offset for r in rest])
    assert offsets_seen[: len(set(offsets_seen))] == list(range(len(set(offsets_seen))))
    assert len(offsets_seen) == len(set(offsets_seen)) == 2000  # none lost, none twice
    assert [r.value for r in rest] == [b"v%d" % o for o in range(rest[0].offset, 2000)]


def test_a_consumer_group_fails_over_and_resumes_at_its_mirrored_commits(sites):
    a, b = sites("a"), sites("b")
    producer = produce(a, "orders", [b"v%d" % i for i in range(1000)])
    group_config = {"consumer/offset/reset": "earliest"}
    with Running(a, b, Selection(topics=("orders",), prefixes=("__dafka_offsets.",)), scan_interval=0.3) as run:
        with Consumer("orders", config=a.config().with_overrides(group_config), group="billing") as member:
            got = []
            deadline = time.monotonic() + 20
            while len(got) < 600 and time.monotonic() < deadline:
                got.extend(member.consume(100, timeout=0.2))
            member.commit()
        wait_copied(b, "orders", producer.address, 999)
        wait_for(lambda: any(p["topic"] == "__dafka_offsets.billing" and p["phase"] == "copying" and p["lag"] == 0
                             for p in run.mirror.partitions()), 20, what="the group's commits copied")
    with Consumer("orders", config=b.config().with_overrides(group_config), group="billing") as member:
        rest = []
        deadline = time.monotonic() + 20
        while len(got) + len(rest) < 1000 and time.monotonic() < deadline:
            rest.extend(member.consume(100, timeout=0.2))
        time.sleep(0.5)
        rest.extend(member.consume(100, timeout=0.2))
    producer.close()
    offsets = [r.offset for r in got] + [r.offset for r in rest]
    assert sorted(offsets) == list(range(1000))  # resumed at the commit: nothing lost, nothing twice


def test_mirroring_both_ways_gives_each_site_the_union_and_never_loops(sites):
    a, b = sites("a"), sites("b")
    pa = produce(a, "orders", [b"a%d" % i for i in range(500)])
    pb = produce(b, "orders", [b"b%d" % i for i in range(700)])
    with Running(a, b, Selection(topics=("orders",)), name="a-to-b", source_site="A") as ab, \
            Running(b, a, Selection(topics=("orders",)), name="b-to-a", source_site="B") as ba:
        wait_copied(b, "orders", pa.address, 499)
        wait_copied(a, "orders", pb.address, 699)
        for i in range(500, 600):
            pa.send(b"a%d" % i)
        pa.flush(10)
        wait_copied(b, "orders", pa.address, 599)

        def looped(run: Running, key) -> bool:
            p = run.mirror.state.partitions.get(key)
            return p is not None and p.phase is Phase.LOOPED

        wait_for(lambda: looped(ab, ("orders", pb.address)) and looped(ba, ("orders", pa.address)), 20,
                 what="each mirror sees the other's copies as loops")
        assert ab.mirror.state.conflicts == ba.mirror.state.conflicts == 0
        # Each partition has one writer per site: the original, or the mirror's copy.
        assert set(ab.mirror.state.owned) == {("orders", pa.address)}
        assert set(ba.mirror.state.owned) == {("orders", pb.address)}
    pa.close()
    pb.close()
    union = {**contents(a, "orders")}
    assert len(union) == 1300 and contents(b, "orders") == union


def test_a_target_partition_with_other_contents_is_a_conflict_and_nothing_is_written(sites):
    a, b = sites("a"), sites("b")
    address = partition_address("shared-name")
    produce(b, "orders", [b"theirs-%d" % i for i in range(50)], address=address, resume=True).close()
    produce(a, "orders", [b"ours-%d" % i for i in range(80)], address=address, resume=True).close()
    before = contents(b, "orders")
    port = free_port()
    registry = CollectorRegistry()
    server = metrics.serve(port, registry=registry)
    try:
        with Running(a, b, Selection(topics=("orders",)), conflict_grace=0.5) as run:
            metrics.register(run.mirror, registry=registry)
            wait_for(lambda: run.mirror.state.conflicts == 1, 20, what="the conflict reported")
            p = run.mirror.state.partitions[("orders", address)]
            assert p.phase is Phase.CONFLICT and "another writer" in p.reason
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            assert 'dafka_mirror_conflicts_total{peer="m",role="mirror"} 1.0' in text
            assert 'dafka_mirror_partitions{peer="m",role="mirror",state="conflict"} 1.0' in text
            time.sleep(0.5)
    finally:
        server.shutdown()
    assert contents(b, "orders") == before  # not one record of A's merged in


def test_a_reference_consumer_in_the_target_reads_a_mirrored_partition_as_an_ordinary_one(sites):
    a, b = sites("a"), sites("b")
    producer = produce(a, "orders", [b"v%d" % i for i in range(300)])
    ref = RefConsumer(b.tower.sub_endpoint, b.tower.pub_endpoint, "F" * 32, earliest=True, keep=True)
    try:
        ref.subscribe("orders")
        with Running(a, b, Selection(topics=("orders",))):
            assert ref.run(lambda: ref.total() >= 300, timeout=20)
            for i in range(300, 400):  # live, through the mirror's producer
                producer.send(b"v%d" % i)
            producer.flush(10)
            assert ref.run(lambda: ref.total() >= 400, timeout=20)
        assert ref.foreign == 0  # RFC 46 frames only
        assert ref.contents[("orders", producer.address)] == [b"v%d" % i for i in range(400)]
    finally:
        ref.close()
        producer.close()


def test_two_live_writers_of_a_partition_in_the_source_are_a_conflict(sites):
    a, b = sites("a"), sites("b")
    address = partition_address("twice")
    first = produce(a, "orders", [b"x"], address=address, resume=True)
    with Running(a, b, Selection(topics=("orders",))) as run:
        wait_copied(b, "orders", address, 0)
        # A second live process beacons the same address (as a misconfigured deployment would).
        ctx = zmq.Context()
        xpub = ctx.socket(zmq.XPUB)
        twin = DataSocket(ctx, a.config(), xpub, address, "producer")
        twin.beacon.start()
        try:
            wait_for(lambda: run.mirror.state.conflicts == 1, 10, what="the twin reported")
            assert "2 live processes" in run.mirror.state.partitions[("orders", address)].reason
        finally:
            twin.close()
            xpub.close(0)
            ctx.term()
    first.close()


def test_status_shows_which_partitions_a_mirror_copied_in(sites):
    a, b = sites("a"), sites("b")
    producer = produce(a, "orders", [b"v%d" % i for i in range(10)])
    local = produce(b, "orders", [b"w"])
    with Running(a, b, Selection(topics=("orders",)), source_site="site-a"):
        wait_copied(b, "orders", producer.address, 9)
        done = subprocess.run(
            [script("dafka"), "status", "--pub", b.tower.pub_endpoint, "--sub",
             b.tower.sub_endpoint, "-X", "beacon/address=127.0.0.1", "--json", "--wait-ms", "1500"],
            capture_output=True, text=True, timeout=60)
    producer.close()
    local.close()
    assert done.returncode == 0, done.stderr
    rows = {(r["topic"], r["partition"]): r for r in json.loads(done.stdout)["partitions"]}
    assert rows[("orders", producer.address)]["mirrored_from"] == "site-a"
    assert rows[("orders", local.address)]["mirrored_from"] is None


def _mirror_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([script("dafka"), "mirror", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_mirror_cli_names_what_is_wrong(sites):
    a = sites("a")
    sides = ["--source-pub", a.tower.pub_endpoint, "--source-sub", a.tower.sub_endpoint]
    nowhere = f"tcp://127.0.0.1:{free_port()}"
    target = ["--target-pub", nowhere, "--target-sub", f"tcp://127.0.0.1:{free_port()}"]
    done = _mirror_cli(*sides, *target)
    assert done.returncode == 2 and "--topic TOPIC, --prefix PREFIX or --all" in done.stderr
    done = _mirror_cli(*sides, *target, "-t", "x", "-S", "beacon/interval=soon")
    assert done.returncode == 2 and "-S" in done.stderr and "beacon/interval" in done.stderr
    done = _mirror_cli(*sides, "-t", "x")
    assert done.returncode == 2 and "--target-pub" in done.stderr
    # The target's tower does not answer: its producer cannot learn anything.
    done = _mirror_cli(*sides, *target, "-t", "x", "-X", "beacon/address=127.0.0.1",
                       "-X", "producer/resume_timeout=1000")
    assert done.returncode == 1 and "the target site" in done.stderr and nowhere in done.stderr, done.stderr


def test_mirror_cli_says_when_the_source_does_not_answer(sites):
    b = sites("b")
    nowhere = f"tcp://127.0.0.1:{free_port()}"
    done = _mirror_cli("--source-pub", nowhere, "--source-sub", f"tcp://127.0.0.1:{free_port()}",
                       "--target-pub", b.tower.pub_endpoint, "--target-sub", b.tower.sub_endpoint, "-t", "x",
                       "-X", "beacon/address=127.0.0.1", "--tower-timeout-ms", "1000")
    assert done.returncode == 1 and "the source site" in done.stderr and nowhere in done.stderr, done.stderr


def test_a_source_site_with_curve_is_mirrored_with_its_own_keys(sites, secure_tower, keys, tmp_path):
    """Each side has its own config: here the source site runs CurveZMQ and the mirror reads it as an
    authorized peer (bob's key), while the target site is plain."""
    fast = {k.replace("__", "/"): v for k, v in FAST.items()}
    source = secure_config(secure_tower, keys, "bob").with_overrides(fast)
    store = Store(secure_config(secure_tower, keys, "bob").with_overrides(fast), db=str(tmp_path / "secure")).start()
    b = sites("b")
    try:
        producer = Producer("orders", secure_config(secure_tower, keys, "alice").with_overrides(fast))
        for i in range(200):
            producer.send(b"secret-%d" % i)
        producer.flush(10)
        mirror = Mirror(source, b.config(), Selection(topics=("orders",)), name="secure")
        mirror.start()
        thread = threading.Thread(target=mirror.run, name="mirror-test")
        thread.start()
        try:
            wait_copied(b, "orders", producer.address, 199)
        finally:
            mirror.stop()
            thread.join(30)
        producer.close()
        assert {o: v for (_, o), v in contents(b, "orders").items()} == {i: b"secret-%d" % i for i in range(200)}
    finally:
        store.stop()


def test_a_mirror_between_sharded_sites_copies_everything_onto_the_owners(sites):
    """Both sites with three stores and store/replicas 2 (rfc 16): the mirror reads the source's partitions
    from whichever stores hold them, and each lands on exactly two target stores, at the same offsets."""
    sharded = {"store__replicas": 2, "store__dead_ms": 3000, "producer__min_acks": 2}
    a, b = sites("a", stores=3, **sharded), sites("b", stores=3, **sharded)
    producers = [produce(a, "orders", [b"p%d-%d" % (n, i) for i in range(800)]) for n in range(4)]
    with Running(a, b, Selection(topics=("orders",)), name="a-to-b"):
        for producer in producers:
            wait_copied(b, "orders", producer.address, 799)
    for producer in producers:
        producer.close()
    source: dict = {}
    for store in a.stores:
        source.update(stored(store, "orders"))
    assert len(source) == 3200
    target: dict = {}
    for store in b.stores:
        for key, value in stored(store, "orders").items():
            target.setdefault(key, set()).add(value)
    assert {key: values.pop() for key, values in target.items() if len(values) == 1} == source
    wait_for(lambda: [sum(1 for s in b.stores if ("orders", p.address) in s.heads()) for p in producers] == [2] * 4,
             10, what="each partition on exactly 2 target stores")
