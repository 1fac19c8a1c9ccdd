"""Rebuild a database table from a CDC topic (``dafka cdc postgres``) and
write it as Parquet::

    python -m dafka.spark.examples.cdc_table --tower tcp://127.0.0.1:5557 \\
        --tower-sub tcp://127.0.0.1:5556 --topic shop --table public.orders --out orders.parquet
    python -m dafka.spark.examples.cdc_table --path ./storedb --topic shop --table public.orders --show

The result is the table as of the topic's last change: per key the newest
change by position (commit LSN, place in its transaction), deletes and
truncates applied (:mod:`dafka.spark.cdc`).
"""

from __future__ import annotations

import argparse
import os
import sys

from pyspark.sql import SparkSession

from dafka.spark import register
from dafka.spark.cdc import materialize


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m dafka.spark.examples.cdc_table",
                                     description="Rebuild a table from the changes in a CDC topic.")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--path", help="a store's LevelDB directory")
    source.add_argument("--tower", help="read live: the tower's XPUB endpoint (beacon/pub_address)")
    parser.add_argument("--tower-sub", help="the tower's XSUB endpoint (beacon/sub_address)")
    parser.add_argument("--topic", required=True, help="the CDC topic")
    parser.add_argument("--table", required=True, help="schema.table to rebuild")
    parser.add_argument("--out", help="write the table here as Parquet (overwrites)")
    parser.add_argument("--show", action="store_true", help="print the first rows")
    parser.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None, spark: SparkSession | None = None) -> int:
    """Run the job; returns the table's row count.  With ``spark`` it uses that session."""
    args = parse_args(argv)
    own = spark is None
    if own:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        spark = (SparkSession.builder.master(args.master).appName("dafka-cdc-table")
                 .config("spark.ui.enabled", "false").getOrCreate())
    try:
        register(spark)
        reader = spark.read.format("dafka").option("topic", args.topic)
        if args.path:
            reader = reader.option("path", args.path)
        else:
            reader = reader.option("tower", args.tower)
            if args.tower_sub:
                reader = reader.option("towerSub", args.tower_sub)
        table = materialize(reader.load(), args.table).cache()
        if args.out:
            table.write.mode("overwrite").parquet(args.out)
        if args.show:
            table.show(20, truncate=False)
        count = table.count()
        print(f"{args.table}: {count} rows", file=sys.stderr)
        return count
    finally:
        if own:
            spark.stop()


if __name__ == "__main__":
    main()
