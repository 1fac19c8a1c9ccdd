"""Hosts in separate network namespaces joined by a userspace impaired link,
for kernels without the ``netem`` qdisc.

Each host is a network namespace with its loopback up and a persistent TUN
device holding ``10.77.0.N/24``, so the route to every other host goes
through that device; ``tun_relay.py``, a subprocess started through
``processes`` (processes.py), moves the IP packets between the devices, dropping,
duplicating and delaying them.  Peers run on a host through
``link.processes_in(host)``, which prefixes every command with
``ip netns exec`` (that execs, so the PID stays the peer's).

``ImpairedLink.close()`` (or leaving its ``with`` block) stops the relay and
deletes the namespaces; a namespace whose processes are still running lives on
nameless until they are killed by the ``processes`` fixture, and namespaces
left by a test run that died are deleted by the next one.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .processes import Processes, wait_until
from .tun_relay import in_netns

NETNS_PREFIX = "dafka-link-"
TUN = "dk0"
SUBNET = "10.77.0"  # every namespace is ours alone, so a fixed private subnet cannot clash
RELAY = Path(__file__).with_name("tun_relay.py")
IP_TIMEOUT = 10.0
_serial = itertools.count(1)


def _ip(*args: str) -> str:
    """Run ``ip ARGS``; raise with its stderr if it fails."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=IP_TIMEOUT)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def missing_capability() -> str | None:
    """Why this machine cannot build an impaired link, or None if it can."""
    if os.geteuid() != 0:
        return "network namespaces and TUN devices need root"
    if not os.path.exists("/dev/net/tun"):
        return "no /dev/net/tun"
    if shutil.which("ip") is None:
        return "no ip command (iproute2)"
    probe = f"{NETNS_PREFIX}{os.getpid()}-probe"
    try:
        _ip("netns", "add", probe)
    except RuntimeError as exc:
        return f"cannot create a network namespace: {exc}"
    _ip("netns", "del", probe)
    return None


def _remove_stale() -> None:
    """Delete the namespaces of test processes that are gone."""
    for line in _ip("netns", "list").splitlines():
        name = line.split()[0] if line.strip() else ""
        match = re.fullmatch(rf"{NETNS_PREFIX}(\d+)-.+", name)
        if match and not os.path.exists(f"/proc/{match[1]}"):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=IP_TIMEOUT)


class NamespaceProcesses:
    """The part of ``Processes`` that ``Cluster`` uses, running every command in one network namespace."""

    def __init__(self, processes: Processes, netns: str) -> None:
        self.processes = processes
        self.netns = netns

    def start(self, args: list[str], **kwargs) -> subprocess.Popen:
        return self.processes.start(["ip", "netns", "exec", self.netns, *args], **kwargs)


