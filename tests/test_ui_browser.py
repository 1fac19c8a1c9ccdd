"""The web console in a real browser (Debian's chromium, driven by Playwright), against a real cluster of
processes: a tower, two stores, two producers, a group of two, a mirror from a second site and a CDC
connector on a private PostgreSQL.  Every page is opened and what it shows is checked against what the
cluster holds.

Chromium comes from Debian (``.ci/run`` installs it); Playwright drives it through ``executable_path`` and
downloads nothing.  Without chromium the module is skipped, except where ``DAFKA_REQUIRE_BROWSER=1`` (tox).
With ``DAFKA_UI_SCREENSHOTS=DIR`` the tests also save the main pages there (docs/images/console/ holds them).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import dafka

from helpers import Processes, script, wait_for

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
if not os.path.exists(CHROMIUM):
    if os.environ.get("DAFKA_REQUIRE_BROWSER") == "1":
        raise ImportError("chromium is not installed (apt-get install chromium), and DAFKA_REQUIRE_BROWSER=1")
    pytest.skip("the console's browser tests need Debian's chromium", allow_module_level=True)

from playwright.sync_api import Page, expect, sync_playwright  # noqa: E402

# serial: a killed producer must show gone within beacon/timeout, which a loaded machine stretches
pytestmark = [pytest.mark.browser, pytest.mark.serial, pytest.mark.timeout(300)]

BEACON = ["-X", "beacon/address=127.0.0.1", "-X", "beacon/bind_address=127.0.0.1",
          "-X", "beacon/interval=300", "-X", "beacon/timeout=1500"]
TIMEOUT_S = 1.5  # beacon/timeout above
HOSTILE = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'
SHOTS = os.environ.get("DAFKA_UI_SCREENSHOTS")


class Site:
    """A tower and its address pair, as a subprocess."""

    def __init__(self, processes: Processes, tmp: Path, name: str) -> None:
        from helpers import free_port
        self.pub, self.sub = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
        self.tower = processes.start([script("dafka"), "tower", "--pub", self.pub, "--sub", self.sub])
        self.args = ["--pub", self.pub, "--sub", self.sub, *BEACON]
        self.processes, self.tmp, self.name = processes, tmp, name

    def store(self, name: str) -> subprocess.Popen:
        return self.processes.start([script("dafka"), "store", "--db", str(self.tmp / f"{self.name}-{name}"), *self.args])

    def producer(self, topic: str) -> subprocess.Popen:
        return self.processes.start([script("dafka"), "produce", topic, *self.args, "-X", "producer/min_acks=2"],
                                    stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def send(producer: subprocess.Popen, lines: list[str]) -> None:
    assert producer.stdin is not None
    producer.stdin.write("".join(line + "\n" for line in lines).encode())
    producer.stdin.flush()


def status(site: Site) -> dict:
    done = subprocess.run([script("dafka"), "status", *site.args, "--json", "--wait-ms", "1000"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def heads(site: Site, topic: str) -> dict[str, int]:
    return {r["partition"]: r["store_head"] for r in status(site)["partitions"] if r["topic"] == topic}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, pg):
    tmp = tmp_path_factory.mktemp("ui")
    processes = Processes()
    c = type("Cluster", (), {})()
    try:
        a, b = Site(processes, tmp, "a"), Site(processes, tmp, "b")
        c.a, c.b, c.tmp = a, b, tmp
        c.stores = [a.store("s1"), a.store("s2"), b.store("s1")]
        time.sleep(0.5)
        # two producers of "orders" in site a, kept open (stdin): 40 records each, one of them hostile
        c.producers = [a.producer("orders"), a.producer("orders")]
        send(c.producers[0], [json.dumps({"n": i, "who": "first"}) for i in range(39)] + [HOSTILE])
        send(c.producers[1], [json.dumps({"n": i, "who": "second"}) for i in range(40)])
        # a record that is not UTF-8, and a topic the mirror copies from site b
        processes.python("import sys; from dafka import Producer\n"
                         "p = Producer('binary', {'beacon/pub_address': sys.argv[1], 'beacon/sub_address': sys.argv[2],"
                         " 'beacon/address': '127.0.0.1', 'beacon/bind_address': '127.0.0.1', 'producer/min_acks': 2})\n"
                         "p.send(b'\\xff\\xfe<script>window.__pwned = 3</script>\\x00')\np.flush(20)\np.close()\n",
                         a.pub, a.sub).wait(60)
        c.remote = b.producer("events")
        send(c.remote, [f"remote event {i}" for i in range(25)])
        c.mirror = processes.start([script("dafka"), "mirror", "--source-pub", b.pub, "--source-sub", b.sub,
                                    "--target-pub", a.pub, "--target-sub", a.sub, "-t", "events", "--name", "b-to-a",
                                    "-X", "beacon/address=127.0.0.1", "-X", "beacon/bind_address=127.0.0.1",
                                    "-X", "beacon/interval=300", "-X", "beacon/timeout=1500"])
        # a CDC connector on a private PostgreSQL
        from cdchelpers import TABLES
        pg.sql("DROP DATABASE IF EXISTS t_console")
        pg.sql("CREATE DATABASE t_console")
        pg.sql(TABLES, dbname="t_console")
        pg.sql("INSERT INTO orders (id, customer) SELECT g, 'c' || g FROM generate_series(1, 30) g", dbname="t_console")
        c.cdc = processes.start([script("dafka"), "cdc", "postgres", "--dsn", pg.dsn("t_console"), "--table", "orders",
                                 "--topic", "shop", "--state-dir", str(tmp), *a.args])
        # the console, on a free port, with the Produce page
        # its log goes to a file (a pipe nobody reads would block it once full), which failures quote
        c.log = tmp / "console.log"
        with open(c.log, "wb") as log:
            c.console = processes.start([script("dafka"), "ui", "--port", "0", "--allow-produce", *a.args],
                                        stderr=log)
        wait_for(lambda: re.search(r"http://127\.0\.0\.1:\d+/", c.log.read_text()), timeout=60,
                 what="the console saying where it listens")
        match = re.search(r"http://127\.0\.0\.1:\d+/", c.log.read_text())
        assert match
        c.url = match.group(0)
        c.processes = processes
        wait_for(lambda: heads(a, "orders") and sorted(heads(a, "orders").values()) == [39, 39], timeout=60,
                 what="both producers' 40 records stored")
        yield c
    finally:
        processes.cleanup()
        try:
            for (slot,) in pg.sql("SELECT slot_name FROM pg_replication_slots WHERE database = 't_console'"):
                pg.sql("SELECT pg_drop_replication_slot(%s)", params=(slot,))
            pg.sql("DROP DATABASE IF EXISTS t_console WITH (FORCE)")
        except Exception:  # noqa: BLE001 - the server may be gone already
            pass


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page(browser, cluster):
    context = browser.new_context(viewport={"width": 1280, "height": 860}, base_url=cluster.url)
    page = context.new_page()
    page.set_default_timeout(15_000)
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    yield page
    context.close()
    assert not dialogs, f"a page opened a dialog: {dialogs}"
    assert not [e for e in errors if "EventSource" not in e], \
        f"the pages logged errors: {errors}; the console's log ends:\n{cluster.log.read_text()[-4000:]}"


def shot(page: Page, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / f"{name}.png"), full_page=True)


def test_overview_shows_every_peer_and_store(page, cluster):
    page.goto("/")
    expect(page.locator("#stores tbody tr")).to_have_count(2)
    for role in ("store-reader", "store-writer", "producer", "mirror", "cdc"):
        expect(page.locator(f"#peers .pill.{role}").first).to_be_visible()
    peer = page.locator("#peers tbody tr[data-role=store-reader]").first
    expect(peer).to_contain_text(dafka.__version__)  # the version, from its PEER-INFO
    expect(peer).to_contain_text("MiB")  # its RSS
    expect(page.locator(".tower.up")).to_be_visible()
    expect(page.locator("[data-test=topics]")).not_to_have_text("0")
    expect(page.locator("#rate-chart polyline")).to_have_count(1, timeout=10_000)


def test_topics_filter_and_topic_heads(page, cluster):
    page.goto("/topics")
    expect(page.locator("#topics tr[data-topic=orders]")).to_be_visible()
    page.fill("input[name=q]", "ord")
    page.click("form.filter button")
    expect(page.locator("#topics tbody tr")).to_have_count(1)
    shot(page, "topics")
    page.click("#topics a:text('orders')")
    expect(page).to_have_url(re.compile(r"/topic\?name=orders"))
    stored = heads(cluster.a, "orders")
    for partition, head in stored.items():
        row = page.locator(f"#partitions tr[data-partition='{partition}']")
        expect(row.locator("[data-test=head]")).to_have_text(f"{head:,}")
        expect(row.locator(".pill.store")).to_have_count(2)  # both stores hold it
        expect(row.locator(".pill.alive")).to_be_visible()
    expect(page.locator("p.dim")).to_contain_text("kept forever")  # the stores' retention, as they said it
    shot(page, "topic")


def test_message_browser_shows_the_value_at_an_offset(page, cluster):
    partition = sorted(heads(cluster.a, "orders"))[0]
    page.goto(f"/messages?topic=orders&partition={partition}&offset=7&count=1")
    row = page.locator("#records tr[data-offset='7']")
    expect(row).to_be_visible()
    value = json.loads(row.locator("pre.value").inner_text())
    assert value["n"] == 7
    # paging, a record a page: newest, then older, then the oldest
    page.click("text=newest ⇥")
    expect(page.locator("#records tr[data-offset='39']")).to_be_visible()
    page.click("text=← older")
    expect(page.locator("#records tr[data-offset='38']")).to_be_visible()
    page.click("text=⇤ oldest")
    expect(page.locator("#records tr[data-offset='0']")).to_be_visible()
    # the format switch: JSON as hex
    page.goto(f"/messages?topic=orders&partition={partition}&offset=7&count=1&format=hex")
    expect(page.locator("#records tr[data-offset='7'] pre.value")).to_contain_text("7b 22 6e 22")
    # a search over values
    page.goto(f"/messages?topic=orders&partition={partition}&offset=oldest&q=%22n%22%3A%2012")
    expect(page.locator("#records tbody tr")).to_have_count(1)
    expect(page.locator("#records tr[data-offset='12']")).to_be_visible()
    page.goto(f"/messages?topic=orders&partition={partition}&offset=0&count=20")
    shot(page, "messages")


def test_hostile_values_are_shown_as_text_and_run_nothing(page, cluster):
    first = next(p for p, h in heads(cluster.a, "orders").items())
    for partition in heads(cluster.a, "orders"):
        page.goto(f"/messages?topic=orders&partition={partition}&offset=39&count=1")
        if "__pwned" in page.locator("#records").inner_text():
            break
    else:
        pytest.fail(f"no partition of orders holds the hostile record (first {first})")
    expect(page.locator("#records tr[data-offset='39'] pre.value")).to_have_text(HOSTILE)
    page.goto("/messages?topic=binary&offset=oldest")
    cell = page.locator("#records tr[data-offset='0']")
    expect(cell.locator(".fmt")).to_have_text("hex")
    expect(cell.locator("pre.value")).to_contain_text("ff fe 3c 73")
    page.wait_for_timeout(500)
    assert page.evaluate("window.__pwned") is None
    assert page.locator("script:not([src])").count() == 0


def test_security_headers_and_produce_needs_the_token(page, cluster):
    response = page.goto("/")
    assert response is not None
    csp = response.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "default-src 'none'" in csp
    forged = page.request.post("/produce", form={"topic": "orders", "value": "forged"})
    assert forged.status == 403
    page.goto("/produce?topic=typed")
    page.fill("input[name=key]", "<b>sku</b>")  # a key is shown as text, as a value is
    page.fill("textarea[name=value]", "from the browser")
    page.click("form.produce button")
    expect(page.locator("#produced")).to_contain_text("offset 0")
    page.click("#produced a")
    expect(page.locator("#records tr[data-offset='0'] pre.value")).to_have_text("from the browser")
    expect(page.locator("#records tr[data-offset='0'] td.key")).to_have_text("<b>sku</b>")
    assert page.locator("#records b").count() == 0


def test_live_tail_receives_new_records_and_pauses(page, cluster):
    page.goto("/live?topic=orders")
    expect(page.locator("#tail-status")).to_contain_text("following")
    send(cluster.producers[1], [f"live {i}" for i in range(5)])
    expect(page.locator("#tail tbody tr")).to_have_count(5, timeout=15_000)
    expect(page.locator("#tail tbody tr").first.locator("pre.value")).to_have_text("live 4")
    expect(page.locator("#tail tbody tr").first.locator("td.key")).to_have_text("–")  # sent without a key
    shot(page, "live")
    page.click("#tail-toggle")
    expect(page.locator("#tail-status")).to_contain_text("paused")
    send(cluster.producers[1], ["while paused"])
    page.wait_for_timeout(1500)
    expect(page.locator("#tail tbody tr")).to_have_count(5)
    page.click("#tail-toggle")
    expect(page.locator("#tail-status")).to_contain_text("following")
    send(cluster.producers[1], ["after resume"])
    expect(page.locator("#tail tbody tr").first.locator("pre.value")).to_have_text("after resume", timeout=15_000)


def test_live_tail_shows_a_one_shot_producers_records(page, cluster):
    """A producer that sends, flushes and exits at once, before the console may have connected to it: its
    records are fetched (issue 49: nothing appeared in 10 s before)."""
    page.goto("/live?topic=oneshot")
    expect(page.locator("#tail-status")).to_contain_text("following")
    lines = "".join(f"one-shot {i}\n" for i in range(6)).encode()
    done = subprocess.run([script("dafka"), "produce", "oneshot", *cluster.a.args, "-X", "producer/min_acks=2"],
                          input=lines, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    expect(page.locator("#tail tbody tr")).to_have_count(6, timeout=15_000)
    expect(page.locator("#tail tbody tr").first.locator("pre.value")).to_have_text("one-shot 5")
    values = page.locator("#tail tbody tr pre.value").all_inner_texts()
    assert values == [f"one-shot {i}" for i in reversed(range(6))]  # newest first, each once


def test_group_members_assignment_and_lag_after_they_stop(page, cluster):
    a = cluster.a
    members = [cluster.processes.start([script("dafka"), "consume", "orders", "--group", "billing",
                                        "--from-beginning", "-q", *a.args], text=True) for _ in range(2)]
    page.goto("/groups")
    expect(page.locator("#groups tr[data-group=billing] td").nth(2)).to_have_text("2", timeout=20_000)
    page.click("#groups a:text('billing')")
    expect(page.locator("#members tbody tr")).to_have_count(2)
    # every record read (the topic's heads), then the members stop: they commit on the way out
    total = sum(h + 1 for h in heads(a, "orders").values())
    expect(page.locator("#assignment [data-test=lag]").first).to_have_text("0", timeout=20_000)
    shot(page, "group")
    for member in members:
        member.send_signal(signal.SIGTERM)
    for member in members:
        assert member.wait(30) == 128 + signal.SIGTERM  # closed cleanly (and committed), as a signal's exit says
    send(cluster.producers[0], [f"after the group {i}" for i in range(3)])
    wait_for(lambda: sum(h + 1 for h in heads(a, "orders").values()) >= total + 3, timeout=30,
             what="the 3 new records stored")
    lags = {}
    for partition, head in heads(a, "orders").items():
        lags[partition] = head  # committed + lag = head + 1
    page.goto("/group?name=billing")
    expect(page.locator("#members")).to_contain_text("No member is alive")
    rows = page.locator("#assignment tbody tr")
    expect(rows).to_have_count(len(lags))
    wait_for(lambda: sum(int(t.replace(",", "")) for t in page.locator("#assignment [data-test=lag]").all_inner_texts()
                         if t != "–") == 3, timeout=20, what="the group's lag of 3 records on the page")


def test_a_kafka_group_shows_its_members_as_the_gateway_describes_them(page, cluster, tmp_path):
    """kcat in a Kafka group reads the dafka producers' topic through ``dafka kafka``: the console lists the
    group as a Kafka one, with the member its gateway coordinates, and says so on the group's page."""
    log = tmp_path / "gateway.log"
    with open(log, "wb") as out:
        gateway = cluster.processes.start([script("dafka"), "kafka", "--port", "0", "--initial-rebalance-delay-ms",
                                           "0", *cluster.a.args], stderr=out)
    try:
        wait_for(lambda: re.search(r"serving Kafka on ([0-9.:]+)", log.read_text()), timeout=30,
                 what="the gateway listening")
        bootstrap = re.search(r"serving Kafka on ([0-9.:]+)", log.read_text()).group(1)
        member = cluster.processes.start(["kcat", "-b", bootstrap, "-G", "kafka-billing", "orders", "-q"],
                                         stdout=subprocess.DEVNULL)
        page.goto("/groups")
        row = page.locator("#groups tr[data-group=kafka-billing]")
        expect(row.locator("td").nth(2)).to_have_text("1", timeout=30_000)
        expect(row.locator(".pill.kafka")).to_have_text("kafka")
        expect(row.locator("td").nth(1)).to_have_text("stable")
        page.click("#groups a:text('kafka-billing')")
        expect(page.locator("#kafka-group")).to_contain_text(bootstrap)
        expect(page.locator("#kafka-group")).to_contain_text("1 member(s), Stable")
        expect(page.locator("#members")).to_contain_text("Its members are Kafka clients")  # (not "no member")
        shot(page, "kafka-group")
        page.goto("/")  # the gateway's peers, as the overview shows them
        expect(page.locator("#peers tbody tr .pill.kafka").first).to_be_visible(timeout=20_000)
        member.terminate()
        member.wait(20)
    finally:
        gateway.terminate()
        gateway.wait(20)
    page.goto("/")  # every peer of the gateway gone (the next tests count the producers): as the console shows them
    expect(page.locator("#peers tbody tr .pill.kafka")).to_have_count(0, timeout=(TIMEOUT_S + 4) * 1000)


