"""``dafka kafka`` (``dafka_kafka``): serve the Kafka protocol in front of a dafka cluster."""

from __future__ import annotations

import asyncio
import gc
import logging
import ssl

import click

from dafka.cli.common import (
    CONTEXT_SETTINGS,
    TowerWatch,
    common_options,
    load_config,
    run_or_exit,
    say,
    serve_metrics,
    setup_logging,
    stop_event_on_signals,
)
from dafka.discovery import peer_info

from .acl import AclError, load_acl
from .sasl import MECHANISMS, PLAIN, SCRAM_SHA_256, SCRAM_SHA_512, CredentialsError, ScramCredential, Users, \
    load_users, save_users

log = logging.getLogger(__name__)

GC_YOUNG = 10_000  # allocations between two collections of the youngest generation (CPython: 700)


def tls_context(cert: str | None, key: str | None, client_ca: str | None) -> ssl.SSLContext | None:
    """The listener's TLS context (None: plaintext), or a click error that names the flag at fault."""
    if cert is None:
        for flag, given in (("--tls-key", key), ("--tls-client-ca", client_ca)):
            if given is not None:
                raise click.BadParameter(f"{flag} needs --tls-cert", param_hint="--tls-cert")
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as exc:
        raise click.BadParameter(f"cannot load the certificate {cert!r}"
                                 + (f" with the key {key!r}" if key else "") + f": {exc}",
                                 param_hint="--tls-cert/--tls-key") from None
    if client_ca is not None:
        try:
            context.load_verify_locations(client_ca)
        except (ssl.SSLError, OSError) as exc:
            raise click.BadParameter(f"cannot load the CA {client_ca!r}: {exc}", param_hint="--tls-client-ca") from None
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def _mechanisms(ctx: click.Context, param: click.Parameter, value: str) -> tuple[str, ...]:
    chosen = tuple(m.strip().upper() for m in value.split(",") if m.strip())
    unknown = [m for m in chosen if m not in MECHANISMS]
    if unknown or not chosen:
        raise click.BadParameter(f"{value!r}: mechanisms are {', '.join(MECHANISMS)} (a comma-separated list)")
    return chosen


def _host_port(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[str, int] | None:
    if value is None:
        return None
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise click.BadParameter(f"{value!r} is not HOST:PORT (e.g. kafka.example.com:9092)")
    return host, int(port)


@click.command("kafka", context_settings=CONTEXT_SETTINGS)
@click.option("--port", type=click.IntRange(0, 65535), default=9092, show_default=True,
              help="The port Kafka clients connect to (0: any free one, said on stderr).")
@click.option("--address", default="127.0.0.1", show_default=True, metavar="ADDRESS",
              help="The interface to listen on (0.0.0.0: every one; without --tls-cert, a warning).")
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False), metavar="PEM",
              help="Serve Kafka over TLS with this certificate chain (Kafka's SSL listener; clients set "
                   "security.protocol=ssl and trust its CA with ssl.ca.location).")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False), metavar="PEM",
              help="The certificate's private key (default: in the --tls-cert file).")
@click.option("--tls-client-ca", type=click.Path(exists=True, dir_okay=False), metavar="PEM",
              help="Require a client certificate signed by this CA (Kafka's ssl.client.auth=required).")
@click.option("--sasl-users", type=click.Path(dir_okay=False), metavar="FILE",
              help="Require SASL against this credentials file (dafka kafka-user add writes it): clients set "
                   "security.protocol=sasl_ssl (or sasl_plaintext), sasl.mechanism and their user and password.")
@click.option("--sasl-mechanisms", callback=_mechanisms, default=",".join(MECHANISMS), show_default=True,
              metavar="LIST", help="The SASL mechanisms offered with --sasl-users (PLAIN sends the password itself: "
                                   "over TLS only, or a warning).")
@click.option("--acl", "acl_path", type=click.Path(dir_okay=False), metavar="FILE",
              help="What each principal may do: lines of PRINCIPAL OPERATIONS RESOURCE NAME (e.g. 'alice "
                   "read,write topic orders'); whatever no line allows is denied. docs/kafka.md has the format.")
@click.option("--advertise", callback=_host_port, metavar="HOST:PORT",
              help="What Metadata tells clients to connect to (default: --address and --port).")
@click.option("--node-id", type=click.IntRange(min=0, max=2 ** 31 - 1), default=1, show_default=True, metavar="N",
              help="This gateway's broker id (Kafka's node.id). Several gateways of one cluster find each other "
                   "and share the partitions and groups: give each its own id; one already live stops the second.")
@click.option("--num-partitions", type=click.IntRange(min=1), default=1, show_default=True, metavar="N",
              help="Partitions of a topic created by its first produce or Metadata (Kafka's num.partitions).")
@click.option("--no-auto-create", is_flag=True,
              help="Answer UNKNOWN_TOPIC_OR_PARTITION for a topic that does not exist, instead of creating it "
                   "(Kafka's auto.create.topics.enable=false).")
@click.option("--max-request-bytes", type=click.IntRange(min=1024), default=100 * 1024 * 1024, show_default=True,
              metavar="BYTES", help="The largest request accepted (Kafka's socket.request.max.bytes); a larger "
                                    "one closes its connection.")
