"""The console's cluster model (ui/model.py, sans-I/O) and value rendering (ui/values.py), without a browser or
a socket."""

from __future__ import annotations

import json

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dafka import protocol as proto
from dafka.ui import values
from dafka.ui.model import ClusterModel

P1, P2 = "A" * 32, "B" * 32
R1, R2 = "1" * 32, "2" * 32


def model_with_stores() -> ClusterModel:
    m = ClusterModel("C" * 32)
    for n, address in enumerate((P1, P2, R1, R2)):
        m.peer_up(f"tcp://127.0.0.1:{1000 + n}", address, 0.0)
    for reader, store in ((R1, "s1"), (R2, "s2")):
        m.on_message(proto.PeerInfoMsg(m.address, reader, "store-reader", {
            "version": "0.2.0", "host": "h", "pid": 1, "started": 100.0, "now": 110.0, "cpu": 1.0, "rss": 2**20,
            "details": {"store": store, "disk": 4096, "topic_bytes": {"orders": 1000}}}), 0.0)
    return m


def test_heads_tails_records_and_stores_of_a_partition():
    m = model_with_stores()
    m.on_message(proto.HeadMsg("orders", P1, "orders", 99), 1.0)
    m.on_message(proto.DirectPartitionsMsg(m.address, R1, "", (proto.PartitionInfo("orders", P1, 10, 99),)), 1.0)
    m.on_message(proto.DirectPartitionsMsg(m.address, R2, "", (proto.PartitionInfo("orders", P1, 0, 98),)), 1.0)
    [row] = m.topic("orders")
    assert (row["producer_head"], row["head"], row["tail"], row["records"]) == (99, 99, 0, 100)
    assert [(s["store"], s["head"]) for s in row["stores"]] == [("s1", 99), ("s2", 98)]
    assert row["alive"]
    # a DIRECT-HEAD names no store: shown as a reference store only when it holds more than the named ones
    m.on_message(proto.DirectHeadMsg(m.address, P1, "orders", 99), 1.0)
    assert len(m.topic("orders")[0]["stores"]) == 2
    m.on_message(proto.DirectHeadMsg(m.address, P1, "orders", 120), 1.0)
    assert m.topic("orders")[0]["stores"][-1] == {"reader": "", "store": "a reference store", "head": 120, "tail": None}
    [topic] = m.topics(1.0)
    assert topic == {"topic": "orders", "partitions": 1, "records": 121, "rate": 0.0, "live": 1, "bytes": 2000}


def test_peers_roles_info_cpu_and_the_gone():
    m = model_with_stores()
    m.on_subscription(proto.Subscription(True, proto.ACK, P1))  # a producer subscribes K<its address>
    m.on_message(proto.PeerInfoMsg(m.address, R1, "store-reader", {
        "version": "0.2.0", "host": "h", "pid": 1, "started": 100.0, "now": 120.0, "cpu": 3.0, "rss": 2**21,
        "details": {"store": "s1"}}), 10.0)
    o = m.overview(10.0)
    roles = {p["address"]: p["role"] for p in o["peers"]}
    assert roles == {P1: "producer", P2: "unknown", R1: "store-reader", R2: "store-reader"}
    r1 = next(p for p in o["peers"] if p["address"] == R1)
    assert r1["cpu"] == pytest.approx(0.2)  # 2 s of CPU over 10 s
    assert r1["uptime"] == pytest.approx(20.0) and r1["rss"] == 2**21 and r1["version"] == "0.2.0"
    assert next(p for p in o["peers"] if p["address"] == P2)["reference"]  # said nothing of itself
    m.peer_down("tcp://127.0.0.1:1000", 12.0)
    o = m.overview(13.0)
    assert P1 not in {p["address"] for p in o["peers"]}
    assert o["gone"] == [{"ago": 1.0, "address": P1, "role": "producer"}]


def test_rates_count_growth_not_discovery():
    m = model_with_stores()
    m.on_message(proto.HeadMsg("orders", P1, "orders", 1_000_000), 0.0)  # a partition met with a million records
    m.tick(0.0)
    m.tick(1.0)
    assert m.rates[-1][1] == 0.0
    m.on_message(proto.HeadMsg("orders", P1, "orders", 1_000_500), 2.0)
    m.tick(2.0)
    assert m.rates[-1][1] == pytest.approx(250.0)  # 500 records over the 2 s since the first sample
    assert m.topics(2.0)[0]["rate"] == pytest.approx(250.0)
    assert m.topics(2.0 + 5)[0]["rate"] == 0.0  # the head stood still


