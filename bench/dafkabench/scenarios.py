"""The one registry of the benchmark's scenarios: run.py's ``--skip``, ``--only`` and full run all read it.

Each size of ``--sizes`` gets a table of the parts in :data:`SIZE_PARTS` (the raw ceiling is in ``live``,
which always runs); then the :data:`SCENARIOS` run once each, in this order.  A scenario's options are its
own (``options``); ``stored`` ones need a store (``--skip store``, or no LevelDB, leaves them out); ``alone``
ones can run by themselves (``--only``), measuring their own ceiling.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field

from . import (bm_bulk, bm_cdc, bm_compaction, bm_groups, bm_idle, bm_kafka, bm_live, bm_mirror, bm_partitions,
               bm_recovery, bm_scale, bm_shard, bm_store, bm_ui)
from .cluster import ceiling, guarded
from .report import fmt_cpu, fmt_rate, print_bulk


def _none(ap: argparse.ArgumentParser) -> None:
    """A scenario without options of its own."""


@dataclass(frozen=True)
class SizePart:
    """Rows of each size's table: ``run(a, size, row)`` fills ``row`` (the size's results)."""

    name: str
    help: str
    run: Callable[[argparse.Namespace, int, dict], None]
    stored: bool = False


@dataclass(frozen=True)
class Scenario:
    """``run(a, results)`` measures, prints and puts its figures in ``results``."""

    name: str
    help: str
    run: Callable[[argparse.Namespace, dict], None]
    stored: bool = False
    alone: bool = False
    options: Callable[[argparse.ArgumentParser], None] = field(default=_none)


def _live(a: argparse.Namespace, size: int, row: dict) -> None:
    row["ceiling"] = ceiling(a.records, size)
    row["direct"] = guarded(bm_live.scenario_direct, a.records, size)
    row["direct_async"] = guarded(bm_live.scenario_direct, a.records, size, api="async")  # next to consume()
    row["direct_poll"] = guarded(bm_live.scenario_direct, a.records, size, api="poll")
    row["paced"] = guarded(bm_live.scenario_paced_latency, min(a.records, 20_000), size, 10_000)


def _recovery(a: argparse.Namespace, size: int, row: dict) -> None:
    for api in ("consume", "async"):
        row[f"recovery_{api}"] = guarded(bm_recovery.scenario_recovery, a.records, size, api)


def _store(a: argparse.Namespace, size: int, row: dict) -> None:
    row["store"] = guarded(bm_store.scenario_store, a.records, size, with_consumer=False)
    row["store_consumer"] = guarded(bm_store.scenario_store, a.records, size, with_consumer=True)


SIZE_PARTS = [
    SizePart("live", "the raw ceiling, producer -> consumer (consume(), poll(), async for), latency at 10,000/s",
             _live),
    SizePart("recovery", "a consumer stopped 2 s mid-stream, and how fast it recovers", _recovery),
    SizePart("store", "producer -> store acked, with a consumer, catch-up from the store", _store, stored=True),
]


def _sizes(a: argparse.Namespace) -> list[int]:
    return [int(s) for s in a.sizes.split(",")]


def _first_ceiling(results: dict) -> float:
    """The raw ceiling of the run's first size (the many-partitions and group rows are at it)."""
    return next(iter(results["runs"].values()))["ceiling"]["rate"]


def _bulk(a: argparse.Namespace, results: dict) -> None:
    session = bm_bulk.spark_session() if "spark" not in a.skip and bm_bulk.spark_available() else None
    results["bulk"] = {}
    try:
        for size in _sizes(a):
            bulk = bm_bulk.scenario_bulk_reads(a.catchup_records, size, session, concurrency=size == _sizes(a)[0])
            results["bulk"][size] = bulk
            print_bulk(bulk, results["runs"][size]["ceiling"]["rate"])
    finally:
        if session is not None:
            bm_bulk.stop_spark(session)


