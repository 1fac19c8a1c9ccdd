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

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from dafka.spark.examples.job import add_source_arguments, read_topic, session


def word_counts(records: DataFrame) -> DataFrame:
    """(word, count) for the values of ``records``, most frequent first."""
    words = records.select(F.explode(F.split(F.lower(F.decode("value", "UTF-8")), r"[^\p{L}\p{N}']+")).alias("word"))
    return (words.where(F.col("word") != "").groupBy("word").count()
            .orderBy(F.desc("count"), F.asc("word")))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m dafka.spark.examples.wordcount",
                                     description="Count the words in the records of a Dafka topic.")
    add_source_arguments(parser, "topic to read (exact name)")
    parser.add_argument("--top", type=int, default=10, help="how many words to print (default 10)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None, spark: SparkSession | None = None) -> list[tuple[str, int]]:
    """Run the job; prints ``word<TAB>count`` lines and returns them.  With
    ``spark`` it uses that session (and leaves it running)."""
    args = parse_args(argv)
    with session(spark, args.master, "dafka-wordcount") as spark:
        top = [(row["word"], row["count"]) for row in word_counts(read_topic(spark, args)).limit(args.top).collect()]
        for word, count in top:
            print(f"{word}\t{count}")
        return top

if __name__ == "__main__":
    main()
