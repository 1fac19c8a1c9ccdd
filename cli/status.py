"""``dafka status``: who is alive, and the heads of every topic and partition
(the survey itself is :mod:`dafka.discovery.survey`).

What ``kafka-topics --describe`` and consumer-lag views give Kafka users, got
the Dafka way: the tool joins the mesh for a moment as a consumer peer, and
after ``--wait-ms`` prints the peers and a table: topic, partition, store head
(highest over the stores), the last HEAD of the live producer, and, for a
partition a mirror copied in from another site, that site (read from the
site's provenance topic, rfc/mirror.md).

With ``--groups`` it also subscribes ``J`` (every consumer group's
GROUP-MEMBER heartbeat, rfc section 14), which members answer at once, and
prints each group's members and the partitions each reads instead; and it
asks every peer for its PEER-INFO (rfc section 17), in which a Kafka gateway
describes the Kafka groups it coordinates (their state, members, commits and
lag), printed after dafka's own.
"""

from __future__ import annotations

import json
import sys
import threading

import click

from dafka.mirror.provenance import read_site
from dafka.discovery.survey import StatusPeer, Survey

from .common import (
    CONTEXT_SETTINGS,
    EXIT_FAILURE,
    common_options,
    load_config,
    say,
    setup_logging,
    table,
)


@click.command("status", context_settings=CONTEXT_SETTINGS)
@click.option("-t", "--topic", metavar="TOPIC", help="Only this topic (default: every topic).")
@click.option("--wait-ms", type=click.IntRange(min=1), default=1000, show_default=True, metavar="MS",
              help="How long to collect answers once the tower answered.")
@click.option("-J", "--json", "as_json", is_flag=True, help="One JSON document instead of tables.")
@click.option("--groups", is_flag=True,
              help="Show the consumer groups instead: each group's live members, the topics they read, and the "
                   "partitions each member reads with the offset it last committed; and the Kafka groups of "
                   "the Kafka gateways (dafka kafka), with their state, members, commits and lag.")
