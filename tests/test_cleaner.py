"""Compacted topics in the store (store/cleaner.py, rfc section 19), on real LevelDB without sockets: the
writer's state stages keyed records, the cleaner's passes delete what newer records of the same key
supersede, and a consumer reading the partition from the beginning ends with the newest value of every
live key, whatever the schedule of passes and kills."""

from __future__ import annotations

import plyvel
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dafka import protocol as proto
from dafka.store import cleaner, keys
from dafka.store.writer_state import WriterState

P = "P" * 32
W = "W" * 32
TOPIC = "prices"


class Partition:
    """A store's database and writer state for one partition of a compacted topic."""

    def __init__(self, path: str) -> None:
        self.db = plyvel.DB(path, create_if_missing=True)
        self.state = WriterState(W, stamp_span_ms=0)
        self.next = 0

    @property
    def p(self):
        return self.state.partitions[(TOPIC, P)]

    def write(self, records: list[tuple[bytes | None, bytes]], unix_ms: int = 1_000) -> None:
        """Records (key, value) as one KEYED-RECORDS, written as the writer writes a batch."""
        lengths, contents = proto.pack_contents([v for _, v in records])
        key_lengths, packed = proto.pack_keys([k for k, _ in records])
        self.state.on_frames(proto.encode(proto.KeyedRecordsMsg(TOPIC, P, TOPIC, self.next, lengths, contents, (),
                                                                 key_lengths, packed)))
        self.next += len(records)
        batch = self.state.take_batch(unix_ms)
        with self.db.write_batch() as wb:
            for k, v in zip(batch.keys, batch.values):
                wb.put(k, v)
        self.state.batch_written(batch)

    def compact(self, now_ms: int = 2_000, tombstone_ms: int = 10**9, budget: int = 7, steps: int = 10**9,
                interruptions: list[bool] = ()) -> bool:
        """Run passes (``budget`` keys a step, at most ``steps`` steps) while one is due; True if it got to
        the end of them.  ``interruptions``: what a step hears at each key entry when it asks whether records
        wait (then none)."""
        heard = iter(interruptions)
        topics = cleaner.Topics(TOPIC)
        if (TOPIC, P) not in self.state.partitions:
            return True
        for _ in range(100):
            p = cleaner.due([self.p], topics, now_ms)
            if p is None:
                return True
            cleaning = cleaner.Pass(p, cleaner.tombstone_limit(self.db, p, now_ms, tombstone_ms))
            cleaning.check_every = 1
            while not cleaning.done:
                if steps <= 0:
                    return False
                steps -= 1
                deletes = cleaning.step(self.db, budget, lambda: next(heard, False))
                with self.db.write_batch() as wb:
                    for k in deletes:
                        wb.delete(k)
            cleaning.finish(now_ms, tombstone_ms)
        raise AssertionError("passes never end")

    def kill(self) -> None:
        """A restart: what is in memory is gone, the database stays."""
        self.state = WriterState(W, stamp_span_ms=0)
        head = self.db.get(keys.head_key(TOPIC, P))
        if head is not None:
            self.state.load(TOPIC, P, keys.seq_of(head))

    def read(self) -> list[tuple[int, bytes | None, bytes]]:
        """What a consumer from the beginning gets: (offset, key, value), in order."""
        record_keys = {keys.seq_of(k[-8:]): v for k, v in self.db.iterator(prefix=keys.partition_prefix(
            keys.RECORD_KEY, TOPIC, P))}
        out = []
        for k, value in self.db.iterator(prefix=keys.partition_prefix(keys.RECORD, TOPIC, P)):
            seq = keys.seq_of(k[-8:])
            entry = record_keys.get(seq)
            out.append((seq, None if entry is None else entry[1:], value))
        return out

    def close(self) -> None:
        self.db.close()


@pytest.fixture
def part(tmp_path):
    made = Partition(str(tmp_path / "db"))
    yield made
    made.close()


def newest(records) -> dict[bytes, bytes]:
    """The state a consumer builds: the newest value of each key, a tombstone (empty value) deleting it."""
    state: dict[bytes, bytes] = {}
    for _, key, value in records:
        if key is None:
            continue
        if value:
            state[key] = value
        else:
            state.pop(key, None)
    return state


