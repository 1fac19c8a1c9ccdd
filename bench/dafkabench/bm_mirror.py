"""The mirror scenario of bench/run.py: `dafka mirror` between two sites.

* **Throughput** (per record size): site A's producer -> store, acked (the
  reference rate, measured in the same run); then a mirror copies those
  records into site B: its rate from its first copied record to the last,
  counted by its ``dafka_mirror_records_total`` (acked by B's store),
  sampled every 20 ms, with its CPU per record and peak RSS; then a new
  producer (a new partition) while the mirror runs: the rate, and how long
  after the producer's last ack the last record is copied (four busy
  processes; it includes the new partition's resume probe, 1.5 x
  ``beacon/interval``, during which its records wait in site A's store).
* **Catch-up**: the mirror is stopped while A's producer writes R records
  (a link partition, or a mirror down for hours), then started again: its
  start-up, then records/s from the first record copied to the last.
* **Lag over the impaired link** (root only: network namespaces): site A on
  one host, site B and the mirror on the other, joined by impaired_link.py's
  userspace link with 20 ± 5 ms of delay each way; a producer on A paced at
  10,000 records/s stamps every 16th record, a consumer on B takes the
  difference when it arrives (p50, p99, after the first 2 s, which include
  the mirror's first meeting with the partition; of a shorter run, after its
  first half).  Then the link is cut
  while A's producer writes R records; once it heals, a consumer on B times
  the catch-up (from its first record to its last, and from the heal: TCP's
  retransmission backoff after a cut, the new partition's probe), while a producer on
  B sends 1,000 records/s of its own and a consumer on B samples their
  latency: the target's live traffic goes on during the catch-up.  Last, a
  consumer on B reads the same records from A's store across the link: the
  link's own ceiling (its relay is a Python process).

Run alone: ``python3 bench/run.py --only mirror`` (see run.py's --help).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from .common import RUN_PY
from .impaired_link import ImpairedLink, missing_capability
from .processes import Processes
from .cluster import Cluster, result_of
from .common import RssSampler, free_port, proc_cpu_seconds, rate_of

_RECORDS = re.compile(r"^dafka_mirror_records_total\{[^}]*\} ([0-9.e+]+)$", re.M)


def _dafka() -> str:
    path = shutil.which("dafka", path=os.path.dirname(sys.executable)) or shutil.which("dafka")
    if path is None:
        raise RuntimeError("the dafka command is not installed: pip install .")
    return path


class MirrorProcess:
    """`dafka mirror` from site ``a`` to site ``b`` (run.py Clusters), with its metrics."""

    def __init__(self, a, b, topic: str, name: str, *extra: str) -> None:
        self.port = free_port()
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(
            [_dafka(), "mirror", "--source-pub", a.tower.pub_endpoint, "--source-sub", a.tower.sub_endpoint,
             "--target-pub", b.tower.pub_endpoint, "--target-sub", b.tower.sub_endpoint, "--topic", topic,
             "--name", name, "-X", "beacon/address=127.0.0.1", "-X", "beacon/bind_address=127.0.0.1",
             "--metrics-port", str(self.port), *extra], stderr=subprocess.PIPE, text=True)
        self.cpu = proc_cpu_seconds
        self.rss = RssSampler(self.proc.pid)

    def records(self) -> int:
        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=2).read().decode()
        except OSError:
            return -1  # not serving yet
        match = _RECORDS.search(text)
        return int(float(match[1])) if match else -1

    def wait_copied(self, count: int, since: int = 0, timeout: float = 600) -> dict:
        """Sample the copied count every 20 ms until it reaches ``count``: the
        rate of the records after ``since``, from the last sample before the
        first of them was copied to the sample that saw the last, and the
        mirror's CPU over the same time."""
        deadline = time.monotonic() + timeout
        before_at, cpu_before, first_at = time.perf_counter(), self.cpu(self.proc.pid), None
        while True:
            now = time.perf_counter()
            cpu = self.cpu(self.proc.pid)
            copied = self.records()
            if copied <= since:
                before_at, cpu_before = now, cpu
            elif first_at is None:
                first_at = now
            if copied >= count:
                return {"first_at": first_at, "last_at": now, "rate": (count - since) / (now - before_at),
                        "cpu_us": (cpu - cpu_before) / (count - since) * 1e6, "records": count}
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"the mirror copied {copied} of {count} records: "
                                   f"{self.proc.stderr.read() if self.proc.poll() is not None else 'timed out'}")
            time.sleep(0.02)

    def stop(self) -> float:
        """SIGTERM, and its peak RSS in MiB."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
        self.rss.stop()
        return self.rss.peak


def throughput(records: int, size: int, catchup_records: int) -> dict:
    a, b = Cluster(), Cluster()
    dbs = [tempfile.mkdtemp(prefix="dafka-bench-mirror-") for _ in range(2)]
    topic, name = f"mirrored-{size}", f"bench-{size}"
    try:
        stores = [a.store(dbs[0]), b.store(dbs[1])]
        time.sleep(1.0)
        common = ["--records", str(records), "--size", str(size), "--min-acks", "1", "--topic", topic]
        base = result_of(a.spawn("producer", *common))
        out = {"size": size, "records": records, "ack_rate": records / base["ack_seconds"],
               "ack_cpu_us": base.get("cpu_us")}
        # What the mirror moves when it has work: the records site A holds, copied into site B.
        mirror = MirrorProcess(a, b, topic, name)
        copied = mirror.wait_copied(records)
        out.update(mirror_rate=copied["rate"], mirror_cpu_us=copied["cpu_us"])
        # Live: the same producer again, the mirror copying as it sends.
        producer = a.spawn("producer", *common)
        copied = mirror.wait_copied(2 * records, since=records)
        p = result_of(producer)
        out.update(live_rate=copied["rate"], live_cpu_us=copied["cpu_us"], live_ack_rate=records / p["ack_seconds"],
                   live_done_s=copied["last_at"] - p["send_started"] - p["ack_seconds"])
        out["mirror_rss_mib"] = mirror.stop()
        if catchup_records:  # stopped (or cut off) while the producer wrote, then back
            r = result_of(a.spawn("producer", "--records", str(catchup_records), "--size", str(size),
                                      "--min-acks", "1", "--topic", topic))
            assert r["sent"] == catchup_records
            mirror = MirrorProcess(a, b, topic, name)
            copied = mirror.wait_copied(catchup_records)
            out.update(catchup_records=catchup_records, catchup_rate=copied["rate"], catchup_cpu_us=copied["cpu_us"],
                       catchup_start_s=copied["first_at"] - mirror.started)
            out["catchup_rss_mib"] = mirror.stop()
        for store, cluster in zip(stores, (a, b)):
            cluster.stop_store(store)
        return out
    finally:
        a.close()
        b.close()
        for db in dbs:
            shutil.rmtree(db, ignore_errors=True)


def lag_over_link(rate: int, seconds: float, catchup_records: int) -> dict:
    """Producer on host a, mirror and consumer on host b, 20 ± 5 ms of delay each way; then
    ``catchup_records`` written while the link is cut, copied once it heals."""
    reason = missing_capability()
    if reason is not None:
        return {"skipped": reason}
    records = int(rate * seconds)
    processes = Processes()
    work = Path(tempfile.mkdtemp(prefix="dafka-bench-link-"))
    try:
        with ImpairedLink(processes, work / "link", ("a", "b"), loss=0.0, duplicate=0.0, delay_ms=20,
                          jitter_ms=5, seed=1) as link:
            round_trip = link.round_trip("a", "b")
            ip = link.address
            tower = {h: (f"tcp://{ip[h]}:5556", f"tcp://{ip[h]}:5557") for h in ip}
            host = {h: link.processes_in(h) for h in ip}

            def role(h: str, name: str, *args: str, **kwargs) -> subprocess.Popen:
                return host[h].start([sys.executable, str(RUN_PY), "--role", name, "--sub", tower[h][0],
                                      "--pub", tower[h][1], "--address", ip[h], *args], **kwargs)

            for h in ip:
                host[h].start([_dafka(), "tower", "--sub", tower[h][0], "--pub", tower[h][1]])
            for h in ip:
                store = role(h, "store", "--db", str(work / f"store-{h}"), stdout=subprocess.PIPE,
                             stdin=subprocess.PIPE, text=True)
                store.stdout.readline()
            host["b"].start([_dafka(), "mirror", "--source-pub", tower["a"][1], "--source-sub", tower["a"][0],
                             "--target-pub", tower["b"][1], "--target-sub", tower["b"][0], "--topic", "lag",
                             "--topic", "backlog",
                             "-X", f"beacon/address={ip['b']}", "-X", f"beacon/bind_address={ip['b']}"],
                            stderr=subprocess.DEVNULL)
            consumer = role("b", "consumer", "--records", str(records), "--size", "100", "--stamp", "--topic", "lag",
                            "--latency-from", str(min(2 * rate, records // 2)), stdout=subprocess.PIPE, text=True)
            time.sleep(2.0)
            producer = role("a", "producer", "--records", str(records), "--size", "100", "--rate", str(rate),
                            "--min-acks", "1", "--topic", "lag", stdout=subprocess.PIPE, text=True)
            c = result_of(consumer, timeout=seconds + 120)
            result_of(producer, timeout=60)
            out = {"rate": rate, "records": records, "received": c["received"], "p50_ms": c.get("p50_ms"),
                   "p99_ms": c.get("p99_ms"), "round_trip_ms": round_trip * 1000}
            if catchup_records:
                # The link cut while A's producer writes; healed, the mirror catches up, and B's own live
                # traffic (1,000 records/s, its latency sampled) goes on meanwhile.
                link.cut()
                r = result_of(role("a", "producer", "--records", str(catchup_records), "--size", "100",
                                       "--min-acks", "1", "--topic", "backlog", "--warmup", "0",
                                       stdout=subprocess.PIPE, text=True), timeout=600)
                catchup = role("b", "consumer", "--records", str(catchup_records), "--size", "100",
                               "--topic", "backlog", stdout=subprocess.PIPE, text=True)
                local_records = 30 * 1000
                local = role("b", "consumer", "--records", str(local_records), "--size", "100", "--stamp",
                             "--topic", "local", "--reset", "latest", stdout=subprocess.PIPE, text=True)
                time.sleep(2.0)
                local_producer = role("b", "producer", "--records", str(local_records), "--size", "100",
                                      "--rate", "1000", "--min-acks", "1", "--topic", "local",
                                      stdout=subprocess.PIPE, text=True)
                time.sleep(3.0)  # B's live traffic flows before the link heals, and on while the mirror catches up
                healed = time.perf_counter()
                link.heal()
                k = result_of(catchup, timeout=900)
                done = k["finished"] - healed
                lc = result_of(local, timeout=120)
                result_of(local_producer, timeout=60)
                out.update(catchup_records=r["sent"], catchup_received=k["received"], catchup_rate=rate_of(k),
                           catchup_seconds=done, heal_to_first_s=k["started"] - healed,
                           local_p50_ms=lc.get("p50_ms"), local_p99_ms=lc.get("p99_ms"))
                # The link's own ceiling for the same records: a consumer on B reading A's store across it.
                across = host["b"].start([sys.executable, str(RUN_PY), "--role", "consumer",
                                          "--sub", tower["a"][0], "--pub", tower["a"][1], "--address", ip["b"],
                                          "--records", str(catchup_records), "--size", "100", "--topic", "backlog"],
                                         stdout=subprocess.PIPE, text=True)
                x = result_of(across, timeout=900)
                out["across_rate"] = rate_of(x)
            return out
    finally:
        processes.cleanup()
        shutil.rmtree(work, ignore_errors=True)


def report(result: dict) -> list[str]:
    lines = ["", "== mirror: site A -> site B (`dafka mirror`, one store per site, min_acks 1) =="]
    for r in result.get("sizes", []):
        size = r["size"]
        lines.append(f"{size} B: producer -> store, acked {r['ack_rate']:>10,.0f}/s ({r['ack_cpu_us']} us/record)")
        lines.append(f"{'':<6} mirror, A's store -> B's store, acked {r['mirror_rate']:>10,.0f}/s = "
                     f"{r['mirror_rate'] / r['ack_rate']:.2f}x ({r['mirror_cpu_us']:.2f} us/record in the mirror, "
                     f"RSS {r['mirror_rss_mib']:.0f} MiB)")
        lines.append(f"{'':<6} a new partition, live ({r['live_ack_rate']:,.0f}/s acked): copied at "
                     f"{r['live_rate']:,.0f}/s = {r['live_rate'] / r['ack_rate']:.2f}x ({r['live_cpu_us']:.2f} "
                     f"us/record), all {r['live_done_s']:.2f} s after the producer's last ack")
        if r.get("catchup_records"):
            lines.append(f"{'':<6} catch-up of {r['catchup_records']:,}: {r['catchup_rate']:>10,.0f}/s "
                         f"({r['catchup_cpu_us']:.2f} us/record, RSS {r['catchup_rss_mib']:.0f} MiB; "
                         f"start-up {r['catchup_start_s']:.2f} s)")
    lag = result.get("lag")
    if lag:
        if "skipped" in lag:
            lines.append(f"lag over the impaired link: skipped ({lag['skipped']})")
        else:
            lines.append(f"lag over the impaired link (20 +- 5 ms each way, round trip {lag['round_trip_ms']:.0f} ms), "
                         f"{lag['rate']:,}/s: p50 {lag['p50_ms']:.1f} ms, p99 {lag['p99_ms']:.1f} ms "
                         f"({lag['received']:,} of {lag['records']:,} records)")
            if lag.get("catchup_records"):
                lines.append(f"  catch-up over the link of {lag['catchup_records']:,} written while it was cut: "
                             f"{lag['catchup_rate']:,.0f}/s from the first record in B to the last (a consumer on B "
                             f"reading A's store across the link: {lag['across_rate']:,.0f}/s); the first came "
                             f"{lag['heal_to_first_s']:.1f} s after the heal, the last {lag['catchup_seconds']:.1f} s "
                             "after; meanwhile "
                             f"B's own traffic at 1,000/s: p50 {lag['local_p50_ms']:.1f} ms, p99 "
                             f"{lag['local_p99_ms']:.1f} ms")
    return lines


def run_all(records: int, sizes: list[int], catchup_records: int, lag_seconds: float) -> dict:
    result = {"sizes": [throughput(records, size, catchup_records if size == sizes[0] else 0) for size in sizes]}
    if lag_seconds:
        result["lag"] = lag_over_link(10_000, lag_seconds, catchup_records)
    print("\n".join(report(result)))
    return json.loads(json.dumps(result))
