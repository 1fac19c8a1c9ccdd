"""The ``dafka`` data source for PySpark's Python Data Source API.

Reading (``spark.read`` / ``spark.readStream``) plans one Spark partition per
Dafka partition (or per ``maxRecordsPerPartition`` records of it) on the
driver, from the store heads; each task then reads its own offset range,
either from a LevelDB directory (``path``) or from the stores over the
network (``tower``).  Writing (``df.write`` / ``writeStream``) turns each task
into a :class:`dafka.Producer` that succeeds only once ``minAcks`` stores
have acknowledged everything it sent.

What runs where: the :class:`DafkaDataSource`, the readers' constructors,
``pushFilters``, ``partitions``/``initialOffset``/``latestOffset`` and the
writers' constructors run on the driver (so bad options fail at planning);
``read`` and ``write`` run in executor Python workers, which are reused
between tasks, so neither keeps anything open after it returns.
"""

from __future__ import annotations

import logging
import time
import zlib
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType, TimestampType

from dafka.errors import FlushTimeout

from . import arrow, leveldb, live
from .options import EARLIEST, LATEST, DafkaSparkError, Options, OptionError, parse

try:  # PySpark >= 4.1
    from pyspark.sql.datasource import (
        DataSourceStreamArrowWriter,
        EqualNullSafe,
        EqualTo,
        GreaterThan,
        GreaterThanOrEqual,
        In,
        LessThan,
        LessThanOrEqual,
        StringStartsWith,
    )
except ImportError:  # pragma: no cover - PySpark 4.0
    from pyspark.sql.datasource import DataSourceStreamWriter as DataSourceStreamArrowWriter

    EqualNullSafe = EqualTo = GreaterThan = GreaterThanOrEqual = In = LessThan = LessThanOrEqual = None
    StringStartsWith = None
try:  # PySpark >= 4.2
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, SupportsTriggerAvailableNow
except ImportError:  # pragma: no cover
    ReadAllAvailable = ReadMaxRows = None

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        pass


log = logging.getLogger(__name__)

NAME = "dafka"
_FIELDS = (
    ("topic", StringType()),
    ("partition", StringType()),
    ("offset", LongType()),
    ("value", BinaryType()),
    ("timestamp", TimestampType()),
    ("key", BinaryType()),  # null for a record without a key (rfc/dafka.md section 18)
)


def schema() -> StructType:
    """The source's schema (a new object: StructType.add changes it in place)."""
    return StructType([StructField(name, kind) for name, kind in _FIELDS])


SCHEMA = schema()
PLANNING_LOCK_TIMEOUT = 2.0  # seconds planning waits for a path locked by someone else


def _check_schema(given: StructType) -> None:
    if tuple((f.name, f.dataType) for f in given.fields) != _FIELDS:
        raise OptionError(
            f"the dafka source has a fixed schema ({schema().simpleString()}); do not pass .schema(...), "
            f"got {given.simpleString()}"
        )


# --------------------------------------------------------------------------
# What the stores hold
# --------------------------------------------------------------------------


@dataclass
class Layout:
    """The partitions of the topic: partition -> (earliest, latest) offsets,
    latest exclusive.  ``exact`` is False when the earliest offset is not known
    at planning (stores that answer without DIRECT-PARTITIONS: 0, with
    retention's gap skipped while reading)."""

    partitions: dict[str, tuple[int, int]]
    exact: bool
    readers: list[str] = field(default_factory=list)
    # the readers tasks reach without the tower: the store running on a path's directory, or every store
    # reader found through the tower when each said where it takes requests (DIRECT-PARTITIONS)
    via: tuple[live.ReaderAt, ...] = ()
    through_path: bool = False  # via is the store running on the directory: no tower to fall back on
    found: live.Discovery | None = None  # what the stores said: which holds which partition

    def via_for(self, partition: str, last: int, task: int) -> tuple[live.ReaderAt, ...]:
        """The reader a task reads offsets up to ``last`` of ``partition`` from, without the tower: one of
        those that hold it (``task`` spreads the tasks over them), else every direct reader."""
        holders = self.found.holders(partition, last) if self.found is not None and not self.through_path else ()
        return (holders[task % len(holders)],) if holders else self.via


