"""``dafka mirror``: copy topics from one site into another, partitions and offsets kept."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import click

from dafka.config import ConfigError
from dafka.cli.common import (
    CONTEXT_SETTINGS,
    EXIT_FAILURE,
    config_reason,
    parse_sets,
    load_config,
    run_or_exit,
    say,
    serve_metrics,
    setup_logging,
    stop_event_on_signals,
)



def _sides(f: Callable) -> Callable:
    """--source-pub/-sub/-config/-set and the same for --target-."""
    for side in ("target", "source"):
        for option in reversed(_side_options(side)):
            f = option(f)
    return f


def _side_options(side: str) -> list:
    other = "target" if side == "source" else "source"
    letter = "S" if side == "source" else "T"
    return [
        click.option(f"--{side}-pub", f"{side}_pub", required=True, metavar="ADDR",
                     help=f"The {side} site's tower XPUB (its beacon/pub_address)."),
        click.option(f"--{side}-sub", f"{side}_sub", required=True, metavar="ADDR",
                     help=f"The {side} site's tower XSUB (its beacon/sub_address)."),
        click.option(f"--{side}-config", f"{side}_config", metavar="FILE",
                     help=f"Config file (ZPL) of the {side} side: its beacon, CURVE keys, producer/min_acks..."),
        click.option(f"-{letter}", f"--{side}-set", f"{side}_sets", metavar="KEY=VALUE", multiple=True,
                     callback=parse_sets,
                     help=f"Set a config key of the {side} side only (repeatable; -X sets both, "
                          f"-{'T' if letter == 'S' else 'S'} the {other})."),
    ]


@click.command("mirror", context_settings=CONTEXT_SETTINGS)
@_sides
@click.option("-t", "--topic", "topics", multiple=True, metavar="TOPIC", help="A topic to mirror (repeatable).")
@click.option("--prefix", "prefixes", multiple=True, metavar="PREFIX",
              help="Mirror every topic whose name starts with PREFIX (repeatable), found as they appear.")
@click.option("--all", "every", is_flag=True,
              help="Mirror every topic of the source (the consumer groups' __dafka_offsets.GROUP included).")
@click.option("--name", metavar="NAME",
              help="The mirror's name (default: SOURCE-PUB->TARGET-PUB). Keep it across restarts: the partition "
                   "that records what this mirror owns in the target derives from it.")
@click.option("--source-site", metavar="NAME", help="The source's name in the provenance records and in "
              "`dafka status` of the target (default: --source-pub).")
@click.option("--min-acks", type=click.IntRange(min=1), metavar="N",
              help="Target stores that must ack a copied record before it counts as mirrored "
                   "(the target's producer/min_acks).")
@click.option("--conflict-grace-ms", type=click.IntRange(min=0), default=10_000, show_default=True, metavar="MS",
              help="How long a partition that the target holds from another writer waits for the source to "
                   "show it is a copy (a loop, skipped quietly) before it is reported as a conflict.")
@click.option("--scan-interval-ms", type=click.IntRange(min=10), default=2000, show_default=True, metavar="MS",
              help="With --prefix or --all: how often to look for new topics in the source.")
@click.option("-X", "--set", "sets", metavar="KEY=VALUE", multiple=True, callback=parse_sets,
              help="Set a config key on both sides (repeatable), e.g. -X beacon/address=127.0.0.1.")
@click.option("--tower-timeout-ms", type=click.IntRange(min=0), default=10_000, show_default=True, metavar="MS",
              help="Give up (exit 1) when a site's tower has not answered after this long.")
@click.option("--metrics-port", type=click.IntRange(1, 65535), metavar="PORT",
              help="Serve Prometheus metrics at http://ADDRESS:PORT/metrics (dafka_mirror_... and the source "
                   "consumer's; README lists them).")
@click.option("--metrics-address", default="127.0.0.1", show_default=True, metavar="ADDRESS",
              help="The interface --metrics-port listens on.")
@click.option("-v", "--verbose", is_flag=True, help="Debug logging on stderr.")
def mirror(topics: tuple[str, ...], prefixes: tuple[str, ...], every: bool, name: str | None,
           source_site: str | None, min_acks: int | None, conflict_grace_ms: int, scan_interval_ms: int,
           sets: list, tower_timeout_ms: int, metrics_port: int | None, metrics_address: str, verbose: bool,
           **sides: Any) -> None:
    """Copy topics from the SOURCE site into the TARGET site: every partition
    keeps its address, every record its offset, so a consumer's offsets file
    and a group's commits mean the same in both sites, and consumers fail
    over with no offset translation.

    A record counts as mirrored once --min-acks target stores acked it. After
    a restart (same --name, kill -9 included) the mirror asks the target
    stores for each partition's head and goes on from head + 1: nothing lost,
    nothing twice. A partition that the target already holds from another
    writer is never written: a copy of the target's own partition (mirroring
    both ways) is skipped, anything else is reported as a conflict (log line,
    dafka_mirror_conflicts_total). Runs until SIGINT or SIGTERM.

    \b
    Examples:
      dafka mirror --source-pub tcp://a:5557 --source-sub tcp://a:5556 \\
                   --target-pub tcp://b:5557 --target-sub tcp://b:5556 --topic orders
      dafka mirror ... --prefix shop. --min-acks 2 --name a-to-b
      dafka mirror ... --all --metrics-port 9102
    """
    from .mirror import Mirror, MirrorError
    from .state import Selection

    if not (topics or prefixes or every):
        raise click.UsageError("choose what to mirror: --topic TOPIC, --prefix PREFIX or --all")
    configs = {}
    for side in ("source", "target"):
        flags = {"beacon/pub_address": (f"--{side}-pub", sides[f"{side}_pub"]),
                 "beacon/sub_address": (f"--{side}-sub", sides[f"{side}_sub"])}
        if side == "target":
            flags["producer/min_acks"] = ("--min-acks", min_acks)
        config = load_config(sides[f"{side}_config"], sets, flags, verbose_keys=("beacon/verbose",), verbose=verbose)
        own = sides[f"{side}_sets"]
        if own:
            flag = f"'-{side[0].upper()}' / '--{side}-set'"
            try:
                # (after -X, then the dedicated flags again: they win, as with the other tools)
                config = config.with_overrides(dict(own), source=flag).with_overrides(
                    {k: v for k, (_, v) in flags.items() if v is not None}, source="flags")
            except ConfigError as exc:
                raise click.BadParameter(config_reason(exc), param_hint=flag) from None
        configs[side] = config
    setup_logging(verbose)
    stop = stop_event_on_signals()
    collector = serve_metrics(metrics_port, metrics_address)
    source_pub, target_pub = sides["source_pub"], sides["target_pub"]
    runner = Mirror(configs["source"], configs["target"], Selection(topics, prefixes, every),
                    name=name or f"{source_pub}->{target_pub}", source_site=source_site,
                    conflict_grace=conflict_grace_ms / 1000.0, scan_interval=scan_interval_ms / 1000.0,
                    tower_timeout=tower_timeout_ms / 1000.0)
    stop.callbacks.append(runner.stop)
    try:
        runner.start()
    except MirrorError as exc:
        say(str(exc))
        runner.close()
        sys.exit(EXIT_FAILURE)
    if collector is not None:
        collector.add(runner)
    what = ", ".join([*topics, *(f"{p}*" for p in prefixes)]) if not every else "every topic"
    say(f"mirroring {what} from {source_pub} to {target_pub} (name {runner.name})")
    run_or_exit(runner.run, "mirror")
    state = runner.state
    say(f"stopped: {state.copied} records copied, {runner.copying()} partition(s) copying, "
        f"{state.conflicts} conflict(s)")
