"""The Spark examples' session: local, quiet, dafka's format registered."""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

from dafka.spark import register


def local_spark(name: str) -> SparkSession:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # the workers run this Python, with dafka installed
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    spark = (SparkSession.builder.master("local[2]").appName(name).config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark
