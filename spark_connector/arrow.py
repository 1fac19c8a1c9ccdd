"""The source's Arrow record batches, built straight from column buffers.

Spark starts new Python workers for many queries, and what a worker spends
before its first record counts as much as the records: ``pa.array`` and
``pa.repeat`` import pandas on their first call in a process (half a second
of CPU), which nothing else in a data source worker needs.  Building the
columns from their buffers (numpy arrays, joined bytes) avoids that import
and costs no more per row.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa

from dafka import protocol as proto

from .options import DafkaSparkError

TIMESTAMP = pa.timestamp("us", tz="UTC")
_MAX_OFFSET = 2**31 - 1  # Arrow binary and string columns have 32-bit offsets


def repeated(text: str, n: int) -> pa.Array:
    """``text`` ``n`` times, as a string column."""
    raw = text.encode()
    if n * len(raw) > _MAX_OFFSET:
        raise DafkaSparkError(f"{n} copies of {text[:50]!r} do not fit in one Arrow string column")
    offsets = np.arange(n + 1, dtype=np.int32) * np.int32(len(raw))
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(raw * n)])


def binary(values: Sequence[bytes]) -> pa.Array:
    """A binary column of ``values``."""
    n = len(values)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, values), dtype=np.int64, count=n), out=offsets[1:])
    if offsets[-1] > _MAX_OFFSET:
        raise DafkaSparkError(f"{n} records of {offsets[-1]} bytes in all do not fit in one Arrow batch "
                              "(at most 2 GiB)")
    return pa.Array.from_buffers(pa.binary(), n,
                                 [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(b"".join(values))])


def binary_from_lengths(lengths: bytes, contents: bytes) -> pa.Array:
    """A binary column over the frames of a DIRECT-RECORDS: ``contents`` is
    its data buffer as it is (no copy); the offsets are the running sum of
    ``lengths`` (u32, little-endian)."""
    sizes = np.frombuffer(lengths, dtype="<u4")
    n = len(sizes)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    if offsets[-1] > _MAX_OFFSET:
        raise DafkaSparkError(f"{n} records of {offsets[-1]} bytes in all do not fit in one Arrow array")
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets.astype(np.int32)),
                                                  pa.py_buffer(contents)])


def null_binaries(n: int) -> pa.Array:
    """A binary column of ``n`` nulls (the keys of records without one)."""
    return pa.Array.from_buffers(pa.binary(), n, [pa.py_buffer(np.zeros((n + 7) // 8, dtype=np.uint8)),
                                                  pa.py_buffer(np.zeros(n + 1, dtype=np.int32)), pa.py_buffer(b"")],
                                 null_count=n)


def keys_from_lengths(lengths: bytes, keys: bytes, n: int) -> pa.Array:
    """The key column of a DIRECT-KEYED-RECORDS of ``n`` records from its frames 4 and 5 (rfc section 18):
    ``keys`` is its data buffer as it is; a length of 2^32-1 is a record without a key (null)."""
    if not lengths:
        return null_binaries(n)
    sizes = np.frombuffer(lengths, dtype="<u4").astype(np.int64)
    known = sizes != proto.NO_KEY
    sizes[~known] = 0
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    if known.all():
        return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets.astype(np.int32)),
                                                      pa.py_buffer(keys)])
    return pa.Array.from_buffers(pa.binary(), n, [pa.py_buffer(np.packbits(known, bitorder="little")),
                                                  pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(keys)],
                                 null_count=n - int(np.count_nonzero(known)))


def keys_of(keys: Sequence[bytes | None]) -> pa.Array:
    """A key column of ``keys`` (None: a record without a key)."""
    lengths, packed = proto.pack_keys(keys)
    return keys_from_lengths(lengths, packed, len(keys))


def int64s(values: np.ndarray) -> pa.Array:
    """A long column of ``values`` (any integer dtype)."""
    data = np.ascontiguousarray(values, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(data), [None, pa.py_buffer(data)])


def timestamps(micros: np.ndarray, known: np.ndarray | None = None) -> pa.Array:
    """A UTC timestamp column of microseconds since the epoch, null where
    ``known`` is False (all known if it is None)."""
    data = np.ascontiguousarray(micros, dtype=np.int64)
    n = len(data)
    if known is None or known.all():
        return pa.Array.from_buffers(TIMESTAMP, n, [None, pa.py_buffer(data)])
    validity = np.packbits(known, bitorder="little")
    return pa.Array.from_buffers(TIMESTAMP, n, [pa.py_buffer(validity), pa.py_buffer(data)],
                                 null_count=n - int(np.count_nonzero(known)))


def null_timestamps(n: int) -> pa.Array:
    return pa.nulls(n, type=TIMESTAMP)


class Batches:
    """Record batches of one partition in the source's ``schema`` (topic,
    partition, offset, value, timestamp, key); the constant columns are built once."""

    def __init__(self, schema: pa.Schema, topic: str, partition: str) -> None:
        self.schema = schema
        self.topic = topic
        self.partition = partition
        self._topics = repeated(topic, 0)
        self._partitions = repeated(partition, 0)

    def batch(self, offsets: np.ndarray, values: Sequence[bytes] | pa.Array, times: pa.Array,
              keys: pa.Array | None = None) -> pa.RecordBatch:
        """A batch of records at ``offsets``; ``values`` a list of contents or
        a binary column already; ``keys`` their key column (None: no record has one)."""
        n = len(values)
        if n > len(self._topics):
            self._topics = repeated(self.topic, n)
            self._partitions = repeated(self.partition, n)
        if not isinstance(values, pa.Array):
            values = binary(values)
        return pa.RecordBatch.from_arrays(
            [self._topics.slice(0, n), self._partitions.slice(0, n), int64s(offsets), values, times,
             null_binaries(n) if keys is None else keys],
            schema=self.schema,
        )
