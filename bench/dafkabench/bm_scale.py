"""The scale scenario of bench/run.py: what discovery costs as the cluster grows.

P simulated peers beacon through one dafka-py tower, once every
``beacon/interval`` (1 s), as RFC 46 peers do: each has its own bound data
socket and its own PUB connected to the tower, and sends the four-frame
beacon, the P beacons spread evenly over the interval.  They are not a
process each: a simulator process holds up to 500 of them.  They are
producers, ten to a topic (``s0``, ``s1``, ...).  Beside them, real dafka-py
peers, each in its own process: an idle consumer of ``s0``, an idle producer
of ``s0`` (it sent one record, which the consumer got), and, once those have
been measured, a newcomer: a consumer of ``s0`` that reads from the
beginning.  For each P it reports the CPU of the tower, of the idle consumer
and of the idle producer over ``--scale-seconds`` after a settling period,
the newcomer's time from its ``Consumer()`` to its first record, and the
tower's RSS.

Two kinds of cluster are measured at each P:

* ``rfc46``: the simulated peers only beacon (they do not listen), and the
  real peers listen to every beacon, as every peer does today and as the
  reference's do;
* ``scoped``: the simulated peers are dafka-py producers that announce what
  they are (rfc 5.6): each simulator's one SUB to the tower carries its
  peers' profiles, and the real peers hear only the beacons they need.

The descriptors: a simulated peer holds four (its listening socket, its
beacon connection, and the two mailboxes of its two libzmq sockets), the
tower one per peer, and an unscoped consumer one per peer it connects to.
The bench raises its soft limit to the hard one (``ulimit -Hn``) and runs a
P only where P + 200 descriptors fit under it.  Local ports bound it too:
the simulated peers take two each (a listening socket, a beacon
connection), and an unscoped consumer one per peer; a row that needs more
than the ephemeral range (``net.ipv4.ip_local_port_range``, 28,232 by
default: unscoped P = 10,000 needs 40,200) is reported as not run.

Run alone: ``python3 bench/run.py --only scale`` (``--scale-peers``,
``--scale-seconds``).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from .common import RUN_PY
from .cluster import start_tower
from .common import line_within, proc_cpu_seconds

PER_SIMULATOR = 500  # simulated peers per process
TOPIC_SIZE = 10  # simulated producers per topic
SETTLE = 8.0  # seconds after every peer is up, before the CPU is measured
MODES = ("rfc46", "scoped")


def raise_fd_limit() -> int:
    """Raise this process's soft descriptor limit to its hard one (children inherit it); returns it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


# ---------------------------------------------------------------------------
# the simulator: many RFC 46 peers in one process
# ---------------------------------------------------------------------------


def simulate(a: argparse.Namespace) -> None:
    import zmq

    from dafka import protocol as proto
    from dafka.core.addresses import new_address

    raise_fd_limit()
    ctx = zmq.Context()
    ctx.max_sockets = 2 * a.count + 16
    beacons = []
    profiles = []
    for i in range(a.first, a.first + a.count):
        data = ctx.socket(zmq.PUB)
        data.linger = 0
        port = data.bind_to_random_port("tcp://127.0.0.1")
        out = ctx.socket(zmq.PUB)
        out.linger = 0
        out.connect(a.sub)
        address = new_address(producer=True)
        beacons.append((out, proto.encode_beacon(proto.Beacon(address, "127.0.0.1", port)), data))
        if a.scoped:
            profiles.append(proto.encode_profile(address, proto.ROLE_PRODUCER, f"s{i // TOPIC_SIZE}"))
    listener = None
    if a.scoped:
        listener = ctx.socket(zmq.SUB)
        listener.linger = 0
        for profile in profiles:
            listener.subscribe(profile)
        listener.connect(a.pub)
    print("ready", flush=True)
    step = a.interval / len(beacons)
    due = time.monotonic()
    while True:  # until killed
        for out, frames, _ in beacons:
            out.send_multipart(frames)
            due += step
            pause = due - time.monotonic()
            if pause > 0:
                time.sleep(pause)
        if listener is not None:
            try:
                while True:
                    listener.recv(zmq.NOBLOCK)
            except zmq.Again:
                pass


# ---------------------------------------------------------------------------
# the real peers (each this file run with --role)
# ---------------------------------------------------------------------------


def _config(a: argparse.Namespace):
    from dafka.config import Config

    values = {"beacon/address": "127.0.0.1", "beacon/bind_address": "127.0.0.1", "beacon/sub_address": a.sub,
              "beacon/pub_address": a.pub, "consumer/offset/reset": "earliest"}
    values["beacon/scoped"] = 1 if a.scoped else 0
    return Config.load(overrides=values)


def role_consumer(a: argparse.Namespace) -> None:
    """Read ``s0`` from the beginning: print the time from Consumer() to the first record, then idle."""
    from dafka import Consumer

    raise_fd_limit()
    created = time.monotonic()
    consumer = Consumer("s0", config=_config(a))
    record = consumer.poll(120)
    first_ms = (time.monotonic() - created) * 1000 if record is not None else None
    print(json.dumps({"first_record_ms": first_ms}), flush=True)
    while True:
        consumer.poll(3600)