def _layout_path(opts: Options, lock_timeout: float = PLANNING_LOCK_TIMEOUT) -> Layout:
    store = leveldb.running_store(opts.path)
    if store is not None:  # a running store holds the directory: read through it
        direct = (live.ReaderAt.running(store),)
        found = live.discover(opts.config(), opts.topic, tower_timeout=opts.timeout("towerTimeoutMs"),
                              timeout=opts.timeout("discoveryTimeoutMs"), direct=direct)
        if not found.readers:
            raise live.NoStore(f"the store running on {opts.path} (process {store.pid}) did not answer at "
                               f"{store.data} within {opts.timeout('discoveryTimeoutMs'):.0f} s")
        layout = _layout_discovery(opts, found)
        layout.via, layout.through_path = direct, True
        return layout
    with leveldb.open_db(opts.path, min(lock_timeout, opts.timeout("lockTimeoutMs"))) as db:
        leveldb.settle(db, opts.path)
        found = leveldb.partitions(db, opts.topic)
        layout = Layout({p: (i.tail, i.head + 1) for p, i in found.items()}, exact=True)
        if not found and opts.mode == "read":
            known = leveldb.topics(db)
            listed = ", ".join(repr(t) for t in known) if known else "none: the database holds no records"
            raise OptionError(f"topic {opts.topic!r} has no records in {opts.path} (topics there: {listed}); "
                              'check option "topic" (names match exactly)')
    return layout


def _layout_discovery(opts: Options, found: live.Discovery) -> Layout:
    if found.tails is not None:  # every store said where its partitions start (DIRECT-PARTITIONS)
        layout = Layout({p: (min(found.tails.get(p, 0), head + 1), head + 1) for p, head in found.heads.items()},
                        exact=True, readers=found.readers, via=found.direct, found=found)
    else:
        layout = Layout({p: (0, head + 1) for p, head in found.heads.items()}, exact=False, readers=found.readers)
    if not found.heads and opts.mode == "read":
        if not found.readers:
            raise live.NoStore(
                f"no store answered through the tower ({opts.where()}; {found.peers} peer(s) seen): "
                "start a store (dafka stored) on that tower, or check the tower options"
            )
        raise OptionError(f"no store holds records of topic {opts.topic!r} ({len(found.readers)} store(s) asked); "
                          'check option "topic" (names match exactly)')
    return layout


def _layout_live(opts: Options) -> Layout:
    found = live.discover(opts.config(), opts.topic, tower_timeout=opts.timeout("towerTimeoutMs"),
                          timeout=opts.timeout("discoveryTimeoutMs"))
    return _layout_discovery(opts, found)


# --------------------------------------------------------------------------
# Input partitions and reading them
# --------------------------------------------------------------------------


class DafkaRange(InputPartition):
    """Offsets ``start .. end-1`` of one Dafka partition: one Spark task.

    ``from_earliest``: the range was asked for from the earliest record, so
    records a store's retention deleted are skipped; otherwise their absence
    is data loss (``failOnDataLoss``)."""

    def __init__(self, topic: str, partition: str, start: int, end: int, from_earliest: bool,
                 readers: list[str], via: tuple[live.ReaderAt, ...] = (), through_path: bool = False) -> None:
        self.topic = topic
        self.partition = partition
        self.start = start
        self.end = end
        self.from_earliest = from_earliest
        self.readers = readers
        self.via = via  # the readers to reach without the tower
        self.through_path = through_path  # path mode on a running store: read through it, no tower


def _split(topic: str, partition: str, start: int, end: int, from_earliest: bool, per_task: int | None,
           layout: Layout) -> list[DafkaRange]:
    if end <= start:
        return []
    step = end - start if per_task is None else per_task
    first = zlib.crc32(partition.encode())  # a partition's tasks, and the partitions, spread over the stores
    return [DafkaRange(topic, partition, s, min(s + step, end), from_earliest, layout.readers,
                       layout.via_for(partition, min(s + step, end) - 1, first + n), layout.through_path)
            for n, s in enumerate(range(start, end, step))]


