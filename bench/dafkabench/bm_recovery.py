"""The recovery scenario of bench/run.py: a consumer that falls behind on purpose.

A producer sends ``records`` records as fast as it can to two consumers that
read from the beginning.  0.1 s after the producer starts sending, one of them is
stopped (SIGSTOP) for ``pause`` seconds, mid-stream: the live records that
reach it meanwhile fill its queues and the rest are dropped, so when it
resumes (SIGCONT) it must fetch what it missed while the stream goes on or
after it ended.  It reports the rate at which it read from its resume to its
last record, against the same run's ceiling, and its CPU per record over
that stretch; the other consumer, never stopped, is the yardstick.

Without a store (the default), the producer's no-store ring holds the whole
run (``bench/run.py``'s ``holding``), and the records come back in the
producer's bulk answers; ``store=True`` adds a store and ``min_acks = 1``.
A role that does not finish says what it received; the run goes on.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from .cluster import Cluster, consumer_row, holding, result_of, stop_stayer

PAUSE_AFTER = 0.1  # seconds after the producer's first send (300,000 records take it 0.3-1 s)


def scenario_recovery(records: int, size: int, api: str = "consume", store: bool = False,
                      pause: float = 2.0) -> dict:
    c = Cluster()
    db = tempfile.mkdtemp(prefix="dafka-bench-recovery-") if store else None
    try:
        store_proc = c.store(db) if db else None
        consumers = [c.spawn("consumer", "--records", str(records), "--size", str(size), "--reset", "earliest",
                             "--api", api) for _ in range(2)]
        time.sleep(1.0)
        producer = c.spawn("producer", "--records", str(records), "--size", str(size), "--min-acks",
                           "1" if store else "0", "--stay", *holding(records, size), stdin=True)
        producer.stdout.readline()  # "sending"
        time.sleep(PAUSE_AFTER)
        paused = consumers[1]
        os.kill(paused.pid, signal.SIGSTOP)
        time.sleep(pause)
        os.kill(paused.pid, signal.SIGCONT)
        steady, behind = (result_of(proc, timeout=records / 2_000 + 120) for proc in consumers)
        produced = stop_stayer(producer)
        out = {"records": records, "size": size, "api": api, "store": store, "pause_s": pause,
               "steady": consumer_row(steady), "behind": consumer_row(behind),
               "cpu_us": {"producer": produced.get("cpu_us"), "steady consumer": steady.get("cpu_us"),
                          "recovering consumer": behind.get("recovery_cpu_us")},
               "fetches": behind.get("fetches")}
        if "incomplete" in out["behind"]:
            out["incomplete"] = out["behind"]["incomplete"]
        elif behind.get("recovered") and behind.get("recovery_seconds"):
            out["recovered"] = behind["recovered"]
            out["rate"] = behind["recovered"] / behind["recovery_seconds"]
        else:
            out["incomplete"] = "the stream was over before the pause: nothing to recover (more --records)"
        if store_proc is not None:
            out["cpu_us"]["store"] = Cluster.stop_store(store_proc).get("cpu_us")
        return out
    finally:
        c.close()
        if db:
            shutil.rmtree(db, ignore_errors=True)
