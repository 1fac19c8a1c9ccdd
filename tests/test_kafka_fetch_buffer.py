"""kafka/fetch_buffer.py without sockets: what a connection keeps of a partition between two Fetches."""

from __future__ import annotations

from hypothesis import given, strategies as st

from dafka.kafka.fetch_buffer import ROW_BYTES, PartitionBuffer


def rows(offsets, size=10):
    return [(o, 1000 + o, None, b"v" * size, ()) for o in offsets]


def test_rows_come_back_from_the_offset_asked_within_the_bytes_and_the_first_one_whatever_its_size():
    buf = PartitionBuffer()
    buf.restart(0)
    buf.add(rows(range(0, 5)))
    buf.add(rows(range(5, 10)))
    assert buf.next == 10 and buf.records == 10
    taken, size = buf.take(3, 3 * (10 + ROW_BYTES))
    assert [r[0] for r in taken] == [3, 4, 5] and size == 3 * (10 + ROW_BYTES)
    taken, size = buf.take(7, 1)
    assert [r[0] for r in taken] == [7] and size == 10 + ROW_BYTES
    assert buf.take(10, 10_000) == ([], 0)


def test_rows_delivered_again_are_left_out_and_a_compacted_partitions_gaps_are_kept():
    buf = PartitionBuffer()
    buf.restart(0)
    buf.add(rows([0, 2, 3]))
    buf.add(rows([2, 3, 7, 9]))  # 2 and 3 again (a refetch after a seek), then past a compacted gap
    assert buf.next == 10 and buf.records == 5
    assert [r[0] for r in buf.take(1, 10_000)[0]] == [2, 3, 7, 9]
    assert [r[0] for r in buf.take(4, 10_000)[0]] == [7, 9]


def test_a_fetch_onwards_drops_what_is_behind_and_one_elsewhere_is_not_held():
    buf = PartitionBuffer()
    buf.restart(100)
    buf.add(rows(range(100, 110)))
    buf.add(rows(range(110, 120)))
    assert not buf.holds(99) and not buf.holds(121)
    assert buf.holds(115) and buf.records == 10  # the first chunk went, all behind 115
    assert buf.holds(120) and buf.records == 0
    buf.restart(5)
    assert buf.next == 5 and buf.take(5, 100) == ([], 0)


@given(st.lists(st.integers(1, 5), min_size=1, max_size=60), st.lists(st.integers(1, 12), min_size=1, max_size=8),
       st.integers(0, 80), st.integers(1, 400))
def test_take_is_the_rows_a_record_at_a_time_would_give(steps, chunking, start, budget):
    offsets = []
    at = 0
    for step in steps:  # rising offsets with gaps
        at += step
        offsets.append(at)
    all_rows = [(o, o, b"k" if o % 3 else None, b"v" * (o % 17), ()) for o in offsets]
    buf = PartitionBuffer()
    buf.restart(0)
    i = 0
    for n in chunking * 10:
        if i >= len(all_rows):
            break
        buf.add(all_rows[i:i + n])
        i += n
    buf.add(all_rows[i:])
    expected, size = [], 0
    for r in all_rows:
        if r[0] < start:
            continue
        n = len(r[3]) + len(r[2] or b"") + ROW_BYTES
        if expected and size + n > budget:
            break
        expected.append(r)
        size += n
    assert buf.take(start, budget) == (expected, size)
