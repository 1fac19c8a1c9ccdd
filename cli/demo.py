"""``dafka demo``: a whole cluster on loopback in one process, records flowing."""

from __future__ import annotations

import tempfile
import time

import click

from dafka import Consumer, Producer
from dafka.config import Config
from dafka.towerd.tower import Tower


def _loopback(tower: Tower | None = None, **extra: object) -> Config:
    values: dict[str, object] = {
        "tower/sub_address": "tcp://127.0.0.1:*",
        "tower/pub_address": "tcp://127.0.0.1:*",
        "beacon/address": "127.0.0.1",
        "beacon/bind_address": "127.0.0.1",
    }
    if tower is not None:
        values["beacon/sub_address"] = tower.sub_endpoint
        values["beacon/pub_address"] = tower.pub_endpoint
    values.update(extra)
    return Config.load(overrides=values)


@click.command("demo")
@click.option("--records", default=10, show_default=True, help="How many records to produce.")
@click.option("--topic", default="hello", show_default=True)
def demo(records: int, topic: str) -> None:
    """Start a tower, a producer and a consumer on 127.0.0.1 (ephemeral
    ports) and show records flowing from one to the other."""
    with tempfile.TemporaryDirectory(prefix="dafka-demo-"):
        tower = Tower(_loopback()).start()
        click.echo(f"tower      beacons in {tower.sub_endpoint}, out {tower.pub_endpoint}")
        try:
            config = _loopback(tower, **{"consumer/offset/reset": "earliest", "producer/min_acks": 0})
            with Consumer(topic, config=config) as consumer, Producer(topic, config) as producer:
                click.echo(f"producer   partition {producer.address} of topic {topic!r}")
                click.echo(f"consumer   {consumer.address}, offset reset earliest")
                started = time.monotonic()
                for i in range(records):
                    producer.send(f"event {i}".encode())
                seen = 0
                while seen < records:
                    record = consumer.poll(timeout=10)
                    if record is None:
                        raise click.ClickException(f"only {seen} of {records} records arrived")
                    click.echo(f"consumed   {record.topic} {record.partition} {record.offset} {record.value.decode()}")
                    seen += 1
                click.echo(f"{records} records end to end in {time.monotonic() - started:.3f}s")
        finally:
            tower.stop()
