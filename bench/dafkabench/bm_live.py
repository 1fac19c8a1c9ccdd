"""The live path: producer -> consumer at full speed (consume(), poll(), async for), latency at a paced
rate, and a consumer's start to its first record."""

from __future__ import annotations

import time

from .cluster import Cluster, consumer_row, holding, result_of, stop_stayer


def scenario_direct(records: int, size: int, api: str = "consume") -> dict:
    c = Cluster()
    try:
        consumer = c.spawn("consumer", "--records", str(records), "--size", str(size), "--stamp",
                           "--reset", "earliest", "--api", api)
        time.sleep(0.5)
        producer = c.spawn("producer", "--records", str(records), "--size", str(size), "--stamp",
                           "--min-acks", "0", "--stay", *holding(records, size), stdin=True)
        r = result_of(consumer)
        p = stop_stayer(producer)
        return {**consumer_row(r), "send_rate": records / p["send_seconds"],
                "rss_mib": {"producer": p["rss_mib"], "consumer": r["rss_mib"]},
                "cpu_us": {"producer": p.get("cpu_us"), "consumer": r.get("cpu_us")}}
    finally:
        c.close()


def scenario_paced_latency(records: int, size: int, rate: int) -> dict:
    c = Cluster()
    try:
        consumer = c.spawn("consumer", "--records", str(records), "--size", str(size), "--stamp",
                           "--reset", "earliest")
        time.sleep(0.5)
        producer = c.spawn("producer", "--records", str(records), "--size", str(size), "--rate", str(rate),
                           "--min-acks", "0", "--linger", "3")
        r = result_of(consumer)
        result_of(producer)
        return {"rate": rate, "p50_ms": r.get("p50_ms"), "p99_ms": r.get("p99_ms")}
    finally:
        c.close()


def scenario_first_record_live() -> dict:
    c = Cluster()
    try:
        producer = c.spawn("producer", "--records", "200", "--size", "100", "--rate", "20", "--min-acks", "0",
                           "--warmup", "0.5", "--linger", "5")
        time.sleep(2.0)
        consumer = c.spawn("consumer", "--records", "1", "--reset", "latest")
        r = result_of(consumer)
        producer.kill()
        return {"first_record_ms": r["first_record_ms"]}
    finally:
        c.close()
