"""Fuzzing every socket of every peer with random and mutated frames.

A tower, a store, a producer and a consumer run as processes.  The test
process is a raw peer:

* an XPUB bound and announced with :class:`dafka.discovery.beacon.Beacon`, so every
  peer's SUB connects to it: the producer's per-peer SUB (``K``/``F``), the
  consumer's SUB, the store writer's and reader's SUBs.  Frames are sent with
  the routing prefixes those SUBs subscribe to, so they get through;
* XSUB sockets connected to every bound socket (producer XPUB, consumer XPUB,
  store reader XPUB, store writer PUB, tower XPUB), sending subscription
  garbage;
* a PUB connected to the tower's XSUB, sending beacon garbage.

Hypothesis draws random frame lists and mutations of valid frames produced
with ``dafka.protocol.encoding.encode`` (bounded to ~20 s; seed ``$DAFKA_FUZZ_SEED``).
Afterwards every peer must still be alive, must have counted what it dropped
(``stats()['malformed']``), a valid record must still go end to end, and the
store's LevelDB must open with every key decoding with ``store/keys.py``.

Input classes that once broke peers (one-frame records, NUL in addresses,
unusable or non-UTF-8 beacon endpoints) each have a regression test at the
end of this file and are part of the broad run; ``DAFKA_FUZZ_KNOWN_BUGS=0``
leaves them out.  ``DAFKA_FUZZ_SECONDS`` sets the budget (default 20).
"""

from __future__ import annotations

import os
import time

import pytest
import zmq
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from dafka import protocol as proto
from faultcheck import check, read_store
from faultkit import Cluster, FuzzPeer, acked_keys, addr, free_port
from helpers import wait_for

pytestmark = pytest.mark.faults

TOPIC = "fz"
FUZZ_SECONDS = float(os.environ.get("DAFKA_FUZZ_SECONDS", "20"))
FUZZ_SEED = int(os.environ.get("DAFKA_FUZZ_SEED", "46"))
# The input classes of the fixed bugs below are fuzzed too unless this is 0.
FUZZ_KNOWN_BUGS = os.environ.get("DAFKA_FUZZ_KNOWN_BUGS", "1") == "1"
MAX_SEQ = 2**64 - 1
MAX_COUNT = 2**32 - 1


@pytest.fixture
def fuzz_cluster(processes, tmp_path):
    """A tower process, a store, a consumer, and a producer that sends nothing
    until ``start_file`` exists (so no forged ACK can release its records)."""
    sub, pub = free_port(), free_port()
    cluster = Cluster(processes, tmp_path / "cluster", f"tcp://127.0.0.1:{sub}", f"tcp://127.0.0.1:{pub}",
                      **{"beacon/interval": 200})
    cluster.tower_role = cluster.tower("t", sub, pub)
    cluster.store_role = cluster.store("s")
    cluster.consumer_role = cluster.consumer("c", TOPIC)
    cluster.start_file = tmp_path / "go"
    cluster.producer_role = cluster.producer("p", TOPIC, count=200, start_file=cluster.start_file)
    peer = FuzzPeer(f"tcp://127.0.0.1:{sub}", f"tcp://127.0.0.1:{pub}")
    cluster.fuzz = peer
    yield cluster
    peer.close()


def endpoints_of(cluster) -> dict[str, str]:
    """Role name -> bound endpoint, from the tower's beacons."""
    sock = zmq.Context.instance().socket(zmq.SUB)
    sock.linger = 0
    sock.setsockopt(zmq.SUBSCRIBE, b"B")
    sock.connect(cluster.base_config["beacon/pub_address"])
    store_words = cluster.store_role.wait_ready()
    names = {cluster.producer_role.address: "producer", cluster.consumer_role.address: "consumer",
             store_words[1]: "writer", store_words[2]: "reader"}
    found: dict[str, str] = {}
    try:
        def all_found():
            while sock.poll(50):
                frames = sock.recv_multipart()
                if len(frames) == 3 and frames[1].decode() in names:
                    found[names[frames[1].decode()]] = frames[2].decode()
            return len(found) == 4
        wait_for(all_found, 10, what="every peer's endpoint")
    finally:
        sock.close(0)
    return found


