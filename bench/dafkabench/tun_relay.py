"""A userspace impaired link: copies IPv4 packets between TUN devices that
live in different network namespaces, dropping, duplicating and delaying them.

This stands in for ``tc netem`` on kernels without that qdisc (see
``impaired_link.py``, which builds the namespaces and runs this program)::

    python -P bench/dafkabench/tun_relay.py --host a,NETNS_A,TUN_A,10.77.0.1 --host b,NETNS_B,TUN_B,10.77.0.2 \\
        [--loss 0.1] [--duplicate 0.1] [--delay-ms 20] [--jitter-ms 5] [--seed N] [--stats FILE]

It attaches to each (already configured, persistent) TUN device from inside
its namespace, prints ``ready``, and relays until SIGTERM.  A packet read from
one device goes to the host that owns its destination address.  It is dropped
with probability ``--loss``; otherwise it is sent once more with probability
``--duplicate``.  Every copy is held for ``delay ± jitter`` (uniform, drawn per
copy), so packets may overtake each other, as with netem's jitter: the link
reorders.  Packets that are not IPv4 (the kernel's IPv6 link-local chatter)
or that go to no known host are counted and discarded.  SIGUSR1 cuts the link
(a network partition: every packet is dropped, and counted so) until SIGUSR2
heals it.

``--stats`` is rewritten a few times a second (write and rename): per
direction (``"a>b"``) the packets ``received``, ``dropped``, ``duplicated``,
``forwarded`` (copies queued, duplicates included) and ``reordered`` (copies
written after one that was read later), plus ``ignored`` and ``write_errors``.
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import heapq
import itertools
import json
import os
import random
import select
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


def _write_json(path: str | None, stats: dict) -> None:
    """Replace the stats file at once (a reader never sees half of it)."""
    if path:
        with open(f"{path}.tmp", "w") as f:
            json.dump(stats, f)
        os.replace(f"{path}.tmp", path)


CLONE_NEWNET = 0x40000000
TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
MAX_PACKET = 65536
BURST = 64  # packets read from one device before looking at the others and the queue

_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


@contextmanager
def in_netns(name: str) -> Iterator[None]:
    """Run the body with the calling thread in network namespace ``name``
    (``/run/netns/NAME``, as made by ``ip netns add``); sockets and TUN fds
    opened there stay in it.  Only the calling thread moves (Python 3.11 has no
    ``os.setns``, hence ctypes)."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        target = os.open(f"/run/netns/{name}", os.O_RDONLY)
        try:
            _setns(target)
        finally:
            os.close(target)
        try:
            yield
        finally:
            _setns(own)
    finally:
        os.close(own)


def open_tun(netns: str, device: str) -> int:
    """A non-blocking fd on the existing TUN ``device`` of namespace ``netns``."""
    with in_netns(netns):
        fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
        try:
            fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH22x", device.encode(), IFF_TUN | IFF_NO_PI))
        except OSError:
            os.close(fd)
            raise
    return fd


@dataclass
class Host:
    name: str
    fd: int
    address: bytes  # packed IPv4


def direction(source: Host, destination: Host) -> str:
    return f"{source.name}>{destination.name}"