def test_group_members_commits_lag_and_a_group_without_members():
    m = model_with_stores()
    m.on_message(proto.HeadMsg("orders", P1, "orders", 99), 0.0)
    m.on_message(proto.HeadMsg("orders", P2, "orders", 49), 0.0)
    entries = (proto.GroupEntry("orders", P1, 90), proto.GroupEntry("orders", P2, proto.NO_OFFSET))
    m.on_message(proto.GroupMemberMsg("billing", R1, ("orders",), entries), 0.0)
    rows = {r["partition"]: r for r in m.group_partitions("billing")}
    assert (rows[P1]["committed"], rows[P1]["lag"], rows[P1]["member"]) == (90, 10, R1)
    assert (rows[P2]["committed"], rows[P2]["lag"]) == (None, 50)
    [g] = m.groups_overview()
    assert (g["members"], g["lag"], g["state"]) == (1, 60, "stable")
    m.tick(1.0)
    assert list(m.groups["billing"].lag) == [(1.0, 60)]
    m.on_message(proto.GroupMemberMsg("billing", R1, ("orders",), entries, leaving=True), 2.0)
    m.on_commits("billing", {("orders", P2): 50})
    [g] = m.groups_overview()
    assert (g["members"], g["lag"], g["state"]) == (0, 10, "empty")
    # a group known only by its offsets topic on the stores
    m.on_message(proto.DirectPartitionsMsg(m.address, R1, "", (proto.PartitionInfo("__dafka_offsets.late", P1, 0, 3),)), 3.0)
    assert m.group_names() == ["billing", "late"]
    assert [t["topic"] for t in m.topics(3.0)] == ["orders"]  # internal topics hidden...
    assert "__dafka_offsets.late" in [t["topic"] for t in m.topics(3.0, internal=True)]  # ...unless asked
    assert m.topics(3.0, "ORD") and not m.topics(3.0, "nope")


def test_under_replicated_partitions_of_sharded_stores():
    m = model_with_stores()
    m.on_message(proto.StoreMemberMsg("w1", "s1", replicas=2, reader=R1), 0.0)
    m.on_message(proto.StoreMemberMsg("w2", "s2", replicas=2, reader=R2, filling=(("orders", P1),)), 0.0)
    m.on_message(proto.DirectPartitionsMsg(m.address, R1, "", (proto.PartitionInfo("orders", P1, 0, 9),)), 0.0)
    m.on_message(proto.DirectPartitionsMsg(m.address, R2, "", (proto.PartitionInfo("orders", P1, 0, 5),)), 0.0)
    assert m.under_replicated() == [("orders", P1)]
    m.on_message(proto.StoreMemberMsg("w2", "s2", replicas=2, reader=R2), 0.0)
    m.on_message(proto.DirectPartitionsMsg(m.address, R2, "", (proto.PartitionInfo("orders", P1, 0, 9),)), 0.0)
    assert m.under_replicated() == []
    assert m.overview(0.0)["sharded"]


def test_mirrors_and_connectors_one_row_a_process():
    m = model_with_stores()
    for address in (P1, P2):
        m.on_message(proto.PeerInfoMsg(m.address, address, "producer", {
            "host": "h", "pid": 7, "application": "mirror", "application_details": {"name": "m", "rows": []}}), 0.0)
    [row] = m.applications("mirror")
    assert row["details"]["name"] == "m" and len(row["peers"]) == 2
    assert m.applications("cdc") == []


