"""The checker itself, on hand-written logs: it must name every kind of anomaly."""

from __future__ import annotations

import os
import signal

import msgpack
import plyvel
import pytest

from dafka.store import keys
from faultcheck import ConsumerRun, ProducerLog, check, read_journal
from roles import decode_value, encode_value, value_for

pytestmark = pytest.mark.faults

P = "AB12CD34EF56AB12CD34EF56AB12CD34"
TOPIC = "t"


def producer_log(tmp_path, sent: range, acked: range, close: str = "ok") -> ProducerLog:
    path = tmp_path / "p.log"
    lines = [f"address {P}", f"topic {TOPIC}"]
    lines += [f"sent {i}" for i in sent] + [f"acked {i}" for i in acked] + [f"close {close}"]
    path.write_text("\n".join(lines) + "\n")
    return ProducerLog.read(path)


def consumer_run(tmp_path, name: str, offsets: list[int], journal: dict[str, int] | None = None,
                 values: dict[int, bytes] | None = None) -> ConsumerRun:
    path = tmp_path / f"{name}.log"
    values = values or {}
    path.write_text("".join(f"{P} {o} {encode_value(values.get(o, value_for(P, o)))}\n" for o in offsets))
    snapshot = None
    if journal is not None:
        snapshot = tmp_path / f"{name}.journal"
        snapshot.write_bytes(b"".join(msgpack.packb([TOPIC, p, n]) for p, n in journal.items()))
    return ConsumerRun.read(path, snapshot)


def test_a_clean_run_has_no_anomaly(tmp_path):
    plog = producer_log(tmp_path, range(10), range(10))
    report = check("clean", [plog], {"c": [consumer_run(tmp_path, "c", list(range(10)))]})
    assert (report.produced, report.acked, report.delivered, report.anomalies, report.unseen) == (10, 10, 10, 0, 0)


def test_every_anomaly_is_named(tmp_path):
    plog = producer_log(tmp_path, range(12), range(8), close="unacked 4")
    assert plog.unacked_at_close == 4
    bad = consumer_run(tmp_path, "bad", [0, 1, 1, 3, 2, 5], values={5: b"forged"})
    report = check("bad", [plog], {"bad": [bad]})
    assert report.dup == 1  # 1 twice
    assert report.out_of_order == 1  # 2 after 3
    assert report.corrupt == 1  # 5 has the wrong value
    assert report.lost == 3  # 4, 6, 7 acked, never delivered (5 was, with a wrong value)
    assert report.unseen == 4  # 8..11: sent, never acked nor delivered
    assert report.anomalies == 6 and any("never delivered" in d for d in report.details)


def test_lost_counts_acked_records_missing_from_a_required_sink(tmp_path):
    plog = producer_log(tmp_path, range(6), range(6))
    report = check("lost", [plog], {"c": [consumer_run(tmp_path, "c", [0, 1, 2, 4, 5])],
                                    "spectator": [consumer_run(tmp_path, "s", [])]},
                   required_consumers=["c"])
    assert report.lost == 1 and report.dup == report.out_of_order == 0


def test_a_kill_may_repeat_only_the_uncommitted_last_record(tmp_path):
    plog = producer_log(tmp_path, range(10), range(10))
    # Run 1 logged 0..4; the journal it left says the next one is 4: record 4 was logged, not committed.
    first = consumer_run(tmp_path, "r1", [0, 1, 2, 3, 4], journal={P: 4})
    second = consumer_run(tmp_path, "r2", [4, 5, 6, 7, 8, 9])
    report = check("kill", [plog], {"c": [first, second]})
    assert (report.redelivered, report.dup, report.out_of_order, report.lost) == (1, 0, 0, 0)
    # Committed (journal says 5): a repeat of 4 is a duplicate.
    first = consumer_run(tmp_path, "r1", [0, 1, 2, 3, 4], journal={P: 5})
    report = check("kill", [plog], {"c": [first, second]})
    assert (report.redelivered, report.dup) == (0, 1)
    # Two records uncommitted is a product bug: only the last one may repeat.
    first = consumer_run(tmp_path, "r1", [0, 1, 2, 3, 4], journal={P: 3})
    second = consumer_run(tmp_path, "r2", [3, 4, 5, 6, 7, 8, 9])
    report = check("kill", [plog], {"c": [first, second]})
    assert (report.redelivered, report.dup) == (1, 1)