def _read(opts: Options, schema: StructType, part: InputPartition) -> Iterator[pa.RecordBatch]:
    if not isinstance(part, DafkaRange):
        return  # Spark's placeholder when there is nothing to read
    arrow_schema = to_arrow_schema(schema, timezone="UTC")
    if opts.path is not None and not part.through_path:
        with leveldb.snapshot_db(opts.path, opts.timeout("lockTimeoutMs")) as db:
            yield from leveldb.read_range(db, part.topic, part.partition, part.start, part.end, arrow_schema)
        return
    batches = arrow.Batches(arrow_schema, part.topic, part.partition)
    for first, values, times, keys in live.fetch_range(
        opts.config(), part.topic, part.partition, part.start, part.end,
        readers=part.readers, from_earliest=part.from_earliest, fail_on_data_loss=opts.fail_on_data_loss,
        tower_timeout=opts.timeout("towerTimeoutMs"), fetch_timeout=opts.timeout("fetchTimeoutMs"), direct=part.via,
        tower_fallback=not part.through_path,
    ):
        yield batches.batch(np.arange(first, first + len(values), dtype=np.int64), values, times, keys)


# --------------------------------------------------------------------------
# Batch reading
# --------------------------------------------------------------------------


@dataclass
class _Pushed:
    """What the pushed filters allow: an offset interval, a set of partitions
    (None = all), and whether the topic matches at all."""

    low: int = 0
    high: int = 2**63 - 1  # exclusive
    partitions: set[str] | None = None
    prefixes: list[str] = field(default_factory=list)
    topic_ok: bool = True

    def allows(self, partition: str) -> bool:
        if self.partitions is not None and partition not in self.partitions:
            return False
        return all(partition.startswith(p) for p in self.prefixes)


def _int_value(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class _BatchReader(DataSourceReader):
    def __init__(self, options, schema: StructType) -> None:
        self.opts = parse(options, "read")
        _check_schema(schema)
        self.schema = schema
        self.pushed = _Pushed()

    def partitions(self) -> list[InputPartition]:
        opts = self.opts
        layout = _layout_path(opts) if opts.path is not None else _layout_live(opts)
        if not self.pushed.topic_ok:
            return []
        for name, spec in (("startingOffsets", opts.starting), ("endingOffsets", opts.ending)):
            unknown = sorted(set(spec.partitions) - set(layout.partitions))
            if unknown:
                known = ", ".join(sorted(layout.partitions))
                raise OptionError(f'"{name}" names partition(s) {", ".join(unknown)} that topic {opts.topic!r} '
                                  f"does not have; its partitions are: {known}")
        ranges: list[InputPartition] = []
        for partition in sorted(layout.partitions):
            if not self.pushed.allows(partition):
                continue
            earliest, latest = layout.partitions[partition]
            wanted_start = opts.starting.for_partition(partition)
            wanted_end = opts.ending.for_partition(partition)
            start = {EARLIEST: earliest, LATEST: latest}.get(wanted_start, wanted_start)
            end = latest if wanted_end == LATEST else min(wanted_end, latest)
            if wanted_start >= 0 and wanted_end >= 0 and wanted_start > wanted_end:
                raise OptionError(f"partition {partition}: startingOffsets {wanted_start} is after "
                                  f"endingOffsets {wanted_end}")
            if layout.exact and 0 <= wanted_start < earliest:
                if opts.fail_on_data_loss:
                    raise OptionError(
                        f"startingOffsets asks for offset {wanted_start} of partition {partition}, but the store "
                        f"keeps only offsets {earliest}..{latest - 1} (older ones were deleted by retention); "
                        f'start at {earliest} or later, or set .option("failOnDataLoss", "false")')
                start = earliest
            start = max(start, self.pushed.low)
            end = min(end, self.pushed.high)
            # From "earliest", records that retention deleted meanwhile are not expected: skipped, not lost.
            ranges.extend(_split(opts.topic, partition, start, end, wanted_start == EARLIEST,
                                 opts.max_records_per_partition, layout))
        return ranges

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.opts, self.schema, partition)


