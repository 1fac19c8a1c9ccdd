"""Path mode's LevelDB reading, directly (no Spark): offsets and gaps, the
receive timestamps, batch boundaries, and letting LevelDB finish compacting."""

from __future__ import annotations

import plyvel
import pytest

from helpers import require_pyspark

require_pyspark()

import numpy as np  # noqa: E402 - after the check above
import pyarrow as pa  # noqa: E402
from pyspark.sql.pandas.types import to_arrow_schema  # noqa: E402

from dafka.spark import arrow, leveldb
from dafka.spark.source import schema
from dafka.store import keys

TOPIC = "t"
PARTITION = "0123456789ABCDEF0123456789ABCDEF"
ARROW_SCHEMA = to_arrow_schema(schema(), timezone="UTC")
STAMP_MS = 1_700_000_000_000

pytestmark = pytest.mark.spark


def value(seq: int) -> bytes:
    return b"record %d " % seq + b"x" * (seq % 7)


def write(path: str, offsets, *, stamps=(), **options) -> None:
    """A store-like database holding the records ``offsets`` of one partition,
    with stamps (first, last, unix_ms)."""
    db = plyvel.DB(path, create_if_missing=True, **options)
    try:
        with db.write_batch() as batch:
            for seq in offsets:
                batch.put(keys.record_key(TOPIC, PARTITION, seq), value(seq))
            for first, last, unix_ms in stamps:
                batch.put(keys.stamp_key(TOPIC, PARTITION, first), keys.encode_stamp(last, unix_ms, 0))
            batch.put(keys.head_key(TOPIC, PARTITION), keys.seq_bytes(max(offsets)))
    finally:
        db.close()


def read(path: str, start: int, end: int) -> tuple[list[pa.RecordBatch], pa.Table]:
    with leveldb.snapshot_db(path, 5) as db:
        batches = list(leveldb.read_range(db, TOPIC, PARTITION, start, end, ARROW_SCHEMA))
    return batches, pa.Table.from_batches(batches, schema=ARROW_SCHEMA)


@pytest.fixture
def small_batches(monkeypatch):
    monkeypatch.setattr(leveldb, "FIRST_BATCH_ROWS", 3)
    monkeypatch.setattr(leveldb, "BATCH_ROWS", 7)


def test_contiguous_records(tmp_path, small_batches):
    path = str(tmp_path / "db")
    write(path, range(100), stamps=[(0, 49, STAMP_MS), (50, 99, STAMP_MS + 1000)])
    batches, table = read(path, 10, 60)
    assert [b.num_rows for b in batches] == [3] + [7] * 6 + [5]
    assert table.column("offset").to_pylist() == list(range(10, 60))
    assert table.column("value").to_pylist() == [value(s) for s in range(10, 60)]
    assert set(table.column("topic").to_pylist()) == {TOPIC}
    assert set(table.column("partition").to_pylist()) == {PARTITION}
    micros = table.column("timestamp").cast(pa.int64()).to_pylist()
    assert micros == [STAMP_MS * 1000] * 40 + [(STAMP_MS + 1000) * 1000] * 10


def test_gaps_are_skipped_with_exact_offsets(tmp_path, small_batches):
    # Retention deleted 0..19; 30..32 and 41 never arrived; 90.. do not exist yet.
    present = [s for s in range(20, 90) if not (30 <= s <= 32 or s == 41)]
    path = str(tmp_path / "db")
    write(path, present, stamps=[(20, 35, STAMP_MS)])
    for start, end in [(0, 100), (0, 2**63 - 1), (25, 45), (30, 33), (31, 42), (89, 95), (95, 200)]:
        _, table = read(path, start, end)
        wanted = [s for s in present if start <= s < end]
        assert table.column("offset").to_pylist() == wanted, (start, end)
        assert table.column("value").to_pylist() == [value(s) for s in wanted], (start, end)
        stamped = [s <= 35 for s in wanted]
        assert [t is not None for t in table.column("timestamp").to_pylist()] == stamped, (start, end)


def test_a_far_first_record_is_found_at_once(tmp_path):
    path = str(tmp_path / "db")
    far = 10**15
    write(path, [far, far + 1, far + 5])
    batches, table = read(path, 0, far + 10)
    assert len(batches) == 1
    assert table.column("offset").to_pylist() == [far, far + 1, far + 5]
    assert table.column("timestamp").null_count == 3  # no stamps: unknown