class Relay:
    """The packets in flight and the counters; ``run`` is the whole program's loop."""

    def __init__(self, hosts: list[Host], loss: float, duplicate: float, delay: float, jitter: float,
                 seed: int) -> None:
        self.hosts = {h.fd: h for h in hosts}
        self.by_address = {h.address: h for h in hosts}
        self.loss = loss
        self.duplicate = duplicate
        self.delay = delay
        self.jitter = jitter
        self.rng = random.Random(seed)
        # (due, tie-break, sequence read, source, destination, packet): a duplicate shares its sequence
        self.queue: list[tuple[float, int, int, Host, Host, bytes]] = []
        self.tie_break = itertools.count()
        self.sequence = 0
        self.last_written: dict[str, int] = {}  # direction -> highest sequence written
        self.directions: dict[str, dict[str, int]] = {}
        self.ignored = 0
        self.write_errors = 0
        self.cut = False  # a network partition: every packet dropped (SIGUSR1 cuts, SIGUSR2 heals)

    def stats(self) -> dict:
        return {"directions": {k: dict(v) for k, v in self.directions.items()}, "ignored": self.ignored,
                "write_errors": self.write_errors, "queued": len(self.queue), "cut": self.cut}

    def _count(self, source: Host, destination: Host, what: str, n: int = 1) -> None:
        counts = self.directions.setdefault(direction(source, destination), dict.fromkeys(
            ("received", "dropped", "duplicated", "forwarded", "reordered"), 0))
        counts[what] += n

    def receive(self, source: Host, packet: bytes, now: float) -> None:
        destination = self.by_address.get(packet[16:20]) if len(packet) >= 20 and packet[0] >> 4 == 4 else None
        if destination is None or destination is source:
            self.ignored += 1
            return
        self._count(source, destination, "received")
        self.sequence += 1
        if self.cut or self.rng.random() < self.loss:
            self._count(source, destination, "dropped")
            return
        copies = 1
        if self.rng.random() < self.duplicate:
            copies = 2
            self._count(source, destination, "duplicated")
        for _ in range(copies):
            due = now + max(0.0, self.delay + self.rng.uniform(-self.jitter, self.jitter))
            heapq.heappush(self.queue, (due, next(self.tie_break), self.sequence, source, destination, packet))
        self._count(source, destination, "forwarded", copies)

    def read(self, source: Host, now: float) -> None:
        for _ in range(BURST):
            try:
                packet = os.read(source.fd, MAX_PACKET)
            except BlockingIOError:
                return
            self.receive(source, packet, now)

    def flush(self, now: float) -> None:
        """Write every packet whose time has come."""
        while self.queue and self.queue[0][0] <= now:
            _, _, sequence, source, destination, packet = heapq.heappop(self.queue)
            last = self.last_written.get(direction(source, destination), -1)
            if sequence < last:
                self._count(source, destination, "reordered")
            self.last_written[direction(source, destination)] = max(sequence, last)
            try:
                os.write(destination.fd, packet)
            except OSError:  # the device went down: the packet is lost, as on a wire
                self.write_errors += 1

    def run(self, stop: threading.Event, stats_path: str | None, interval: float = 0.2) -> None:
        next_stats = 0.0
        while not stop.is_set():
            now = time.monotonic()
            timeout = min(interval, max(0.0, self.queue[0][0] - now)) if self.queue else interval
            readable, _, _ = select.select(list(self.hosts), [], [], timeout)
            now = time.monotonic()
            for fd in readable:
                self.read(self.hosts[fd], now)
            self.flush(time.monotonic())
            if now >= next_stats:
                _write_json(stats_path, self.stats())
                next_stats = now + interval
        _write_json(stats_path, self.stats())


def parse_host(text: str) -> tuple[str, str, str, str]:
    """``NAME,NETNS,TUN,ADDRESS``."""
    parts = tuple(text.split(","))
    if len(parts) != 4:
        raise argparse.ArgumentTypeError(f"expected NAME,NETNS,TUN,ADDRESS, got {text!r}")
    return parts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", type=parse_host, action="append", required=True)
    parser.add_argument("--loss", type=float, default=0.10)
    parser.add_argument("--duplicate", type=float, default=0.0)
    parser.add_argument("--delay-ms", type=float, default=20.0)
    parser.add_argument("--jitter-ms", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--stats")
    args = parser.parse_args(argv)

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    hosts = [Host(name, open_tun(netns, tun), socket.inet_aton(address))
             for name, netns, tun, address in args.host]
    relay = Relay(hosts, args.loss, args.duplicate, args.delay_ms / 1000, args.jitter_ms / 1000, args.seed)
    signal.signal(signal.SIGUSR1, lambda *_: setattr(relay, "cut", True))
    signal.signal(signal.SIGUSR2, lambda *_: setattr(relay, "cut", False))
    print("ready", flush=True)
    relay.run(stop, args.stats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
