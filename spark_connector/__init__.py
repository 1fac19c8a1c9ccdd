"""dafka.spark: read and write Dafka topics from PySpark (``format("dafka")``).

Built on PySpark's Python Data Source API (PySpark 4.x, Java 17); no JVM code.

>>> from dafka.spark import register
>>> register(spark)
>>> df = (spark.read.format("dafka")
...       .option("tower", "tcp://10.0.0.5:5557").option("towerSub", "tcp://10.0.0.5:5556")
...       .option("topic", "weather").load())

Schema (modelled on Spark's Kafka source)::

    topic string, partition string, offset long, value binary, timestamp timestamp

``partition`` is the producer's address, ``offset`` its sequence number,
``timestamp`` the time the store received the record (path mode, from the
store's stamps, to within 100 ms; null where unknown, always null in live mode).

Where to read from (exactly one):

* ``tower``: read live through the Dafka protocol.  The tower's XPUB
  (``beacon/pub_address``), with ``towerSub`` its XSUB (``beacon/sub_address``);
  or ``tower="SUB,PUB"``; or ``tower=HOST`` for the default ports 5556/5557
  (``tower=tcp://H:5557`` alone implies ``towerSub=tcp://H:5556``).  The driver
  asks the stores for the heads; every task FETCHes its own offset range from
  the stores, so executors must reach the stores' endpoints.
* ``path``: a store's LevelDB directory (a stopped store, a backup, a copy);
  every executor must see it at that path.  Fastest.  A directory held by a
  running store is refused with an error naming the process.  Like any
  LevelDB open, planning may rewrite the directory's table files: it lets
  LevelDB finish the compaction a store stopped mid-write left pending (up to
  10 s per query) instead of leaving every task to redo it.

Other options:

* ``topic`` (required to read): exact topic name.
* ``startingOffsets`` / ``endingOffsets``: ``earliest``, ``latest`` or JSON
  ``{"<topic>": {"<partition>": offset}}`` with -2 = earliest, -1 = latest;
  ending is exclusive.  Batch defaults: earliest .. latest; streams start at
  ``latest`` by default and pick up new partitions from their earliest record.
* ``maxRecordsPerPartition``: split bigger partitions into several tasks.
* ``maxRecordsPerTrigger`` (streaming): at most this many records per micro-batch.
* ``failOnDataLoss`` (default true): fail when records to read were deleted by
  a store's retention; false skips them.
* ``minAcks`` (writing): stores that must ACK every record before a task
  succeeds (default: ``producer/min_acks``, 1).
* ``config``: a dafka ZPL configuration file; ``dafka.<key>`` sets any dafka
  configuration key (e.g. ``dafka.beacon/address``).
* ``towerTimeoutMs`` (5000), ``discoveryTimeoutMs`` (3000), ``fetchTimeoutMs``
  (60000), ``lockTimeoutMs`` (30000), ``flushTimeoutMs`` (60000).

Filters on ``topic``, ``partition`` and ``offset`` are pushed down (PySpark
4.1+, with ``spark.sql.python.filterPushdown.enabled=true``, which
:func:`register` sets).

Writing: a ``value`` column (binary or string) is produced to ``topic`` (or to
each row's ``topic`` column); each Spark task is one producer, i.e. one new
partition, and succeeds only once ``minAcks`` stores have acknowledged all its
records.  Like Spark's Kafka sink it is at-least-once: a retried task sends its
records again, under a new partition.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .options import DafkaSparkError, OptionError
from .source import (
    SCHEMA,
    DafkaDataSource,
    DafkaDataSourceNoPushdown,
    DafkaReader,
    DafkaStreamReader,
    DafkaStreamWriter,
    DafkaWriter,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"

__all__ = [
    "PUSHDOWN_CONF", "SCHEMA", "DafkaDataSource", "DafkaDataSourceNoPushdown", "DafkaReader", "DafkaSparkError",
    "DafkaStreamReader", "DafkaStreamWriter", "DafkaWriter", "OptionError", "register",
]


def register(spark: SparkSession, *, pushdown: bool = True) -> None:
    """Make ``format("dafka")`` available in ``spark`` (a SparkSession).

    With ``pushdown`` (the default) it also enables PySpark's filter pushdown
    for Python data sources (``spark.sql.python.filterPushdown.enabled``), so
    that ``where offset >= N`` reads only what it needs; pass
    ``pushdown=False`` to leave that setting alone."""
    if pushdown:
        try:
            spark.conf.set(PUSHDOWN_CONF, "true")
        except Exception:  # an older PySpark without the setting
            pushdown = False
    spark.dataSource.register(DafkaDataSource if pushdown else DafkaDataSourceNoPushdown)
