"""``dafka cdc postgres`` and ``dafka cdc mysql``: the connectors' command lines."""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from typing import Any

import click

from dafka.cli.common import (
    CONTEXT_SETTINGS,
    EXIT_FAILURE,
    common_options,
    load_config,
    run_or_exit,
    say,
    serve_metrics,
    setup_logging,
    stop_event_on_signals,
)



@click.group("cdc", context_settings=CONTEXT_SETTINGS)
def cdc() -> None:
    """Change data capture: a database's committed changes into a topic, one
    JSON envelope per row change (rfc/cdc.md), in commit order."""


def _connector_options(table_metavar: str, table_help: str, state_help: str) -> Callable:
    """The options both connectors take, then the other tools' -c/-X/--pub/--sub/--metrics-port."""

    def decorate(f: Callable) -> Callable:
        options = [
            click.option("--table", "tables", multiple=True, required=True, metavar=table_metavar, help=table_help),
            click.option("--topic", required=True, metavar="TOPIC",
                         help="The topic the changes go to: one partition, every change in commit order."),
            click.option("--topic-per-table", is_flag=True,
                         help=f"One topic per table instead, TOPIC.{table_metavar}; records still carry the clock."),
            click.option("--name", metavar="NAME", help="The connector's name (default: the topic). What it keeps "
                         "(slot, state file, the partition's address) derives from it: a restart with the same name "
                         "resumes."),
            click.option("--state-dir", default=".", show_default=True, metavar="DIR", help=state_help),
            click.option("--no-bootstrap", is_flag=True,
                         help="Do not read the tables' existing rows: stream changes only."),
            click.option("--tombstones", is_flag=True,
                         help="After each delete, a tombstone: a record with the row's key and an empty value "
                              "(Debezium's tombstones.on.delete). On a compacted topic (store/compaction/topics) "
                              "a deleted row's records then all go, the tombstone itself after "
                              "store/compaction/tombstone_ms; without it, the delete's envelope stays for ever. "
                              "Consumers skip empty records (dafka.cdc.apply and dafka.spark.cdc do)."),
            click.option("--min-acks", type=click.IntRange(min=1), metavar="N",
                         help="producer/min_acks: stores that must ack a change before the connector counts it "
                              "as delivered (and confirms it to the database)."),
        ]
        f = common_options(
            pub_help="The tower's XPUB: beacon/pub_address (default tcp://127.0.0.1:5557).",
            sub_help="The tower's XSUB: beacon/sub_address (default tcp://127.0.0.1:5556).",
            metrics=True,
        )(f)
        for option in reversed(options):
            f = option(f)
        return f

    return decorate


def _run(tool: str, make: Callable[[], Any], options: dict[str, Any]) -> None:
    """Load the config, build the connector with ``make(config)``, serve its
    metrics, run it until SIGINT/SIGTERM; SIGUSR1 asks for a new snapshot."""
    from .connector import CdcError

    config = load_config(
        options["config_path"], options["sets"],
        {"beacon/pub_address": ("--pub", options["pub"]), "beacon/sub_address": ("--sub", options["sub"]),
         "producer/min_acks": ("--min-acks", options["min_acks"])},
        verbose_keys=("producer/verbose", "beacon/verbose"), verbose=options["verbose"],
    )
    setup_logging(options["verbose"])
    stop = stop_event_on_signals()
    collector = serve_metrics(options["metrics_port"], options["metrics_address"])
    try:
        capture = make(config)
    except CdcError as exc:
        say(str(exc))
        sys.exit(EXIT_FAILURE)
    stop.callbacks.append(capture.stop)
    if hasattr(capture, "request_snapshot"):
        signal.signal(signal.SIGUSR1, lambda signum, frame: capture.request_snapshot())
    if collector is not None:
        collector.add(capture)
    say(f"capturing {', '.join(capture.source.tables)} into {capture.source.topic} ({tool}, name {capture.label})")
    run_or_exit(capture.run, "cdc", (CdcError,))  # (a ResumeError, a store gone for close_timeout...: exit 1)
    stats = capture.stats
    say(f"stopped: {stats.snapshot_rows} rows bootstrapped, {stats.changes} changes in {stats.transactions} "
        f"transactions, confirmed {stats.confirmed_lsn}")


