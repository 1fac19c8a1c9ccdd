"""The ui scenario of bench/run.py: what the web console (``dafka ui``) costs and how fast its pages come.

Page loads: a store holds ``partitions`` partitions (30 topics) and ``records``
records between them, written straight into its LevelDB in the store's own key
layout (store/keys.py: records, heads and stamps, as a store writes them),
because 3,000 live producers would be 3,000 beacons on 2 cores.  A console
joins; once it shows every partition, each page is asked for ``loads`` times
over HTTP (the server's whole answer) and, where Debian's chromium and
Playwright are there, loaded in the browser (``loadEventEnd`` of the navigation,
scripts and style included): the overview, the topic list, one topic's
page, and a record at a random offset of a random partition.

CPU: the console process's CPU (all threads, /proc schedstat) over
``seconds``, with nobody looking and with the overview open in the browser
(or, without one, fetched as the page does: its content every 2 s and the
chart's data every 2 s), on an idle cluster (a store, a producer that waits)
and while a producer sends ``rate`` records a second to the store.

Run alone: ``python3 bench/run.py --only ui`` (``--ui-partitions``, ``--ui-records``,
``--ui-seconds``, ``--ui-rate``).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from .cluster import Cluster, ScenarioFailed, guarded, stop_stayer
from .common import proc_cpu_and_wakeups

TOPICS = 30
VALUE = b'{"order": %d, "customer": "c-%d", "amount": 12.50, "note": "a record of about a hundred bytes"}'
BROWSER_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync"]


def build_store(path: str, partitions: int, records: int) -> list[tuple[str, str, int]]:
    """A store database of ``partitions`` partitions over :data:`TOPICS` topics, ``records`` records in all;
    returns (topic, partition, head) of each."""
    import plyvel

    from dafka.core.addresses import new_address
    from dafka.store import keys

    now_ms = int(time.time() * 1000)
    db = plyvel.DB(path, create_if_missing=True, write_buffer_size=64 << 20)
    layout = []
    try:
        per = records // partitions
        for n in range(partitions):
            topic, address = f"orders-{n % TOPICS:02d}", new_address(producer=True)
            count = per + (1 if n < records % partitions else 0)
            with db.write_batch() as batch:
                nbytes = 0
                for seq in range(count):
                    value = VALUE % (seq, n)
                    nbytes += len(value)
                    batch.put(keys.record_key(topic, address, seq), value)
                batch.put(keys.head_key(topic, address), keys.seq_bytes(count - 1))
                batch.put(keys.stamp_key(topic, address, 0), keys.encode_stamp(count - 1, now_ms, nbytes))
            layout.append((topic, address, count - 1))
    finally:
        db.close()
    return layout


class Console:
    """``dafka ui`` as a child process on a free port."""

    def __init__(self, sub: str, pub: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from dafka.ui.cli import main; main()", "--port", "0", "--sub", sub, "--pub", pub,
             "-X", "beacon/address=127.0.0.1", "-X", "beacon/bind_address=127.0.0.1"],
            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        assert self.proc.stderr is not None
        match = re.search(r"http://127\.0\.0\.1:\d+/", self.proc.stderr.readline())
        if match is None:
            self.proc.kill()
            raise RuntimeError("the console did not say where it listens")
        self.url = match.group(0)

    def get(self, path: str) -> tuple[float, bytes]:
        started = time.perf_counter()
        with urllib.request.urlopen(self.url + path.lstrip("/"), timeout=60) as response:
            body = response.read()
        return time.perf_counter() - started, body

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


def browser_available() -> bool:
    try:
        import playwright  # noqa: F401
    except ImportError:
        return False
    return os.path.exists("/usr/bin/chromium")


def _ms(samples: list[float]) -> dict:
    ordered = sorted(samples)
    return {"p50_ms": statistics.median(ordered) * 1000, "p99_ms": ordered[max(0, int(len(ordered) * 0.99) - 1)] * 1000,
            "max_ms": ordered[-1] * 1000, "n": len(ordered)}


def page_loads(partitions: int, records: int, loads: int, browser: bool) -> dict:
    db = tempfile.mkdtemp(prefix="dafka-bench-ui-")
    c = Cluster()
    console = None
    try:
        started = time.perf_counter()
        layout = build_store(db, partitions, records)
        built = time.perf_counter() - started
        store = c.store(db)
        console = Console(c.tower.sub_endpoint, c.tower.pub_endpoint)
        deadline = time.monotonic() + 120
        shown = 0
        while time.monotonic() < deadline:
            _, body = console.get("/")
            found = re.search(rb'data-test="partitions">([\d,]+)<', body)
            shown = int(found.group(1).replace(b",", b"")) if found else 0
            if shown >= partitions:
                break
            time.sleep(0.5)
        if shown < partitions:
            raise ScenarioFailed(f"the console showed {shown} of {partitions} partitions after 120 s")
        rng = random.Random(46)
        pages = {"overview": lambda: "/", "topic list": lambda: "/topics",
                 "topic page": lambda: f"/topic?name=orders-{rng.randrange(TOPICS):02d}"}

        def a_record() -> str:
            topic, partition, head = rng.choice(layout)
            return f"/messages?topic={topic}&partition={partition}&offset={rng.randint(0, head)}&count=1"
        pages["record at an offset"] = a_record
        http = {}
        for name, path in pages.items():
            console.get(path())  # warm
            http[name] = _ms([console.get(path())[0] for _ in range(loads)])
            if name == "record at an offset":
                _, body = console.get(path())
                if b"data-offset" not in body:
                    raise ScenarioFailed("the record page showed no record")
        in_browser = _browser_loads(console.url, pages, max(5, loads // 4)) if browser else {}
        stopped = stop_stayer(store, timeout=120)
        return {"partitions": partitions, "records": records, "built_seconds": built, "http": http,
                "browser": in_browser, "store_rss_mib": stopped.get("rss_mib")}
    finally:
        if console is not None:
            console.close()
        c.close()
        shutil.rmtree(db, ignore_errors=True)


def _browser_loads(url: str, pages: dict, loads: int) -> dict:
    """Each page loaded in chromium: navigation start to loadEventEnd (HTML, script, style, first render)."""
    from playwright.sync_api import sync_playwright

    out = {}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=BROWSER_ARGS)
        try:
            page = browser.new_page()
            for name, path in pages.items():
                samples = []
                for _ in range(loads + 1):
                    page.goto(url + path().lstrip("/"), wait_until="load")
                    samples.append(page.evaluate("performance.getEntriesByType('navigation')[0].loadEventEnd") / 1000)
                out[name] = _ms(samples[1:])
        finally:
            browser.close()
    return out


class PageOpen:
    """The overview open while the CPU is measured: in chromium, or fetched as its script does."""

    def __init__(self, console: Console, browser: bool) -> None:
        self.console = console
        self.stop = threading.Event()
        self.how = "chromium" if browser else "fetched as the page does"
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.ready = threading.Event()
        self.thread.start()
        self.ready.wait(60)

    def _run(self) -> None:
        if self.how == "chromium":
            from playwright.sync_api import sync_playwright

            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=BROWSER_ARGS)
                page = browser.new_page()
                page.goto(self.console.url)
                self.ready.set()
                while not self.stop.is_set():
                    page.wait_for_timeout(200)
                browser.close()
            return
        self.ready.set()
        while not self.stop.wait(2.0):
            self.console.get("/?fragment=1")
            self.console.get("/api/rates")

    def close(self) -> None:
        self.stop.set()
        self.thread.join(30)


def console_cpu(seconds: float, rate: int, idle_wait: float, browser: bool) -> dict:
    db = tempfile.mkdtemp(prefix="dafka-bench-ui-cpu-")
    c = Cluster()
    console = None
    out: dict = {}
    try:
        store = c.store(db)
        idle = c.spawn("producer", "--records", "1", "--size", "100", "--min-acks", "1", "--stay", "--topic", "idle",
                       stdin=True)
        idle.stdout.readline()  # its result: one record acked
        console = Console(c.tower.sub_endpoint, c.tower.pub_endpoint)
        time.sleep(5)

        def measure(label: str) -> None:
            cpu0, woken0 = proc_cpu_and_wakeups(console.proc.pid)
            time.sleep(seconds)
            cpu1, woken1 = proc_cpu_and_wakeups(console.proc.pid)
            out[label] = {"cpu_percent": (cpu1 - cpu0) / seconds * 100, "wakeups_per_s": (woken1 - woken0) / seconds}
            if "open" in label:  # the rate the console itself saw, over the last seconds
                points = json.loads(console.get("/api/rates")[1])["points"]
                out[label]["cluster_rate"] = points[-1][1] if points else None
            seen = out[label].get("cluster_rate")
            print(f"  console CPU, {label}: {out[label]['cpu_percent']:.2f} %, {out[label]['wakeups_per_s']:.1f} "
                  f"wake-ups/s" + (f"; the cluster's rate on the page: {seen:,.0f}/s" if seen is not None else ""),
                  flush=True)

        time.sleep(idle_wait)  # nobody has looked yet: the console does not listen at all
        measure("idle, page closed")
        page = PageOpen(console, browser)
        time.sleep(3)
        measure("idle, page open")
        page.close()
        time.sleep(idle_wait)  # the console stops listening 30 s after the last look
        measure("idle, page closed again")
        records = int(rate * (3 * seconds + 40))
        load = c.spawn("producer", "--records", str(records), "--size", "100", "--rate", str(rate), "--min-acks", "1",
                       "--topic", "load")
        time.sleep(3)
        measure(f"{rate:,} records/s, page closed")
        page = PageOpen(console, browser)
        time.sleep(3)
        measure(f"{rate:,} records/s, page open")
        page.close()
        console.get("/live?topic=load")
        tail = threading.Thread(target=_follow_tail, args=(console.url, seconds + 6), daemon=True)
        tail.start()
        time.sleep(3)
        measure(f"{rate:,} records/s, live tail open")
        tail.join(30)
        load.kill()
        out["page open with"] = page.how
        idle.stdin.write("\n")
        idle.stdin.flush()
        stop_stayer(store, timeout=120)
        return out
    finally:
        if console is not None:
            console.close()
        c.close()
        shutil.rmtree(db, ignore_errors=True)


def _follow_tail(url: str, seconds: float) -> None:
    """A live tail's event stream, read (and dropped) for ``seconds``."""
    deadline = time.monotonic() + seconds
    with urllib.request.urlopen(url + "api/tail?topic=load", timeout=seconds + 10) as stream:
        while time.monotonic() < deadline:
            if not stream.readline():
                return