def test_large_values_make_smaller_batches(tmp_path, monkeypatch):
    monkeypatch.setattr(leveldb, "FIRST_BATCH_ROWS", 40)
    monkeypatch.setattr(leveldb, "BATCH_ROWS", 40)
    monkeypatch.setattr(leveldb, "BATCH_BYTES", 10_000)
    path = str(tmp_path / "db")
    db = plyvel.DB(path, create_if_missing=True)
    for seq in range(200):
        db.put(keys.record_key(TOPIC, PARTITION, seq), bytes([seq]) * 3_000)
    db.put(keys.head_key(TOPIC, PARTITION), keys.seq_bytes(199))
    db.close()
    batches, table = read(path, 0, 200)
    assert table.column("offset").to_pylist() == list(range(200))
    assert table.column("value").to_pylist() == [bytes([s]) * 3_000 for s in range(200)]
    assert batches[0].num_rows == 40 and all(b.num_rows == 3 for b in batches[1:-1])


def test_arrow_columns_from_buffers():
    column = arrow.repeated("été", 4)
    column.validate(full=True)
    assert column.to_pylist() == ["été"] * 4
    assert arrow.repeated("", 2).to_pylist() == ["", ""]
    values = arrow.binary([b"a", b"", b"\0bc"])
    values.validate(full=True)
    assert values.to_pylist() == [b"a", b"", b"\0bc"]
    assert arrow.int64s(np.array([3, 2**62], dtype=np.uint64)).to_pylist() == [3, 2**62]
    times = arrow.timestamps(np.array([1, 2, 3]), np.array([True, False, True]))
    times.validate(full=True)
    assert times.null_count == 1
    assert times.cast(pa.int64()).to_pylist() == [1, None, 3]
    assert arrow.timestamps(np.array([5])).null_count == 0
    # keys (rfc 18): null for a record without one, empty for an empty key
    for keys_column in (arrow.keys_of([b"k", None, b"", b"\xff"]), arrow.keys_of([None, None]), arrow.null_binaries(3)):
        keys_column.validate(full=True)
    assert arrow.keys_of([b"k", None, b"", b"\xff"]).to_pylist() == [b"k", None, b"", b"\xff"]
    assert arrow.keys_of([None, None]).to_pylist() == [None, None] == arrow.null_binaries(2).to_pylist()


def test_keys_are_read_beside_their_records(tmp_path, small_batches):
    """A record's key lives under 'k' (store/keys.py): a path read puts it in the key column, null where a
    record has none, across batches and gaps."""
    path = str(tmp_path / "db")
    offsets = [0, 1, 2, 3, 5, 6, 7, 8, 9, 10, 11]
    write(path, offsets)
    db = plyvel.DB(path)
    try:
        for seq in offsets:
            if seq % 3:
                db.put(keys.record_key_entry(TOPIC, PARTITION, seq), keys.key_entry_value(b"key %d" % seq, value(seq)))
    finally:
        db.close()
    _, table = read(path, 0, 12)
    assert table.column("offset").to_pylist() == offsets
    assert table.column("key").to_pylist() == [b"key %d" % s if s % 3 else None for s in offsets]


class _Tables:
    """A stand-in for a plyvel.DB that only answers leveldb.sstables."""

    def __init__(self, levels: dict[int, list[int]]) -> None:
        lines = []
        for level in range(7):
            lines.append(f"--- level {level} ---")
            lines += [f" {10 + i}:{size}['a' @ 1 : 1 .. 'b' @ 2 : 1]" for i, size in enumerate(levels.get(level, []))]
        self.text = ("\n".join(lines) + "\n").encode()

    def get_property(self, name: bytes) -> bytes:
        assert name == b"leveldb.sstables"
        return self.text


def test_compaction_pending_follows_leveldb_triggers():
    mib = 1048576
    assert not leveldb.compaction_pending(_Tables({}))
    assert not leveldb.compaction_pending(_Tables({0: [mib] * 3, 1: [5 * mib], 2: [90 * mib]}))
    assert leveldb.compaction_pending(_Tables({0: [mib] * 4}))
    assert leveldb.compaction_pending(_Tables({1: [6 * mib, 4 * mib]}))
    assert not leveldb.compaction_pending(_Tables({1: [6 * mib, 4 * mib - 1]}))
    assert leveldb.compaction_pending(_Tables({3: [1001 * mib]}))
    assert not leveldb.compaction_pending(_Tables({6: [10**6 * mib]}))  # the last level is never compacted


def test_settle_finishes_leveldb_compaction(tmp_path):
    path = str(tmp_path / "db")
    # Small memtables: many level-0 tables, which LevelDB compacts in the background.
    for part in range(8):
        write(path, range(part * 2_000, (part + 1) * 2_000), write_buffer_size=64 * 1024)
    with leveldb.open_db(path, 5) as db:
        assert leveldb.settle(db, path, timeout=60)
        assert not leveldb.compaction_pending(db)
    _, table = read(path, 0, 16_000)
    assert np.array_equal(table.column("offset").to_numpy(), np.arange(16_000))
