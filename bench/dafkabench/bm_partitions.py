"""Many partitions: P producers in one process, to one store."""

from __future__ import annotations

import shutil
import tempfile
import time

from .cluster import Cluster, result_of


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