def test_stores_are_checked_and_every_key_must_decode(tmp_path):
    plog = producer_log(tmp_path, range(5), range(5))
    db = plyvel.DB(str(tmp_path / "db"), create_if_missing=True)
    for seq in (0, 1, 3, 4):
        db.put(keys.record_key(TOPIC, P, seq), value_for(P, seq))
    db.put(keys.head_key(TOPIC, P), (1).to_bytes(8, "big"))
    db.close()
    report = check("store", [plog], stores={"s": tmp_path / "db"}, complete_stores=["s"])
    assert report.lost == 1 and report.stored == 4
    db = plyvel.DB(str(tmp_path / "db"))
    db.put(b"Xjunk", b"")
    db.close()
    with pytest.raises(ValueError):
        check("store", [plog], stores={"s": tmp_path / "db"})


def test_log_encoding_round_trips_any_bytes(tmp_path):
    for raw in (b"plain", b"with space", b"new\nline", b"", b"\xff\x00", b"hex:abc"):
        assert decode_value(encode_value(raw)) == raw
    path = tmp_path / "journal"
    path.write_bytes(msgpack.packb(["t", "A", 3]) + msgpack.packb(["t", "A", 4]) + b"\xc1")
    assert read_journal(path) == {"A": 4}


def test_the_soak_joins_a_groups_tenures_of_a_partition():
    """The 5-minute soak of 2026-11-27 failed on "group repeated ... 95..152": g1 had read 0..94, handed
    the partition to g2 while their views differed, and took it back at g2's commit 153; the check took
    each member's first and last offset for one span, so g1's [0, 376207] seemed to cover g2's tenure."""
    from soak import group_anomalies

    heads = {P: 1000}
    g1, g2 = {P: [[0, 94], [153, 1000]]}, {P: [[95, 152]]}
    assert group_anomalies(heads, [g1, g2]) == []
    assert group_anomalies(heads, [{P: [[0, 152], [153, 1000]]}, g2]) == [f"group repeated {P} 95..152"]
    assert group_anomalies(heads, [{P: [[0, 94], [160, 1000]]}, g2]) == [f"group lost {P} 153..159"]
    assert group_anomalies(heads, [{P: [[0, 94], [153, 900]]}, g2]) == [f"group lacks {P} after 900 (head 1000)"]


def test_the_soak_measures_a_database_whose_tables_vanish(tmp_path, monkeypatch):
    """The 60-minute soak of 2026-11-27 died at minute 41 with FileNotFoundError: LevelDB's compaction
    deleted a table between the disk-use sampler's listing of the directory and its stat of that file."""
    import soak

    (tmp_path / "000001.ldb").write_bytes(b"x" * 1000)
    real_walk = os.walk

    def walk_with_a_vanished_table(path):
        for root, dirs, files in real_walk(path):
            yield root, dirs, files + ["000002.ldb"]  # listed, then deleted by a compaction

    monkeypatch.setattr(os, "walk", walk_with_a_vanished_table)
    assert soak.directory_bytes(str(tmp_path)) == 1000


def test_the_soak_samples_children_started_by_any_thread():
    """Spark's JVM starts its Python workers from threads other than its main one, and a child is listed
    under the thread that started it: the soak sampled Spark without its workers until 2026-11-27."""
    import subprocess
    import sys
    import time

    import soak

    code = ("import subprocess, threading\n"
            "t = threading.Thread(target=subprocess.run, args=([sys.executable, '-c', 'import time; time.sleep(30)'],))\n"
            "t.start(); t.join()")
    parent = subprocess.Popen([sys.executable, "-c", "import sys\n" + code])
    try:
        deadline = time.monotonic() + 10
        while len(soak._proc_tree(parent.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(soak._proc_tree(parent.pid)) == 2
    finally:
        for pid in soak._proc_tree(parent.pid)[1:]:
            os.kill(pid, signal.SIGTERM)
        parent.wait(10)
