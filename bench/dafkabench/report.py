"""The tables the run prints: each rate beside the same run's ceiling, as a ratio, with CPU per record."""

from __future__ import annotations

import os



def fmt_rate(rate: float | None, ceiling_rate: float) -> str:
    if not rate:
        return "n/a"
    return f"{rate:>10,.0f}/s  ({rate / ceiling_rate:4.2f}x)"


def print_bulk(b: dict, ceiling_rate: float) -> None:
    print(f"\n== {b['records']:,} stored {b['size']}-byte records, read back while the store runs ==")
    print(f"{'producer -> store, acked':<44} {fmt_rate(b['ack_rate'], ceiling_rate)}")
    rfc46 = b["catchup_rfc46"]["rate"]
    for name, label in (("bulk", "consumer catch-up, bulk answers"), ("rfc46", "consumer catch-up, RFC 46 answers"),
                        ("reference", "reference consumer (raw frames) catch-up")):
        r = b[f"catchup_{name}"]
        note = f"{r['received']:,} records"
        if name == "reference":
            note += (f", {r['rate'] / rfc46:.2f}x RFC 46 consumer, {r['fetches']} FETCHes ({r['filtered']} "
                     f"filtered), {r['foreign']} foreign messages")
        if r.get("cpu_us") is not None:
            note += f", CPU {r['cpu_us']:.2f} us/record"
        print(f"{label:<44} {fmt_rate(r['rate'], ceiling_rate):<28} {note}")
    path = b.get("spark_path_rate")
    for key, label in (("spark_path_rate", "Spark via path, a stopped store's copy (median)"),
                       ("spark_tower_rate", "Spark via tower (median of 3)"),
                       ("spark_path_running_rate", "Spark via path, running store (median)")):
        rate = b.get(key)
        if rate is not None:
            vs = f", {rate['median'] / path['median']:.2f}x path" if path and key != "spark_path_rate" else ""
            print(f"{label:<44} {fmt_rate(rate['median'], ceiling_rate):<28} best {rate['best']:,.0f}/s, "
                  f"{b['spark_tasks']} tasks{vs}; {fmt_cpu(rate.get('cpu_us', {}))}; "
                  f"{rate.get('busy_cores', 0):.2f} of {os.cpu_count()} cores busy")
    if "four_readers" in b:
        f = b["four_readers"]
        print(f"{'4 bulk readers at once: store RSS':<44} {'':<28} {f['rss_before_mib']:.0f} -> "
              f"{f['rss_peak_mib']:.0f} MiB, {f['growth_per_reader_mib']:.1f} MiB per reader; rates "
              + ", ".join(f"{r:,.0f}/s" for r in f["rates"]))
    if "fairness" in b:
        f = b["fairness"]
        print(f"{'Spark (4 tasks) + 2 consumers at once':<44} {fmt_rate(f['spark_rate'], ceiling_rate):<28} "
              + "; ".join(f"consumer {c['rate']:,.0f}/s, first record {c['first_record_ms']:.0f} ms, done "
                          f"{c['finished_after_spark_began_s']:.2f} s after Spark began" for c in f["consumers"])
              + f"; Spark took {f['spark_seconds']:.2f} s")
    if "live" in b:
        lv = b["live"]
        print(f"{'producer -> store acked, alone':<44} {fmt_rate(lv['alone_ack_rate'], ceiling_rate)}")
        print(f"{'  ... while 2 consumers catch up':<44} {fmt_rate(lv['busy_ack_rate'], ceiling_rate):<28} "
              f"{lv['busy_ack_rate'] / lv['alone_ack_rate']:.2f}x alone; catch-up "
              + ", ".join(f"{r:,.0f}/s" for r in lv["catchup_rates"]))
    print(f"{'peak RSS (MiB)':<44} {'':<28} " + ", ".join(f"{k} {v:.0f}" for k, v in b["rss_mib"].items()))


def fmt_cpu(cpu: dict) -> str:
    """CPU microseconds per record of each process, e.g. "CPU/rec producer 2.1 us, consumer 2.9 us"."""
    shown = [f"{name} {value:.2f}" for name, value in cpu.items() if value is not None]
    return "CPU us/record: " + ", ".join(shown) if shown else ""


