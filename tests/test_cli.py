"""The command-line tools as users run them: real subprocesses of the
installed console scripts (``pip install -e .``), on a tower bound to
ephemeral loopback ports, with no config file.  Every process is killed in
teardown by the ``processes`` fixture.

The helpers at the top (also used by test_cli_status.py) read the tools'
pipes without blocking and start a ``dafka_towerd`` whose chosen ports are
parsed from its startup line on stderr."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import time

import pytest

from helpers import script

SCRIPTS = ("dafka", "dafka_towerd", "dafka_stored", "dafka_console_producer", "dafka_console_consumer")


class Stream:
    """Accumulates a pipe's bytes, read without blocking."""

    def __init__(self, pipe) -> None:
        self.fd = pipe.fileno()
        self.data = b""
        self.eof = False

    def pump(self, timeout: float = 0.0) -> None:
        if self.eof:
            return
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if ready:
            chunk = os.read(self.fd, 65536)
            if chunk:
                self.data += chunk
            else:
                self.eof = True

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", "replace")

    def wait_for(self, pattern: str | bytes, timeout: float = 10.0, what: str = "") -> re.Match:
        regex = re.compile(pattern.encode() if isinstance(pattern, str) else pattern)
        deadline = time.monotonic() + timeout
        while True:
            match = regex.search(self.data)
            if match:
                return match
            left = deadline - time.monotonic()
            if left <= 0 or self.eof:
                pytest.fail(f"timed out waiting for {what or pattern!r}; got {self.text!r}")
            self.pump(min(left, 0.1))

    def lines(self) -> list[bytes]:
        return self.data.splitlines()


class Tool:
    """A running console script with non-blocking stdout/stderr readers."""

    def __init__(self, processes, args: list[str], stdin=subprocess.DEVNULL) -> None:
        self.args = args
        self.proc = processes.start([script(args[0]), *args[1:]], stdin=stdin)
        self.out = Stream(self.proc.stdout)
        self.err = Stream(self.proc.stderr)

    def wait(self, timeout: float = 10.0) -> int:
        """Exit status, reading both pipes meanwhile (so the tool never blocks on a full pipe)."""
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:
            if time.monotonic() > deadline:
                pytest.fail(f"{' '.join(self.args)} still running after {timeout}s; "
                            f"stdout {self.out.text!r}, stderr {self.err.text!r}")
            self.out.pump(0.02)
            self.err.pump(0)
        while not (self.out.eof and self.err.eof):
            self.out.pump(0.05)
            self.err.pump(0.05)
        return self.proc.returncode

    def signal(self, signum: int = signal.SIGINT) -> None:
        self.proc.send_signal(signum)

    def write(self, data: bytes) -> None:
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def close_stdin(self) -> None:
        self.proc.stdin.close()


class Cluster:
    """A ``dafka_towerd`` on ephemeral loopback ports and the flags peers need."""

    def __init__(self, processes, *extra: str, command: tuple[str, ...] = ("dafka_towerd",)) -> None:
        self.processes = processes
        self.tower = Tool(processes, [*command, "--pub", "tcp://127.0.0.1:*", "--sub", "tcp://127.0.0.1:*", *extra])
        match = self.tower.err.wait_for(rb"beacons in (tcp://\S+), out (tcp://\S+)\n", what="the tower's endpoints")
        self.sub_address, self.pub_address = (m.decode() for m in match.groups())
        self.flags = ["--pub", self.pub_address, "--sub", self.sub_address]

    def run(self, *args: str, stdin=subprocess.DEVNULL) -> Tool:
        """Start a tool connected to this tower (no config file, no beacon/address)."""
        return Tool(self.processes, [*args, *self.flags], stdin=stdin)

    def produce(self, topic: str, data: bytes, *args: str,
                command: tuple[str, ...] = ("dafka_console_producer",)) -> Tool:
        tool = self.run(*command, topic, *args, stdin=subprocess.PIPE)
        tool.write(data)
        tool.close_stdin()
        return tool

    def store(self, db, *args: str) -> Tool:
        tool = self.run("dafka_stored", "--db", str(db), *args)
        tool.err.wait_for(rb"storing in .*; writer [0-9A-F]{32}, reader [0-9A-F]{32}\n", what="the store to start")
        return tool


def partition_of(summary: str) -> str:
    """The partition a console producer's summary names."""
    return re.search(r"partition ([0-9A-F]{32})", summary).group(1)


def assert_no_traceback(*tools: Tool) -> None:
    for tool in tools:
        assert "Traceback" not in tool.err.text, tool.err.text


