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
import sys

from pyspark.sql import SparkSession

from dafka.spark.cdc import materialize
from dafka.spark.examples.job import add_source_arguments, read_topic, session


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m dafka.spark.examples.cdc_table",
                                     description="Rebuild a table from the changes in a CDC topic.")
    add_source_arguments(parser, "the CDC topic")
    parser.add_argument("--table", required=True, help="schema.table to rebuild")
    parser.add_argument("--out", help="write the table here as Parquet (overwrites)")
    parser.add_argument("--show", action="store_true", help="print the first rows")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None, spark: SparkSession | None = None) -> int:
    """Run the job; returns the table's row count.  With ``spark`` it uses that session."""
    args = parse_args(argv)
    with session(spark, args.master, "dafka-cdc-table") as spark:
        table = materialize(read_topic(spark, args), args.table).cache()
        if args.out:
            table.write.mode("overwrite").parquet(args.out)
        if args.show:
            table.show(20, truncate=False)
        count = table.count()
        print(f"{args.table}: {count} rows", file=sys.stderr)
        return count

if __name__ == "__main__":
    main()