def vs_consume(rate: float, consume_rate: float, cpu: float | None, consume_cpu: float | None) -> str:
    """async for against consume() in the same run: rate and the consumer's CPU per record."""
    note = f"{rate / consume_rate:.2f}x consume()" if consume_rate else ""
    if cpu and consume_cpu:
        note += f"; consumer CPU {cpu:.2f} us/record, {cpu / consume_cpu:.2f}x consume()'s"
    return note


def print_table(size: int, run: dict) -> None:
    ceiling_rate = run["ceiling"]["rate"]
    rows = [("raw pyzmq PUB/SUB ceiling", fmt_rate(ceiling_rate, ceiling_rate), fmt_cpu(run["ceiling"]["cpu_us"]))]

    def add(name: str, r: dict, rate: float | None, note: str) -> None:
        """A row, or what stopped it: a scenario that did not finish, or one that delivered less."""
        if "error" in r:
            rows.append((name, "did not finish", r["error"]))
        else:
            rows.append((name, fmt_rate(rate, ceiling_rate), f"{r['incomplete']}; {note}" if r.get("incomplete") else note))

    d = run["direct"]
    add("producer -> consumer (consume())", d, d.get("rate"),
        f"p50 {d['p50_ms']:.1f} ms, p99 {d['p99_ms']:.1f} ms at full load" if d.get("p50_ms") else "")
    if "error" not in d:
        rows.append(("  producer send()", fmt_rate(d["send_rate"], ceiling_rate), fmt_cpu(d["cpu_us"])))
    dp = run["direct_poll"]
    add("  ... read with poll() per record", dp, dp.get("rate"), fmt_cpu(dp.get("cpu_us", {})))
    da = run["direct_async"]
    add("  ... read with dafka.aio async for", da, da.get("rate"),
        vs_consume(da["rate"], d["rate"], da["cpu_us"]["consumer"], d["cpu_us"]["consumer"])
        if "error" not in da and "error" not in d else "")
    for api, label in (("consume", "consume()"), ("async", "async for")):
        r = run.get(f"recovery_{api}")
        if r is not None:
            add(f"stopped 2 s, recovers ({label})", r, r.get("rate"),
                fmt_cpu(r.get("cpu_us", {})) + (f"; steady consumer {r['steady']['rate']:,.0f}/s" if "steady" in r else ""))
    p = run["paced"]
    if p.get("p50_ms") is not None:
        rows.append(("latency at 10,000 rec/s", "", f"p50 {p['p50_ms']:.2f} ms, p99 {p['p99_ms']:.2f} ms"))
    if "store" in run:
        s = run["store"]
        add("producer -> store, acked", s, s.get("ack_rate"), fmt_cpu(s.get("cpu_us", {})))
        sc = run["store_consumer"]
        add("producer -> consumer, store running", sc, sc.get("rate"), fmt_cpu(sc.get("cpu_us", {})))
        if "error" not in s:
            rows.append(("consumer catch-up from store", fmt_rate(s["catchup_rate"], ceiling_rate),
                         f"{s['catchup_received']:,} records"))
            rows.append(("  ... read with dafka.aio async for", fmt_rate(s["catchup_async_rate"], ceiling_rate),
                         vs_consume(s["catchup_async_rate"], s["catchup_rate"], s["catchup_async_cpu_us"],
                                    s["cpu_us"]["catchup consumer"])))
            if s.get("first_record_from_store_ms") is not None:
                rows.append(("start to first record (store only)", "", f"{s['first_record_from_store_ms']:.1f} ms"))
            rows.append(("peak RSS (MiB)", "", ", ".join(f"{k} {v:.0f}" for k, v in s["rss_mib"].items())))
    if "error" not in d:
        rows.append(("peak RSS direct (MiB)", "", ", ".join(f"{k} {v:.0f}" for k, v in d["rss_mib"].items())))
    print(f"\n== {size}-byte records ==")
    for name, rate, note in rows:
        print(f"{name:<38} {rate:<28} {note}")