class ImpairedLink:
    """Hosts ``hosts`` (``10.77.0.1``, ``.2``, ... in that order) and the relay
    between them; see ``tun_relay.py`` for ``loss``, ``duplicate``, ``delay_ms``
    and ``jitter_ms``."""

    def __init__(self, processes: Processes, workdir: Path, hosts: Sequence[str] = ("a", "b"), *,
                 loss: float = 0.10, duplicate: float = 0.0, delay_ms: float = 20.0, jitter_ms: float = 5.0,
                 seed: int = 0, ready_timeout: float = 10.0) -> None:
        self.processes = processes
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        tag = f"{NETNS_PREFIX}{os.getpid()}-{next(_serial)}"
        self.netns = {name: f"{tag}-{name}" for name in hosts}
        self.address = {name: f"{SUBNET}.{i}" for i, name in enumerate(hosts, 1)}
        self.stats_path = self.dir / "relay.stats.json"
        self.relay_out, self.relay_err = self.dir / "relay.out", self.dir / "relay.err"
        self.relay: subprocess.Popen | None = None
        self._created: list[str] = []
        try:
            _remove_stale()
            for name in hosts:
                self._add_host(name)
            self._start_relay(["--loss", str(loss), "--duplicate", str(duplicate), "--delay-ms", str(delay_ms),
                               "--jitter-ms", str(jitter_ms), "--seed", str(seed)], ready_timeout)
        except BaseException:
            self.close()
            raise

    def _add_host(self, name: str) -> None:
        netns = self.netns[name]
        _ip("netns", "add", netns)
        self._created.append(netns)
        _ip("-n", netns, "link", "set", "lo", "up")
        _ip("-n", netns, "tuntap", "add", "dev", TUN, "mode", "tun")
        _ip("-n", netns, "addr", "add", f"{self.address[name]}/24", "dev", TUN)
        _ip("-n", netns, "link", "set", TUN, "up")

    def _start_relay(self, options: list[str], timeout: float) -> None:
        hosts = [arg for name, netns in self.netns.items()
                 for arg in ("--host", f"{name},{netns},{TUN},{self.address[name]}")]
        with open(self.relay_out, "wb") as stdout, open(self.relay_err, "wb") as stderr:
            self.relay = self.processes.start(
                [sys.executable, "-P", str(RELAY), *hosts, *options, "--stats", str(self.stats_path)],
                stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL)

        def ready() -> bool:
            if self.relay.poll() is not None:
                raise RuntimeError(f"tun_relay exited with {self.relay.returncode}: {self.relay_err.read_text()}")
            return self.relay_out.read_text().startswith("ready")

        wait_until(ready, timeout, interval=0.02, what="tun_relay ready")

    def cut(self) -> None:
        """A network partition: nothing crosses the link until :meth:`heal`."""
        self._signal(signal.SIGUSR1, True)

    def heal(self) -> None:
        self._signal(signal.SIGUSR2, False)

    def _signal(self, sig: int, cut: bool) -> None:
        self.relay.send_signal(sig)
        wait_until(lambda: self.stats().get("cut") is cut, 5, interval=0.02, what=f"the link {'cut' if cut else 'healed'}")

    def processes_in(self, host: str) -> NamespaceProcesses:
        return NamespaceProcesses(self.processes, self.netns[host])

    def stats(self) -> dict:
        """The relay's counters (see ``tun_relay.py``); final once the link is closed."""
        try:
            return json.loads(self.stats_path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def tail(self) -> str:
        """The relay's counters and error output, for a failing test's log."""
        try:
            err = self.relay_err.read_text(errors="replace")
        except FileNotFoundError:
            err = ""
        return f"==== tun_relay (rc {self.relay.poll() if self.relay else None})\n{self.stats()}\n{err}"

    def direction(self, source: str, destination: str) -> dict[str, int]:
        return self.stats().get("directions", {}).get(f"{source}>{destination}", {})

    def round_trip(self, source: str, destination: str, probes: int = 5, port: int = 9) -> float:
        """Seconds of the fastest of ``probes`` TCP connects from ``source`` to a
        closed ``port`` of ``destination``: SYN there, RST back, one round trip
        each.  The minimum, because a lost SYN costs a 1 s retransmission."""

        def probe() -> list[float]:
            times = []
            with in_netns(self.netns[source]):
                for _ in range(probes):
                    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                        s.settimeout(5.0)
                        start = time.monotonic()
                        try:
                            s.connect((self.address[destination], port))
                        except ConnectionRefusedError:
                            times.append(time.monotonic() - start)
                        except TimeoutError:
                            continue
            return times

        # A thread of its own enters the namespace, so this one never leaves the test's.
        with ThreadPoolExecutor(1) as pool:
            times = pool.submit(probe).result(timeout=probes * 6.0)
        if not times:
            raise RuntimeError(f"no TCP round trip from {source} to {destination} in {probes} tries")
        return min(times)

    def close(self) -> None:
        if self.relay is not None and self.relay.poll() is None:
            self.relay.terminate()  # it writes its final counters
            try:
                self.relay.wait(5)
            except subprocess.TimeoutExpired:
                self.relay.kill()
                self.relay.wait(5)
        while self._created:
            subprocess.run(["ip", "netns", "del", self._created.pop()], capture_output=True, timeout=IP_TIMEOUT)

    def __enter__(self) -> "ImpairedLink":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