def run_all(partitions: int, records: int, seconds: float, rate: int, idle_wait: float = 35.0,
            browser: bool = True, loads: int = 40) -> dict:
    print(f"\n== web console (dafka ui): {partitions:,} partitions, {records:,} records stored ==", flush=True)
    result: dict = {}
    browser = browser and browser_available()
    result["pages"] = guarded(page_loads, partitions, records, loads, browser)
    pages = result["pages"]
    if "http" in pages:
        print(f"  store database written in {pages['built_seconds']:.0f} s; page loads "
              f"(server's whole answer over HTTP, {loads} each; in chromium where shown):", flush=True)
        for name, r in pages["http"].items():
            b = pages["browser"].get(name)
            extra = f"  | chromium load p50 {b['p50_ms']:.0f} ms, max {b['max_ms']:.0f} ms" if b else ""
            print(f"  {name:<22} p50 {r['p50_ms']:7.1f} ms  p99 {r['p99_ms']:7.1f} ms  max {r['max_ms']:7.1f} ms{extra}",
                  flush=True)
    print(f"\n== web console CPU ({seconds:.0f} s each) ==", flush=True)
    result["cpu"] = guarded(console_cpu, seconds, rate, idle_wait, browser)
    return result


def report(result: dict) -> str:
    return json.dumps(result, indent=2)
