"""A man in the middle between two towers' worlds, dropping or duplicating
messages, to test recovery over a bad link.

Peers on side A (tower A) and side B (tower B) see the proxy as one peer on
their side; the proxy forwards data and subscriptions both ways, like
``zmq_proxy`` with XSUB/XPUB.  ``fault(frames, direction) -> copies`` (0
drops, 2 duplicates) applies to every data message, ``direction`` being
"A>B" or "B>A".  Subscription frames pass untouched: they are ZMTP control
traffic that TCP never loses, and libzmq would never send a lost one again
(a real network cannot do that)."""

from __future__ import annotations

import random
import threading

import zmq

from dafka.beacon import CONNECT, Beacon

DIRECTIONS = ("A>B", "B>A")


class _Side:
    def __init__(self, ctx: zmq.Context, tower_sub: str, tower_pub: str, name: str) -> None:
        self.xpub = ctx.socket(zmq.XPUB)  # this side's peers connect here
        self.xpub.setsockopt(zmq.XPUB_VERBOSE, 1)
        self.xpub.sndhwm = 1_000_000
        self.xpub.linger = 0
        self.xpub.bind("tcp://127.0.0.1:*")
        port = int(self.xpub.last_endpoint.decode().rsplit(":", 1)[1])
        self.xsub = ctx.socket(zmq.XSUB)  # connects to this side's peers
        self.xsub.rcvhwm = 1_000_000
        self.xsub.linger = 0
        self.beacon = Beacon(ctx, f"PROXY{name}{random.getrandbits(64):016X}", port, host="127.0.0.1",
                             tower_sub=tower_sub, tower_pub=tower_pub, name="proxy").start()
        self.peers: set[str] = set()


class LossyProxy:
    """``side_a``/``side_b`` are (tower XSUB, tower XPUB) endpoint pairs."""

    def __init__(self, side_a: tuple[str, str], side_b: tuple[str, str], fault) -> None:
        ctx = zmq.Context.instance()
        self.fault = fault
        self.a = _Side(ctx, *side_a, "A")
        self.b = _Side(ctx, *side_b, "B")
        self.forwarded = dict.fromkeys(DIRECTIONS, 0)
        self.dropped = dict.fromkeys(DIRECTIONS, 0)
        self.duplicated = dict.fromkeys(DIRECTIONS, 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dafka-test-proxy", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        a, b = self.a, self.b
        poller = zmq.Poller()
        for s in (a.xpub, a.xsub, b.xpub, b.xsub, a.beacon.events, b.beacon.events):
            poller.register(s, zmq.POLLIN)
        while not self._stop.is_set():
            ready = dict(poller.poll(50))
            for side in (a, b):
                if side.beacon.events in ready:
                    for event in Beacon.read_events(side.beacon.events):
                        if (event.kind == CONNECT and event.endpoint not in side.peers
                                and not event.sender.startswith("PROXY")):
                            side.peers.add(event.endpoint)
                            side.xsub.connect(event.endpoint)
            # subscriptions flow from one side's XPUB to the other side's XSUB
            for src, dst in ((a.xpub, b.xsub), (b.xpub, a.xsub)):
                if src in ready:
                    while True:
                        try:
                            dst.send(src.recv(zmq.NOBLOCK))
                        except zmq.Again:
                            break
            # data: A's peers -> B's XPUB, B's peers -> A's XPUB, through the fault
            for src, dst, direction in ((a.xsub, b.xpub, "A>B"), (b.xsub, a.xpub, "B>A")):
                if src in ready:
                    for _ in range(10_000):
                        try:
                            frames = src.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        copies = self.fault(frames, direction)
                        self.forwarded[direction] += 1
                        if copies == 0:
                            self.dropped[direction] += 1
                        elif copies > 1:
                            self.duplicated[direction] += copies - 1
                        for _ in range(copies):
                            dst.send_multipart(frames)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for side in (self.a, self.b):
            side.beacon.stop()
            side.xpub.close(0)
            side.xsub.close(0)
