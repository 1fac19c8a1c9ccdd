"""The asyncio API (dafka.aio), in aiokafka's shape: send and await acks,
read with ``async for``.

    python examples/asyncio_app.py
"""

from __future__ import annotations

import asyncio
import json

from local_cluster import local_cluster

from dafka.aio import AsyncConsumer, AsyncProducer


async def run(config: dict[str, object]) -> None:
    async with AsyncProducer("orders", config, value_serializer=lambda order: json.dumps(order).encode()) as producer:
        futures = [await producer.send({"id": i, "total": 10 * i}) for i in range(5)]
        acked = await asyncio.gather(*futures)  # each is done once a store has acked it
        print("acked offsets:", [metadata.offset for metadata in acked])
    consumer_config = dict(config, **{"consumer/offset/reset": "earliest"})
    async with AsyncConsumer("orders", config=consumer_config, value_deserializer=json.loads) as consumer:
        total = 0
        async for record in consumer:
            print(record.offset, record.value)
            total += record.value["total"]
            if record.offset == 4:
                break
    assert total == 100, total


def main() -> None:
    with local_cluster() as config:
        asyncio.run(run(config))


if __name__ == "__main__":
    main()
