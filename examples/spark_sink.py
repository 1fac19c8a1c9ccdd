"""Spark writing a DataFrame to a topic (the sink): each task publishes as a
new partition and commits once ``minAcks`` stores have acked its records.

    python examples/spark_sink.py
"""

from __future__ import annotations

from local_cluster import local_cluster

from dafka import Consumer
from dafka.spark.examples.job import session


def main() -> None:
    with local_cluster() as config:
        with session(None, "local[2]", "dafka-sink-example") as spark:  # registers format("dafka")
            spark.sparkContext.setLogLevel("ERROR")
            df = spark.range(100).selectExpr("cast(concat('order ', id) as binary) as value").repartition(2)
            (df.write.format("dafka").mode("append").option("tower", config["beacon/pub_address"])
             .option("towerSub", config["beacon/sub_address"]).option("topic", "orders")
             .option("minAcks", "1").save())
        with Consumer("orders", config=dict(config, **{"consumer/offset/reset": "earliest"})) as consumer:
            values: set[bytes] = set()
            while len(values) < 100:
                records = consumer.consume(500, timeout=10.0)
                assert records, f"only {len(values)} of 100 records arrived"
                values.update(record.value for record in records)
        print(f"read back {len(values)} records from the store, written by Spark in 2 partitions")
        assert values == {f"order {i}".encode() for i in range(100)}


if __name__ == "__main__":
    main()
