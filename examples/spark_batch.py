"""A Spark batch job over a topic, read live through the tower: each task
fetches its partition's offset range from the stores.

    python examples/spark_batch.py
"""

from __future__ import annotations

from local_cluster import local_cluster

from dafka import Producer
from dafka.spark.examples.job import session


def main() -> None:
    with local_cluster() as config:
        for city in ("paris", "oslo"):
            with Producer("weather", config) as producer:  # one partition each
                for day in range(50):
                    producer.send(f"{city} {'rain' if day % 3 else 'sun'}".encode())
                producer.flush(timeout=10)
        with session(None, "local[2]", "dafka-batch-example") as spark:  # registers format("dafka")
            spark.sparkContext.setLogLevel("ERROR")
            spark.conf.set("spark.sql.shuffle.partitions", "2")
            df = (spark.read.format("dafka").option("tower", config["beacon/pub_address"])
                  .option("towerSub", config["beacon/sub_address"]).option("topic", "weather").load())
            counts = df.selectExpr("cast(value as string) as reading").groupBy("reading").count().orderBy("reading")
            rows = {row["reading"]: row["count"] for row in counts.collect()}
            print(rows)
            assert sum(rows.values()) == 100 and rows["oslo sun"] == 17, rows


if __name__ == "__main__":
    main()
