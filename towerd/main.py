"""``dafka_towerd`` (and ``dafka tower``): run a tower until SIGINT/SIGTERM.

Drop-in for the reference's tool: ``-c FILE``, ``--pub ADDR`` (sets
``tower/pub_address``), ``--sub ADDR`` (sets ``tower/sub_address``),
``--verbose``.  On start it says on stderr where it listens, e.g.::

    dafka_towerd: beacons in tcp://127.0.0.1:5556, out tcp://127.0.0.1:5557

which also gives the ports chosen for ephemeral binds (``tcp://127.0.0.1:*``).
The first SIGINT/SIGTERM stops it cleanly (exit 0); a second one exits at once.
"""

from __future__ import annotations

import errno
import logging
import sys
import time

import click
import zmq

from dafka.cli.common import (
    CONTEXT_SETTINGS,
    EXIT_FAILURE,
    common_options,
    serve_metrics,
    load_config,
    say,
    setup_logging,
    stop_event_on_signals,
)
from dafka.towerd.tower import Tower

log = logging.getLogger("dafka.towerd")

_PEER_CHECK = 0.25  # seconds between looks at the live peers (logged with --verbose)


@click.command("dafka_towerd", context_settings=CONTEXT_SETTINGS)
@common_options(
    pub_help="Where beacons go out: tower/pub_address (default tcp://*:5557).",
    sub_help="Where beacons come in: tower/sub_address (default tcp://*:5556).",
    tower_timeout=False,
    metrics=True,
)
def main(config_path: str | None, pub: str | None, sub: str | None, sets: list, verbose: bool,
         metrics_port: int | None, metrics_address: str) -> None:
    """Run a Dafka tower: peers find each other through it (no record
    passes through it).  Runs until SIGINT or SIGTERM.

    \b
    Example:
      dafka_towerd --pub tcp://127.0.0.1:5557 --sub tcp://127.0.0.1:5556
    """
    config = load_config(
        config_path, sets,
        {"tower/pub_address": ("--pub", pub), "tower/sub_address": ("--sub", sub)},
        verbose_keys=("tower/verbose",), verbose=verbose,
    )
    setup_logging(verbose or bool(config["tower/verbose"]))
    stop = stop_event_on_signals()
    collector = serve_metrics(metrics_port, metrics_address)
    try:
        tower = Tower(config)
    except zmq.ZMQError as exc:
        if exc.errno in (errno.EINVAL, errno.EPROTONOSUPPORT, errno.ENODEV):  # a malformed address: usage
            raise click.UsageError(f"cannot bind tower/sub_address={config['tower/sub_address']} and "
                                   f"tower/pub_address={config['tower/pub_address']}: {exc}") from None
        say(f"cannot bind tower/sub_address={config['tower/sub_address']} and "
            f"tower/pub_address={config['tower/pub_address']}: {exc.strerror}")
        sys.exit(EXIT_FAILURE)
    say(f"beacons in {tower.sub_endpoint}, out {tower.pub_endpoint}")
    if collector is not None:
        collector.add(tower)
    tower.start()
    known: dict[str, str] = {}
    watch = log.isEnabledFor(logging.INFO)  # without --verbose nothing wakes while all is quiet
    try:
        while not stop.wait(_PEER_CHECK if watch else None):
            known = _log_peers(known, tower.peers())
    finally:
        started = time.monotonic()
        tower.stop()
        log.info("tower stopped in %.3fs", time.monotonic() - started)


def _log_peers(known: dict[str, str], live: dict[str, str]) -> dict[str, str]:
    for sender, endpoint in live.items():
        if known.get(sender) != endpoint:
            log.info("peer %s at %s", sender, endpoint)
    for sender, endpoint in known.items():
        if sender not in live:
            log.info("peer %s at %s expired", sender, endpoint)
    return live


if __name__ == "__main__":  # pragma: no cover
    main()