def routes(p: str, c: str, w: str, r: str) -> list[bytes]:
    """The prefixes the peers' SUBs subscribe to (what gets through)."""
    z = b"\0"
    return [b"K" + p.encode() + z, b"F" + p.encode() + z,
            b"D" + c.encode() + z, b"E" + c.encode() + z, b"L" + c.encode() + z, b"T" + c.encode() + z,
            b"M" + TOPIC.encode() + z, b"H" + TOPIC.encode() + z,
            b"M", b"H", b"D" + w.encode() + z, b"T" + w.encode() + z,
            b"F", b"G", b"W" + r.encode()]


def templates(p: str, c: str, w: str, r: str, me: str) -> list[list[bytes]]:
    """Valid messages to mutate.  None carries content for the real producer's
    partition (an unauthenticated record would legitimately be accepted), and
    the producer has sent nothing yet, so no ACK can be valid for it."""
    fp = addr()  # a fuzz partition
    msgs = [
        proto.RecordMsg(TOPIC, fp, TOPIC, 0, b"fuzz"),
        proto.RecordMsg(TOPIC, fp, TOPIC, 7, b""),
        proto.DirectRecordMsg(c, fp, TOPIC, 1, b"fuzz"),
        proto.DirectRecordMsg(w, fp, TOPIC, 2, b"x" * 300),
        proto.FetchMsg(p, me, TOPIC, 0, MAX_COUNT),
        proto.FetchMsg(fp, me, TOPIC, MAX_SEQ, 1),
        proto.AckMsg(p, TOPIC, 0),
        proto.AckMsg(p, TOPIC, MAX_SEQ),
        proto.HeadMsg(TOPIC, fp, TOPIC, 3),
        proto.HeadMsg(TOPIC, fp, TOPIC, MAX_SEQ),
        proto.DirectHeadMsg(c, fp, TOPIC, 5),
        proto.DirectTailMsg(c, fp, TOPIC, 9),
        proto.DirectTailMsg(w, fp, TOPIC, MAX_SEQ),
        proto.GetHeadsMsg(TOPIC, me),
        proto.ConsumerHelloMsg(r, me, (TOPIC, "other")),
        proto.ConsumerHelloMsg(r, me, ()),
        proto.StoreHelloMsg(c, me),
    ]
    return [proto.encode(m) for m in msgs]