class DafkaReader(_BatchReader):
    """Batch reader with filter pushdown on ``topic``, ``partition`` and ``offset``."""

    def pushFilters(self, filters):
        pushed = self.pushed
        for f in filters:
            if not self._push(f, pushed):
                yield f

    def _push(self, f, pushed: _Pushed) -> bool:
        """Apply ``f`` to the plan; True if it is then fully taken care of."""
        attribute = getattr(f, "attribute", None)
        if attribute is None or len(attribute) != 1:
            return False
        column = attribute[0].lower()
        kind = type(f)
        if column == "offset":
            if kind is In:
                values = [_int_value(v) for v in f.value]
                if not values or any(v is None for v in values):
                    return False
                pushed.low = max(pushed.low, min(values))
                pushed.high = min(pushed.high, max(values) + 1)
                return len(values) == 1  # the interval holds more than the list: Spark filters the rest
            value = _int_value(getattr(f, "value", None))
            if value is None:
                return False
            if kind is GreaterThan:
                pushed.low = max(pushed.low, value + 1)
            elif kind is GreaterThanOrEqual:
                pushed.low = max(pushed.low, value)
            elif kind is LessThan:
                pushed.high = min(pushed.high, value)
            elif kind is LessThanOrEqual:
                pushed.high = min(pushed.high, value + 1)
            elif kind in (EqualTo, EqualNullSafe):
                pushed.low = max(pushed.low, value)
                pushed.high = min(pushed.high, value + 1)
            else:
                return False
            return True
        if column in ("topic", "partition"):
            if kind in (EqualTo, EqualNullSafe):
                values = {f.value}
            elif kind is In:
                values = set(f.value)
            elif kind is StringStartsWith and column == "partition" and isinstance(f.value, str):
                pushed.prefixes.append(f.value)
                return True
            else:
                return False
            if not all(isinstance(v, str) for v in values):
                return False
            if column == "topic":
                pushed.topic_ok = pushed.topic_ok and self.opts.topic in values
            else:
                pushed.partitions = values if pushed.partitions is None else pushed.partitions & values
            return True
        return False


class DafkaPlainReader(_BatchReader):
    """Batch reader without filter pushdown (see :func:`dafka.spark.register`)."""


# --------------------------------------------------------------------------
# Streaming reading
# --------------------------------------------------------------------------


