"""A consumer group of M members reading 8 producers' records through a store."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from .cluster import Cluster, result_of


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
