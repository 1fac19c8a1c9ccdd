"""User code, type-checked against the installed API (``tox -e type``):
mypy --strict must accept every line, and each ``assert_type`` states what a
type checker must infer.  A ``# type: ignore[code]`` marks a mistake the API's
types must catch: with ``warn_unused_ignores`` (part of --strict) the check
fails if the mistake stops being reported.  Never run, only checked."""

from __future__ import annotations

import asyncio
import json
from typing import Any, assert_type

import dafka
from dafka import Consumer, Producer, Record, RecordMetadata, SendHandle, TopicPartition
from dafka.aio import AsyncConsumer, AsyncProducer, SendFuture
from dafka.config import Config
from dafka.metrics import register, serve
from dafka.store import Store
from dafka.towerd.tower import Tower

CONFIG = {"beacon/address": "127.0.0.1"}


def produce_bytes() -> None:
    with Producer("weather", CONFIG) as producer:
        assert_type(producer, Producer[bytes])
        handle = producer.send(b"sunny")
        assert_type(handle, SendHandle)
        assert_type(handle.get(timeout=5), RecordMetadata)
        first = producer.send_many([b"a", b"b"], timeout=1.0)
        assert_type(first, int)
        producer.flush(timeout=10)
        producer.send("not bytes")  # type: ignore[arg-type]


def produce_with_a_serializer() -> None:
    def to_json(value: dict[str, int]) -> bytes:
        return json.dumps(value).encode()

    producer = Producer("weather", CONFIG, value_serializer=to_json)
    assert_type(producer, Producer[dict[str, int]])
    producer.send({"celsius": 21})
    producer.send(b"raw")  # type: ignore[arg-type]
    producer.close()


def consume_bytes() -> None:
    with Consumer("weather", config={"consumer/offset/reset": "earliest"}) as consumer:
        assert_type(consumer, Consumer[bytes])
        record = consumer.poll(timeout=1.0)
        assert_type(record, Record[bytes] | None)
        if record is not None:
            topic, partition, offset, value = record
            assert_type(value, bytes)
            assert_type(offset, int)
        for batch_record in consumer.consume(500, timeout=1.0):
            assert_type(batch_record.value, bytes)
        for each in consumer:
            assert_type(each, Record[bytes])
            break
        assert_type(consumer.assignment(), set[TopicPartition])


def consume_with_a_deserializer() -> None:
    consumer = Consumer("weather", config=Config.load(), value_deserializer=bytes.decode)
    assert_type(consumer, Consumer[str])
    record = consumer.poll()
    if record is not None:
        assert_type(record.value, str)
        record.value.upper()
    consumer.close()


async def asyncio_user() -> None:
    async with AsyncProducer("weather", CONFIG, value_serializer=str.encode) as producer:
        assert_type(producer, AsyncProducer[str])
        future = await producer.send("sunny")
        assert_type(future, SendFuture)
        assert_type(await future, RecordMetadata)
        assert_type(await producer.send_and_wait("rain"), RecordMetadata)
        await asyncio.gather(future)
    async with AsyncConsumer("weather", config=CONFIG, value_deserializer=json.loads) as consumer:
        assert_type(consumer, AsyncConsumer[Any])
        async for record in consumer:
            assert_type(record, Record[Any])
            break
    async with AsyncConsumer("weather", config=CONFIG) as raw_consumer:
        assert_type(raw_consumer, AsyncConsumer[bytes])
        one = await raw_consumer.getone()
        assert_type(one.value, bytes)
        batches = await raw_consumer.getmany(timeout_ms=100, max_records=10)
        assert_type(batches, dict[TopicPartition, list[Record[bytes]]])
        async for raw_record in raw_consumer:
            assert_type(raw_record.value, bytes)
            break


def operate() -> None:
    tower = Tower(Config.load(overrides=CONFIG)).start()
    with Store(CONFIG, db="/tmp/never-created") as store:
        assert_type(store.heads(), dict[tuple[str, str], int])
        register(store, tower)
        serve(0, "127.0.0.1")
    tower.stop()
    assert_type(dafka.__version__, str)
    assert_type(dafka.partition_address("cdc-orders"), str)