def test_a_kafka_group_shows_the_members_and_state_its_gateway_describes():
    m = model_with_stores()
    m.on_message(proto.DirectPartitionsMsg(m.address, R1, "", (proto.PartitionInfo("__dafka_offsets.kg", P1, 0, 3),)),
                 0.0)
    details = {"listener": "127.0.0.1:9092", "kafka_groups": [
        {"group": "kg", "state": "Stable", "protocol": "range", "generation": 3, "members": 2, "lag": 5},
        {"group": 7, "state": "Stable"},  # (hostile: no name) left out
        {"group": "fresh", "state": "PreparingRebalance", "members": "two"}]}  # (a wrong type reads as absent)
    m.on_message(proto.PeerInfoMsg(m.address, P2, "producer", {"host": "h", "pid": 9, "application": "kafka",
                                                               "application_details": details}), 0.0)
    assert sorted(m.kafka_groups()) == ["fresh", "kg"]
    rows = {g["group"]: g for g in m.groups_overview()}
    assert (rows["kg"]["members"], rows["kg"]["state"], rows["kg"]["kafka"]) == (2, "stable", "127.0.0.1:9092")
    assert (rows["fresh"]["members"], rows["fresh"]["state"]) == (0, "preparingrebalance")


@pytest.mark.parametrize("raw, fmt, shown", [
    (b'{"a": [1, 2]}', "auto", "json"),
    (b"plain words", "auto", "text"),
    ("<script>alert(1)</script>".encode(), "auto", "text"),
    (b"\xff\xfe\x00<b>", "auto", "hex"),
    (msgpack.packb({"k": [1, b"\x00"]}), "auto", "msgpack"),
    (b"12", "auto", "json"),
    (b"not json", "json", "hex"),
    (b"\xff", "text", "text"),
    (b'{"a": 1}', "hex", "hex"),
])
def test_values_are_rendered_as_the_bytes_say(raw, fmt, shown):
    used, text = values.render(raw, fmt)
    assert used == shown
    if used == "json":
        assert json.loads(text) == json.loads(raw)
    if raw.startswith(b"<script>"):
        assert text == raw.decode()  # as it is: the templates escape it
    if used == "hex":
        assert text.startswith("00000000  " + raw[:1].hex())


def test_values_refuse_an_unknown_format():
    with pytest.raises(ValueError, match="unknown format"):
        values.render(b"x", "yaml")


# Any body a peer may send (rfc 17: a map of strings to plain values), and bodies shaped like the real ones
# with values of any type: the model and every template that shows them must neither fail nor let markup through.
_any = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats() | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=12), inner, max_size=3),
    max_leaves=10)
_keys = st.sampled_from(["version", "host", "pid", "started", "now", "rss", "cpu", "metrics", "application",
                         "details", "application_details", "store", "disk", "path", "topic_bytes", "retention_ms",
                         "rows", "topic", "partition", "lag", "lag_seconds", "tables", "topics", "name", "source"])
_bodies = st.dictionaries(st.one_of(_keys, st.text(max_size=8)),
                          st.one_of(_any, st.dictionaries(_keys, _any, max_size=6),
                                    st.lists(st.dictionaries(_keys, _any, max_size=6), max_size=3)),
                          max_size=10)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["producer", "store-reader", "consumer", "<b>x</b>"]), _bodies),
                min_size=1, max_size=4))
def test_hostile_peer_info_neither_breaks_a_page_nor_reaches_it_as_markup(infos):
    from dafka.ui.app import Console

    m = model_with_stores()
    for n, (role, body) in enumerate(infos):
        m.on_message(proto.PeerInfoMsg(m.address, (P1, P2, R1, R2)[n], role, {**body, "host": "<script>x</script>"}), 1.0)
    m.on_message(proto.DirectPartitionsMsg(m.address, R1, "", (proto.PartitionInfo("orders", P1, 0, 9),)), 1.0)
    env = Console(None, allow_produce=False).env  # type: ignore[arg-type]
    common = {"title": "t", "request_path": "/", "token": "k", "tower": True, "towers": ["tcp://127.0.0.1:1"]}
    stores = m.stores()
    pages = [
        env.get_template("overview.html").render(o=m.overview(2.0), **common),
        env.get_template("topics.html").render(rows=m.topics(2.0), q="", internal=False, **common),
        env.get_template("topic.html").render(
            name="orders", rows=m.topic("orders", 2.0), stores=len(stores), mirrored={},
            retention=sorted({(s["retention_ms"], s["retention_bytes"]) for s in stores if s["retention_ms"] is not None}),
            **common),
        env.get_template("connectors.html").render(mirrors=m.applications("mirror"), cdc=m.applications("cdc"),
                                                   provenance=[], **common),
    ]
    for html in pages:
        assert "<script>x" not in html and "<b>x</b>" not in html
