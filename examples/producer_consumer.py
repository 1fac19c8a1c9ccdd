"""Produce a few records, then read them back from the beginning.

    python examples/producer_consumer.py
"""

from __future__ import annotations

from local_cluster import local_cluster

from dafka import Consumer, Producer


def main() -> None:
    with local_cluster() as config:
        with Producer("weather", config) as producer:
            for reading in (b"sunny", b"cloudy", b"rain"):
                producer.send(reading)
            producer.flush(timeout=10)  # a store has acked every record
            partition = producer.address
        # A consumer started after the producer left: its records come from the store.
        with Consumer("weather", config=dict(config, **{"consumer/offset/reset": "earliest"}),
                      value_deserializer=bytes.decode) as consumer:
            seen: list[str] = []
            while len(seen) < 3:
                for record in consumer.consume(100, timeout=10.0):
                    assert record.partition == partition
                    seen.append(record.value)
                    print(f"{record.topic} {record.offset}: {record.value}")
        assert seen == ["sunny", "cloudy", "rain"], seen


if __name__ == "__main__":
    main()