@cdc.command("postgres", context_settings=CONTEXT_SETTINGS)
@click.option("--dsn", required=True, metavar="DSN",
              help="libpq connection string of the database, e.g. 'host=db1 dbname=shop user=cdc'. The role needs "
                   "REPLICATION and SELECT on the tables; wal_level must be logical.")
@click.option("--slot", metavar="SLOT", help="Replication slot (default dafka_NAME); created when absent.")
@click.option("--publication", metavar="PUB", help="Publication (default dafka_NAME); created when absent, and "
              "set to --table's tables.")
@_connector_options("SCHEMA.TABLE", "A table to capture (repeatable; the schema defaults to public).",
                    "Where the connector notes that its bootstrap finished (SLOT.dafka-cdc.json).")
def postgres(dsn: str, slot: str | None, publication: str | None, tables: tuple[str, ...], topic: str,
             topic_per_table: bool, name: str | None, state_dir: str, no_bootstrap: bool, tombstones: bool,
             **options: Any) -> None:
    """Capture PostgreSQL changes (logical decoding, pgoutput) into TOPIC.

    On its first start it creates a publication and a replication slot,
    publishes every existing row as op "r" (read in the slot's snapshot),
    then every committed insert, update, delete and truncate. The slot
    confirms a change only once --min-acks stores acked it: after a crash
    or restart (same --name) it resumes the same partition, and the changes
    after the last confirmed one may come again, with their LSN, for
    consumers to drop (rfc/cdc.md, the idempotent-apply rule). SIGUSR1
    publishes every row again (op "r"), so that consumers that start after
    retention deleted the bootstrap can rebuild the tables. Runs until
    SIGINT or SIGTERM.

    \b
    Examples:
      dafka cdc postgres --dsn 'host=127.0.0.1 dbname=shop user=cdc' \\
          --table public.orders --table public.items --topic shop
      dafka_console_consumer shop --from-beginning --json
    """
    from .postgres import PostgresCapture, PostgresSource

    def make(config: Any) -> PostgresCapture:
        source = PostgresSource(dsn, list(tables), topic, name=name or "", slot=slot or "",
                                publication=publication or "", topic_per_table=topic_per_table, state_dir=state_dir,
                                bootstrap=not no_bootstrap, tombstones=tombstones)
        return PostgresCapture(source, config)

    _run("postgres", make, options)


@cdc.command("mysql", context_settings=CONTEXT_SETTINGS)
@click.option("--dsn", required=True, metavar="URL",
              help="mysql://USER:PASSWORD@HOST:PORT/ of the server. The user needs REPLICATION SLAVE, REPLICATION "
                   "CLIENT and SELECT on the tables; the server needs log_bin, binlog_format = ROW and "
                   "binlog_row_image = FULL.")
@click.option("--server-id", type=click.IntRange(1, 2**32 - 1), metavar="ID",
              help="The replica id to read the binlog as (default: derived from --name); unique among replicas.")
@_connector_options("DATABASE.TABLE", "A table to capture (repeatable).",
                    "Where the connector keeps the binlog position the stores acked (NAME.dafka-cdc-mysql.json).")
def mysql(dsn: str, server_id: int | None, tables: tuple[str, ...], topic: str, topic_per_table: bool,
          name: str | None, state_dir: str, no_bootstrap: bool, tombstones: bool, **options: Any) -> None:
    """Capture MySQL or MariaDB row changes (the row-based binlog) into TOPIC.

    The same envelope as dafka cdc postgres (rfc/cdc.md): op c/u/d/r, before,
    after, key, and source.lsn, a number that orders transactions (binlog
    file number << 32 | position), with source.file, source.pos and
    source.gtid. On its first start it publishes every existing row as op "r",
    read in one consistent snapshot, then streams from that snapshot's binlog
    position. It saves the position after the last transaction --min-acks
    stores acked in --state-dir, and a restart reads the binlog from there:
    the server must keep its binlogs at least that long. Runs until SIGINT or
    SIGTERM.

    \b
    Example:
      dafka cdc mysql --dsn mysql://cdc:secret@127.0.0.1:3306/ --table shop.orders --topic shop
    """
    from .mysql import MysqlCapture, MysqlSource

    def make(config: Any) -> MysqlCapture:
        source = MysqlSource(dsn, list(tables), topic, name=name or "", topic_per_table=topic_per_table,
                             state_dir=state_dir, bootstrap=not no_bootstrap, server_id=server_id or 0,
                             tombstones=tombstones)
        return MysqlCapture(source, config)

    _run("mysql", make, options)
