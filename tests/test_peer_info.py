"""PEER-INFO (rfc 17): a dafka-py peer says what it is to who asks, and to nobody else."""

from __future__ import annotations

import time

import zmq

from dafka import Producer, protocol as proto
from dafka.discovery import peer_info
from dafka.store import Store
from helpers import loopback_config
from rawpeer import RawPeer


def _infos_from(raw: RawPeer, addresses: set[str], timeout: float = 10.0) -> dict[str, proto.PeerInfoMsg]:
    infos: dict[str, proto.PeerInfoMsg] = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not addresses <= set(infos):
        raw.pump()
        if raw.sub.poll(50):
            msg = proto.decode(raw.sub.recv_multipart())
            if isinstance(msg, proto.PeerInfoMsg):
                infos[msg.address] = msg
    assert addresses <= set(infos), f"no PEER-INFO from {addresses - set(infos)}"
    return infos


def test_peers_answer_peer_info_only_to_who_asks(tower, tmp_path):
    """A producer and a store answer the subscription I<requester> with their PEER-INFO; a raw peer that
    subscribes as a reference consumer does (M, D, E, L for itself) never receives one."""
    config = loopback_config(tower)
    asker = RawPeer(tower, "Q" * 32, [proto.subscription(proto.PEER_INFO, "Q" * 32, exact=True)])
    reference = RawPeer(tower, "F" * 32, [proto.subscription(proto.RECORD, "orders", exact=True)] + [
        proto.subscription(m, "F" * 32, exact=True) for m in (proto.DIRECT_RECORD, proto.DIRECT_HEAD,
                                                              proto.STORE_HELLO)])
    store = Store(config, db=str(tmp_path / "db")).start()
    producer = Producer("orders", config)
    try:
        infos = _infos_from(asker, {producer.address, store.reader_address, store.writer_address})
        info = infos[producer.address]
        assert info.role == "producer" and info.topic == "Q" * 32
        assert info.info["pid"] > 0 and info.info["rss"] > 0 and info.info["version"]
        store_info = infos[store.reader_address]
        assert store_info.role == "store-reader" and infos[store.writer_address].role == "store-writer"
        assert store_info.info["details"]["store"] == store.store_id
        received: list[list[bytes]] = []
        end = time.monotonic() + 10
        while time.monotonic() < end and not any(frames[0][:1] == proto.RECORD for frames in received):
            producer.send(b"x")  # until the reference peer's subscription has reached the producer
            reference.pump()
            if reference.sub.poll(100):
                received.append(reference.sub.recv_multipart())
        # the asker asks again (a new subscription): it is answered while the reference listens, which is not
        prefix = proto.subscription(proto.PEER_INFO, "Q" * 32, exact=True)
        asker.sub.setsockopt(zmq.UNSUBSCRIBE, prefix)
        asker.sub.setsockopt(zmq.SUBSCRIBE, prefix)
        _infos_from(asker, {producer.address, store.reader_address})
        while reference.sub.poll(200):
            received.append(reference.sub.recv_multipart())
        ids = {frames[0][:1] for frames in received}
        assert proto.RECORD in ids and proto.PEER_INFO not in ids
    finally:
        producer.close()
        store.stop()
        asker.close()
        reference.close()


def test_the_body_is_what_the_process_says_of_itself():
    peer_info.set_application("mirror", lambda: {"name": "m"})
    try:
        body = peer_info.info(lambda: {"disk": 1})
    finally:
        peer_info.set_application("", None)
    assert body["application"] == "mirror" and body["application_details"] == {"name": "m"}
    assert body["details"] == {"disk": 1} and body["rss"] > 0 and body["cpu"] > 0 and body["now"] >= body["started"]

    def broken() -> dict:
        raise RuntimeError("a role that cannot describe itself")
    assert peer_info.info(broken)["details"] == {}  # logged; the peer goes on
