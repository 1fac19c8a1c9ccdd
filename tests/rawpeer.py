"""A test peer that speaks raw RFC 46 frames, as a reference C peer would.

It binds one data socket (announced through its own beacon to the tower) and
connects one SUB to every peer the tower reports.  Tests drive it by hand."""

from __future__ import annotations

import time

import zmq

from dafka import protocol as proto
from dafka.discovery.beacon import CONNECT, Beacon


class RawPeer:
    def __init__(self, tower, address: str, subscriptions: list[bytes], sock_type: int = zmq.XPUB) -> None:
        ctx = zmq.Context.instance()
        self.address = address
        self.data = ctx.socket(sock_type)
        self.data.linger = 0
        if sock_type == zmq.XPUB:
            self.data.setsockopt(zmq.XPUB_VERBOSE, 1)
        self.data.bind("tcp://127.0.0.1:*")
        port = int(self.data.last_endpoint.decode().rsplit(":", 1)[1])
        self.sub = ctx.socket(zmq.SUB)
        self.sub.linger = 0
        for prefix in subscriptions:
            self.sub.setsockopt(zmq.SUBSCRIBE, prefix)
        self.beacon = Beacon(ctx, address, port, host="127.0.0.1", tower_sub=tower.sub_endpoint,
                             tower_pub=tower.pub_endpoint, interval_ms=200, name="rawpeer").start()
        self.peers: set[str] = set()
        self.subscriptions: list[bytes] = []

    def pump(self) -> None:
        for event in Beacon.read_events(self.beacon.events):
            if event.kind == CONNECT and event.endpoint not in self.peers:
                self.peers.add(event.endpoint)
                self.sub.connect(event.endpoint)
        if self.data.type == zmq.XPUB:
            while True:
                try:
                    self.subscriptions.append(self.data.recv(zmq.NOBLOCK))
                except zmq.Again:
                    break

    def wait_subscribed(self, prefix: bytes, timeout: float = 5.0, also=None) -> None:
        """Wait until some peer subscribed ``prefix`` on our XPUB; ``also`` is
        called while waiting (e.g. to let a consumer poll)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.pump()
            if any(s[:1] == b"\x01" and s[1:].startswith(prefix) for s in self.subscriptions):
                return
            if also is not None:
                also()
            time.sleep(0.005)
        raise AssertionError(f"nobody subscribed {prefix!r}; saw {self.subscriptions}")

    def send(self, msg) -> None:
        self.data.send_multipart(proto.encode(msg))

    def recv(self, kind, timeout: float = 5.0, also=None, where=lambda m: True):
        """The next message of type ``kind`` matching ``where``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.pump()
            if also is not None:
                also()
            if self.sub.poll(5):
                msg = proto.decode(self.sub.recv_multipart())
                if type(msg) is kind and where(msg):
                    return msg
        raise AssertionError(f"no {kind.__name__} within {timeout}s")

    def close(self) -> None:
        self.beacon.stop()
        self.data.close(0)
        self.sub.close(0)