def test_a_pass_keeps_the_newest_record_of_each_key_and_every_unkeyed_one(part):
    part.write([(b"a", b"1"), (b"b", b"1"), (None, b"x"), (b"a", b"2")])
    part.write([(b"a", b"3"), (b"c", b"1"), (None, b"y"), (b"b", b"2")])
    assert part.compact()
    assert part.read() == [(2, None, b"x"), (4, b"a", b"3"), (5, b"c", b"1"), (6, None, b"y"), (7, b"b", b"2")]
    assert part.p.cleaned == 7 and part.p.clean_keys == 3
    # offsets never change; more records make the partition dirty again
    part.write([(b"c", b"2")])
    assert cleaner.due([part.p], cleaner.Topics("p*"), 0) is None  # one dirty record against 3 clean keys
    part.write([(b"c", b"3"), (b"d", b"1"), (b"d", b"2")])
    assert part.compact()
    assert part.read() == [(2, None, b"x"), (4, b"a", b"3"), (6, None, b"y"), (7, b"b", b"2"), (9, b"c", b"3"),
                           (11, b"d", b"2")]


def test_a_tombstone_deletes_its_key_and_goes_itself_once_old_and_clean(part):
    part.write([(b"a", b"1"), (b"b", b"1"), (b"a", b"")], unix_ms=1_000)  # a deleted
    assert part.compact(now_ms=2_000, tombstone_ms=500)
    # the pass that met it made it clean; its records before it are gone, it stays until the next pass
    assert part.read() == [(1, b"b", b"1"), (2, b"a", b"")]
    assert part.p.tombstones_due_ms == 2_500
    assert part.compact(now_ms=2_400, tombstone_ms=500)  # not due yet
    assert part.read() == [(1, b"b", b"1"), (2, b"a", b"")]
    assert part.compact(now_ms=2_600, tombstone_ms=500)
    assert part.read() == [(1, b"b", b"1")]
    # a young tombstone stays: it was received 1,000 ms before, tombstone_ms is 5,000
    part.write([(b"b", b"")], unix_ms=10_000)
    assert part.compact(now_ms=11_000, tombstone_ms=5_000) and part.compact(now_ms=12_000, tombstone_ms=5_000)
    assert part.read() == [(3, b"b", b"")]


def test_topics_are_matched_by_their_patterns():
    topics = cleaner.Topics(" cdc.*, prices ,")
    assert "cdc.shop" in topics and "prices" in topics and "prices2" not in topics and "x.cdc.a" not in topics
    assert not cleaner.Topics("") and cleaner.Topics("a")


writes = st.lists(st.tuples(st.one_of(st.none(), st.sampled_from([b"a", b"b", b"c", b"d", b"e"])),
                            st.sampled_from([b"", b"1", b"2", b"3"])), min_size=1, max_size=12)
events = st.lists(st.one_of(
    st.tuples(st.just("write"), writes),
    st.tuples(st.just("compact"), st.tuples(st.integers(1, 6), st.lists(st.booleans(), max_size=12))),
    # steps of a pass, cut short (as by a kill); steps ended early when records wait
    st.tuples(st.just("kill"), st.none()),
), min_size=1, max_size=25)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(events, st.booleans())
def test_any_schedule_of_writes_passes_and_kills_leaves_the_newest_value_of_every_live_key(tmp_path_factory, script,
                                                                                            old_tombstones):
    part = Partition(str(tmp_path_factory.mktemp("cleaner") / "db"))
    try:
        written: list[tuple[int, bytes | None, bytes]] = []
        tombstone_ms = 0 if old_tombstones else 10**9
        for kind, arg in script:
            if kind == "write":
                first = part.next
                part.write(list(arg))
                written.extend((first + i, k, v) for i, (k, v) in enumerate(arg))
            elif kind == "compact":
                steps, interruptions = arg
                part.compact(tombstone_ms=tombstone_ms, budget=3, steps=steps, interruptions=interruptions)
            else:
                part.kill()
        part.compact(tombstone_ms=tombstone_ms, budget=3)
        part.compact(now_ms=10**7, tombstone_ms=tombstone_ms, budget=3)  # a later pass, for old tombstones
        kept = part.read()
        offsets = [seq for seq, _, _ in kept]
        assert offsets == sorted(set(offsets))  # strictly increasing, and never moved
        assert set(kept) <= set(written)  # nothing new, nothing changed
        assert newest(kept) == newest(written)  # the newest value of every live key, and no deleted one back
        assert [r for r in written if r[1] is None] == [r for r in kept if r[1] is None]  # unkeyed: all kept
        superseded = {seq for seq, key, _ in written
                      if key is not None and any(s > seq and k == key for s, k, _ in written)}
        assert not superseded & set(offsets)  # ...and nothing a newer record of its key supersedes
    finally:
        part.close()
