"""``dafka status`` on a running system of real processes: the live peers
from the tower and, per topic and partition, the stores' heads and the live
producers' HEADs."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time

from test_cli import Cluster, assert_no_traceback, partition_of

N = 5


def status_json(cluster: Cluster, *args: str) -> dict:
    tool = cluster.run("dafka", "status", "--json", "--wait-ms", "700", *args)
    assert tool.wait(10) == 0, tool.err.text
    assert_no_traceback(tool)
    return json.loads(tool.out.data)


def wait_for_heads(cluster: Cluster, topic: str, want: dict, timeout: float = 15.0) -> dict:
    """Run ``dafka status --json`` until the row of ``topic`` has the ``want``ed fields."""
    deadline = time.monotonic() + timeout
    while True:
        doc = status_json(cluster)
        rows = [r for r in doc["partitions"] if r["topic"] == topic]
        if rows and all(rows[0][k] == v for k, v in want.items()):
            return doc
        assert time.monotonic() < deadline, f"no {want} for {topic} in {doc}"


def test_status_shows_live_peers_and_heads(processes, tmp_path):
    cluster = Cluster(processes)
    store = cluster.store(tmp_path / "storedb")
    reader = store.err.wait_for(rb"reader ([0-9A-F]{32})").group(1).decode()
    writer = store.err.wait_for(rb"writer ([0-9A-F]{32})").group(1).decode()
    # A live producer: its stdin stays open.
    producer = cluster.run("dafka_console_producer", "stat", stdin=subprocess.PIPE)
    producer.write(b"".join(b"r%d\n" % i for i in range(N)))

    doc = wait_for_heads(cluster, "stat", {"store_head": N - 1, "producer_head": N - 1})
    assert doc["tower"] == cluster.pub_address
    roles = {p["address"]: p["role"] for p in doc["peers"]}
    partition = next(a for a, r in roles.items() if r == "producer")
    assert roles[reader] == "store-reader" and roles[writer] == "store-writer"
    assert all(p["endpoint"].startswith("tcp://127.0.0.1:") for p in doc["peers"]), doc["peers"]
    row = next(r for r in doc["partitions"] if r["topic"] == "stat")
    assert row == {"topic": "stat", "partition": partition, "store_head": N - 1, "producer_head": N - 1,
                   "stores": {reader: N - 1}, "mirrored_from": None}

    table = cluster.run("dafka", "status")
    assert table.wait(10) == 0, table.err.text
    lines = table.out.text.splitlines()
    # 3 peers, plus the earlier `dafka status` runs: the tower remembers a
    # peer for beacon/timeout after its last beacon (listed with role "?").
    assert re.fullmatch(rf"tower {re.escape(cluster.pub_address)}: (\d+) live peers", lines[0]), table.out.text
    assert int(lines[0].split()[2]) >= 3
    assert any(line.split() == ["producer", partition, line.split()[-1]] for line in lines)
    header = ["TOPIC", "PARTITION", "STORE", "HEAD", "PRODUCER", "HEAD", "STORES", "MIRRORED", "FROM"]
    assert header in [line.split() for line in lines]
    assert ["stat", partition, str(N - 1), str(N - 1), "1", "-"] in [line.split() for line in lines], table.out.text

    other = status_json(cluster, "--topic", "other")
    assert other["partitions"] == []

    producer.close_stdin()
    assert producer.wait(15) == 0, producer.err.text
    assert partition_of(producer.err.text) == partition
    assert_no_traceback(table, producer, store)


def test_status_shows_stored_topics_without_a_live_producer(processes, tmp_path):
    """GET-HEADS with the empty topic: every topic the stores hold."""
    cluster = Cluster(processes)
    cluster.store(tmp_path / "storedb")
    producer = cluster.produce("gone", b"g0\ng1\ng2\n")
    assert producer.wait(15) == 0, producer.err.text
    partition = partition_of(producer.err.text)
    doc = wait_for_heads(cluster, "gone", {"store_head": 2}, timeout=8.0)
    row = next(r for r in doc["partitions"] if r["topic"] == "gone")
    assert row["partition"] == partition and row["producer_head"] is None


def test_status_shows_the_owners_of_sharded_stores_and_what_is_under_replicated(processes, tmp_path):
    """Three stores started with --replicas 2: each partition's two OWNERS, none UNDER-REPLICATED; with one
    store gone (SIGKILL), the partitions it owned are, until store/dead_ms places them again."""
    cluster = Cluster(processes)
    sharded = ("--replicas", "2", "-X", "beacon/interval=300", "-X", "beacon/timeout=1500",
               "-X", "store/dead_ms=60000")
    stores = [cluster.store(tmp_path / f"s{n}", *sharded) for n in range(3)]
    ids = [store.err.wait_for(rb"sharded: store ([0-9A-F]{32})", what="its identity").group(1).decode()
           for store in stores]
    producer = cluster.run("dafka_console_producer", "shards", "-X", "producer/min_acks=2", stdin=subprocess.PIPE)
    producer.write(b"".join(b"r%d\n" % i for i in range(N)))
    doc = wait_for_heads(cluster, "shards", {"store_head": N - 1, "under_replicated": False})
    row = next(r for r in doc["partitions"] if r["topic"] == "shards")
    assert len(row["owners"]) == 2 and len(row["stores"]) == 2
    table = cluster.run("dafka", "status")
    assert table.wait(10) == 0, table.err.text
    header = next(line for line in table.out.text.splitlines() if line.startswith("TOPIC"))
    assert "OWNERS" in header and "UNDER-REPLICATED" in header
    line = next(line for line in table.out.text.splitlines() if line.startswith("shards "))
    assert line.split()[5] == ",".join(owner[:8] for owner in row["owners"]) and line.split()[6] == "-"
    # An owner dies: its copy is not live any more.
    owners = [store for store, identity in zip(stores, ids) if identity in row["owners"]]
    assert len(owners) == 2
    owners[0].signal(signal.SIGKILL)
    wait_for_heads(cluster, "shards", {"under_replicated": True}, timeout=20)


def test_store_refuses_a_dead_ms_within_the_beacon_timeout(processes, tmp_path):
    cluster = Cluster(processes)
    tool = cluster.run("dafka_stored", "--db", str(tmp_path / "s"), "--replicas", "2", "-X", "store/dead_ms=1000")
    assert tool.wait(10) == 2
    assert "store/dead_ms: must be longer than beacon/timeout (4000 ms)" in tool.err.text
    assert_no_traceback(tool)
