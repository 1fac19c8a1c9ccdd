"""Optional CURVE on every socket: authorized peers work, others are shut out,
and what crosses the wire is ciphertext."""

from __future__ import annotations

import select
import socket
import threading

import pytest
import zmq
import zmq.auth

from dafka import Consumer, Producer, protocol as proto
from helpers import curve_settings, loopback_config, secure_config, wait_for

SECRET = b"SECRET-PLAINTEXT-RECORD-0123456789"


def test_authorized_peers_exchange_records(secure_tower, keys):
    with Producer("sec", secure_config(secure_tower, keys, "alice", **{"producer/min_acks": 0})) as producer, \
            Consumer("sec", config=secure_config(secure_tower, keys, "bob",
                                                 **{"consumer/offset/reset": "earliest"})) as consumer:
        for i in range(10):
            producer.send(b"%d" % i)
        got = [consumer.poll(5) for _ in range(10)]
        assert [r.offset for r in got] == list(range(10))
        assert consumer.connected and producer.connected


def test_unauthorized_consumer_reads_nothing(secure_tower, keys):
    with Producer("sec", secure_config(secure_tower, keys, "alice", **{"producer/min_acks": 0})) as producer, \
            Consumer("sec", config=secure_config(secure_tower, keys, "mallory",
                                       **{"consumer/offset/reset": "earliest"})) as intruder:
        producer.send(b"for authorized eyes")
        assert intruder.poll(2.0) is None
        assert not intruder.connected  # the tower refused it too


@pytest.mark.parametrize("cluster", ["fake_cluster", "cluster"])
def test_unauthorized_producer_cannot_publish(secure_tower, keys, cluster):
    with Consumer("sec", config=secure_config(secure_tower, keys, "bob",
                                              **{"consumer/offset/reset": "earliest"})) as consumer, \
            Producer("sec", secure_config(secure_tower, keys, "mallory", cluster,
                                          **{"producer/min_acks": 0})) as intruder:
        for _ in range(20):
            intruder.send(b"forged")
        assert consumer.poll(2.0) is None
        assert not intruder.connected


def test_missing_key_file_is_a_config_error(keys, tmp_path):
    from dafka import ConfigError
    missing = str(tmp_path / "nope.key_secret")
    with pytest.raises(ConfigError, match="security/peer_key: cannot read secret key file .*nope"):
        Producer("x", loopback_config(security__curve=1, security__cluster_key=keys["cluster"],
                                      security__peer_key=missing, security__authorized_keys=keys["authorized"]))
    with pytest.raises(ConfigError, match="security/authorized_keys"):
        Producer("x", loopback_config(security__curve=1, security__cluster_key=keys["cluster"],
                                      security__peer_key=keys["alice"], security__authorized_keys=missing))


class Relay:
    """A plain TCP relay that keeps a copy of every byte it forwards."""

    def __init__(self, target: str) -> None:
        host, port = target.replace("tcp://", "").rsplit(":", 1)
        self.target = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"tcp://127.0.0.1:{self.listener.getsockname()[1]}"
        self.captured = bytearray()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dafka-test-relay", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        self.listener.settimeout(0.1)
        while not self._stop.is_set():
            try:
                client, _ = self.listener.accept()
                break
            except socket.timeout:
                continue
        else:
            return
        upstream = socket.create_connection(self.target)
        pairs = {client: upstream, upstream: client}
        while not self._stop.is_set():
            readable, _, _ = select.select(list(pairs), [], [], 0.1)
            for sock in readable:
                data = sock.recv(65536)
                if not data:
                    return
                self.captured += data
                pairs[sock].sendall(data)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.listener.close()


@pytest.mark.parametrize("secure", [True, False])
def test_wire_capture_shows_no_plaintext_with_curve(tower, secure_tower, keys, secure):
    chosen = secure_tower if secure else tower
    config = secure_config(chosen, keys, "alice", **{"producer/min_acks": 0}) if secure else \
        loopback_config(tower, producer__min_acks=0)
    with Producer("sec", config) as producer:
        relay = Relay(producer.endpoint)
        sub = zmq.Context.instance().socket(zmq.SUB)
        sub.linger = 0
        if secure:
            public, secret = zmq.auth.load_certificate(keys["bob"])
            sub.curve_secretkey, sub.curve_publickey = secret, public
            sub.curve_serverkey = zmq.auth.load_certificate(keys["cluster"])[0]
        sub.setsockopt(zmq.SUBSCRIBE, proto.subscription(proto.RECORD, "sec", exact=True))
        sub.connect(relay.endpoint)
        try:
            def received():
                producer.send(SECRET)
                return sub.poll(50) and sub.recv_multipart()
            frames = wait_for(received, 10, what="a record through the relay")
            assert frames[1] == SECRET
            assert len(relay.captured) > len(SECRET)
            assert (SECRET in relay.captured) is not secure
        finally:
            sub.close()
            relay.close()


def test_authenticator_restarts_at_once_on_the_same_context(keys):
    # Regression: the last peer of a context stops the ZAP authenticator and
    # the next one starts a new one; libzmq closes the old ZAP socket
    # asynchronously, so binding inproc://zeromq.zap.01 again failed with
    # EADDRINUSE (290 of 300 immediate restarts) unless it waits its turn.
    from dafka.core.security import Curve, acquire_authenticator, release_authenticator

    alice = curve_settings(keys, "alice")
    settings = Curve.from_config(loopback_config(**{k.replace("/", "__"): v for k, v in alice.items()}))
    ctx = zmq.Context()
    try:
        for _ in range(50):
            acquire_authenticator(ctx, settings)
            release_authenticator(ctx, settings)
    finally:
        ctx.term()
