"""The shards scenario of bench/run.py: what sharded stores (rfc 16) buy as the cluster grows.

Capacity: for S = 1, 2, 4, 8 store processes, sharded (``store/replicas`` R =
2, 1 at S = 1) and unsharded (every store holds everything), four processes
of ``partitions`` / 4 producers each send ``records`` records between them,
random bytes that do not compress, with ``min_acks`` = R.  Each row gives the
acked rate (from the first send to the last ACK) against the same run's
ceiling, each store's CPU per acked record (its whole process, while the
records flow: from the first producer's first send to the last ACK) and
their sum, and each store's disk against R/S of the
data (the data: the S = 1 store's disk).  Rendezvous hashing spreads
partitions at random: with N partitions, a store's share of the R x N
copies has a standard deviation of sqrt(R N (1/S)(1 - 1/S)).

Rebalance: four sharded stores (R = 2) hold ``partitions`` partitions (one
process of that many producers); a consumer from the beginning measures the
bulk catch-up rate; then, while a producer sends 2,000 stamped records a
second to a live consumer, a fifth store joins.  It reports the fraction of
partitions that moved (ideal R/5), the rate at which the newcomer copied its
share against the catch-up rate, and the live consumer's p99 during the move.

Run alone: ``python3 bench/run.py --only shards`` (``--shard-stores``,
``--shard-records``, ``--shard-partitions``).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from .cluster import Cluster, ceiling, guarded, result_of
from .report import fmt_rate

SHARDED = ["beacon/interval=300", "beacon/timeout=1500", "store/dead_ms=5000", "store/handoff_ms=1000"]
PRODUCERS = 4
LIVE_RATE = 2000  # records a second of the live producer during the rebalance


def _disk(path: str) -> int:
    """A stopped store's database size once compacted: what it holds, not when LevelDB last compacted."""
    import plyvel

    db = plyvel.DB(path)
    try:
        db.compact_range()
    finally:
        db.close()
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def _cpu_seconds(pid: int) -> float:
    """CPU seconds a process has used so far, all its threads (/proc/PID/stat utime + stime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _stats(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def capacity(stores: int, replicas: int, records: int, size: int, partitions: int) -> dict:
    """One row: ``stores`` stores (``replicas`` 0: unsharded); :data:`PRODUCERS` processes of
    ``partitions`` / :data:`PRODUCERS` producers each send ``records`` in all, with ``min_acks`` = R."""
    c = Cluster()
    base = tempfile.mkdtemp(prefix="dafka-bench-shards-")
    acks = replicas or min(2, stores)
    settings = SHARDED + [f"store/replicas={replicas}"]  # the same beacon settings sharded or not
    per_process = max(1, partitions // PRODUCERS)
    each = max(1, records // (per_process * PRODUCERS))
    try:
        procs = [c.store(f"{base}/s{n}", settings) for n in range(stores)]
        time.sleep(2.0)  # the stores meet and settle (three beacon intervals)
        producers = [c.spawn("partitions", "--producers", str(per_process), "--records", str(each), "--size",
                             str(size), "--min-acks", str(acks), "--warmup", "1",
                             "--wait-peers", str(2 * stores),  # scoped discovery: a producer hears the stores
                             *(["--set", f"store/replicas={replicas}"] if replicas else []))
                     for _ in range(PRODUCERS)]
        producers[0].stdout.readline()  # the first producer sends: the stores' CPU from here...
        before = [_cpu_seconds(p.pid) for p in procs]
        ps = [result_of(p) for p in producers]
        after = [_cpu_seconds(p.pid) for p in procs]  # ...to the last ACK
        results = [Cluster.stop_store(p) for p in procs]
        total = each * per_process * PRODUCERS
        started = min(p["send_started"] for p in ps)
        finished = max(p["finished"] for p in ps)
        cpu = [(b - a) / total * 1e6 for a, b in zip(before, after)]
        disk = [_disk(f"{base}/s{n}") for n in range(stores)]
        return {"stores": stores, "replicas": replicas, "min_acks": acks, "records": total, "size": size,
                "partitions": per_process * PRODUCERS, "rate": total / (finished - started),
                "store_cpu_us": [round(x, 3) for x in cpu], "store_cpu_us_sum": round(sum(cpu), 3),
                "producer_cpu_us": round(sum(p["cpu_us"] for p in ps) / len(ps), 3),
                "disk": disk, "rss_mib": {"store (max)": max(r["rss_mib"] for r in results)}}
    finally:
        c.close()
        shutil.rmtree(base, ignore_errors=True)


def rebalance(partitions: int, records: int, size: int) -> dict:
    """Four sharded stores, then a fifth joins under a live stream."""
    c = Cluster()
    base = tempfile.mkdtemp(prefix="dafka-bench-rebalance-")
    settings = SHARDED + ["store/replicas=2"]
    try:
        stores = [c.store(f"{base}/s{n}", settings, progress=f"{base}/s{n}.json") for n in range(4)]
        time.sleep(2.0)
        per_process = max(1, partitions // PRODUCERS)
        partitions = per_process * PRODUCERS
        each = max(1, records // partitions)
        fillers = [c.spawn("partitions", "--producers", str(per_process), "--records", str(each), "--size",
                           str(size), "--min-acks", "2", "--warmup", "2", "--set", "store/replicas=2")
                   for _ in range(PRODUCERS)]
        for filler in fillers:
            result_of(filler)
        total = each * partitions
        catchup = result_of(c.spawn("consumer", "--records", str(total), "--reset", "earliest"))
        catchup_rate = catchup["received"] / catchup["seconds"] if catchup.get("seconds") else 0.0
        # The live stream, and its consumer (from the latest: the stored partitions are not its business).
        live_records = LIVE_RATE * 20
        consumer = c.spawn("consumer", "--records", str(live_records), "--reset", "latest", "--stamp",
                           "--topic", "live")
        live = c.spawn("producer", "--records", str(live_records), "--size", str(max(size, 16)), "--rate",
                       str(LIVE_RATE), "--min-acks", "2", "--topic", "live", "--warmup", "1",
                       "--set", "store/replicas=2")
        time.sleep(4.0)  # the stream flows
        joined = time.monotonic()
        stores.append(c.store(f"{base}/s4", settings, progress=f"{base}/s4.json"))
        files = [Path(f"{base}/s{n}.json") for n in range(5)]
        began = copied = moved_at = None  # the newcomer took up its share; holds it whole; the others let go
        copied_records = 0
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            time.sleep(0.05)
            now = [_stats(f) for f in files]
            if began is None and now[4].get("moves_in"):
                began = time.monotonic()
            if began is not None and copied is None and now[4].get("under_replicated") == 0 and \
                    not now[4].get("filling"):
                copied, copied_records = time.monotonic(), now[4].get("records_written", 0)
            if copied is not None and all(s.get("under_replicated") == 0 for s in now) and \
                    sum(s.get("partitions", 0) for s in now) == 2 * (partitions + 1):
                moved_at = time.monotonic()
                break
        final = [_stats(f) for f in files]
        live_result = result_of(live)
        consumer_result = result_of(consumer)
        for proc in stores:
            Cluster.stop_store(proc)
        return {"partitions": partitions, "records": total, "size": size,
                "moved": final[4].get("moves_in", 0), "moved_fraction": final[4].get("moves_in", 0) / partitions,
                "others_took_up": sum(s.get("moves_in", 0) for s in final[:4]),
                "handed_over": sum(s.get("moves_out", 0) for s in final[:4]),
                "move_seconds": None if moved_at is None else moved_at - joined,
                "copy_seconds": None if copied is None else copied - began,
                "copy_rate": None if copied is None else copied_records / max(copied - began, 0.05),
                "catchup_rate": catchup_rate,
                "live_p50_ms": consumer_result.get("p50_ms"), "live_p99_ms": consumer_result.get("p99_ms"),
                "live_received": consumer_result.get("received"), "live_sent": live_result.get("sent"),
                "disk": [_disk(f"{base}/s{n}") for n in range(5)]}
    finally:
        c.close()
        shutil.rmtree(base, ignore_errors=True)


def run_all(stores: list[int], records: int, sizes: list[int], partitions: int) -> dict:
    ceilings = {size: ceiling(min(records, 300_000), size) for size in sizes}
    out: dict = {"capacity": {}, "ceiling": {size: c["rate"] for size, c in ceilings.items()}}
    for size in sizes:
        rows = []
        ceiling_rate = ceilings[size]["rate"]
        print(f"\n== shards: S stores, {partitions} partitions send {records:,} {size}-byte records, "
              f"min_acks = R (ceiling {ceiling_rate:,.0f}/s) ==")
        data = None  # one copy of everything: the S = 1 store's disk
        for s in stores:
            for replicas in ((min(2, s) if s > 1 else 1), 0):
                if s == 1 and not replicas:
                    continue  # one store: sharded with R = 1 is the same cluster
                row = guarded(capacity, s, replicas, records, size, partitions)
                row.setdefault("stores", s)
                row.setdefault("replicas", replicas)
                rows.append(row)
                label = f"S={s} " + (f"sharded R={replicas}" if replicas else "unsharded")
                if "error" in row:
                    print(f"{label:<24} did not finish: {row['error']}")
                    continue
                data = data or row["disk"][0]
                share = data * (min(replicas, s) if replicas else s) / s
                row["disk_vs_share"] = [round(d / share, 3) for d in row["disk"]]
                print(f"{label:<24} {fmt_rate(row['rate'], ceiling_rate):<28} store CPU us/acked record: "
                      f"sum {row['store_cpu_us_sum']:.2f} (" + ", ".join(f"{x:.2f}" for x in row["store_cpu_us"])
                      + f"); producers {row['producer_cpu_us']:.2f}; disk MiB "
                      + ", ".join(f"{d / 2**20:.1f}" for d in row["disk"])
                      + f" ({min(row['disk_vs_share']):.2f}-{max(row['disk_vs_share']):.2f}x R/S of the data)")
        out["capacity"][size] = rows
    size = sizes[0]
    r = guarded(rebalance, partitions, records, size)
    out["rebalance"] = r
    print(f"\n== rebalance: a fifth store joins four (R=2), {partitions} partitions of {size}-byte records ==")
    if "error" in r:
        print(f"did not finish: {r['error']}")
    else:
        copy = f"{r['copy_rate']:,.0f}/s in {r['copy_seconds']:.2f} s" if r["copy_rate"] else "n/a"
        print(f"moved {r['moved']} of {partitions} partitions ({r['moved_fraction']:.2f}, ideal 0.40), others took up "
              f"{r['others_took_up']}, handed over {r['handed_over']}; all settled in "
              f"{r['move_seconds'] or float('nan'):.1f} s after the join; copy {copy} against bulk catch-up "
              f"{r['catchup_rate']:,.0f}/s; live consumer p50 {r['live_p50_ms'] or float('nan'):.1f} ms, "
              f"p99 {r['live_p99_ms'] or float('nan'):.1f} ms ({r['live_received']:,} of {r['live_sent']:,})")
    return out

