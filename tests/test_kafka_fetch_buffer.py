"""kafka/fetch_buffer.py without sockets: what a connection keeps of a partition between two Fetches."""

from __future__ import annotations

import struct

from hypothesis import given, strategies as st

from dafka.kafka.batches import read_batches
from dafka.kafka.fetch_buffer import ROW_BYTES, FrameSlice, PartitionBuffer
from dafka.kafka.mapping import _batches
from dafka.protocol.messages import DirectKeyedRecordsMsg


def rows(offsets, size=10):
    return [(o, 1000 + o, None, b"v" * size, ()) for o in offsets]


def frames(first, values, keys=None, times=None):
    """A DIRECT-KEYED-RECORDS of ``values`` from sequence ``first`` (``keys``: None for none; ``times``: each
    record's timestamp, None for none), as a store answers."""
    u32 = b"".join
    key_lengths = b"" if keys is None else u32(struct.pack("<I", 2**32 - 1 if k is None else len(k)) for k in keys)
    attributes = {} if times is None else {"times": u32(struct.pack("<q", t) for t in times),
                                           "header_lengths": bytes(4 * len(values))}
    return DirectKeyedRecordsMsg("consumer", "store", "topic", first, u32(struct.pack("<I", len(v)) for v in values),
                                 b"".join(values), key_lengths=key_lengths, keys=b"".join(k or b"" for k in keys or []),
                                 **attributes)


def taken_rows(taken):
    """What ``PartitionBuffer.take`` gave, a row per record (frames as the Kafka batch of them reads back)."""
    segments, size = taken
    out = []
    for segment in segments:
        if isinstance(segment, FrameSlice):
            for batch in read_batches(b"".join(_batches([segment]))):
                out += [(batch.base_offset + r.offset_delta, r.timestamp, r.key, r.value, tuple(r.headers))
                        for r in batch.records]
        else:
            out += segment
    return out, size


def test_rows_come_back_from_the_offset_asked_within_the_bytes_and_the_first_one_whatever_its_size():
    buf = PartitionBuffer()
    buf.restart(0)
    buf.add(rows(range(0, 5)))
    buf.add(rows(range(5, 10)))
    assert buf.next == 10 and buf.records == 10
    taken, size = taken_rows(buf.take(3, 3 * (10 + ROW_BYTES)))
    assert [r[0] for r in taken] == [3, 4, 5] and size == 3 * (10 + ROW_BYTES)
    taken, size = taken_rows(buf.take(7, 1))
    assert [r[0] for r in taken] == [7] and size == 10 + ROW_BYTES
    assert taken_rows(buf.take(10, 10_000)) == ([], 0)


def test_rows_delivered_again_are_left_out_and_a_compacted_partitions_gaps_are_kept():
    buf = PartitionBuffer()
    buf.restart(0)
    buf.add(rows([0, 2, 3]))
    buf.add(rows([2, 3, 7, 9]))  # 2 and 3 again (a refetch after a seek), then past a compacted gap
    assert buf.next == 10 and buf.records == 5
    assert [r[0] for r in taken_rows(buf.take(1, 10_000))[0]] == [2, 3, 7, 9]
    assert [r[0] for r in taken_rows(buf.take(4, 10_000))[0]] == [7, 9]


def test_a_fetch_onwards_drops_what_is_behind_and_one_elsewhere_is_not_held():
    buf = PartitionBuffer()
    buf.restart(100)
    buf.add(rows(range(100, 110)))
    buf.add(rows(range(110, 120)))
    assert not buf.holds(99) and not buf.holds(121)
    assert buf.holds(115) and buf.records == 10  # the first chunk went, all behind 115
    assert buf.holds(120) and buf.records == 0
    buf.restart(5)
    assert buf.next == 5 and taken_rows(buf.take(5, 100)) == ([], 0)


def test_a_stores_answer_is_taken_as_it_came_and_cut_by_bytes_and_offset():
    buf = PartitionBuffer()
    buf.restart(0)
    buf.add_frames(frames(0, [b"a" * 10] * 5, [b"k", None, b"", None, b"kk"]), 0, 7)
    buf.add(rows([5]))
    buf.add_frames(frames(3, [b"b" * 10] * 6), 0, 8)  # 3 to 5 again (a refetch): left out
    assert buf.next == 9 and buf.records == 9
    taken, size = buf.take(0, 10_000)
    assert [type(s) for s in taken] == [FrameSlice, list, FrameSlice] and [len(s) for s in taken] == [5, 1, 3]
    got, _ = taken_rows((taken, size))
    assert [(r[0], r[1], r[2]) for r in got[:5]] == [(0, 7, b"k"), (1, 7, None), (2, 7, b""), (3, 7, None), (4, 7, b"kk")]
    assert [r[0] for r in got] == list(range(9)) and got[8] == (8, 8, None, b"b" * 10, ())
    assert size == 9 * (10 + ROW_BYTES) + 3  # and the keys
    got, size = taken_rows(buf.take(2, 2 * (10 + ROW_BYTES) + 1))  # cut inside the first message: its keys count
    assert [r[0] for r in got] == [2, 3] and size == 2 * (10 + ROW_BYTES)
    got, size = taken_rows(buf.take(7, 1))  # the first record whatever its size
    assert [r[0] for r in got] == [7] and size == 10 + ROW_BYTES
    assert buf.holds(6) and buf.records == 3  # the chunks behind 6 went


@given(st.lists(st.integers(1, 5), min_size=1, max_size=60), st.lists(st.integers(1, 12), min_size=1, max_size=8),
       st.integers(0, 80), st.integers(1, 400), st.lists(st.booleans(), min_size=1, max_size=8))
def test_take_is_the_rows_a_record_at_a_time_would_give(steps, chunking, start, budget, as_frames):
    offsets = []
    at = 0
    for step in steps:  # rising offsets with gaps
        at += step
        offsets.append(at)
    all_rows = [(o, o, b"k" if o % 3 else None, b"v" * (o % 17), ()) for o in offsets]
    buf = PartitionBuffer()
    buf.restart(0)

    def add(chunk, i):
        contiguous = chunk and chunk[-1][0] - chunk[0][0] == len(chunk) - 1
        if contiguous and as_frames[i % len(as_frames)]:  # a message's frames, as a store's answer comes
            buf.add_frames(frames(chunk[0][0], [r[3] for r in chunk], [r[2] for r in chunk], [r[1] for r in chunk]), 0, -1)
        else:
            buf.add(chunk)

    i = 0
    for k, n in enumerate(chunking * 10):
        if i >= len(all_rows):
            break
        add(all_rows[i:i + n], k)
        i += n
    add(all_rows[i:], 0)
    expected, size = [], 0
    for r in all_rows:
        if r[0] < start:
            continue
        n = len(r[3]) + len(r[2] or b"") + ROW_BYTES
        if expected and size + n > budget:
            break
        expected.append(r)
        size += n
    assert taken_rows(buf.take(start, budget)) == (expected, size)