def role_producer(a: argparse.Namespace) -> None:
    """Send one record to ``s0``, then idle."""
    from dafka import Producer

    raise_fd_limit()
    producer = Producer("s0", config=_config(a))
    producer.send(b"the one record")
    print(json.dumps({"sent": 1}), flush=True)
    while True:
        time.sleep(3600)


# ---------------------------------------------------------------------------
# the orchestrator
# ---------------------------------------------------------------------------


def _spawn(*args: str) -> subprocess.Popen:
    """run.py with ``args`` (a role of this module: ``--role scale-...``); its stderr goes to a temporary
    file, which an error message quotes."""
    err = tempfile.TemporaryFile()
    proc = subprocess.Popen([sys.executable, str(RUN_PY), *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=err, text=True)
    proc.err = err  # type: ignore[attr-defined]
    return proc


def _line(proc: subprocess.Popen, what: str, timeout: float = 120.0) -> str:
    line = line_within(proc.stdout, timeout)
    if not line and proc.poll() is None:
        raise RuntimeError(f"scale bench: the {what} said nothing in {timeout:.0f} s")
    if not line:
        code = proc.wait()
        proc.err.seek(0)  # type: ignore[attr-defined]
        tail = proc.err.read().decode(errors="replace").strip().splitlines()[-3:]  # type: ignore[attr-defined]
        raise RuntimeError(f"scale bench: the {what} exited ({code}): {' / '.join(tail)}")
    return line


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return 0.0


def run_one(peers: int, mode: str, seconds: float) -> dict:
    """One cluster of ``peers`` simulated peers: the figures of one row."""
    procs: list[subprocess.Popen] = []
    try:
        tower, tower_sub, tower_pub = start_tower()
        procs.append(tower)
        links = ["--sub", tower_sub, "--pub", tower_pub] + (["--scoped"] if mode == "scoped" else [])
        sims = []
        for first in range(0, peers, PER_SIMULATOR):
            sims.append(_spawn("--role", "scale-simulate", *links, "--first", str(first),
                               "--count", str(min(PER_SIMULATOR, peers - first))))
        procs.extend(sims)
        for sim in sims:
            _line(sim, "simulator")
        producer = _spawn("--role", "scale-producer", *links)
        procs.append(producer)
        _line(producer, "idle producer")
        consumer = _spawn("--role", "scale-consumer", *links)
        procs.append(consumer)
        json.loads(_line(consumer, "idle consumer"))
        time.sleep(SETTLE)
        measured = {"tower": tower, "consumer": consumer, "producer": producer}
        before = {role: proc_cpu_seconds(p.pid) for role, p in measured.items()}
        time.sleep(seconds)
        cpu = {role: (proc_cpu_seconds(p.pid) - before[role]) / seconds * 100 for role, p in measured.items()}
        tower_rss = _rss_mib(tower.pid)
        newcomer = _spawn("--role", "scale-consumer", *links)
        procs.append(newcomer)
        first = json.loads(_line(newcomer, "newcomer"))["first_record_ms"]
        return {"peers": peers, "mode": mode, "cpu_percent": cpu, "newcomer_first_record_ms": first,
                "tower_rss_mib": tower_rss}
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def run_all(peer_counts: list[int], seconds: float) -> dict:
    limit = raise_fd_limit()
    print(f"\n== scale: P simulated peers beacon once a second through one tower; {seconds:.0f} s of CPU each "
          f"(descriptor limit {limit}) ==")
    print(f"{'P':>6} {'discovery':<9} {'tower CPU':>10} {'consumer':>9} {'producer':>9} {'newcomer':>9} {'tower RSS':>10}")
    low, high = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    ports = high - low + 1
    rows = []
    for peers in peer_counts:
        for mode in MODES:
            # local ports: each simulated peer's listening socket and beacon connection, and, unscoped,
            # one connection per peer from each of the two consumers (the idle one and the newcomer)
            needed_ports = (4 if mode == "rfc46" else 2) * peers + 200
            why = (f"needs {peers + 200} descriptors, the limit is {limit}" if peers + 200 > limit else
                   f"needs {needed_ports} local ports, the ephemeral range has {ports} "
                   f"(net.ipv4.ip_local_port_range)" if needed_ports > ports else None)
            if why:
                rows.append({"peers": peers, "mode": mode, "not_run": why})
                print(f"{peers:>6} {mode:<9} not run: {why}")
                continue
            r = run_one(peers, mode, seconds)
            rows.append(r)
            c = r["cpu_percent"]
            first = r["newcomer_first_record_ms"]
            print(f"{peers:>6} {mode:<9} {c['tower']:>9.2f}% {c['consumer']:>8.2f}% {c['producer']:>8.2f}% "
                  f"{'-' if first is None else f'{first:.0f} ms':>9} {r['tower_rss_mib']:>6.0f} MiB", flush=True)
    return {"seconds": seconds, "fd_limit": limit, "rows": rows}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--role", choices=("simulate", "consumer", "producer"), required=True)
    ap.add_argument("--sub", required=True)
    ap.add_argument("--pub", required=True)
    ap.add_argument("--scoped", action="store_true")
    ap.add_argument("--first", type=int, default=0)
    ap.add_argument("--count", type=int, default=0)
    ap.add_argument("--interval", type=float, default=1.0)
    a = ap.parse_args(argv)
    {"simulate": simulate, "consumer": role_consumer, "producer": role_producer}[a.role](a)


if __name__ == "__main__":
    main()