def test_mirrors_and_cdc_connectors(page, cluster):
    page.goto("/connectors")
    mirror = page.locator("section[data-mirror=b-to-a]")
    expect(mirror).to_contain_text(cluster.b.pub, timeout=20_000)
    expect(mirror.locator("tbody tr").first).to_contain_text("events")
    connector = page.locator("section[data-connector]")
    expect(connector).to_contain_text("orders", timeout=20_000)
    expect(connector).to_contain_text("shop")
    shot(page, "connectors")
    expect(page.locator("#provenance tbody tr")).to_have_count(1)
    expect(page.locator("#provenance")).to_contain_text(cluster.b.pub)  # the source site, as the mirror names it
    page.goto("/topic?name=events")
    expect(page.locator("#partitions [data-test=head]").first).to_have_text("24", timeout=20_000)
    expect(page.locator("#partitions [data-test=source]").first).to_contain_text("b-to-a")


def test_a_killed_producer_shows_gone_within_the_beacon_timeout(page, cluster):
    producer = cluster.producers[0]
    page.goto("/")
    rows = page.locator("#peers tbody tr[data-role=producer]")
    before = rows.count()
    assert before >= 2
    shot(page, "overview")  # last: the chart has the run's records by now
    killed = time.monotonic()
    producer.send_signal(signal.SIGKILL)
    producer.wait(10)
    expect(rows).to_have_count(before - 1, timeout=(TIMEOUT_S + 4) * 1000)
    took = time.monotonic() - killed
    # beacon/timeout, plus the tower's slot and the page's refresh (2 s)
    assert took < TIMEOUT_S + 3.5, f"shown gone after {took:.1f} s"
    expect(page.locator("ul.gone")).to_contain_text("producer")


def test_the_console_refuses_bad_flags_and_without_a_page_sends_nothing(cluster):
    bad = subprocess.run([script("dafka"), "ui", "--port", "70000"], capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "--port" in bad.stderr
    taken = int(cluster.url.rsplit(":", 1)[1].strip("/"))  # the console's own port
    busy = subprocess.run([script("dafka"), "ui", "--port", str(taken), *cluster.a.args], capture_output=True,
                          text=True, timeout=60)
    assert busy.returncode == 1 and "address already in use" in busy.stderr
    assert f"cannot serve the console on 127.0.0.1:{taken}" in busy.stderr
    with urllib.request.urlopen(cluster.url + "api/rates", timeout=10) as response:
        assert "default-src 'none'" in response.headers["Content-Security-Policy"]
    try:
        urllib.request.urlopen(cluster.url + "messages?topic=orders&offset=minus", timeout=10)
        pytest.fail("a bad offset was accepted")
    except urllib.error.HTTPError as exc:
        assert exc.code == 400 and "offset must be a number" in exc.read().decode()
