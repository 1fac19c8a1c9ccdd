"""Word count over the records of a Dafka topic.

Reads every record of ``--topic`` (UTF-8 text) either from a store's LevelDB
directory (``--path``, a stopped store or a copy) or live through a tower
(``--tower``/``--tower-sub``), splits the values into words and prints the
most frequent ones::

    python -m dafka.spark.examples.wordcount --path ./storedb --topic hello
    python -m dafka.spark.examples.wordcount --tower tcp://127.0.0.1:5557 \\
        --tower-sub tcp://127.0.0.1:5556 --topic hello --top 20
"""

from __future__ import annotations

import argparse
import os
import sys

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from dafka.spark import register


def word_counts(records: DataFrame) -> DataFrame:
    """(word, count) for the values of ``records``, most frequent first."""
    words = records.select(F.explode(F.split(F.lower(F.decode("value", "UTF-8")), r"[^\p{L}\p{N}']+")).alias("word"))
    return (words.where(F.col("word") != "").groupBy("word").count()
            .orderBy(F.desc("count"), F.asc("word")))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m dafka.spark.examples.wordcount",
                                     description="Count the words in the records of a Dafka topic.")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--path", help="a store's LevelDB directory (stopped store, backup or copy)")
    source.add_argument("--tower", help="read live: the tower's XPUB endpoint (beacon/pub_address)")
    parser.add_argument("--tower-sub", help="the tower's XSUB endpoint (beacon/sub_address)")
    parser.add_argument("--topic", required=True, help="topic to read (exact name)")
    parser.add_argument("--top", type=int, default=10, help="how many words to print (default 10)")
    parser.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None, spark: SparkSession | None = None) -> list[tuple[str, int]]:
    """Run the job; prints ``word<TAB>count`` lines and returns them.  With
    ``spark`` it uses that session (and leaves it running)."""
    args = parse_args(argv)
    own = spark is None
    if own:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        spark = (SparkSession.builder.master(args.master).appName("dafka-wordcount")
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
        top = [(row["word"], row["count"]) for row in word_counts(reader.load()).limit(args.top).collect()]
        for word, count in top:
            print(f"{word}\t{count}")
        return top
    finally:
        if own:
            spark.stop()


if __name__ == "__main__":
    main()
