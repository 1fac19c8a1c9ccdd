"""A man in the middle between two towers' worlds, dropping or duplicating
messages, to test recovery over a bad link.

Peers on side A (tower A) and side B (tower B) see the proxy as one peer on
their side; the proxy forwards data and subscriptions both ways, like
``zmq_proxy`` with XSUB/XPUB.  ``fault(frames, direction) -> copies`` (0
drops, 2 duplicates) applies to every data message, ``direction`` being
"A>B" or "B>A".  Subscription frames pass untouched: they are ZMTP control
traffic that TCP never loses, and libzmq would never send a lost one again
(a real network cannot do that).

:class:`KafkaResponseProxy` does the same to a Kafka client's TCP link to the
gateway: it delays some responses and drops others (a dropped response takes
its connection with it, as when a link breaks while the answer travels)."""

from __future__ import annotations

import random
import socket
import struct
import threading

import zmq

from dafka.discovery.beacon import CONNECT, Beacon

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


class KafkaResponseProxy:
    """Listens on 127.0.0.1 (``port``: 0 for any) and forwards each connection to ``upstream`` (host, port).
    ``fault(api_key) -> (drop, delay_seconds)`` is asked for every response, by the key of the request it
    answers: a dropped one is never delivered and both sides of its connection are closed; a delayed one
    holds the responses after it too (they stay in order)."""

    def __init__(self, upstream: tuple[str, int], fault, port: int = 0) -> None:
        self.upstream = upstream
        self.fault = fault
        self.listener = socket.create_server(("127.0.0.1", port))
        self.port = self.listener.getsockname()[1]
        self.dropped = 0
        self.delayed = 0
        self.connections = 0
        self._stop = threading.Event()
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, name="dafka-test-kafka-proxy", daemon=True).start()

    def _accept(self) -> None:
        self.listener.settimeout(0.1)
        while not self._stop.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                continue
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            self.connections += 1
            self._sockets += [client, server]
            apis: dict[int, int] = {}  # correlation id -> api key, of the requests in flight
            threading.Thread(target=self._requests, args=(client, server, apis), daemon=True).start()
            threading.Thread(target=self._responses, args=(server, client, apis), daemon=True).start()

    @staticmethod
    def _frame(sock: socket.socket) -> bytes | None:
        head = b""
        while len(head) < 4:
            chunk = sock.recv(4 - len(head))
            if not chunk:
                return None
            head += chunk
        size = struct.unpack(">i", head)[0]
        body = b""
        while len(body) < size:
            chunk = sock.recv(min(1 << 20, size - len(body)))
            if not chunk:
                return None
            body += chunk
        return head + body

    def _requests(self, client: socket.socket, server: socket.socket, apis: dict[int, int]) -> None:
        try:
            while (frame := self._frame(client)) is not None:
                api_key, _, correlation = struct.unpack(">hhi", frame[4:12])
                apis[correlation] = api_key
                server.sendall(frame)
        except OSError:
            pass
        self._close(client, server)

    def _responses(self, server: socket.socket, client: socket.socket, apis: dict[int, int]) -> None:
        try:
            while (frame := self._frame(server)) is not None:
                correlation = struct.unpack(">i", frame[4:8])[0]
                drop, delay = self.fault(apis.pop(correlation, -1))
                if drop:
                    self.dropped += 1
                    break
                if delay:
                    self.delayed += 1
                    self._stop.wait(delay)
                client.sendall(frame)
        except OSError:
            pass
        self._close(client, server)

    @staticmethod
    def _close(*socks: socket.socket) -> None:
        for sock in socks:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def close(self) -> None:
        self._stop.set()
        self.listener.close()
        self._close(*self._sockets)