@click.option("--initial-rebalance-delay-ms", type=click.IntRange(min=0), default=3000, show_default=True,
              metavar="MS", help="How long an empty group's first rebalance waits for more members (Kafka's "
                                 "group.initial.rebalance.delay.ms): members that start together share the first "
                                 "generation.")
@click.option("--survey-interval-ms", type=click.IntRange(min=0), default=5000, show_default=True, metavar="MS",
              help="How often the gateway surveys the cluster for new topics, and for partitions that dafka "
                   "producers start (which Kafka consumers read once their metadata is refreshed); 0: only once, "
                   "when a request first names a topic (and for a Metadata of every topic, at start).")
@common_options(pub_help="The tower's XPUB (beacon/pub_address).", sub_help="The tower's XSUB (beacon/sub_address).",
                metrics=True)
def kafka(port: int, address: str, tls_cert: str | None, tls_key: str | None, tls_client_ca: str | None,
          sasl_users: str | None, sasl_mechanisms: tuple[str, ...], acl_path: str | None,
          advertise: tuple[str, int] | None, node_id: int, num_partitions: int, no_auto_create: bool,
          max_request_bytes: int, initial_rebalance_delay_ms: int, survey_interval_ms: int,
          config_path: str | None, pub: str | None,
          sub: str | None, sets: list[tuple[str, str]],
          verbose: bool, tower_timeout_ms: int, metrics_port: int | None, metrics_address: str) -> None:
    """Serve the Kafka protocol: Kafka clients (librdkafka and kcat,
    confluent-kafka, kafka-python, aiokafka...) produce to and fetch from the
    dafka cluster through this gateway, which joins it as a peer.

    A Kafka topic is a dafka topic. Kafka partition N of topic T is the dafka
    partition named kafka:T:N (dafka.partition_address), which the gateway
    produces as a resumed producer: offsets go on across restarts. Offsets
    are dafka offsets, keys dafka keys. acks=all waits for producer/min_acks
    stores. Partitions that dafka producers write follow, at numbers kept in
    the cluster: Kafka consumers read them, Kafka producers cannot write
    their topic. docs/kafka.md has the mapping and what each client can do.

    Several gateways (each its own --node-id) serve one cluster: clients
    bootstrap with them all, each partition and group is led by one live
    gateway, and the others take over what a lost one led.

    \b
    Examples:
      dafka kafka --pub tcp://127.0.0.1:5557 --sub tcp://127.0.0.1:5556
      kcat -b 127.0.0.1:9092 -L
      echo hello | kcat -b 127.0.0.1:9092 -P -t greetings
      kcat -b 127.0.0.1:9092 -C -t greetings -e
      dafka kafka --port 9093 --node-id 2 --pub ... --sub ...   (a second one)
    """
    from .server import KafkaGateway

    config = load_config(config_path, sets, {"beacon/pub_address": ("--pub", pub),
                                             "beacon/sub_address": ("--sub", sub)},
                         verbose_keys=("beacon/verbose",), verbose=verbose)
    setup_logging(verbose)
    tls = tls_context(tls_cert, tls_key, tls_client_ca)
    users = None
    if sasl_users is not None:
        try:
            users = load_users(sasl_users)
        except CredentialsError as exc:
            raise click.BadParameter(str(exc), param_hint="--sasl-users") from None
        if tls is None and PLAIN in sasl_mechanisms:
            log.warning("SASL/PLAIN without TLS: passwords cross the network in clear (add --tls-cert, or "
                        "--sasl-mechanisms SCRAM-SHA-512,SCRAM-SHA-256)")
    acl = None
    if acl_path is not None:
        try:
            acl = load_acl(acl_path)
        except AclError as exc:
            raise click.BadParameter(str(exc), param_hint="--acl") from None
        if users is None:
            log.warning("--acl without --sasl-users: every client is ANONYMOUS, and only its lines apply")
    if address not in ("127.0.0.1", "localhost", "::1"):
        if tls is None and users is None:
            log.warning("serving Kafka on %s without TLS or SASL: anyone who reaches it can read and write", address)
        elif tls is None:
            log.warning("serving Kafka on %s without TLS: what clients read and write crosses the network in clear",
                        address)
        elif tls_client_ca is None and users is None:
            log.warning("serving Kafka on %s over TLS without client certificates or SASL: anyone who reaches it "
                        "can read and write", address)
    stop = stop_event_on_signals()
    watch = TowerWatch(lambda: gateway.tower_reached, config["beacon/pub_address"], tower_timeout_ms)
    collector = serve_metrics(metrics_port, metrics_address)
    gateway = KafkaGateway(config, address=address, port=port, advertise=advertise, num_partitions=num_partitions,
                           auto_create=not no_auto_create, max_request_bytes=max_request_bytes,
                           initial_rebalance_delay=initial_rebalance_delay_ms / 1000.0,
                           survey_interval=survey_interval_ms / 1000.0, tls=tls, users=users,
                           sasl_mechanisms=sasl_mechanisms, acl=acl, node_id=node_id)

    async def main() -> None:
        try:
            await gateway.start()
        except OSError as exc:
            raise click.ClickException(f"cannot listen on {address}:{port}: {exc.strerror or exc}") from None
        if collector is not None:
            collector.add(gateway)
        peer_info.set_application("kafka", gateway.describe)
        # What the start made (modules, config, the loops) is left out of every collection from now on, and
        # the youngest generation is collected every GC_YOUNG allocations, not 700: a gateway holds a record
        # or two a record in flight (a held record's attributes, a fetch's row), and with CPython's defaults
        # the collector took a third of its CPU (A/B, 200,000 records of 100 B: produce 2.1 -> 1.35 us a
        # record, fetch 4.4 -> 2.5 us; docs/benchmarks.md).
        gc.freeze()
        gc.set_threshold(GC_YOUNG, 10, 10)
        say(f"serving Kafka on {gateway.address}:{gateway.port}" + (" over TLS" if tls is not None else "")
            + (f" with SASL ({', '.join(sasl_mechanisms)})" if users is not None else ""))
        watch.start()
        done = asyncio.Event()
        loop = asyncio.get_running_loop()
        stop.callbacks.append(lambda: loop.call_soon_threadsafe(done.set))  # type: ignore[attr-defined]
        if stop.is_set():
            done.set()
        failed = asyncio.ensure_future(gateway.failed.wait())
        await asyncio.wait([asyncio.ensure_future(done.wait()), failed], return_when=asyncio.FIRST_COMPLETED)
        await gateway.close()
        if gateway.failure is not None:
            raise click.ClickException(gateway.failure)

    try:
        run_or_exit(lambda: asyncio.run(main()), "kafka gateway")
    finally:
        watch.cancel()
    say(f"stopped: {gateway.counters.requests} requests, {gateway.counters.records_in} records in, "
        f"{gateway.counters.records_out} out")


