"""The compiled twins (dafka/core/extensions.py): each gives what its pure-Python
module gives, for any input; ``DAFKA_NO_EXTENSIONS`` turns them off; and the
run is the one it says it is.

tox runs the suite with the twins (``DAFKA_EXPECT_EXTENSIONS=compiled``) and
again without (tox -e pure: ``DAFKA_NO_EXTENSIONS=1``,
``DAFKA_EXPECT_EXTENSIONS=pure``): :func:`test_the_run_is_the_one_expected`
fails a run that is not what it was meant to be.  Outside tox, a checkout
whose twins were not built (``python setup.py build_ext --inplace``) skips the
comparisons."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dafka.core import extensions
from dafka.protocol import packing
from dafka import protocol as proto
from dafka.records import Record

EXPECTED = os.environ.get("DAFKA_EXPECT_EXTENSIONS")  # "compiled" or "pure", set by tox


def _twin_module():
    try:
        return importlib.import_module("dafka.protocol._cpacking")
    except ImportError:
        if EXPECTED is not None:
            raise  # tox built the wheel with its twins: a missing one fails
        pytest.skip("the compiled twins are not built in this checkout (python setup.py build_ext --inplace)")


@pytest.fixture(scope="module")
def twin():
    return _twin_module()


def outcome(fn, *args):
    """What a call gives: its result, or the type of what it raised."""
    try:
        return "ok", fn(*args)
    except Exception as exc:
        return "raised", type(exc)


def test_the_run_is_the_one_expected():
    status = extensions.status()
    assert set(status) == set(extensions.TWINNED)
    if EXPECTED == "compiled":
        assert all(status.values()), status
        assert packing.split_records is not packing.PURE["split_records"]
    elif EXPECTED == "pure":
        assert extensions.DISABLED
        assert not any(status.values()), status
        assert packing.split_records is packing.PURE["split_records"]
    else:
        pytest.skip("not under tox: either run is right")


def test_the_environment_variable_turns_them_off(twin):
    code = ("from dafka.core import extensions; from dafka.protocol import packing; "
            "print(extensions.summary()); print(packing.split_records is packing.PURE['split_records'])")
    env = {**os.environ, "DAFKA_NO_EXTENSIONS": "1"}
    off = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert off.returncode == 0, off.stderr
    assert off.stdout.split("\n")[:2] == ["compiled extensions: off (DAFKA_NO_EXTENSIONS is set)", "True"]
    env["DAFKA_NO_EXTENSIONS"] = "0"  # "0" is not "off"
    on = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert on.returncode == 0, on.stderr
    assert on.stdout.split("\n")[:2] == ["compiled extensions: on", "False"]


def test_dafka_version_says_which_ran():
    env = {k: v for k, v in os.environ.items() if k != "DAFKA_NO_EXTENSIONS"}
    out = subprocess.run([sys.executable, "-c", "from dafka.cli.main import main; main(['--version'])"],
                         capture_output=True, text=True, timeout=60, env={**env, "DAFKA_NO_EXTENSIONS": "1"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[1] == "compiled extensions: off (DAFKA_NO_EXTENSIONS is set)"


lengths_frames = st.one_of(
    st.lists(st.integers(0, 300), max_size=40).map(lambda sizes: proto.pack_contents([b"x" * n for n in sizes])[0]),
    st.binary(max_size=64))  # anything: lengths past the contents, huge ones, not a multiple of 4


@settings(max_examples=400, deadline=None)
@given(lengths=lengths_frames, contents=st.binary(max_size=4000))
def test_split_contents_is_the_same(twin, lengths, contents):
    assert outcome(twin.split_contents, lengths, contents) == outcome(packing.PURE["split_contents"], lengths,
                                                                      contents)


@settings(max_examples=400, deadline=None)
@given(values=st.lists(st.binary(max_size=200), max_size=40), first=st.integers(0, 2**64 - 1),
       skip=st.integers(-3, 45), topic=st.text(max_size=8), partition=st.text(max_size=40))
def test_split_records_is_the_same(twin, values, first, skip, topic, partition):
    lengths, contents = proto.pack_contents(values)
    compiled = twin.split_records(topic, partition, first, lengths, contents, skip)
    assert compiled == packing.PURE["split_records"](topic, partition, first, lengths, contents, skip)
    assert all(type(record) is Record for record in compiled)
    assert [record.offset for record in compiled] == list(range(first + max(skip, 0), first + len(values)))


@settings(max_examples=200, deadline=None)
@given(lengths=st.binary(max_size=64), contents=st.binary(max_size=300), first=st.integers(0, 2**64 - 1))
def test_split_records_of_bad_frames_is_the_same(twin, lengths, contents, first):
    assert outcome(twin.split_records, "t", "p", first, lengths, contents) == \
        outcome(packing.PURE["split_records"], "t", "p", first, lengths, contents)


@settings(max_examples=400, deadline=None)
@given(prefix=st.binary(max_size=60), start=st.integers(-5, 2**64 + 5), length=st.integers(-3, 50))
def test_sequence_keys_are_the_same(twin, prefix, start, length):
    end = start + length
    assert outcome(twin.sequence_keys, prefix, start, end) == \
        outcome(packing.PURE["sequence_keys"], prefix, start, end)


@given(pairs=st.lists(st.tuples(st.binary(max_size=20), st.binary(max_size=20)), max_size=30))
def test_put_all_puts_the_same(twin, pairs):
    keys, values = [k for k, _ in pairs], [v for _, v in pairs]
    done: list[tuple[bytes, bytes]] = []
    twin.put_all(lambda k, v: done.append((k, v)), keys, values)
    assert done == pairs


def test_the_records_are_owned_as_the_pure_ones_are(twin):
    """Reference counts: what the twin built is held exactly as what the pure function built (a leak or a
    missing reference would show here long before a crash)."""
    lengths, contents = proto.pack_contents([b"a" * 50, b"b" * 60])
    topic, partition = "t" * 3, "p" * 40
    counts = []
    for split in (twin.split_records, packing.PURE["split_records"]):
        before = sys.getrefcount(topic), sys.getrefcount(partition)
        records = split(topic, partition, 5, lengths, contents)
        counts.append(([sys.getrefcount(r) for r in records], [sys.getrefcount(r.value) for r in records],
                       sys.getrefcount(topic) - before[0], sys.getrefcount(partition) - before[1]))
        del records
        assert (sys.getrefcount(topic), sys.getrefcount(partition)) == before
    assert counts[0] == counts[1]
    assert counts[0][2:] == (2, 2)  # one reference in each of the two records


FIELDS = ("min_acks", "max_unacked", "max_unacked_bytes", "next_seq", "base", "buffered_bytes", "keys", "released",
          "published_bytes", "batch", "batch_keys", "batch_bytes", "batch_first", "batch_due", "last_publish", "note_due")


class _Audience:
    batches = False


def _fields(outbox) -> dict:
    return {name: getattr(outbox, name) for name in FIELDS} | {"buffer": list(outbox.buffer),
                                                              "notes": list(outbox.times.notes)}


@pytest.fixture(scope="module")
def outbox_twin():
    try:
        return importlib.import_module("dafka.producer._coutbox").Outbox
    except ImportError:
        if EXPECTED is not None:
            raise
        pytest.skip("the compiled twins are not built in this checkout (python setup.py build_ext --inplace)")


steps = st.lists(st.one_of(
    st.tuples(st.just("publish"), st.binary(max_size=300), st.floats(0, 1e-4)),  # (content, time since the last)
    st.tuples(st.just("batches"), st.booleans()),  # somebody starts or stops reading RECORDS
    st.tuples(st.just("key"), st.binary(max_size=20)),  # the newest record gets a key
    st.tuples(st.just("take"),),  # the batch goes out
    st.tuples(st.just("drop"),),  # the oldest held record goes (an ACK released it)
), max_size=60)


@settings(max_examples=300, deadline=None)
@given(min_acks=st.integers(0, 2), max_unacked=st.integers(1, 20), max_unacked_bytes=st.integers(0, 3000),
       start=st.integers(0, 2**64 - 100), steps=steps)
def test_the_outbox_twin_keeps_the_same_fields(outbox_twin, min_acks, max_unacked, max_unacked_bytes, start, steps):
    from dafka.producer import outbox

    boxes = [cls(min_acks, max_unacked, max_unacked_bytes, _Audience()) for cls in (outbox_twin, outbox.Outbox)]
    for box in boxes:
        box.next_seq = box.base = start
        box.released = start - 1
    now = 0.0
    for step in steps:
        if step[0] == "publish":
            now += step[2]
        results = []
        for box in boxes:
            if step[0] == "publish":
                results.append(box.publish(step[1], now))
            elif step[0] == "batches":
                box.audience.batches = step[1]
            elif step[0] == "key" and box.next_seq > box.base:
                box.keys[box.next_seq - 1] = step[1]
                box.buffered_bytes += len(step[1])
            elif step[0] == "take":
                box.batch = []
                box.batch_bytes = 0
            elif step[0] == "drop" and box.buffer:
                box._drop_oldest()
        assert results[:1] == results[1:]
        assert _fields(boxes[0]) == _fields(boxes[1])
    assert type(boxes[0]) is outbox_twin and type(boxes[1]) is outbox.Outbox and outbox_twin is not outbox.Outbox


def test_a_producer_state_is_the_outbox_that_runs():
    from dafka.producer import outbox
    from dafka.producer.state import ProducerState

    base = ProducerState.__mro__[1]
    assert base.__name__ == "Outbox"
    assert (base is not outbox.Outbox) == extensions.status()["dafka.producer.outbox"]
    state = ProducerState("p" * 32, "t", min_acks=0)
    assert state.publish(b"abc") == 0 and state.buffered_bytes == 3