@common_options(
    pub_help="The tower's XPUB: beacon/pub_address (default tcp://127.0.0.1:5557).",
    sub_help="The tower's XSUB: beacon/sub_address (default tcp://127.0.0.1:5556).",
)
def status(topic: str | None, wait_ms: int, as_json: bool, groups: bool, config_path: str | None, pub: str | None,
           sub: str | None, sets: list, verbose: bool, tower_timeout_ms: int) -> None:
    """Show the live peers (from the tower) and, per topic and partition,
    the stores' head and the last HEAD of the live producer; with --groups,
    the consumer groups' members and who reads which partition, and the
    Kafka groups that Kafka gateways coordinate, with their lag.

    \b
    Examples:
      dafka status --pub tcp://127.0.0.1:5557 --sub tcp://127.0.0.1:5556
      dafka status --groups
    """
    config = load_config(
        config_path, sets,
        {"beacon/pub_address": ("--pub", pub), "beacon/sub_address": ("--sub", sub)},
        verbose_keys=("beacon/verbose",), verbose=verbose,
    )
    setup_logging(verbose)
    tower = config["beacon/pub_address"]
    peer = StatusPeer(config, topic, groups)
    mirrored: dict = {}
    reader = None
    try:
        peer.start()
        if not peer.wait_connected(tower_timeout_ms / 1000.0):
            say(f"no tower answers at {tower} (after {tower_timeout_ms} ms)")
            sys.exit(EXIT_FAILURE)
        if not groups:  # which partitions a mirror copied in, read meanwhile from the site's provenance topic
            reader = threading.Thread(target=lambda: mirrored.update(read_site(config, wait_ms / 1000.0)),
                                      name="dafka-status-provenance", daemon=True)
            reader.start()
        peer.run(wait_ms / 1000.0)
        if reader is not None:
            reader.join(5)
    except KeyboardInterrupt:
        sys.exit(130)
    finally:
        peer.close()
    survey = peer.survey
    if groups:
        _print_groups(survey, as_json, topic)
        return
    partitions = survey.partition_rows()
    for row in partitions:
        provenance = mirrored.get((row["topic"], row["partition"]))
        row["mirrored_from"] = provenance.source if provenance else None
    if as_json:
        click.echo(json.dumps({
            "tower": tower,
            "address": survey.address,
            "peers": survey.peer_rows(),
            "partitions": partitions,
        }, indent=2))
        return
    peers = survey.peer_rows()
    click.echo(f"tower {tower}: {len(peers)} live peer{'s' if len(peers) != 1 else ''}")
    if peers:
        for line in table(["ROLE", "ADDRESS", "ENDPOINT"], [[p["role"], p["address"], p["endpoint"]] for p in peers]):
            click.echo("  " + line)
        if any(p["role"] == "?" for p in peers):
            click.echo("  (? = did not connect within --wait-ms: probably gone; the tower "
                       "forgets a peer beacon/timeout after its last beacon)")
    click.echo()
    if not partitions:
        click.echo("no partitions" + (f" of topic {topic}" if topic else "") + " known to the stores or live producers")
        return

    def cell(value: int | None) -> str:
        return "-" if value is None else str(value)

    rows = [[p["topic"], p["partition"], cell(p["store_head"]), cell(p["producer_head"]), str(len(p["stores"])),
             p["mirrored_from"] or "-"] for p in partitions]
    header = ["TOPIC", "PARTITION", "STORE HEAD", "PRODUCER HEAD", "STORES", "MIRRORED FROM"]
    if any("owners" in p for p in partitions):  # sharded stores (rfc 16): who should hold each partition
        header[5:5] = ["OWNERS", "UNDER-REPLICATED"]
        for row, p in zip(rows, partitions):
            row[5:5] = [",".join(store[:8] for store in p.get("owners", ())) or "-",
                        "yes" if p.get("under_replicated") else "-"]
    for line in table(header, rows):
        click.echo(line)


def _print_groups(survey: Survey, as_json: bool, topic: str | None) -> None:
    rows = [r for r in survey.group_rows() if topic is None or topic in r["topics"]]
    kafka_rows = [r for r in survey.kafka_group_rows()
                  if topic is None or any(p["topic"] == topic for p in r["partitions"])]
    if as_json:
        click.echo(json.dumps({"groups": rows, "kafka_groups": kafka_rows}, indent=2))
        return
    if not rows and not kafka_rows:
        click.echo("no consumer group has a live member" + (f" reading topic {topic}" if topic else ""))
        return
    if rows:
        _print_dafka_groups(rows)
    if kafka_rows:
        if rows:
            click.echo("")
        _print_kafka_groups(kafka_rows)


def _print_kafka_groups(rows: list[dict]) -> None:
    """The Kafka groups of the gateways (``dafka kafka``): one line a partition, its commit and lag."""
    lines = []
    for r in rows:
        for part in r["partitions"] or [None]:
            lines.append([r["group"], r["gateway"], r["state"], str(r["members"]),
                          "-" if part is None else f"{part['topic']}/{part['partition']}",
                          "-" if part is None else str(part["committed"]),
                          str(r["lag"]) if part is None else str(part["lag"])])
    for line in table(["KAFKA GROUP", "GATEWAY", "STATE", "MEMBERS", "PARTITION", "COMMITTED", "LAG"], lines):
        click.echo(line)


def _print_dafka_groups(rows: list[dict]) -> None:
    lines = []
    for r in rows:
        parts = r["partitions"] or [None]
        for part in parts:
            committed = "-" if part is None or part["committed"] is None else str(part["committed"])
            lines.append([r["group"], r["member"], ",".join(r["topics"]),
                          "-" if part is None else f"{part['topic']}/{part['partition']}", committed])
    for line in table(["GROUP", "MEMBER", "TOPICS", "PARTITION", "COMMITTED"], lines):
        click.echo(line)