def _partitions(a: argparse.Namespace, results: dict) -> None:
    ceiling_rate = _first_ceiling(results)
    results["partitions"] = {}
    print(f"\n== many partitions: P producers send {a.catchup_records // 5:,} 100-byte records in all ==")
    for producers in (int(x) for x in a.partitions.split(",")):
        m = bm_partitions.scenario_partitions(producers, a.catchup_records // 5)
        results["partitions"][producers] = m
        print(f"{'P=' + str(producers):<44} {fmt_rate(m['rate'], ceiling_rate):<28} {fmt_cpu(m['cpu_us'])}; "
              f"RSS MiB " + ", ".join(f"{k} {v:.0f}" for k, v in m["rss_mib"].items()))
        print(f"{'':<44} from the first send(): {fmt_rate(m['sending_rate'], ceiling_rate)}")
        print(f"{'':<44} a producer's CPU ms: " + ", ".join(f"{k} {v:.0f}" for k, v in m["producer_cpu_ms"].items()))


def _groups(a: argparse.Namespace, results: dict) -> None:
    ceiling_rate, size = _first_ceiling(results), _sizes(a)[0]
    results["groups"] = {}
    print(f"\n== consumer group: M members read 8 producers' {a.records:,} {size}-byte records ==")
    for members in (int(x) for x in a.group_members.split(",")):
        g = bm_groups.scenario_groups(members, 8, a.records, size)
        results["groups"][members] = g
        print(f"{'M=' + str(members):<44} {fmt_rate(g['rate'], ceiling_rate):<28} {fmt_cpu(g['cpu_us'])}; "
              f"{g['received']:,} of {g['records']:,} records, partitions per member {g['shares']}, "
              f"RSS MiB member {g['rss_mib']['member (max)']:.0f}")


def _idle(a: argparse.Namespace, results: dict) -> None:
    results["idle"] = idle = guarded(bm_idle.scenario_idle, a.idle_seconds)
    print(f"\n== idle for {a.idle_seconds:.0f} s (daemons and console tools, nothing flowing) ==")
    if "error" in idle:
        print(f"did not finish: {idle['error']}")
    for role, r in idle.get("roles", {}).items():
        print(f"{role:<44} CPU {r['cpu_percent']:.3f} %, {r['wakeups_per_s']:.1f} wake-ups/s")


def _first_record(a: argparse.Namespace, results: dict) -> None:
    results["first_record_live"] = first = bm_live.scenario_first_record_live()
    if "first_record_ms" in first:
        print(f"consumer start to first record, live producer: {first['first_record_ms']:.1f} ms")


def _hold(a: argparse.Namespace, results: dict) -> None:
    results["hold"] = h = bm_store.scenario_hold_unacked(a.hold_records)
    if "buffered" in h:
        print(f"producer holding {h['buffered']:,} unacked 100-byte records: peak RSS {h['rss_mib']:.0f} MiB")


def _burst(a: argparse.Namespace, results: dict) -> None:
    records = a.catchup_records * 10 if a.burst_records is None else a.burst_records
    results["burst"] = bm_store.scenario_store_burst(records, a.burst_set)


def _mirror(a: argparse.Namespace, results: dict) -> None:
    records = a.records if a.mirror_records is None else a.mirror_records
    catchup = a.catchup_records if a.mirror_catchup_records is None else a.mirror_catchup_records
    results["mirror"] = bm_mirror.run_all(records, _sizes(a), catchup, a.mirror_lag_seconds)


def _ui(a: argparse.Namespace, results: dict) -> None:
    import importlib.util

    if importlib.util.find_spec("starlette") is None or importlib.util.find_spec("uvicorn") is None:
        print("\n== web console: skipped (pip install '.[ui]') ==")
        results["ui"] = {}
        return
    results["ui"] = bm_ui.run_all(a.ui_partitions, a.ui_records, a.ui_seconds, a.ui_rate, idle_wait=a.ui_idle_wait,
                                  browser=bool(a.ui_browser))


def _opt(*specs: tuple[str, dict]) -> Callable[[argparse.ArgumentParser], None]:
    """A scenario's options: ``(flag, add_argument's keywords)`` each."""
    def add(ap: argparse.ArgumentParser) -> None:
        for flag, kwargs in specs:
            ap.add_argument(flag, **kwargs)
    return add


SCENARIOS = [
    Scenario("bulk", "stored records read back: bulk, RFC 46 and reference consumers, Spark, four readers, fairness",
             _bulk, stored=True),
    Scenario("partitions", "P producers in one process each, to one store", _partitions, stored=True, options=_opt(
        ("--partitions", dict(default="1,8,32,128", help="producer counts of the many-partitions scenario")))),
    Scenario("groups", "a consumer group of M members reads 8 producers", _groups, options=_opt(
        ("--group-members", dict(default="1,2,4", help="member counts of the consumer group scenario")))),
    Scenario("idle", "CPU and wake-ups of each daemon while nothing flows", _idle, options=_opt(
        ("--idle-seconds", dict(type=float, default=60.0, help="how long the idle scenario measures")))),
    Scenario("first_record", "a consumer's start to its first record from a live producer", _first_record),
    Scenario("cdc", "dafka cdc postgres: sustained capture, latency, bootstrap (bm_cdc.py)",
             lambda a, r: r.update(cdc=bm_cdc.run_all(a.cdc_records, a.bootstrap_rows, a.cdc_latency_seconds)),
             alone=True, options=_opt(
                 ("--cdc-records", dict(type=int, default=100_000, help="row changes per sustained CDC run")),
                 ("--bootstrap-rows", dict(type=int, default=1_000_000, help="rows of the CDC bootstrap run")),
                 ("--cdc-latency-seconds", dict(type=float, default=10.0,
                                                help="how long the CDC latency run commits 1,000 changes/s")))),
    Scenario("mirror", "dafka mirror between two sites, and its lag over an impaired link (bm_mirror.py)", _mirror,
             stored=True, alone=True, options=_opt(
                 ("--mirror-records", dict(type=int, help="records of each mirror throughput run (default --records)")),
                 ("--mirror-catchup-records", dict(type=int, help="records the mirror catches up on after a stop "
                                                                  "(default --catchup-records; 0: none)")),
                 ("--mirror-lag-seconds", dict(type=float, default=10.0, help="how long the mirror lag run over the "
                                               "impaired link sends 10,000 records/s (0: not run)")))),
    Scenario("burst", "a store's memory through one burst of records", _burst, stored=True, alone=True, options=_opt(
        ("--burst-records", dict(type=int, help="records of the one-burst store memory run "
                                                "(default 10 x --catchup-records)")),
        ("--burst-set", dict(action="append", metavar="KEY=VALUE", default=[],
                             help="a config key of the store in the one-burst run (repeatable), e.g. to compare "
                                  "store/block_bytes=4096 with the default")))),
    Scenario("scale", "discovery's cost against the number of peers (bm_scale.py)",
             lambda a, r: r.update(scale=bm_scale.run_all([int(p) for p in a.scale_peers.split(",")],
                                                          a.scale_seconds)),
             alone=True, options=_opt(
                 ("--scale-peers", dict(default="100,500,2000,10000", help="cluster sizes of the discovery scale "
                                        "scenario (simulated peers; see bench/dafkabench/bm_scale.py)")),
                 ("--scale-seconds", dict(type=float, default=20.0,
                                          help="how long the scale scenario measures CPU at each size")))),
    Scenario("shards", "sharded stores' capacity against S, and a rebalance (bm_shard.py)",
             lambda a, r: r.update(shards=bm_shard.run_all([int(s) for s in a.shard_stores.split(",") if s],
                                                           a.shard_records, _sizes(a), a.shard_partitions)),
             stored=True, alone=True, options=_opt(
                 ("--shard-stores", dict(default="1,2,4,8", help="store counts of the shards scenario (empty: only "
                                                                 "its rebalance)")),
                 ("--shard-records", dict(type=int, default=200_000, help="records of each row of the shards scenario")),
                 ("--shard-partitions", dict(type=int, default=64, help="partitions of the shards scenario (its "
                                                                        "capacity rows and its rebalance)")))),
    Scenario("ui", "the web console's page loads at scale, and its CPU (bm_ui.py)", _ui, stored=True, alone=True,
             options=_opt(
                 ("--ui-partitions", dict(type=int, default=3000, help="partitions the ui scenario's store holds")),
                 ("--ui-records", dict(type=int, default=10_000_000, help="records the ui scenario's store holds")),
                 ("--ui-seconds", dict(type=float, default=30.0, help="how long the ui scenario measures each CPU "
                                                                      "figure")),
                 ("--ui-rate", dict(type=int, default=100_000, help="records a second of the ui scenario's loaded "
                                                                     "cluster")),
                 ("--ui-browser", dict(type=int, choices=(0, 1), default=1, help="the ui scenario loads pages in "
                                       "chromium where it is installed (0: over HTTP only)")),
                 ("--ui-idle-wait", dict(type=float, default=35.0, help="seconds the ui scenario waits for the "
                                         "console to stop listening (it does 30 s after a look)")))),
    Scenario("compaction", "writes with and without compaction, a compacted topic's CDC bootstrap (bm_compaction.py)",
             lambda a, r: r.update(compaction=bm_compaction.run_all(a.compaction_records, a.compaction_keys,
                                                                    a.bootstrap_rows)),
             stored=True, alone=True, options=_opt(
                 ("--compaction-records", dict(type=int, default=500_000, help="keyed records of each write run of "
                                               "the compaction scenario")),
                 ("--compaction-keys", dict(type=int, default=10_000, help="keys those records cycle over")))),
    Scenario("kafka", "confluent-kafka through dafka kafka against the native path (bm_kafka.py)",
             lambda a, r: r.update(kafka=bm_kafka.run_all(a.kafka_records, _sizes(a), a.kafka_rate,
                                                          a.kafka_latency_seconds)),
             stored=True, alone=True, options=_opt(
                 ("--kafka-records", dict(type=int, default=100_000, help="records of each Kafka gateway run, per "
                                                                          "size in --sizes")),
                 ("--kafka-rate", dict(type=int, default=10_000, help="records/s of the Kafka gateway's "
                                                                      "produce-to-consume latency run")),
                 ("--kafka-latency-seconds", dict(type=float, default=10.0, help="how long the Kafka gateway's "
                                                  "latency run lasts (0: no latency nor rebalance run)")))),
    Scenario("hold", "a producer's RSS holding unacked records", _hold, options=_opt(
        ("--hold-records", dict(type=int, default=1_000_000, help="unacked records held for the RSS run")))),
]

SKIPPABLE = [p.name for p in SIZE_PARTS if p.name != "live"] + [s.name for s in SCENARIOS] + ["spark"]
ALONE = [s.name for s in SCENARIOS if s.alone]