@st.composite
def mutated(draw, frames: list[bytes]) -> list[bytes]:
    frames = [bytearray(f) for f in frames]
    for op in draw(st.lists(st.sampled_from(
            ["flip", "truncate", "extend", "insert", "special", "version", "length", "drop", "add", "seq"]),
            min_size=1, max_size=4)):
        i = draw(st.integers(0, len(frames) - 1))
        f = frames[i]
        if op == "flip" and f:
            pos = draw(st.integers(1 if i == 0 and len(f) > 1 else 0, len(f) - 1))
            f[pos] ^= draw(st.integers(1, 255))
        elif op == "truncate":
            del f[draw(st.integers(1 if i == 0 else 0, max(len(f), 1))):]
        elif op == "extend":
            f += draw(st.binary(min_size=1, max_size=40))
        elif op == "insert" and f:
            pos = draw(st.integers(1 if i == 0 else 0, len(f)))
            f[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif op == "special" and f:
            f[draw(st.integers(0, len(f) - 1))] = draw(st.sampled_from([0, 1, 0x20, 0x7F, 0x80, 0xFF]))
        elif op == "version" and i == 0 and 0 in f[1:]:
            nul = f.index(0, 1)
            if nul + 1 < len(f):
                f[nul + 1] = draw(st.sampled_from([0, 2, 0xFF]))
        elif op == "length" and i == 0 and 0 in f[1:]:
            nul = f.index(0, 1)
            if nul + 2 < len(f):  # the first length byte after the version
                f[nul + 2] = draw(st.sampled_from([0, 1, 31, 33, 0xFF]))
        elif op == "drop" and len(frames) > 1:
            del frames[i]
        elif op == "add":
            frames.insert(draw(st.integers(1, len(frames))), bytearray(draw(st.binary(max_size=30))))
        elif op == "seq" and i == 0 and len(f) >= 8:
            f[-8:] = draw(st.sampled_from([0, 1, 2**63, MAX_SEQ])).to_bytes(8, "big")
    return [bytes(f) for f in frames]


def subscription_garbage() -> st.SearchStrategy[bytes]:
    ids = st.sampled_from([b"M", b"D", b"F", b"K", b"H", b"E", b"G", b"W", b"L", b"T", b"B", b"", b"\0", b"\xff"])
    structured = st.builds(lambda flag, i, body, nul: flag + i + body + nul,
                           st.sampled_from([b"\x00", b"\x01"]), ids, st.binary(max_size=300),
                           st.sampled_from([b"", b"\0"]))
    return st.one_of(st.binary(max_size=300), structured)


def beacon_garbage(safe_port: int) -> st.SearchStrategy[list[bytes]]:
    frame = st.binary(max_size=64)
    raw = st.lists(frame, min_size=1, max_size=6)
    shaped = st.builds(lambda b, s, h, p: [b, s, h, p], st.sampled_from([b"B", b"b", b"", b"BB"]), frame,
                       st.one_of(frame, st.just(b"127.0.0.1")),
                       st.one_of(frame, st.sampled_from([b"0", b"65536", b"01", b"99999", b"-1", b"5556"])))
    return st.one_of(raw, shaped).map(lambda frames: sanitize_beacon(frames, safe_port))


def sanitize_beacon(frames: list[bytes], safe_port: int) -> list[bytes]:
    """A beacon the tower would accept and relay is pointed at a closed
    loopback port with a hex sender: a relayed beacon whose host is not a
    valid ZeroMQ host, or whose sender or host is not UTF-8, crashes peers
    (before the fixes tested at the end of this file), and one that names a real peer's endpoint would
    re-route it (forged beacons are an accepted risk, RFC 46 section 11)."""
    try:
        beacon = proto.decode_beacon(frames)
    except proto.MalformedMessage:
        return frames
    if FUZZ_KNOWN_BUGS:
        return [b"B", frames[1], frames[2] if beacon.host != "127.0.0.1" else b"", str(safe_port).encode()]
    return [b"B", b"FUZZ" + frames[1].hex().upper().encode()[:28], b"127.0.0.1", str(safe_port).encode()]


def fuzz_cases(fuzz: FuzzPeer, eps: dict, addresses: dict, safe_port: int) -> st.SearchStrategy:
    p, c, w, r = (addresses[k] for k in ("producer", "consumer", "writer", "reader"))
    route = st.sampled_from(routes(p, c, w, r))
    random_data = st.builds(lambda prefix, body, rest: [prefix + body, *rest], route, st.binary(max_size=200),
                            st.lists(st.binary(max_size=100), max_size=3))
    mutated_data = st.sampled_from(templates(p, c, w, r, fuzz.address)).flatmap(mutated)
    data = st.tuples(st.just("data"), st.one_of(random_data, mutated_data))
    subs = st.tuples(st.sampled_from(sorted(fuzz.xsubs)), subscription_garbage().map(lambda f: [f]))
    beacons = st.tuples(st.just("beacon"), beacon_garbage(safe_port))
    return st.one_of(data, data, subs, beacons)


def known_bug(frames: list[bytes], consumer: str) -> str | None:
    """Which known product bug (each has a regression test below) these
    frames would trigger, if any; the broad run leaves them out (unless
    ``$DAFKA_FUZZ_KNOWN_BUGS=1``)."""
    if FUZZ_KNOWN_BUGS:
        return None
    f = frames[0]
    if len(frames) == 1 and (f.startswith(b"M" + TOPIC.encode() + b"\0") or
                             f.startswith(b"D" + consumer.encode() + b"\0")):
        return "one-frame RECORD/DIRECT-RECORD to the consumer"
    try:
        msg = proto.decode(frames)
    except proto.MalformedMessage:
        return None
    if "\0" in getattr(msg, "address", ""):
        return "NUL in an address field"
    return None


@pytest.mark.serial  # as many examples as a fixed time allows: at least 1,000 alone, 600 beside 3 other workers
def test_fuzz_every_socket_of_every_peer(fuzz_cluster, fault_report):
    cluster = fuzz_cluster
    fuzz: FuzzPeer = cluster.fuzz
    eps = endpoints_of(cluster)
    store_words = cluster.store_role.wait_ready()
    addresses = {"producer": cluster.producer_role.address, "consumer": cluster.consumer_role.address,
                 "writer": store_words[1], "reader": store_words[2]}
    for name in ("producer", "consumer", "writer", "reader"):
        fuzz.attach(name, eps[name])
    fuzz.attach("tower", cluster.base_config["beacon/pub_address"])
    p, c, w, r = (addresses[k] for k in ("producer", "consumer", "writer", "reader"))
    for prefix in (b"K" + p.encode() + b"\0", b"M" + TOPIC.encode() + b"\0", b"M", b"F"):
        wait_for(lambda: fuzz.subscribed(prefix), 10, what=f"a peer subscribes {prefix!r} on the fuzzer")
    roles = [cluster.tower_role, cluster.store_role, cluster.consumer_role, cluster.producer_role]
    before = {role.name: role.stats() for role in roles}
    safe_port = free_port()
    deadline = time.monotonic() + FUZZ_SECONDS
    sent = {"examples": 0}
    skipped: dict[str, int] = {}
    recent: list = []

    cases = fuzz_cases(fuzz, eps, addresses, safe_port)

    def fuzz_one(case):
        target, frames = case
        if target == "data":
            bug = known_bug(frames, c)
            if bug is not None:
                skipped[bug] = skipped.get(bug, 0) + 1
                return
            fuzz.xpub.send_multipart(frames)
        elif target == "beacon":
            fuzz.beacon_pub.send_multipart(frames)
        else:
            fuzz.xsubs[target].send(frames[0])
        sent["examples"] += 1
        recent.append(case)
        del recent[:-12]
        if sent["examples"] % 200 == 0:
            fuzz.drain()
            time.sleep(0.005)  # let the peers keep up
            dead = [role for role in roles if not role.alive()]
            assert not dead, (f"{[d.name for d in dead]} died; last inputs: {recent}\n"
                              + "\n".join(d.tail() for d in dead))

    # Hypothesis has no time budget: run it in rounds of a few hundred examples
    # (each round its own seed, so the whole run is reproducible) until time is up.
    rounds = 0
    while time.monotonic() < deadline:
        seed(FUZZ_SEED * 1000 + rounds)(
            settings(max_examples=300, deadline=None, database=None, phases=[Phase.generate],
                     suppress_health_check=list(HealthCheck))(given(cases)(fuzz_one)))()
        rounds += 1
    time.sleep(1.0)
    dead = [role for role in roles if not role.alive()]
    assert not dead, f"{[d.name for d in dead]} died; last inputs: {recent}\n" + "\n".join(d.tail() for d in dead)
    after = {role.name: role.stats() for role in roles}

    def grew(role, key):
        return after[role].get(key, 0) - before[role].get(key, 0)

    counted = {"producer": grew("p", "malformed"), "consumer": grew("c", "malformed"),
               "store writer": grew("s", "writer_malformed"), "store reader": grew("s", "reader_malformed"),
               "tower": grew("t", "malformed")}
    assert all(n > 0 for n in counted.values()), counted

    # Still working: a valid record goes end to end.
    cluster.start_file.touch()
    assert cluster.producer_role.wait_exit(60) == 0, cluster.producer_role.tail()
    cluster.wait_delivered("c", acked_keys(cluster.producer_role), 30)
    assert cluster.consumer_role.stop() == 0
    assert cluster.store_role.stop() == 0
    db = cluster.store_role.db
    every_key = read_store(db)  # opens, and every key decodes with store/keys.py (else ValueError)
    report = check("fuzz: every socket", [cluster.producer_role.producer_log()], cluster.consumer_runs(), {"s": db},
                   complete_stores=["s"])
    report.extra.update(examples=sent["examples"], rounds=rounds, malformed_counted=counted, keys_in_db=len(every_key),
                        left_out_known_bugs=skipped)
    fault_report(report)
    assert sent["examples"] > 1_000


# -----------------------------------------------------------------------------
# Product bugs the fuzzer found, now fixed: each test states the correct behaviour.


@pytest.fixture
def raw_peer(cluster, tower):
    peer = FuzzPeer(tower.sub_endpoint, tower.pub_endpoint)
    yield peer
    peer.close()


def inject_beacon(tower_sub: str, frames: list[bytes]) -> None:
    """Publish a beacon into the tower's XSUB, as any peer (or attacker) can."""
    pub = zmq.Context.instance().socket(zmq.PUB)
    pub.linger = 500
    pub.connect(tower_sub)
    try:
        time.sleep(0.3)  # the tower's XSUB forwards the peers' "B" subscription to us
        for _ in range(3):
            pub.send_multipart(frames)
            time.sleep(0.05)
    finally:
        pub.close()


# Regression test, fixed bug (dafka/consumer/consumer.py Consumer._on_sub, `content = recv(0, False)`): after a
# frame 1 whose id is M or D the consumer does a *blocking* recv for the content frame without
# checking RCVMORE; a one-frame message 'M<topic>\0...' (or 'D<consumer>\0...') blocks poll(timeout)
# until some other message arrives (forever if none does) and then takes that message's frame 1 as the
# content, losing it


def test_consumer_poll_keeps_its_timeout_after_a_one_frame_record(cluster, raw_peer):
    consumer = cluster.consumer("c", TOPIC)
    wait_for(lambda: raw_peer.subscribed(b"M" + TOPIC.encode() + b"\0"), 10, what="consumer subscribes")
    consumer.wait_stat(lambda s: True, 5, "first stats")
    raw_peer.xpub.send(b"M" + TOPIC.encode() + b"\0\x01")  # a RECORD without its content frame
    time.sleep(0.5)
    before = consumer.stat("time")
    time.sleep(1.5)  # the consumer role polls with a 0.2 s timeout and rewrites its stats after each poll
    assert consumer.alive()
    assert consumer.stat("time") > before + 1.0, "poll(0.2) has not returned for 1.5 s"


# Regression test, fixed bug (dafka/consumer/state.py ConsumerState._hello and _request): an address
# field with a NUL (STORE-HELLO's reader address, or a RECORD/HEAD/DIRECT-HEAD producer address) is
# used as the topic of the CONSUMER-HELLO/FETCH it answers with; proto.encode refuses a NUL in a topic
# with ValueError, which escapes from Consumer.poll() and kills the application


@pytest.mark.parametrize("kind", ["store-hello", "head"])
def test_consumer_survives_a_nul_in_an_address_field(cluster, raw_peer, kind):
    consumer = cluster.consumer("c", TOPIC)
    c = consumer.address
    wait_for(lambda: raw_peer.subscribed(b"L" + c.encode() + b"\0"), 10, what="consumer subscribes")
    msg = (proto.StoreHelloMsg(c, "READER\0X") if kind == "store-hello"
           else proto.HeadMsg(TOPIC, "PRODUCER\0X", TOPIC, 3))
    raw_peer.xpub.send_multipart(proto.encode(msg))
    time.sleep(1.0)
    assert consumer.alive(), consumer.tail()


# Regression test, fixed bug (dafka/producer/state.py ProducerState.fetch_answers ->
# proto.record_prefix): a FETCH whose requester address holds a NUL is queued, and encoding the
# DIRECT-RECORD answer (topic = requester) raises ValueError in the producer's loop thread, which
# dies: no more ACKs, HEADs or FETCH answers, flush/close time out (on_fetch should drop and count
# such a FETCH)


def test_producer_survives_a_fetch_from_a_requester_address_with_a_nul(cluster, raw_peer, fault_report):
    producer = cluster.producer("p", TOPIC, count=50, hold=True, producer__min_acks=0)
    p = producer.address
    wait_for(lambda: raw_peer.subscribed(b"F" + p.encode() + b"\0"), 10, what="producer subscribes")
    producer.wait_stat(lambda s: s.get("sent", 0) == 50, 10, "50 sent")
    raw_peer.xpub.send_multipart(proto.encode(proto.FetchMsg(p, "REQ\0UESTER", TOPIC, 0, 10)))
    time.sleep(0.5)
    cluster.consumer("late", TOPIC)  # it can only get the records by FETCH from the producer
    cluster.wait_delivered("late", {(p, i) for i in range(50)}, 8)


# Regression test, fixed bug (dafka/discovery/links.py PeerLinks.on_beacon, dafka/producer/producer.py
# Producer._on_beacon): the tower relays any decodable beacon as 'tcp://<host>:<port>' and every peer
# passes that endpoint to zmq connect(); a host libzmq rejects (e.g. 'bad host') raises
# ZMQError(EINVAL), which kills the producer's loop thread, the store's writer and reader threads (the
# store exits) and escapes from Consumer.poll(); peers should drop and count such an endpoint (and the
# tower could refuse hosts that are not hostnames/IPs)
# Regression test, fixed bug (dafka/discovery/beacon.py Beacon._emit, `event.endpoint.encode()` /
# `event.sender.encode()`): a relayed beacon whose sender or host is not UTF-8 decodes with
# surrogateescape, and the strict encode() raises UnicodeEncodeError in every peer's beacon thread,
# which dies: no peer discovers or expires anything afterwards (refuse such beacons as malformed in
# BeaconState.on_frames / proto.decode_tower_beacon; pyzmq's connect() would raise UnicodeEncodeError
# on such an endpoint too)


def test_peers_survive_a_relayed_beacon_with_a_host_libzmq_rejects(cluster, tower, fault_report):
    store = cluster.store("s")
    consumer = cluster.consumer("c", TOPIC)
    producer = cluster.producer("p", TOPIC, rate=1_000, wait_peers=3)
    producer.wait_stat(lambda s: s.get("acked", 0) >= 200, 20, "200 acked")
    inject_beacon(tower.sub_endpoint, [b"B", b"BAD" + b"0" * 29, b"bad host", b"1234"])
    time.sleep(1.0)
    dead = [r.name for r in (store, consumer, producer) if not r.alive()]
    acked = producer.fresh_stat("acked")
    time.sleep(1.0)
    assert not dead and producer.fresh_stat("acked") > acked, (dead, cluster.tails())


def test_peers_survive_a_relayed_beacon_that_is_not_utf8(cluster, tower):
    cluster.consumer("c", TOPIC)
    inject_beacon(tower.sub_endpoint, [b"B", b"BAD" + b"0" * 29, b"\xff", b"1234"])
    time.sleep(0.5)
    producer = cluster.producer("p", TOPIC, count=100, hold=True, producer__min_acks=0)  # arrives afterwards
    cluster.wait_delivered("c", {(producer.address, i) for i in range(100)}, 8)


# Regression test, fixed bug (minor; dafka/core/sockets.py read_subscriptions, `except proto.MalformedMessage:
# continue`, used by Producer._poll_subscriptions): a malformed frame on the producer's XPUB is
# dropped but not counted in stats()['malformed'] (the consumer and the store reader count theirs; RFC
# 46 section 10.2: dropped *and counted*)


def test_producer_counts_malformed_subscription_frames(cluster, tower):
    producer = cluster.producer("p", TOPIC, hold=True, producer__min_acks=0)
    endpoint = wait_for(lambda: tower.peers().get(producer.address), 10, what="the producer's endpoint")
    sock = zmq.Context.instance().socket(zmq.XSUB)
    sock.linger = 0
    sock.connect(endpoint)
    try:
        time.sleep(0.3)
        for frame in (b"\x07junk", b"\x01M\0fz", b"\x02", b""):
            sock.send(frame)
        producer.wait_stat(lambda s: s.get("malformed", 0) >= 3, 3, "malformed subscriptions counted")
    finally:
        sock.close(0)
