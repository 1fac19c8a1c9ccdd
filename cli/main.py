"""The umbrella ``dafka`` command."""

from __future__ import annotations

import click

from .demo import demo


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """dafka: brokerless Kafka-style streaming on ZeroMQ (RFC 46/Dafka)."""


main.add_command(demo)
