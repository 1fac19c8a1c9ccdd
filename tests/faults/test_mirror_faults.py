"""The mirror between two sites joined by the impaired link (loss,
duplication, delay, and a partition), with real processes: the mirror is
`dafka mirror` on site B, killed with SIGKILL and started again while the
producers of site A write."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from faultcheck import check, read_store
from faultkit import Cluster, acked_keys
from helpers import script, wait_for
from dafkabench.impaired_link import ImpairedLink, missing_capability

pytestmark = [pytest.mark.faults, pytest.mark.mirror]

TOPIC = "mirrored"


def _mirror(link: ImpairedLink, workdir: Path, source: str, target: str, name: str, *extra: str,
            runs: list) -> subprocess.Popen:
    """`dafka mirror` on host ``target`` (the side it writes), reading ``source`` across the link."""
    src, dst = link.address[source], link.address[target]
    base = workdir / f"mirror-{name}-{len(runs) + 1}"
    with open(base.with_suffix(".out"), "wb") as out, open(base.with_suffix(".err"), "wb") as err:
        proc = link.processes_in(target).start(
            [script("dafka"), "mirror", "--source-pub", f"tcp://{src}:5557", "--source-sub", f"tcp://{src}:5556",
             "--target-pub", f"tcp://{dst}:5557", "--target-sub", f"tcp://{dst}:5556", "--name", name,
             "--source-site", source, "-X", f"beacon/address={dst}", "-X", f"beacon/bind_address={dst}",
             "-X", "producer/head_interval=200", "-X", "consumer/fetch_retry=300", *extra],
            stdout=out, stderr=err, stdin=subprocess.DEVNULL)
    runs.append((proc, base))
    return proc


def _tails(runs: list) -> str:
    return "\n".join(f"==== mirror {base.name} (rc {proc.poll()})\n{base.with_suffix('.err').read_text()[-3000:]}"
                     for proc, base in runs)


def _sites(link: ImpairedLink, workdir: Path) -> dict[str, Cluster]:
    return {host: Cluster(link.processes_in(host), workdir / host, f"tcp://{address}:5556", f"tcp://{address}:5557",
                          **{"beacon/address": address, "beacon/bind_address": address})
            for host, address in link.address.items()}


@pytest.fixture
def link(processes, tmp_path):
    reason = missing_capability()
    if reason is not None:
        pytest.skip(reason)
    with ImpairedLink(processes, tmp_path / "link", ("a", "b"), loss=0.05, duplicate=0.05, delay_ms=20,
                      jitter_ms=5, seed=2323) as made:
        yield made


def test_mirror_copies_every_record_exactly_through_kills_and_a_link_partition_and_consumers_fail_over(
        link, tmp_path, fault_report):
    sides = _sites(link, tmp_path)
    a, b = sides["a"], sides["b"]
    runs: list = []
    try:
        towers = [a.tower("ta", 5556, 5557, host=link.address["a"]), b.tower("tb", 5556, 5557, host=link.address["b"])]
        source_store = a.store("sa")
        target_stores = [b.store("sb1"), b.store("sb2")]
        reader = a.consumer("ca", TOPIC, offsets=True)  # fails over to B below, with its offsets file
        producers = [a.producer(f"p{i}", TOPIC, count=12_000, rate=1_500, size=100, wait_peers=2) for i in range(2)]
        mirror = _mirror(link, tmp_path, "a", "b", "a-to-b", "--topic", TOPIC, "--min-acks", "2", runs=runs)
        time.sleep(3)
        mirror.kill()  # mid-copy, twice, and a partition of the link in between
        mirror.wait(10)
        reader.stop()  # A's consumer stops part way
        mirror = _mirror(link, tmp_path, "a", "b", "a-to-b", "--topic", TOPIC, "--min-acks", "2", runs=runs)
        time.sleep(2)
        link.cut()
        time.sleep(3)
        link.heal()
        time.sleep(1)
        mirror.send_signal(signal.SIGKILL)
        mirror.wait(10)
        mirror = _mirror(link, tmp_path, "a", "b", "a-to-b", "--topic", TOPIC, "--min-acks", "2", runs=runs)
        for producer in producers:
            assert producer.wait_exit(120) == 0, producer.tail()
        expected = acked_keys(*producers)
        assert len(expected) == 24_000
        # Site B, read by a fresh consumer, holds all of it.
        b.consumer("cb", TOPIC)
        b.wait_delivered("cb", expected, 120)
        # The consumer fails over: A's offsets file, B's tower.
        shutil.copyfile(a.dir / "ca.offsets", b.dir / "ca.offsets")
        failover = b.consumer("ca", TOPIC, offsets=True)
        wait_for(lambda: len(b.delivered("ca")) + len(a.delivered("ca")) >= 24_000, 60, interval=0.2,
                 what="the failed-over consumer reads the rest")
        time.sleep(0.5)
        assert failover.stop() == 0
        assert 0 < len(a.delivered("ca")) < 24_000 and len(b.delivered("ca")) > 0
        mirror.send_signal(signal.SIGTERM)
        assert mirror.wait(60) == 0, _tails(runs)
        for role in [*target_stores, source_store, *towers]:
            assert role.stop() == 0
    except BaseException:
        print(a.tails(), b.tails(), _tails(runs), link.tail(), sep="\n")
        raise
    logs = [p.producer_log() for p in producers]
    # A's consumer and its failover on B are one consumer: no record lost, none twice, in order.
    consumer_runs = {"ca": a.consumer_runs()["ca"] + b.consumer_runs()["ca"], "cb": b.consumer_runs()["cb"]}
    report = check("mirror: kills, partition, failover", logs, consumer_runs,
                   {"sa": source_store.db, "sb1": target_stores[0].db, "sb2": target_stores[1].db},
                   complete_stores=["sa", "sb1", "sb2"], value_size=100)
    report.extra["link"] = {"a>b": link.direction("a", "b"), "b>a": link.direction("b", "a")}
    fault_report(report)
    # The checker: every partition, every offset, the same bytes, in both target stores.
    source = read_store(source_store.db, TOPIC)
    for store in target_stores:
        assert read_store(store.db, TOPIC) == source
    assert link.direction("a", "b")["dropped"] > 0


def test_mirror_both_ways_across_the_link_gives_each_site_the_union_without_a_loop(link, tmp_path, fault_report):
    sides = _sites(link, tmp_path)
    a, b = sides["a"], sides["b"]
    runs: list = []
    try:
        towers = [a.tower("ta", 5556, 5557, host=link.address["a"]), b.tower("tb", 5556, 5557, host=link.address["b"])]
        stores = {"sa": a.store("sa"), "sb": b.store("sb")}
        producers = [a.producer("pa", TOPIC, count=5_000, rate=1_000, size=100, wait_peers=1),
                     b.producer("pb", TOPIC, count=5_000, rate=1_000, size=100, wait_peers=1)]
        mirrors = [_mirror(link, tmp_path, "a", "b", "a-to-b", "--topic", TOPIC, runs=runs),
                   _mirror(link, tmp_path, "b", "a", "b-to-a", "--topic", TOPIC, runs=runs)]
        for producer in producers:
            assert producer.wait_exit(120) == 0, producer.tail()
        expected = acked_keys(*producers)
        a.consumer("ca", TOPIC)
        b.consumer("cb", TOPIC)
        a.wait_delivered("ca", expected, 120)
        b.wait_delivered("cb", expected, 120)
        time.sleep(2)  # a loop, if there were one, would write more by now
        for mirror in mirrors:
            mirror.send_signal(signal.SIGTERM)
            assert mirror.wait(60) == 0, _tails(runs)
        for role in [*stores.values(), *towers]:
            assert role.stop() == 0
    except BaseException:
        print(a.tails(), b.tails(), _tails(runs), link.tail(), sep="\n")
        raise
    logs = [p.producer_log() for p in producers]
    consumer_runs = {**a.consumer_runs(), **b.consumer_runs()}
    report = check("mirror: both ways", logs, consumer_runs, {n: s.db for n, s in stores.items()},
                   complete_stores=list(stores), value_size=100)
    fault_report(report)
    union = read_store(stores["sa"].db, TOPIC)
    assert len(union) == 10_000 and read_store(stores["sb"].db, TOPIC) == union
    for proc, base in runs:  # each mirror said what it left alone, and found no conflict
        said = base.with_suffix(".err").read_text()
        assert "0 conflict(s)" in said, said[-2000:]


def _store_heads(link: ImpairedLink, host: str, topic: str) -> dict[str, int]:
    """partition -> the stores' head of ``topic`` on ``host``'s site, from `dafka status --json`."""
    ip = link.address[host]
    proc = link.processes_in(host).start(
        [script("dafka"), "status", "--json", "--topic", topic, "--pub", f"tcp://{ip}:5557", "--sub",
         f"tcp://{ip}:5556", "-X", f"beacon/address={ip}", "-X", f"beacon/bind_address={ip}", "--wait-ms", "1000"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return {row["partition"]: row["store_head"] for row in json.loads(out)["partitions"]
            if row["store_head"] is not None}


def test_a_consumer_group_fails_over_across_the_link_at_its_mirrored_commits(link, tmp_path, fault_report):
    sides = _sites(link, tmp_path)
    a, b = sides["a"], sides["b"]
    runs: list = []
    commits = "__dafka_offsets.billing"
    try:
        towers = [a.tower("ta", 5556, 5557, host=link.address["a"]), b.tower("tb", 5556, 5557, host=link.address["b"])]
        stores = {"sa": a.store("sa"), "sb": b.store("sb")}
        # The producer waits at 3,000 records until site A's member has left, however busy the machine is: the
        # member must leave a part of the partition unread, for site B's member to take over from its commit.
        resume = tmp_path / "resume"
        producer = a.producer("p", TOPIC, count=8_000, rate=2_000, size=100, wait_peers=1, pause_at=3_000,
                              resume_file=resume)
        mirror = _mirror(link, tmp_path, "a", "b", "a-to-b", "--topic", TOPIC, "--prefix", "__dafka_offsets.",
                         "--scan-interval-ms", "500", runs=runs)
        member = a.consumer("g", TOPIC, group="billing")
        wait_for(lambda: len(a.delivered("g")) >= 3_000, 60, interval=0.1, what="the group reads on site A")
        assert member.stop() == 0  # site A's member leaves; it commits what it returned
        resume.touch()
        assert producer.wait_exit(120) == 0, producer.tail()
        expected = acked_keys(producer)
        read_on_a = a.delivered("g")
        assert len(read_on_a) < len(expected)
        # Site B holds the group's commits as site A does (the mirror copied __dafka_offsets.billing).
        on_a = _store_heads(link, "a", commits)
        assert on_a, "site A holds no commits of the group"
        wait_for(lambda: _store_heads(link, "b", commits) == on_a, 60, interval=0.5, what="the commits mirrored")
        b.consumer("g", TOPIC, group="billing")  # the same group, on site B
        b.wait_delivered("g", expected - read_on_a, 120)
        time.sleep(1.0)  # anything read twice would be logged by now
        mirror.send_signal(signal.SIGTERM)
        assert mirror.wait(60) == 0, _tails(runs)
        for role in b.runs["g"]:
            assert role.stop() == 0
        for role in [*stores.values(), *towers]:
            assert role.stop() == 0
    except BaseException:
        print(a.tails(), b.tails(), _tails(runs), link.tail(), sep="\n")
        raise
    report = check("mirror: group failover", [producer.producer_log()],
                   {"g": a.consumer_runs()["g"] + b.consumer_runs()["g"]}, {n: s.db for n, s in stores.items()},
                   complete_stores=list(stores), value_size=100)
    fault_report(report)
    assert report.extra["delivered_by"]["g"] == len(expected)