def _allocate(available: dict[str, int], budget: int) -> dict[str, int]:
    """Share ``budget`` rows fairly among partitions (water-filling)."""
    given = dict.fromkeys(available, 0)
    left = {p: n for p, n in available.items() if n > 0}
    while budget > 0 and left:
        share = max(1, budget // len(left))
        for p in sorted(left):
            take = min(share, left[p], budget)
            given[p] += take
            left[p] -= take
            budget -= take
            if left[p] == 0:
                del left[p]
            if budget == 0:
                break
    return given


class DafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch source: offsets are ``{topic: {partition: next sequence}}``."""

    def __init__(self, options, schema: StructType) -> None:
        self.opts = parse(options, "stream")
        _check_schema(schema)
        self.schema = schema
        self._stream: live.Stream | None = None  # the driver's peer, kept between micro-batches
        self._target: Layout | None = None  # availableNow: the end, fixed when the query starts
        self._earliest: dict[str, int] = {}
        self._last = Layout({}, exact=False)  # the last layout seen: how the tasks reach the stores
        self._warned = False

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_stream"] = None
        return state

    def _layout(self) -> Layout:
        opts = self.opts
        if opts.path is not None:
            layout = _layout_path(opts, opts.timeout("lockTimeoutMs"))
        else:
            if self._stream is None:
                self._stream = live.Stream(opts.config(), opts.topic, tower_timeout=opts.timeout("towerTimeoutMs"),
                                           timeout=opts.timeout("discoveryTimeoutMs"))
            layout = _layout_discovery(opts, self._stream.heads())
        if not layout.partitions and not self._warned:
            self._warned = True
            log.warning("dafka.spark: topic %r has no records yet (%s); waiting for some", opts.topic, opts.where())
        self._earliest.update({p: e for p, (e, _) in layout.partitions.items()})
        self._last = layout
        return layout

    def _offsets(self, positions: dict[str, int]) -> dict:
        return {self.opts.topic: {p: positions[p] for p in sorted(positions)}}

    def initialOffset(self) -> dict:
        layout = self._layout()
        positions = {}
        for partition, (earliest, latest) in sorted(layout.partitions.items()):
            wanted = self.opts.starting.for_partition(partition)
            positions[partition] = {EARLIEST: earliest, LATEST: latest}.get(wanted, wanted)
        for partition, wanted in self.opts.starting.partitions.items():
            if partition not in positions and wanted >= 0:
                positions[partition] = wanted  # a partition to come: it starts there, not at its earliest
        return self._offsets(positions)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._layout()

    def getDefaultReadLimit(self):
        if self.opts.max_records_per_trigger is not None and ReadMaxRows is not None:
            return ReadMaxRows(self.opts.max_records_per_trigger)
        return ReadAllAvailable() if ReadAllAvailable is not None else super().getDefaultReadLimit()

    def latestOffset(self, start: dict | None = None, limit=None) -> dict:
        layout = self._target if self._target is not None else self._layout()
        begin = dict((start or {}).get(self.opts.topic, {}))
        ends = {}
        available = {}
        for partition, (earliest, latest) in layout.partitions.items():
            position = begin.get(partition, earliest)
            ends[partition] = (position, max(latest, position))
            available[partition] = max(0, latest - position)
        if ReadMaxRows is not None and isinstance(limit, ReadMaxRows):
            given = _allocate(available, limit.max_rows)
        else:
            given = available
        positions = dict(begin)
        for partition, (position, _) in ends.items():
            if given[partition] > 0:
                positions[partition] = position + given[partition]
        return self._offsets(positions)

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        topic = self.opts.topic
        begin = (start or {}).get(topic, {})
        ranges: list[InputPartition] = []
        for partition, stop in sorted(end.get(topic, {}).items()):
            first = begin.get(partition)
            from_earliest = first is None
            if first is None:
                first = self._earliest.get(partition, 0)
            ranges.extend(_split(topic, partition, first, stop, from_earliest, self.opts.max_records_per_partition,
                                 self._last))
        return ranges

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.opts, self.schema, partition)

    def commit(self, end: dict) -> None:
        pass

    def stop(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None


# --------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------


@dataclass
class DafkaCommitMessage(WriterCommitMessage):
    """What one write task produced: (topic, partition, records) per producer."""

    produced: list[tuple[str, str, int]]


class _Producing:
    """Option checks (driver) and the producing task (executor) shared by the
    batch and the streaming writer."""

    def _setup(self, options, schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise OptionError('Dafka topics are append-only: use .mode("append") (or outputMode "append"), '
                              'not overwrite')
        self.opts = opts = parse(options, "write")
        names = {f.name.lower(): (i, f.dataType) for i, f in enumerate(schema.fields)}
        if "value" not in names or not isinstance(names["value"][1], (BinaryType, StringType)):
            raise OptionError(f"writing to dafka needs a column 'value' of type binary or string; the DataFrame "
                              f"has {schema.simpleString()}")
        self.value_index, value_type = names["value"]
        self.value_is_string = isinstance(value_type, StringType)
        # an optional key column (rfc section 18): binary or string, null for a record without a key
        self.key_index: int | None = None
        self.key_is_string = False
        if "key" in names:
            if not isinstance(names["key"][1], (BinaryType, StringType)):
                raise OptionError(f"the column 'key' must be binary or string to be written as the records' keys; "
                                  f"the DataFrame has {schema.simpleString()}")
            self.key_index, key_type = names["key"]
            self.key_is_string = isinstance(key_type, StringType)
        self.topic_index = None
        if opts.topic is None:
            if "topic" not in names or not isinstance(names["topic"][1], StringType):
                raise OptionError('say which topic to write to: .option("topic", "<name>"), or a string '
                                  "column 'topic' in the DataFrame")
            self.topic_index = names["topic"][0]
        config = opts.config()
        min_acks = config["producer/min_acks"]
        stores = live.count_stores(config, tower_timeout=opts.timeout("towerTimeoutMs"),
                                   timeout=opts.timeout("discoveryTimeoutMs"))
        if stores < min_acks:
            raise OptionError(f"minAcks is {min_acks} but {stores} store(s) answered through the tower "
                              f"({opts.where()}): start more stores, or lower option \"minAcks\"")

    def _produce(self, batches: Iterator[pa.RecordBatch]) -> DafkaCommitMessage:
        from dafka import Producer  # executor side

        opts = self.opts
        config = opts.config()
        producers: dict[str, Producer] = {}
        counts: dict[str, int] = {}
        flushed = False

        def producer(topic: str) -> Producer:
            p = producers.get(topic)
            if p is None:
                p = producers[topic] = Producer(topic, config)
                counts[topic] = 0
            return p

        try:
            for batch in batches:
                column = batch.column(self.value_index)
                if column.null_count:
                    raise DafkaSparkError(f"{column.null_count} row(s) have a null value: a Dafka record is bytes; "
                                          "filter them out or use coalesce(value, '')")
                values = column.to_pylist()
                if self.value_is_string:
                    values = [v.encode("utf-8") for v in values]
                record_keys = [None] * len(values)
                if self.key_index is not None:
                    record_keys = batch.column(self.key_index).to_pylist()
                    if self.key_is_string:
                        record_keys = [None if k is None else k.encode("utf-8") for k in record_keys]
                if self.topic_index is None:
                    send = producer(opts.topic).send
                    for value, key in zip(values, record_keys):
                        send(value, key=key)
                    counts[opts.topic] += len(values)
                else:
                    for topic, value, key in zip(batch.column(self.topic_index).to_pylist(), values, record_keys):
                        if not topic:
                            raise DafkaSparkError("a row has an empty or null 'topic' column; give "
                                                  '.option("topic", ...) or fill the column')
                        producer(topic).send(value, key=key)
                        counts[topic] += 1
            deadline = time.monotonic() + opts.timeout("flushTimeoutMs")
            for topic, p in producers.items():
                try:
                    p.flush(max(0.0, deadline - time.monotonic()))
                except FlushTimeout as exc:
                    raise DafkaSparkError(
                        f"{exc.unacked} of {counts[topic]} record(s) written to topic {topic!r} were not acked by "
                        f"{p.min_acks} store(s) within {opts.timeout('flushTimeoutMs'):.0f} s: check that the "
                        f'stores run on the tower, or change "minAcks"/"flushTimeoutMs"') from None
            flushed = True
            return DafkaCommitMessage([(t, p.address, counts[t]) for t, p in producers.items()])
        finally:
            for p in producers.values():
                try:
                    p.close(timeout=5.0 if flushed else 0.0)
                except FlushTimeout:
                    pass

    def _log(self, what: str, messages) -> None:
        produced = [row for m in messages if isinstance(m, DafkaCommitMessage) for row in m.produced]
        log.info("dafka.spark: %s: %d record(s) in %d partition(s)", what, sum(n for _, _, n in produced),
                 len(produced))


class DafkaWriter(_Producing, DataSourceArrowWriter):
    """Batch sink: each task is a producer (a new partition of the topic)."""

    def __init__(self, options, schema: StructType, overwrite: bool) -> None:
        self._setup(options, schema, overwrite)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> DafkaCommitMessage:
        return self._produce(iterator)

    def commit(self, messages) -> None:
        self._log("written", messages)

    def abort(self, messages) -> None:
        self._log("write aborted; acked records stay in the topic", messages)


class DafkaStreamWriter(_Producing, DataSourceStreamArrowWriter):
    """Streaming sink: each task of each micro-batch is a producer."""

    def __init__(self, options, schema: StructType, overwrite: bool) -> None:
        self._setup(options, schema, overwrite)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> DafkaCommitMessage:
        return self._produce(iterator)

    def commit(self, messages, batchId: int) -> None:
        self._log(f"batch {batchId} written", messages)

    def abort(self, messages, batchId: int) -> None:
        self._log(f"batch {batchId} aborted; acked records stay in the topic", messages)


# --------------------------------------------------------------------------
# The data source
# --------------------------------------------------------------------------


class DafkaDataSource(DataSource):
    """``format("dafka")``: see the package documentation for the options."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        return schema()

    def reader(self, schema: StructType) -> DataSourceReader:
        return DafkaReader(self.options, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return DafkaStreamReader(self.options, schema)

    def writer(self, schema: StructType, overwrite: bool) -> DafkaWriter:
        return DafkaWriter(self.options, schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DafkaStreamWriter:
        return DafkaStreamWriter(self.options, schema, overwrite)


class DafkaDataSourceNoPushdown(DafkaDataSource):
    """The same source for sessions with ``spark.sql.python.filterPushdown.enabled=false``."""

    def reader(self, schema: StructType) -> DataSourceReader:
        return DafkaPlainReader(self.options, schema)
