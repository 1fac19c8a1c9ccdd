"""What the example jobs share: where they read a topic from (a store's
directory or a tower), and a Spark session of their own unless they are
given one."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from pyspark.sql import DataFrame, SparkSession

from dafka.spark import register


def add_source_arguments(parser: argparse.ArgumentParser, topic_help: str) -> None:
    """--path or --tower (with --tower-sub), --topic and --master."""
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--path", help="a store's LevelDB directory (a stopped store, a copy, or a running "
                                       "store's, read through it)")
    source.add_argument("--tower", help="read live: the tower's XPUB endpoint (beacon/pub_address)")
    parser.add_argument("--tower-sub", help="the tower's XSUB endpoint (beacon/sub_address)")
    parser.add_argument("--topic", required=True, help=topic_help)
    parser.add_argument("--master", default="local[*]", help="Spark master (default local[*])")


@contextmanager
def session(spark: SparkSession | None, master: str, name: str) -> Iterator[SparkSession]:
    """``spark`` with the dafka format registered (left running), or a new
    local session, stopped at the end."""
    own = spark is None
    if own:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        spark = SparkSession.builder.master(master).appName(name).config("spark.ui.enabled", "false").getOrCreate()
    try:
        register(spark)
        yield spark
    finally:
        if own:
            spark.stop()


def read_topic(spark: SparkSession, args: argparse.Namespace) -> DataFrame:
    """The records of ``args.topic`` from ``args.path`` or ``args.tower``."""
    reader = spark.read.format("dafka").option("topic", args.topic)
    if args.path:
        return reader.option("path", args.path).load()
    reader = reader.option("tower", args.tower)
    if args.tower_sub:
        reader = reader.option("towerSub", args.tower_sub)
    return reader.load()