@click.group("kafka-user", context_settings=CONTEXT_SETTINGS)
def kafka_user() -> None:
    """Manage the SASL users of `dafka kafka --sasl-users FILE`.

    The file keeps each password salted and hashed for SCRAM-SHA-256 and
    SCRAM-SHA-512 (RFC 5802: salt, iterations, stored and server keys, as
    Kafka keeps them), never in clear; PLAIN logins are checked against it
    too. A running gateway reads it at start.

    \b
    Examples:
      dafka kafka-user add alice --file users.json      (asks for the password)
      printf 's3cret' | dafka kafka-user add bob --file users.json --password-stdin
      dafka kafka-user list --file users.json
      dafka kafka-user remove bob --file users.json
    """


_FILE = click.option("--file", "path", required=True, type=click.Path(dir_okay=False), metavar="FILE",
                     help="The credentials file (made if missing, readable by its owner alone).")


def _existing(path: str, missing_ok: bool) -> Users:
    import os

    if missing_ok and not os.path.exists(path):
        return {}
    try:
        return load_users(path)
    except CredentialsError as exc:
        raise click.BadParameter(str(exc), param_hint="--file") from None


@kafka_user.command("add", context_settings=CONTEXT_SETTINGS)
@click.argument("name")
@_FILE
@click.option("--password-stdin", is_flag=True, help="Read the password from stdin (its first line) instead of asking.")
@click.option("--iterations", type=click.IntRange(min=4096), default=4096, show_default=True,
              help="PBKDF2 iterations of the salted password (Kafka's default and floor: 4096).")
def kafka_user_add(name: str, path: str, password_stdin: bool, iterations: int) -> None:
    """Add user NAME, or give it a new password."""
    import sys

    if not name or any(c in name for c in ",=\0") or name != name.strip():
        raise click.BadParameter(f"{name!r}: a user name without ',', '=', NUL or surrounding spaces",
                                 param_hint="NAME")
    if password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = click.prompt("Password", hide_input=True, confirmation_prompt=True)
    if not password:
        raise click.BadParameter("an empty password", param_hint="--password-stdin")
    users = _existing(path, missing_ok=True)
    users[name] = {m: ScramCredential.make(m, password, iterations) for m in (SCRAM_SHA_256, SCRAM_SHA_512)}
    save_users(path, users)
    say(f"{name}: SCRAM-SHA-256 and SCRAM-SHA-512 credentials in {path}")


@kafka_user.command("remove", context_settings=CONTEXT_SETTINGS)
@click.argument("name")
@_FILE
def kafka_user_remove(name: str, path: str) -> None:
    """Remove user NAME."""
    users = _existing(path, missing_ok=False)
    if users.pop(name, None) is None:
        raise click.BadParameter(f"no user {name!r} in {path}", param_hint="NAME")
    save_users(path, users)
    say(f"{name}: removed from {path}")


@kafka_user.command("list", context_settings=CONTEXT_SETTINGS)
@_FILE
def kafka_user_list(path: str) -> None:
    """The users and their mechanisms, one a line."""
    for name, entries in sorted(_existing(path, missing_ok=False).items()):
        click.echo(f"{name}\t{','.join(sorted(entries))}")


def main() -> None:
    kafka(prog_name="dafka_kafka")
