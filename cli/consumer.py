"""``dafka_console_consumer`` (and ``dafka consume``): print a topic's records.

Drop-in for the reference's tool (``TOPIC``, ``--from-beginning``, ``-c``,
``--pub``, ``--sub``, ``--verbose``; default output ``subject SP partition SP
content``), with the topic accepted anywhere on the command line, stdout
flushed after every record, and the flags Kafka and kcat users reach for.
"""

from __future__ import annotations

import os
import sys
import time

import click

from dafka import Consumer

from .common import (
    CONTEXT_SETTINGS,
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
from .formats import FormatError, Printer, compile_format


def _offset(ctx: click.Context, param: click.Parameter, value: str | None) -> str | int | None:
    if value is None:
        return None
    word = value.lower()
    if word in ("earliest", "latest", "beginning", "end"):
        return {"beginning": "earliest", "end": "latest"}.get(word, word)
    if value.isdigit():
        return int(value)
    raise click.BadParameter(f"expected earliest, latest or an offset (a number, with --partition), got {value!r}")


@click.command("dafka_console_consumer", context_settings=CONTEXT_SETTINGS)
@click.argument("topics", nargs=-1, metavar="TOPIC...")
@click.option("-t", "--topic", "topic_opts", multiple=True, metavar="TOPIC",
              help="Topic to read (repeatable); the same as the TOPIC argument.")
@click.option("--from-beginning", is_flag=True,
              help="Start at the first record of each partition (consumer/offset/reset = earliest).")
@click.option("-o", "--offset", callback=_offset, metavar="earliest|latest|N",
              help="Where to start on a partition with no stored offset (consumer/offset/reset); "
                   "a number N starts the --partition at offset N.")
@click.option("--partition", metavar="ADDR", help="Only this producer's (partition's) records.")
@click.option("-m", "--max-messages", type=click.IntRange(min=1), metavar="N", help="Exit after N records.")
@click.option("--timeout-ms", type=click.IntRange(min=0), metavar="MS",
              help="Exit when no record arrived for this long.")
@click.option("-f", "--format", "fmt", metavar="FMT",
              help=r"kcat-style output: %t topic, %p partition, %o offset, %s value, %S value size, "
                   r"%T timestamp (-1: unknown), %k key (none), %%; escapes \n \t \r \\.  "
                   r"Nothing is added: end with \n.")
@click.option("-J", "--json", "as_json", is_flag=True,
              help="One JSON object per record: topic, partition, offset, timestamp, value, value_encoding.")
@click.option("--value-format", type=click.Choice(["raw", "msgpack"]), default="raw", show_default=True,
              help="msgpack: decode values and print them as JSON.")
@click.option("--offsets-file", type=click.Path(dir_okay=False), metavar="PATH",
              help="Keep positions here; a restarted consumer resumes where it stopped.")
@click.option("-g", "--group", metavar="NAME",
              help="Join consumer group NAME: its members share the topics' partitions, and a partition that "
                   "moves resumes from the group's last commit (kept by the stores). Commits every "
                   "consumer/group/auto_commit_interval ms and on exit; which partitions this member reads "
                   "is said on stderr as they move.")
@click.option("-q", "--quiet", is_flag=True, help="No summary on stderr at exit.")
@common_options(
    pub_help="The tower's XPUB: beacon/pub_address (default tcp://127.0.0.1:5557).",
    sub_help="The tower's XSUB: beacon/sub_address (default tcp://127.0.0.1:5556).",
    metrics=True,
)
@exit_on_interrupt
def main(topics: tuple[str, ...], topic_opts: tuple[str, ...], from_beginning: bool, offset: str | int | None,
         partition: str | None, max_messages: int | None, timeout_ms: int | None, fmt: str | None,
         as_json: bool, value_format: str, offsets_file: str | None, group: str | None, quiet: bool,
         config_path: str | None, pub: str | None, sub: str | None, sets: list, verbose: bool,
         tower_timeout_ms: int, metrics_port: int | None, metrics_address: str) -> None:
    """Print the records of TOPIC, one line each: `topic partition value`.

    \b
    Examples:
      dafka_console_consumer hello --from-beginning
      dafka_console_consumer --from-beginning hello --max-messages 10 --json
      dafka_console_consumer hello -f '%p %o %s\\n' --timeout-ms 5000
      dafka_console_consumer orders --group billing --from-beginning
    """
    names = list(dict.fromkeys([*topics, *topic_opts]))
    if not names:
        raise click.UsageError("Missing argument 'TOPIC'.")
    if fmt is not None and as_json:
        raise click.UsageError("--format and --json do not go together.")
    if group is not None and offsets_file is not None:
        raise click.UsageError("--group and --offsets-file do not go together: a group keeps its offsets "
                               "in the stores.")
    if group is not None and partition is not None:
        raise click.UsageError("--group and --partition do not go together: the group says which partitions "
                               "this member reads.")
    if fmt is not None:
        try:
            compile_format(fmt)
        except FormatError as exc:
            raise click.BadParameter(str(exc), param_hint="'-f' / '--format'") from None
    reset = None
    start_at: int | None = None
    if isinstance(offset, int):
        if partition is None:
            raise click.UsageError("--offset N needs --partition ADDR.")
        start_at = offset
        # The stores announce partitions (DIRECT-HEAD) only to earliest
        # consumers; the others are filtered out by --partition anyway.
        reset = "earliest"
    elif offset is not None:
        reset = offset
    if from_beginning:
        if reset == "latest":
            raise click.UsageError("--from-beginning and --offset latest contradict each other.")
        reset = "earliest"
    config = load_config(
        config_path, sets,
        {"beacon/pub_address": ("--pub", pub), "beacon/sub_address": ("--sub", sub),
         "consumer/offset/reset": ("--offset" if offset is not None else "--from-beginning", reset)},
        verbose_keys=("consumer/verbose", "beacon/verbose"), verbose=verbose,
    )
    setup_logging(verbose or bool(config["consumer/verbose"]))
    raise_on_signals()
    collector = serve_metrics(metrics_port, metrics_address)

    warned: set[str] = set()

    def bad_value(record, reason: str) -> None:
        if "msgpack" not in warned:
            warned.add("msgpack")
            say(f"{record.topic}/{record.partition}@{record.offset}: {reason}; printing the raw bytes "
                "(warned once)")

    printer = Printer(fmt, as_json, value_format, bad_value)
    out = sys.stdout.buffer
    count = 0
    code = 0
    started = time.monotonic()
    consumer: Consumer | None = None
    watch: TowerWatch | None = None
    try:
        try:
            consumer = Consumer(*names, config=config, offsets_path=offsets_file, **_group_options(group, quiet))
        except (ValueError, OSError) as exc:
            raise click.UsageError(str(exc)) from None
        if group is not None and not quiet:
            say(f"group {group}: member {consumer.address}")
        if collector is not None:
            collector.add(consumer)
        watch = TowerWatch(lambda: consumer.connected, config["beacon/pub_address"], tower_timeout_ms).start()
        if start_at is not None:
            for topic in names:
                consumer.seek(partition, start_at, topic)
        last = time.monotonic()
        while max_messages is None or count < max_messages:
            # No wake-ups while nothing comes: a signal interrupts the wait (its handler raises Interrupted).
            wait = None
            if timeout_ms is not None:
                wait = timeout_ms / 1000.0 - (time.monotonic() - last)
                if wait <= 0:
                    break
            record = consumer.poll(wait)
            if record is None:
                continue
            last = time.monotonic()
            if partition is not None and record.partition != partition:
                continue
            out.write(printer.render(record))
            out.flush()
            count += 1
    except BrokenPipeError:
        # The reader went away (e.g. `| head -1`): not an error of ours.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except Interrupted as exc:
        code = exc.code
    finally:
        if watch is not None:
            watch.cancel()
        if consumer is not None:
            try:
                consumer.close()
            except Interrupted as exc:  # pragma: no cover - a signal during close
                code = code or exc.code
    if not quiet:
        say(f"Processed a total of {count} messages in {time.monotonic() - started:.2f}s")
    if code:
        sys.exit(code)


def _group_options(group: str | None, quiet: bool) -> dict:
    """The Consumer arguments of ``--group``: the partitions that move are said on stderr."""
    if group is None:
        return {}

    def said(verb: str):
        return lambda partitions: say(f"group {group}: {verb} " + (
            ", ".join(f"{tp.topic}/{tp.partition}" for tp in partitions) or "nothing"))

    return {"group": group, "on_assign": None if quiet else said("reading"),
            "on_revoke": None if quiet else said("handing over")}


if __name__ == "__main__":  # pragma: no cover
    main()
