"""What the roles and the orchestrator share: the roles' config, CPU and memory readings, a role's result
line, payloads, ports."""

from __future__ import annotations

import json
import os
import resource
import selectors
import threading
import time
from pathlib import Path




RUN_PY = Path(__file__).resolve().parents[1] / "run.py"  # the driver: each role is it run with --role
IDLE_STOP = 10.0  # a consumer role stops after this long without a record, and says what it got


TOPIC = "bench"


STAMP_EVERY = 16  # latency is sampled on every 16th record


SPIN_BELOW = 0.0002  # a paced sender spins through the last 0.2 ms of a wait, sleeps through the rest


def peak_rss_mib() -> float:
    """Peak RSS of this process image (VmHWM).  ``ru_maxrss`` would not do: on
    Linux it survives execve and starts at the parent's size at fork."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


ADDRESS = ["127.0.0.1"]  # the roles' beacon/address (--address: a host of the impaired link)


def config(sub: str, pub: str, **extra: object):
    from dafka.config import Config

    values: dict[str, object] = {
        "beacon/address": ADDRESS[0],
        "beacon/bind_address": ADDRESS[0],
        "beacon/sub_address": sub,
        "beacon/pub_address": pub,
    }
    values.update(extra)
    return Config.load(overrides=values)


def cpu_seconds() -> float:
    """CPU time of this whole process (every thread: Python, libzmq I/O, LevelDB)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def emit(result: dict, cpu_since: float | None = None, records: int = 0) -> None:
    """Print the role's result; with ``cpu_since`` also the process's CPU
    microseconds per record since then, a figure that steal time and
    neighbours move far less than a rate."""
    result["rss_mib"] = round(peak_rss_mib(), 1)
    if cpu_since is not None and records:
        result["cpu_us"] = round((cpu_seconds() - cpu_since) / records * 1e6, 2)
    print(json.dumps(result), flush=True)


def payload(size: int, stamp: bool) -> bytes:
    body = b"x" * size
    if stamp:
        return time.monotonic_ns().to_bytes(8, "big") + body[8:]
    return body


class RssSampler:
    """The RSS of a process (``/proc/<pid>/status`` VmRSS), sampled every 20 ms
    in a thread of the orchestrator: a baseline, then the peak over a phase."""

    def __init__(self, pid: int) -> None:

        self.pid = pid
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def current(self) -> float:
        try:
            with open(f"/proc/{self.pid}/status") as status:
                for line in status:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) / 1024.0
        except OSError:
            pass
        return 0.0

    def parts(self) -> dict[str, float]:
        """The RSS's parts (MiB): anonymous memory (the heap, the threads' stacks) and file pages
        mapped by the process (LevelDB maps the tables it reads; the kernel can take those back)."""
        out: dict[str, float] = {}
        try:
            with open(f"/proc/{self.pid}/status") as status:
                for line in status:
                    if line.startswith(("RssAnon:", "RssFile:", "RssShmem:")):
                        key, value = line.split()[:2]
                        out[key[3:-1].lower()] = int(value) / 1024.0
        except OSError:
            pass
        return out

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self.current())

    def reset(self) -> float:
        """Start a new phase; returns the RSS now."""
        self.peak = now = self.current()
        return now

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def rate_of(r: dict) -> float:
    return r["received"] / r["seconds"] if r.get("received") and r.get("seconds") else 0.0


def line_within(stream, timeout: float) -> str:
    """The next line of a child's pipe (text mode), or "" if nothing came within ``timeout`` seconds
    (or it closed)."""
    with selectors.DefaultSelector() as sel:
        sel.register(stream, selectors.EVENT_READ)
        if not sel.select(timeout):
            return ""
    return stream.readline()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_cpu_seconds(pid: int) -> float:
    """CPU seconds of a process so far, all its threads together (user + system)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_cpu_and_wakeups(pid: int) -> tuple[float, int]:
    """CPU seconds and voluntary context switches (a thread went to sleep, to
    be woken later) of a process so far, all its threads together.  CPU from
    each thread's schedstat (nanoseconds): idle roles spend a few
    milliseconds a minute, which /proc's 10 ms ticks would round away."""
    schedstat = Path("/proc/self/schedstat").exists()  # a kernel without schedstats: ticks it is
    cpu = 0.0 if schedstat else proc_cpu_seconds(pid)
    switches = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            if schedstat:
                cpu += int((task / "schedstat").read_text().split()[0]) / 1e9
            for line in (task / "status").read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches"):
                    switches += int(line.split()[1])
        except (FileNotFoundError, ProcessLookupError):
            pass  # a thread that ended meanwhile (its time is lost: threads of idle roles live on)
    return cpu, switches
