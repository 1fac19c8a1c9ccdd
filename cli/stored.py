"""``dafka_stored`` (and ``dafka store``): run a store until SIGINT/SIGTERM.

Drop-in for the reference's tool (``-c``, ``--pub``, ``--sub``,
``--verbose``), plus ``--db PATH`` and retention flags.  The first
SIGINT/SIGTERM writes what is pending, closes LevelDB and exits 0; a second
one exits at once.
"""

from __future__ import annotations

import logging
import os
import sys

import click

from dafka.config import ConfigError

from .common import (
    CONTEXT_SETTINGS,
    EXIT_FAILURE,
    TowerWatch,
    common_options,
    serve_metrics,
    load_config,
    say,
    setup_logging,
    stop_event_on_signals,
)

log = logging.getLogger("dafka.cli.stored")

STOP_TIMEOUT = 5.0  # seconds the clean shutdown may take


@click.command("dafka_stored", context_settings=CONTEXT_SETTINGS)
@click.option("--db", metavar="PATH", help="LevelDB directory (store/db, default ./storedb).")
@click.option("--retention-ms", type=click.IntRange(min=-1), metavar="MS",
              help="Delete records older than this (store/retention/ms; -1 = keep forever).")
@click.option("--retention-bytes", type=click.IntRange(min=-1), metavar="BYTES",
              help="Keep at most this many bytes per partition (store/retention/bytes; -1 = unlimited).")
@click.option("--sync/--no-sync", default=None, help="fsync every write (store/sync).")
@click.option("--replicas", type=click.IntRange(min=0, max=255), metavar="R",
              help="Sharded stores: each partition lives on R stores, placed automatically over the stores "
                   "alive, and moved when stores come and go (store/replicas; 0 = every store holds "
                   "everything).")
@click.option("--rack", metavar="NAME",
              help="With --replicas: this store's rack or zone; a partition's replicas go to different racks "
                   "(store/rack).")
@common_options(
    pub_help="The tower's XPUB: beacon/pub_address (default tcp://127.0.0.1:5557).",
    sub_help="The tower's XSUB: beacon/sub_address (default tcp://127.0.0.1:5556).",
    metrics=True,
)
def main(db: str | None, retention_ms: int | None, retention_bytes: int | None, sync: bool | None,
         replicas: int | None, rack: str | None, config_path: str | None, pub: str | None, sub: str | None,
         sets: list, verbose: bool, tower_timeout_ms: int, metrics_port: int | None, metrics_address: str) -> None:
    """Run a Dafka store: persist every record of every topic to LevelDB,
    acknowledge it to its producer, and serve replay to consumers.  Runs until
    SIGINT or SIGTERM.

    \b
    Examples:
      dafka_stored --db /var/lib/dafka/storedb --retention-ms 604800000
      dafka_stored --db /data/s1 --replicas 2 --rack eu-west-1a   # sharded: each partition on 2 stores
    """
    config = load_config(
        config_path, sets,
        {"beacon/pub_address": ("--pub", pub), "beacon/sub_address": ("--sub", sub),
         "store/db": ("--db", db), "store/retention/ms": ("--retention-ms", retention_ms),
         "store/retention/bytes": ("--retention-bytes", retention_bytes), "store/sync": ("--sync", sync),
         "store/replicas": ("--replicas", replicas), "store/rack": ("--rack", rack)},
        verbose_keys=("store/verbose", "beacon/verbose"), verbose=verbose,
    )
    setup_logging(verbose or bool(config["store/verbose"]))
    stop = stop_event_on_signals()
    collector = serve_metrics(metrics_port, metrics_address)
    from dafka.store import Store, StoreError, StoreLocked

    path = config["store/db"]
    try:
        store = Store(config, db=path)
    except StoreLocked:
        say(f"the database {os.path.abspath(path)} is in use by another store; stopping")
        sys.exit(EXIT_FAILURE)
    except (StoreError, OSError) as exc:
        say(f"cannot open the database {os.path.abspath(path)}: {exc}")
        sys.exit(EXIT_FAILURE)
    except ConfigError as exc:  # settings that contradict each other (store/dead_ms against beacon/timeout...)
        raise click.UsageError(str(exc)) from None
    stop.callbacks.append(store.request_stop)
    if collector is not None:
        collector.add(store)
    if stop.is_set():  # signalled while the database was opening
        store.stop(STOP_TIMEOUT)
        return
    store.start()
    say(f"storing in {os.path.abspath(path)}; writer {store.writer_address}, reader {store.reader_address}")
    if config["store/replicas"]:
        rack = config["store/rack"]
        say(f"sharded: store {store.store_id}{f' in rack {rack}' if rack else ''}, each partition on "
            f"{config['store/replicas']} stores")
    watch = TowerWatch(lambda: store.connected, config["beacon/pub_address"], tower_timeout_ms).start()
    try:
        # Serves until request_stop() (our signal handler) or until a store
        # thread dies; then stops: pending writes, LevelDB closed, threads joined.
        store.run_forever(install_signal_handlers=False)
    except StoreError as exc:
        say(f"{exc}; stopped")
        sys.exit(EXIT_FAILURE)
    finally:
        watch.cancel()
        store.stop(STOP_TIMEOUT)
    log.info("store stopped: %s", store.stats())


if __name__ == "__main__":  # pragma: no cover
    main()
