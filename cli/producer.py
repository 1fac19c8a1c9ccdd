"""``dafka_console_producer`` (and ``dafka produce``): one record per input line.

Drop-in for the reference's tool: ``TOPIC``, ``-c``, ``--pub``, ``--sub``,
``--verbose``; each stdin line (trailing CR/LF stripped) is one record.  At
EOF it waits until ``producer/min_acks`` stores have acked every record, but
never forever:

* acked: a summary on stderr, exit 0;
* not acked after ``producer/close_timeout`` (e.g. no store running): it says
  how many records were left unacked, exit 1;
* ``producer/terminate_unacked = 1`` (the reference's switch): exit 0 at
  once, like the reference;
* ``--min-acks 0`` (no store needed): after EOF it lingers one
  ``producer/head_interval`` once the tower answered, so consumers that are
  running can fetch what they missed, then exits 0.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from typing import BinaryIO

import click

from dafka import Producer
from dafka.errors import BufferFull, DafkaError, FlushTimeout, RecordTooLarge

from .common import (
    CONTEXT_SETTINGS,
    EXIT_FAILURE,
    Interrupted,
    exit_on_interrupt,
    TowerWatch,
    common_options,
    serve_metrics,
    load_config,
    raise_on_signals,
    say,
    setup_logging,
)
from .formats import pack_json_line


class LineTooLong(Exception):
    pass


def _lines(stream: BinaryIO, limit: int) -> Iterator[bytes]:
    """Lines as they come (also from a terminal, line by line).  A line
    longer than ``limit`` bytes (without its CR/LF) raises
    :class:`LineTooLong`: memory stays bounded, and signals are seen."""
    while True:
        line = stream.readline(limit + 2)
        if not line:
            return
        if len(line.rstrip(b"\r\n")) > limit:
            raise LineTooLong()
        yield line


class _Progress:
    """A progress bar on stderr for --file, only when stderr is a terminal."""

    def __init__(self, path: str | None) -> None:
        self._bar = None
        if path is None or path == "-" or not sys.stderr.isatty():
            return
        try:
            size = os.path.getsize(path)
        except OSError:
            return
        self._bar = click.progressbar(length=size, label="producing", file=sys.stderr, show_pos=False,
                                      update_min_steps=max(1, size // 500))
        self._bar.__enter__()

    def update(self, n: int) -> None:
        if self._bar is not None:
            self._bar.update(n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.update_min_steps = 1
            self._bar.update(0)  # show the steps held back by update_min_steps
            self._bar.__exit__(None, None, None)
            self._bar = None


@click.command("dafka_console_producer", context_settings=CONTEXT_SETTINGS)
@click.argument("topics", nargs=-1, metavar="TOPIC")
@click.option("-t", "--topic", "topic_opt", metavar="TOPIC", help="The topic; the same as the TOPIC argument.")
@click.option("--file", "path", type=click.Path(exists=True, dir_okay=False, allow_dash=True), metavar="PATH",
              help="Read records from this file instead of stdin (a progress bar shows on a terminal).")
@click.option("--value-format", type=click.Choice(["raw", "msgpack"]), default="raw", show_default=True,
              help="msgpack: each line is a JSON document, sent packed as msgpack.")
@click.option("-K", "--key-delimiter", metavar="DELIM",
              help="kcat's -K: each line is KEY DELIM VALUE, split at the first DELIM (\\t: a tab); a line "
                   "without it is a value with no key.")
@click.option("--min-acks", type=click.IntRange(min=0), metavar="N",
              help="Stores that must ack each record (producer/min_acks, default 1); 0 = no store needed.")
@click.option("-q", "--quiet", is_flag=True, help="No summary on stderr.")
@common_options(
    pub_help="The tower's XPUB: beacon/pub_address (default tcp://127.0.0.1:5557).",
    sub_help="The tower's XSUB: beacon/sub_address (default tcp://127.0.0.1:5556).",
    metrics=True,
)
@exit_on_interrupt
def main(topics: tuple[str, ...], topic_opt: str | None, path: str | None, value_format: str,
         key_delimiter: str | None, min_acks: int | None, quiet: bool, config_path: str | None, pub: str | None,
         sub: str | None, sets: list, verbose: bool, tower_timeout_ms: int, metrics_port: int | None,
         metrics_address: str) -> None:
    """Send each line of stdin (or --file) to TOPIC as one record; at EOF
    wait for the stores' acks (bounded by producer/close_timeout) and exit.

    \b
    Examples:
      printf 'A first event\\nA second event\\n' | dafka_console_producer hello
      dafka_console_producer hello --file events.txt --min-acks 2
      echo '{"temp": 21.5}' | dafka_console_producer weather --value-format msgpack
      echo 'sku-42:{"price": 9.5}' | dafka_console_producer prices -K:
    """
    names = [*topics, *([topic_opt] if topic_opt else [])]
    if not names:
        raise click.UsageError("Missing argument 'TOPIC'.")
    if len(set(names)) > 1:
        raise click.UsageError(f"one topic per producer, got {', '.join(names)}.")
    topic = names[0]
    delimiter = None
    if key_delimiter is not None:
        delimiter = key_delimiter.replace("\\t", "\t").encode("utf-8", "surrogateescape")
        if not delimiter:
            raise click.BadParameter("the key delimiter is empty", param_hint="'-K' / '--key-delimiter'")
    config = load_config(
        config_path, sets,
        {"beacon/pub_address": ("--pub", pub), "beacon/sub_address": ("--sub", sub),
         "producer/min_acks": ("--min-acks", min_acks)},
        verbose_keys=("producer/verbose", "beacon/verbose"), verbose=verbose,
    )
    setup_logging(verbose or bool(config["producer/verbose"]))
    raise_on_signals()
    collector = serve_metrics(metrics_port, metrics_address)
    code = _produce(topic, config, path, value_format, delimiter, quiet, tower_timeout_ms, collector)
    if code:
        sys.exit(code)


def _produce(topic, config, path, value_format, delimiter, quiet, tower_timeout_ms, collector) -> int:
    try:
        producer = Producer(topic, config)
        if collector is not None:
            collector.add(producer)
    except ValueError as exc:
        raise click.UsageError(f"topic {topic!r}: {exc}") from None
    stream: BinaryIO = sys.stdin.buffer if path in (None, "-") else open(path, "rb")
    progress = _Progress(path)
    watch = TowerWatch(lambda: producer.connected, config["beacon/pub_address"], tower_timeout_ms).start()
    started = time.monotonic()
    sent = 0
    code = 0
    problem = None
    closed = False
    interrupted = False
    limit = config["producer/max_record_bytes"]
    if value_format == "msgpack":
        limit = max(limit * 4, 1 << 20)  # JSON text is larger than the msgpack it packs to
    lineno = 0
    try:
        try:
            for lineno, line in enumerate(_lines(stream, limit), 1):
                progress.update(len(line))
                value = line.rstrip(b"\r\n")
                key = None
                if delimiter is not None and delimiter in value:
                    key, value = value.split(delimiter, 1)
                if value_format == "msgpack":
                    if not value.strip():
                        continue
                    try:
                        value = pack_json_line(value)
                    except (ValueError, TypeError) as exc:
                        problem = f"line {lineno} is not a JSON document ({exc}); stopped reading"
                        code = EXIT_FAILURE
                        break
                try:
                    producer.send(value, key=key)
                except RecordTooLarge as exc:
                    problem = f"line {lineno}: {exc}; stopped reading"
                    code = EXIT_FAILURE
                    break
                except BufferFull as exc:
                    problem = f"line {lineno}: {exc}; stopped reading"
                    code = EXIT_FAILURE
                    break
                sent += 1
        except LineTooLong:
            problem = (f"line {lineno + 1} is longer than producer/max_record_bytes="
                       f"{config['producer/max_record_bytes']}; stopped reading")
            code = EXIT_FAILURE
        finally:
            progress.close()
            if stream is not sys.stdin.buffer:
                stream.close()
        min_acks = producer.min_acks
        if min_acks == 0 and sent:
            _linger(producer, config)
        try:
            producer.close()
            unacked = 0
        except FlushTimeout as exc:
            unacked = exc.unacked
            code = EXIT_FAILURE
        closed = True
    except Interrupted as exc:
        code = exc.code
        unacked = None
        interrupted = True
    finally:
        watch.cancel()
        if not closed:
            try:
                producer.close(timeout=0)
            except DafkaError:
                pass
    elapsed = time.monotonic() - started
    if problem:
        say(problem)
    if not quiet or code:
        say(_summary(topic, producer, sent, unacked, config, elapsed, interrupted=interrupted))
    return code


def _linger(producer: Producer, config) -> None:
    """With min_acks = 0 nothing tells us whether anybody got the records:
    give running consumers the time to hear our HEAD and fetch them."""
    close_timeout = config["producer/close_timeout"] / 1000.0
    deadline = time.monotonic() + close_timeout
    while not producer.connected and time.monotonic() < deadline:
        time.sleep(0.02)
    if producer.connected:
        time.sleep(min(config["producer/head_interval"] / 1000.0, max(0.0, deadline - time.monotonic())))


def _summary(topic, producer, sent, unacked, config, elapsed, interrupted) -> str:
    where = f"to {topic} (partition {producer.address})"
    stores = f"{producer.min_acks} store{'s' if producer.min_acks != 1 else ''}"
    if interrupted:
        return f"interrupted: {sent} record(s) sent {where} in {elapsed:.2f}s; stopped without waiting for acks"
    if producer.min_acks == 0:
        return f"{sent} record(s) sent {where} in {elapsed:.2f}s (min_acks=0: no acks awaited)"
    if unacked:
        return (f"{sent} record(s) sent {where}; {unacked} NOT acked by {stores} after "
                f"producer/close_timeout={config['producer/close_timeout']}ms (is a store running? "
                f"--min-acks 0 or -X producer/terminate_unacked=1 do not wait); {elapsed:.2f}s")
    if config["producer/terminate_unacked"]:
        stats = producer.stats()
        left = stats["unacked"]
        return (f"{sent} record(s) sent {where}, {sent - left} acked by {stores}, {left} left unacked "
                f"(producer/terminate_unacked=1) in {elapsed:.2f}s")
    return f"{sent} record(s) sent {where}, {sent} acked by {stores} in {elapsed:.2f}s"


if __name__ == "__main__":  # pragma: no cover
    main()
