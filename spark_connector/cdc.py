"""Turn a CDC topic (``dafka cdc``, rfc/cdc.md) back into its tables with Spark.

>>> from dafka.spark.cdc import materialize
>>> changes = spark.read.format("dafka").option("tower", "10.0.0.5").option("topic", "shop").load()
>>> orders = materialize(changes, "public.orders")          # the table as of the topic's last change
>>> orders.write.mode("overwrite").parquet("orders.parquet")

The rule is the idempotent-apply rule in bulk: per table and key, the change
with the highest position ``(source.lsn, source.seq)`` wins; a delete wins by
removing the row; a truncate removes every row of its table that came before
it.  Replayed changes (the same position twice, after a connector restart)
change nothing.  The result has the columns of the table's newest change (a
dropped column is gone, an added one is null where no change set it).

For a streaming copy, :func:`apply_batch` inside ``foreachBatch`` keeps a
Parquet copy current, deletes and truncates kept as tombstones (see its doc
for the guarantees).  Columns whose value an
update did not send (``unchanged``: TOASTed values under a replica identity
other than FULL) keep no old value here: capture such tables with
``REPLICA IDENTITY FULL``, or use :class:`dafka.cdc.apply.TableState`.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

CHANGE_COLUMNS = ("table", "op", "key", "lsn", "seq", "after")


def changes(records: DataFrame) -> DataFrame:
    """The change envelopes of a ``format("dafka")`` DataFrame as columns:
    table ("schema.table"), op, key (canonical JSON), lsn, seq, after (JSON).
    Tombstones (empty records after deletes, ``--tombstones``) are left out."""
    value = F.col("value").cast("string")

    def field(path: str) -> Column:
        return F.get_json_object(value, path)

    return records.where(F.length("value") > 0).select(
        F.concat_ws(".", field("$.source.schema"), field("$.source.table")).alias("table"),
        field("$.op").alias("op"),
        field("$.key").alias("key"),
        field("$.source.lsn").cast("long").alias("lsn"),
        field("$.source.seq").cast("long").alias("seq"),
        field("$.after").alias("after"),
    )


def latest(change_rows: DataFrame, keep_deletes: bool = False) -> DataFrame:
    """Per table and key the newest change, from :func:`changes` rows; rows a
    truncate removed are left out.  By default deleted keys are left out too
    (columns ``table, key, lsn, seq, after``); with ``keep_deletes`` the
    newest delete of a key and the newest truncate of a table stay, as
    tombstones (columns of :func:`changes`), so that a change replayed later
    with an older position cannot bring a row back."""
    position = F.struct("lsn", "seq")
    truncated = change_rows.where(F.col("op") == "t").groupBy("table").agg(F.max(position).alias("cut"))
    rows = change_rows.where(F.col("op") != "t").join(truncated, "table", "left")
    rows = rows.where(F.col("cut").isNull() | (position > F.col("cut"))).drop("cut")
    newest = Window.partitionBy("table", "key").orderBy(F.col("lsn").desc(), F.col("seq").desc())
    rows = rows.withColumn("_rank", F.row_number().over(newest)).where(F.col("_rank") == 1).drop("_rank")
    if keep_deletes:
        cuts = truncated.select("table", F.lit("t").alias("op"), F.lit(None).cast("string").alias("key"),
                                F.col("cut.lsn").alias("lsn"), F.col("cut.seq").alias("seq"),
                                F.lit(None).cast("string").alias("after"))
        return rows.select(*CHANGE_COLUMNS).unionByName(cuts)
    return rows.where(F.col("op") != "d").select("table", "key", "lsn", "seq", "after")


def columns_of(change_rows: DataFrame, table: str) -> list[str]:
    """The table's columns as its newest change with a row shows them, in order."""
    newest = (change_rows.where((F.col("table") == table) & F.col("after").isNotNull())
              .orderBy(F.col("lsn").desc(), F.col("seq").desc()).select("after").first())
    if newest is None:
        return []
    return list(json.loads(newest["after"]))


def materialize(records: DataFrame, table: str, schema: StructType | None = None) -> DataFrame:
    """The table ``table`` ("schema.table") as the changes in ``records`` (a
    ``format("dafka")`` DataFrame of a CDC topic) leave it.  Without a
    ``schema``, Spark infers the columns' types from the JSON values."""
    return _as_table(changes(records), table, schema)


def _as_table(change_rows: DataFrame, table: str, schema: StructType | None) -> DataFrame:
    spark = change_rows.sparkSession
    rows = change_rows.where(F.col("table") == table)
    names = columns_of(rows, table)
    if not names:
        return spark.createDataFrame([], StructType([]))
    current = latest(rows).select("after")
    if schema is None:
        schema = spark.read.json(current.rdd.map(lambda r: r.after)).schema
    parsed = current.select(F.from_json("after", schema).alias("row")).select("row.*")
    present = set(parsed.columns)
    return parsed.select([F.col(f"`{n}`") if n in present else F.lit(None).alias(n) for n in names])


def apply_batch(batch: DataFrame, batch_id: int, path: str) -> None:
    """A ``foreachBatch`` function that keeps the state of every table of a
    CDC stream under ``path`` (Parquet, columns ``table, key, lsn, seq,
    after, op``; deletes and truncates stay as tombstones):
    ``stream.writeStream.foreachBatch(lambda df, i: apply_batch(df,
    i, "state")).option("checkpointLocation", ...)``.

    Each batch writes a new version ``path/v=<batch_id>`` from the version
    before it and the batch's changes, then renames it into place, so a
    reader (:func:`read_state`) always sees a whole version.  After a driver
    restart Spark runs the last uncommitted batch again with the same id and
    the same records; its version is written again from the same previous
    version and comes out the same: re-runs are idempotent, and replayed
    changes are dropped by position."""
    spark = batch.sparkSession
    target = os.path.join(path, f"v={batch_id:012d}")
    previous = _versions(path, below=batch_id)
    current = changes(batch)
    if previous:
        current = current.unionByName(spark.read.parquet(os.path.join(path, previous[-1])).select(*CHANGE_COLUMNS))
    staging = os.path.join(path, f"_staging-{uuid.uuid4().hex}")
    latest(current, keep_deletes=True).write.mode("overwrite").parquet(staging)
    if os.path.exists(target):
        shutil.rmtree(target)
    os.replace(staging, target)
    for old_version in previous[:-1]:
        shutil.rmtree(os.path.join(path, old_version), ignore_errors=True)


def read_state(spark: SparkSession, path: str, table: str, schema: StructType | None = None) -> DataFrame:
    """The table ``table`` from the newest whole version :func:`apply_batch` wrote under ``path``."""
    versions = _versions(path)
    if not versions:
        raise FileNotFoundError(f"no materialized version under {path}")
    return _as_table(spark.read.parquet(os.path.join(path, versions[-1])), table, schema)


def _versions(path: str, below: int | None = None) -> list[str]:
    try:
        names = sorted(n for n in os.listdir(path) if n.startswith("v="))
    except FileNotFoundError:
        return []
    if below is not None:
        names = [n for n in names if int(n[2:]) < below]
    return names


__all__ = ["apply_batch", "changes", "columns_of", "latest", "materialize", "read_state"]
