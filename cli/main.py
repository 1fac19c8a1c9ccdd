"""The umbrella ``dafka`` command.

``dafka tower``, ``dafka store``, ``dafka produce`` and ``dafka consume`` are
the same commands as ``dafka_towerd``, ``dafka_stored``,
``dafka_console_producer`` and ``dafka_console_consumer``; ``dafka status``,
``dafka demo``, ``dafka keygen``, ``dafka cdc``, ``dafka mirror`` and ``dafka kafka-user`` exist only here;
``dafka ui`` is also ``dafka_ui``, ``dafka kafka`` also ``dafka_kafka``.
"""

from __future__ import annotations

import click

from dafka import __version__

from dafka.cdc.cli import cdc
from dafka.kafka.cli import kafka, kafka_user
from dafka.mirror.cli import mirror
from dafka.towerd.main import main as tower
from dafka.ui.cli import ui

from .common import CONTEXT_SETTINGS
from .consumer import main as consume
from .demo import demo
from .keygen import keygen
from .producer import main as produce
from .status import status
from .stored import main as store


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from dafka.core import extensions

    click.echo(f"dafka, version {__version__}\n{extensions.summary()}")
    ctx.exit()


@click.group(context_settings=CONTEXT_SETTINGS)
@click.option("-V", "--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
              help="Show the version, and whether the compiled extensions run, and exit.")
def main() -> None:
    """dafka: brokerless Kafka-style streaming on ZeroMQ (RFC 46/Dafka).

    \b
    Quickstart (each in its own terminal):
      dafka tower
      dafka store --db storedb
      printf 'A first event\\nA second event\\n' | dafka produce hello
      dafka consume hello --from-beginning
      dafka status
    """


main.add_command(tower, "tower")
main.add_command(store, "store")
main.add_command(produce, "produce")
main.add_command(consume, "consume")
main.add_command(status, "status")
main.add_command(demo)
main.add_command(keygen)
main.add_command(cdc)
main.add_command(mirror)
main.add_command(kafka)
main.add_command(kafka_user)
main.add_command(ui)
