"""A store's rows: producer -> store acked, with a consumer beside it, catch-up; a store's memory through
one burst; a producer holding unacked records."""

from __future__ import annotations

import shutil
import tempfile
import time

from .cluster import Cluster, ceiling, result_of
from .common import RssSampler, rate_of
from .report import fmt_cpu, fmt_rate


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
