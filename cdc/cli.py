"""``dafka cdc postgres``: the connector's command line."""

from __future__ import annotations

import logging
import signal
import sys

import click

from dafka.cli.common import (
    CONTEXT_SETTINGS,
    EXIT_FAILURE,
    common_options,
    load_config,
    say,
    serve_metrics,
    setup_logging,
    stop_event_on_signals,
)

log = logging.getLogger("dafka.cdc.cli")


@click.group("cdc", context_settings=CONTEXT_SETTINGS)
def cdc() -> None:
    """Change data capture: a database's committed changes into a topic, one
    JSON envelope per row change (rfc/cdc.md), in commit order."""


@cdc.command("postgres", context_settings=CONTEXT_SETTINGS)
@click.option("--dsn", required=True, metavar="DSN",
              help="libpq connection string of the database, e.g. 'host=db1 dbname=shop user=cdc'. The role needs "
                   "REPLICATION and SELECT on the tables; wal_level must be logical.")
@click.option("--table", "tables", multiple=True, required=True, metavar="SCHEMA.TABLE",
              help="A table to capture (repeatable; the schema defaults to public).")
@click.option("--topic", required=True, metavar="TOPIC",
              help="The topic the changes go to: one partition, every change in commit order.")
@click.option("--topic-per-table", is_flag=True,
              help="One topic per table instead, TOPIC.SCHEMA.TABLE; records still carry the commit LSN.")
@click.option("--name", metavar="NAME", help="The connector's name (default: the topic). The slot, the publication "
              "and the partition's address derive from it: a restart with the same name resumes.")
@click.option("--slot", metavar="SLOT", help="Replication slot (default dafka_NAME); created when absent.")
@click.option("--publication", metavar="PUB", help="Publication (default dafka_NAME); created when absent, and "
              "set to --table's tables.")
@click.option("--state-dir", default=".", show_default=True, metavar="DIR",
              help="Where the connector notes that its bootstrap finished (SLOT.dafka-cdc.json).")
@click.option("--no-bootstrap", is_flag=True, help="Do not read the tables' existing rows: stream changes only.")
@click.option("--min-acks", type=click.IntRange(min=1), metavar="N",
              help="producer/min_acks: stores that must ack a change before the slot confirms it.")
@common_options(
    pub_help="The tower's XPUB: beacon/pub_address (default tcp://127.0.0.1:5557).",
    sub_help="The tower's XSUB: beacon/sub_address (default tcp://127.0.0.1:5556).",
    metrics=True,
)
def postgres(dsn: str, tables: tuple[str, ...], topic: str, topic_per_table: bool, name: str | None,
             slot: str | None, publication: str | None, state_dir: str, no_bootstrap: bool, min_acks: int | None,
             config_path: str | None, pub: str | None, sub: str | None, sets: list, verbose: bool,
             tower_timeout_ms: int, metrics_port: int | None, metrics_address: str) -> None:
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
    from .postgres import CdcError, PostgresCapture, PostgresSource

    config = load_config(
        config_path, sets,
        {"beacon/pub_address": ("--pub", pub), "beacon/sub_address": ("--sub", sub),
         "producer/min_acks": ("--min-acks", min_acks)},
        verbose_keys=("producer/verbose", "beacon/verbose"), verbose=verbose,
    )
    setup_logging(verbose)
    stop = stop_event_on_signals()
    collector = serve_metrics(metrics_port, metrics_address)
    try:
        source = PostgresSource(dsn, list(tables), topic, name=name or "", slot=slot or "",
                                publication=publication or "", topic_per_table=topic_per_table, state_dir=state_dir,
                                bootstrap=not no_bootstrap)
        capture = PostgresCapture(source, config)
    except CdcError as exc:
        say(str(exc))
        sys.exit(EXIT_FAILURE)
    stop.callbacks.append(capture.stop)
    signal.signal(signal.SIGUSR1, lambda signum, frame: capture.request_snapshot())
    if collector is not None:
        collector.add(capture)
    say(f"capturing {', '.join(source.tables)} into {topic} (slot {source.slot}, publication {source.publication})")
    try:
        capture.run()
    except CdcError as exc:
        say(str(exc))
        sys.exit(EXIT_FAILURE)
    except Exception as exc:  # a ResumeError, a store gone for close_timeout...: one line, exit 1
        say(f"{type(exc).__name__}: {exc}")
        log.debug("cdc failed", exc_info=True)
        sys.exit(EXIT_FAILURE)
    stats = capture.stats
    say(f"stopped: {stats.snapshot_rows} rows bootstrapped, {stats.changes} changes in {stats.transactions} "
        f"transactions, confirmed LSN {stats.confirmed_lsn}")
