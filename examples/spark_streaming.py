"""A Spark structured streaming query over a topic: each micro-batch gets
the records published since the last one, in offset order per partition.

    python examples/spark_streaming.py
"""

from __future__ import annotations

import time

from local_cluster import local_cluster

from dafka import Producer
from dafka.spark.examples.job import session


def main() -> None:
    with local_cluster() as config:
        with session(None, "local[2]", "dafka-streaming-example") as spark:  # registers format("dafka")
            spark.sparkContext.setLogLevel("ERROR")
            seen: list[int] = []

            def each_batch(batch, batch_id: int) -> None:
                values = [int(row["value"]) for row in batch.selectExpr("cast(value as string) as value").collect()]
                if values:
                    print(f"batch {batch_id}: {len(values)} records")
                seen.extend(values)

            query = (spark.readStream.format("dafka").option("tower", config["beacon/pub_address"])
                     .option("towerSub", config["beacon/sub_address"]).option("topic", "ticks")
                     .option("startingOffsets", "earliest").load()
                     .writeStream.foreachBatch(each_batch).trigger(processingTime="1 second").start())
            try:
                with Producer("ticks", config) as producer:
                    for i in range(200):
                        producer.send(str(i).encode())
                        if i % 50 == 49:
                            producer.flush(timeout=10)
                            time.sleep(1.0)  # spread over several micro-batches
                deadline = time.monotonic() + 120
                while len(seen) < 200 and time.monotonic() < deadline and query.isActive:
                    time.sleep(0.5)
            finally:
                query.stop()
        assert sorted(seen) == list(range(200)), len(seen)


if __name__ == "__main__":
    main()