# ==========================================================================
# The tests
# ==========================================================================

import base64  # noqa: E402
import json  # noqa: E402
import socket  # noqa: E402

import msgpack  # noqa: E402
from click.testing import CliRunner  # noqa: E402

CONSUMER = "dafka_console_consumer"
PRODUCER = "dafka_console_producer"


def dead_endpoint() -> str:
    """A loopback endpoint nobody listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


# -- flags and errors (exit 2) ---------------------------------------------


def test_every_tool_is_installed_with_the_reference_flags():
    from dafka.cli.consumer import main as consumer
    from dafka.cli.main import main as umbrella
    from dafka.cli.producer import main as producer
    from dafka.cli.stored import main as stored
    from dafka.towerd.main import main as towerd

    for name in SCRIPTS:
        script(name)
    runner = CliRunner()
    for command in (towerd, stored, producer, consumer):
        for flag in ("-h", "--help"):
            result = runner.invoke(command, [flag])
            assert result.exit_code == 0, result.output
            for option in ("-c, --config FILE", "--pub ADDR", "--sub ADDR", "--verbose", "-X, --set KEY=VALUE"):
                assert option in result.output, (command.name, option)
    consumer_help = runner.invoke(consumer, ["-h"]).output
    for option in ("--from-beginning", "--max-messages", "--timeout-ms", "--offset", "--partition", "--format",
                   "--json", "--value-format", "--offsets-file"):
        assert option in consumer_help
    producer_help = runner.invoke(producer, ["-h"]).output
    for option in ("--file", "--value-format", "--min-acks"):
        assert option in producer_help
    stored_help = runner.invoke(stored, ["-h"]).output
    for option in ("--db", "--retention-ms", "--retention-bytes"):
        assert option in stored_help
    umbrella_help = runner.invoke(umbrella, ["--help"]).output
    for command in ("tower", "store", "produce", "consume", "status", "demo"):
        assert f"  {command} " in umbrella_help


def test_version_lives_in_one_place_and_dafka_version_prints_it():
    from importlib.metadata import version

    import dafka

    out = subprocess.run([script("dafka"), "--version"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and out.stdout.splitlines()[0] == f"dafka, version {dafka.__version__}"
    assert out.stdout.splitlines()[1].startswith("compiled extensions: ")  # which ran (tests/test_extensions.py)
    assert version("dafka") == dafka.__version__  # pyproject reads it from dafka/__init__.py


def test_bad_flags_exit_2_and_name_the_problem(processes):
    cases = [
        ([CONSUMER, "hello", "--no-such-flag"], "--no-such-flag"),
        ([PRODUCER, "hello", "-X", "no/such=1"], "no/such"),
        ([PRODUCER, "hello", "-X", "producer/min_acks"], "expected key=value"),
        ([CONSUMER, "hello", "-X", "consumer/offset/reset=sometimes"], "consumer/offset/reset"),
        ([CONSUMER, "hello", "--format", "%z"], "%z"),
        ([CONSUMER, "--from-beginning"], "TOPIC"),
        (["dafka_towerd", "--pub"], "--pub"),
        (["dafka_stored", "--retention-ms", "-5"], "--retention-ms"),
        (["dafka", "consume", "hello", "--max-messages", "zero"], "--max-messages"),
    ]
    tools = [Tool(processes, args) for args, _ in cases]
    for tool, (args, needle) in zip(tools, cases):
        assert tool.wait(10) == 2, (args, tool.err.text)
        assert needle in tool.err.text, (args, tool.err.text)
    assert_no_traceback(*tools)


def test_config_file_errors_exit_2_and_name_file_line_and_key(processes, tmp_path):
    missing = tmp_path / "nowhere" / "dafka.cfg"
    bad = tmp_path / "bad.cfg"
    bad.write_text("beacon\n    address = 127.0.0.1\nconsumer\n    offset\n        reset = sometimes\n")
    tools = [Tool(processes, [name, *topic, "-c", str(missing)])
             for name, topic in ((CONSUMER, ["hello"]), (PRODUCER, ["hello"]), ("dafka_towerd", []),
                                 ("dafka_stored", []))]
    for tool in tools:
        assert tool.wait(10) == 2, tool.err.text
        assert str(missing) in tool.err.text and "no such config file" in tool.err.text
    wrong = Tool(processes, [CONSUMER, "hello", "-c", str(bad)])
    assert wrong.wait(10) == 2
    assert f"{bad}:5" in wrong.err.text and "consumer/offset/reset" in wrong.err.text, wrong.err.text
    assert_no_traceback(wrong, *tools)


# -- the Dafka quickstart ----------------------------------------------------


def test_quickstart_with_a_store(processes, tmp_path):
    cluster = Cluster(processes, "--verbose")
    store = cluster.store(tmp_path / "storedb")
    producer = cluster.produce("hello", b"A first event\nA second event\n")
    assert producer.wait(15) == 0, producer.err.text
    assert "2 record(s) sent" in producer.err.text and "2 acked by 1 store" in producer.err.text
    partition = partition_of(producer.err.text)
    # The topic after the flag: the reference's parser would take it as the flag's value.
    consumer = cluster.run(CONSUMER, "--from-beginning", "hello", "--max-messages", "2")
    assert consumer.wait(15) == 0, consumer.err.text
    assert consumer.out.lines() == [f"hello {partition} A first event".encode(),
                                    f"hello {partition} A second event".encode()]
    # All traffic on loopback: every endpoint the tower relayed is 127.0.0.1.
    peer_line = rb"peer [0-9A-F]{32} at (\S+)\n"
    # 4 peers: the store's writer and reader, the producer, the consumer.
    cluster.tower.err.wait_for(rb"(?:%s(?:.|\n)*?){4}" % peer_line, what="4 peers in the tower's log")
    endpoints = re.findall(peer_line, cluster.tower.err.data)
    assert all(e.startswith(b"tcp://127.0.0.1:") for e in endpoints), endpoints
    assert_no_traceback(cluster.tower, store, producer, consumer)


def test_quickstart_without_a_store(processes):
    cluster = Cluster(processes)
    # Like the reference, the producer holds its records for late consumers
    # while it waits for acks; unlike it, only for producer/close_timeout.
    producer = cluster.produce("hello", b"A first event\r\nA second event\n", "-X", "producer/close_timeout=3000")
    consumer = cluster.run(CONSUMER, "hello", "--from-beginning", "--max-messages", "2")
    assert consumer.wait(10) == 0, consumer.err.text
    assert producer.wait(10) == 1, producer.err.text
    assert "2 NOT acked by 1 store" in producer.err.text
    partition = partition_of(producer.err.text)
    assert consumer.out.lines() == [f"hello {partition} A first event".encode(),
                                    f"hello {partition} A second event".encode()]
    # The reference's switch: exit at once, 0.
    started = time.monotonic()
    quick = cluster.produce("hello", b"x\n", "-X", "producer/terminate_unacked=1")
    assert quick.wait(5) == 0, quick.err.text
    assert time.monotonic() - started < 3
    assert "1 left unacked (producer/terminate_unacked=1)" in quick.err.text
    assert_no_traceback(producer, consumer, quick)


# -- consumer output -----------------------------------------------------------


def test_max_messages_json_and_format(processes):
    cluster = Cluster(processes)
    cluster.produce("fmt", b"one\ntwo\n\xff\xfe\n", "-X", "producer/close_timeout=8000")
    first = cluster.run(CONSUMER, "fmt", "--from-beginning", "--max-messages", "1")
    as_json = cluster.run(CONSUMER, "--json", "-o", "earliest", "fmt", "-m", "3")
    custom = cluster.run(CONSUMER, "fmt", "--from-beginning", "--max-messages", "3",
                         "--format", r"%t|%p|%o|%s|%S|%T\n")
    for tool in (first, as_json, custom):
        assert tool.wait(10) == 0, tool.err.text
    records = [json.loads(line) for line in as_json.out.lines()]
    partition = records[0]["partition"]
    assert [(r["topic"], r["partition"], r["offset"]) for r in records] == [("fmt", partition, i) for i in range(3)]
    assert [(r["value"], r["value_encoding"]) for r in records] == [
        ("one", "utf-8"), ("two", "utf-8"), (base64.b64encode(b"\xff\xfe").decode(), "base64")]
    assert all(r["timestamp"] is None for r in records)
    assert first.out.lines() == [f"fmt {partition} one".encode()]
    assert custom.out.data == (f"fmt|{partition}|0|one|3|-1\nfmt|{partition}|1|two|3|-1\n".encode()
                               + f"fmt|{partition}|2|".encode() + b"\xff\xfe|2|-1\n")
    assert "Processed a total of 3 messages" in custom.err.text
    assert_no_traceback(first, as_json, custom)


def test_keys_with_kcats_delimiter_and_format_tokens(processes):
    """-K splits each line at its first delimiter into key and value (kcat); %k and %K print them, and
    --json gives the key with its encoding (null for a record without one)."""
    cluster = Cluster(processes)
    cluster.produce("keyed", b"a:one\ntwo\nb:c:three\n\xff:four\n", "-K:", "-X", "producer/close_timeout=8000")
    custom = cluster.run(CONSUMER, "keyed", "--from-beginning", "-m", "4", "--format", r"%k|%K|%s\n")
    as_json = cluster.run(CONSUMER, "keyed", "--from-beginning", "-m", "4", "--json")
    for tool in (custom, as_json):
        assert tool.wait(20) == 0, tool.err.text
    assert custom.out.data == b"a|1|one\n|-1|two\nb|1|c:three\n\xff|1|four\n"
    assert [(r["key"], r["key_encoding"], r["value"]) for r in map(json.loads, as_json.out.lines())] == [
        ("a", "utf-8", "one"), (None, None, "two"), ("b", "utf-8", "c:three"),
        (base64.b64encode(b"\xff").decode(), "base64", "four")]
    empty = cluster.run(PRODUCER, "keyed", "-K", "")
    assert empty.wait(10) == 2 and "'-K' / '--key-delimiter'" in empty.err.text
    assert_no_traceback(custom, as_json, empty)


def test_msgpack_round_trip_through_the_umbrella_command(processes):
    cluster = Cluster(processes, command=("dafka", "tower"))
    docs = [{"a": 1, "b": [True, None]}, "text", 3.5]
    lines = b"".join(json.dumps(d).encode() + b"\n" for d in docs) + b"\n"  # a blank line is skipped
    cluster.produce("mp", lines, "--value-format", "msgpack", "-X", "producer/close_timeout=8000",
                    command=("dafka", "produce"))
    decoded = cluster.run("dafka", "consume", "mp", "--from-beginning", "--value-format", "msgpack", "-m", "3")
    as_json = cluster.run("dafka", "consume", "mp", "--from-beginning", "--value-format", "msgpack", "--json",
                          "-m", "3")
    raw = cluster.run("dafka", "consume", "mp", "--from-beginning", "--json", "-m", "3")
    for tool in (decoded, as_json, raw):
        assert tool.wait(10) == 0, tool.err.text
    values = [json.loads(line) for line in as_json.out.lines()]
    assert [v["value"] for v in values] == docs
    assert {v["value_encoding"] for v in values} == {"msgpack"}
    partition = values[0]["partition"]
    assert decoded.out.lines() == [f"mp {partition} {json.dumps(d, separators=(',', ':'))}".encode() for d in docs]
    packed = [json.loads(line) for line in raw.out.lines()]
    assert [msgpack.unpackb(base64.b64decode(p["value"]) if p["value_encoding"] == "base64"
                            else p["value"].encode()) for p in packed] == docs
    # A line that is not JSON stops the producer: exit 1, naming the line.
    bad = cluster.produce("mp", b'{"ok": 1}\nnot json\n', "--value-format", "msgpack", "--min-acks", "0",
                          command=("dafka", "produce"))
    assert bad.wait(10) == 1
    assert "line 2 is not a JSON document" in bad.err.text
    assert_no_traceback(decoded, as_json, raw, bad)


def test_partition_offset_and_offsets_file(processes, tmp_path):
    cluster = Cluster(processes)
    cluster.store(tmp_path / "storedb")
    one = cluster.produce("multi", b"a0\na1\n")
    two = cluster.produce("multi", b"b0\nb1\n")
    assert one.wait(15) == 0 and two.wait(15) == 0
    p1, p2 = partition_of(one.err.text), partition_of(two.err.text)
    fmt = ["--format", r"%p %o %s\n"]
    offsets = tmp_path / "offsets"
    only = cluster.run(CONSUMER, "multi", "--from-beginning", "--partition", p1, "--timeout-ms", "2000", *fmt)
    at = cluster.run(CONSUMER, "multi", "--partition", p2, "--offset", "1", "--max-messages", "1", *fmt)
    first = cluster.run(CONSUMER, "multi", "--from-beginning", "--offsets-file", str(offsets), "-m", "4", *fmt)
    assert only.wait(15) == 0 and at.wait(15) == 0 and first.wait(15) == 0
    assert only.out.lines() == [f"{p1} 0 a0".encode(), f"{p1} 1 a1".encode()]
    assert at.out.lines() == [f"{p2} 1 b1".encode()]
    assert sorted(first.out.lines()) == sorted(f"{p} {i} {v}{i}".encode() for p, v in ((p1, "a"), (p2, "b"))
                                               for i in range(2))
    # Restarted with the same offsets file: nothing old again, only what is new.
    three = cluster.produce("multi", b"c0\n")
    assert three.wait(15) == 0
    p3 = partition_of(three.err.text)
    resumed = cluster.run(CONSUMER, "multi", "--from-beginning", "--offsets-file", str(offsets),
                          "--timeout-ms", "2000", *fmt)
    assert resumed.wait(15) == 0
    assert resumed.out.lines() == [f"{p3} 0 c0".encode()]
    assert_no_traceback(only, at, first, resumed)


# -- signals and a missing tower --------------------------------------------


def test_consumer_prints_at_once_and_exits_130_on_sigint(processes):
    cluster = Cluster(processes)
    consumer = cluster.run(CONSUMER, "live", "--verbose")
    consumer.err.wait_for(rb"tower reached", what="the consumer to reach the tower")
    producer = cluster.produce("live", b"hello live\n", "--min-acks", "0")
    # Line-buffered: the record shows while the consumer still runs.
    consumer.out.wait_for(rb"^live [0-9A-F]{32} hello live\n", what="the record")
    assert consumer.proc.poll() is None
    assert producer.wait(10) == 0, producer.err.text
    started = time.monotonic()
    consumer.signal(signal.SIGINT)
    assert consumer.wait(5) == 130
    assert time.monotonic() - started < 3
    assert "Processed a total of 1 messages" in consumer.err.text
    assert_no_traceback(consumer, producer)


def test_towerd_stops_cleanly_on_sigint_and_sigterm(processes):
    for signum, command in ((signal.SIGINT, ("dafka_towerd",)), (signal.SIGTERM, ("dafka", "tower"))):
        cluster = Cluster(processes, command=command)
        started = time.monotonic()
        cluster.tower.signal(signum)
        assert cluster.tower.wait(5) == 0, cluster.tower.err.text
        assert time.monotonic() - started < 3
        assert_no_traceback(cluster.tower)


def test_stored_stops_cleanly_on_sigint_and_keeps_its_data(processes, tmp_path):
    cluster = Cluster(processes)
    db = tmp_path / "storedb"
    store = cluster.store(db)
    locked = cluster.run("dafka_stored", "--db", str(db))
    assert locked.wait(10) == 1
    assert "in use by another store" in locked.err.text
    producer = cluster.produce("kept", b"k0\nk1\nk2\n")
    assert producer.wait(15) == 0, producer.err.text
    partition = partition_of(producer.err.text)
    started = time.monotonic()
    store.signal(signal.SIGINT)
    assert store.wait(8) == 0, store.err.text
    assert time.monotonic() - started < 5
    # The lock is released and the records were written: a new store serves them.
    again = cluster.store(db, "--retention-ms", "-1")
    consumer = cluster.run(CONSUMER, "kept", "--from-beginning", "-m", "3")
    assert consumer.wait(15) == 0, consumer.err.text
    assert consumer.out.lines() == [f"kept {partition} k{i}".encode() for i in range(3)]
    again.signal(signal.SIGTERM)
    assert again.wait(8) == 0
    assert_no_traceback(store, locked, again, consumer)


def test_an_unreachable_tower_is_reported_once(processes):
    pub, sub = dead_endpoint(), dead_endpoint()
    flags = ["--pub", pub, "--sub", sub, "--tower-timeout-ms", "300"]
    started = time.monotonic()
    consumer = Tool(processes, [CONSUMER, "nowhere", *flags])
    producer = Tool(processes, [PRODUCER, "nowhere", *flags, "-X", "producer/close_timeout=1500"],
                    stdin=subprocess.PIPE)
    producer.write(b"lost\n")
    producer.close_stdin()
    status = Tool(processes, ["dafka", "status", *flags])
    warning = f"no tower answers at {pub}; still trying"
    consumer.err.wait_for(re.escape(warning), timeout=5)
    assert producer.wait(10) == 1
    assert warning in producer.err.text and "1 NOT acked" in producer.err.text
    assert status.wait(10) == 1
    assert f"no tower answers at {pub}" in status.err.text
    # Once: the beacon's own repeated warning (after 2 s) stays quiet.
    while time.monotonic() - started < 2.8:
        consumer.err.pump(0.1)
    assert consumer.err.text.count("no tower answers") == 1, consumer.err.text
    consumer.signal(signal.SIGTERM)
    assert consumer.wait(5) == 143
    assert_no_traceback(consumer, producer, status)
