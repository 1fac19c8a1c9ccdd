"""A cluster for a scenario: a tower in the orchestrator, each peer a role process (run.py --role); the
raw ceiling; reading a role's result."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from .common import IDLE_STOP, RUN_PY, line_within


# The interpreter the Cluster's roles run in: this one, or (--ab) another commit's venv (bench/dafkabench/ab.py).
PYTHON = [sys.executable]


class Cluster:
    """A tower in this process; peers as child processes."""

    def __init__(self) -> None:
        from dafka.config import Config
        from dafka.towerd.tower import Tower

        self.tower = Tower(Config.load(overrides={
            "tower/sub_address": "tcp://127.0.0.1:*", "tower/pub_address": "tcp://127.0.0.1:*"})).start()
        self.procs: list[subprocess.Popen] = []

    def spawn(self, role: str, *args: str, stdin: bool = False) -> subprocess.Popen:
        cmd = [PYTHON[0], str(RUN_PY), "--role", role, "--sub", self.tower.sub_endpoint,
               "--pub", self.tower.pub_endpoint, *args]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stdin=subprocess.PIPE if stdin else None, text=True)
        self.procs.append(proc)
        return proc

    def store(self, db: str, settings: list[str] = (), progress: str | None = None) -> subprocess.Popen:
        """A store process on ``db`` (``settings``: KEY=VALUE config; ``progress``: the file it writes its
        stats to), once it has started."""
        store = self.spawn("store", "--db", db, *(arg for kv in settings for arg in ("--set", kv)),
                           *(["--progress", progress] if progress else []), stdin=True)
        store.stdout.readline()
        return store

    @staticmethod
    def stop_store(store: subprocess.Popen) -> dict:
        """Stop a store process; its result (CPU per record, RSS)."""
        return stop_stayer(store, timeout=900)

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        self.tower.stop()


class ScenarioFailed(RuntimeError):
    """A role of a scenario timed out or printed no result: the scenario is reported as such, the run goes on."""


def result_of(proc: subprocess.Popen, timeout: float = 900) -> dict:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        role = proc.args[proc.args.index("--role") + 1] if "--role" in proc.args else proc.args
        raise ScenarioFailed(f"the {role} role did not finish in {timeout:.0f} s; it printed: {(out or '').strip()[-300:]!r}")
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if not lines:
        raise ScenarioFailed(f"benchmark process {proc.args} printed no result (exit {proc.returncode})")
    return json.loads(lines[-1])


def ceiling(records: int, size: int) -> dict:
    sub = subprocess.Popen([sys.executable, str(RUN_PY), "--role", "raw-sub", "--records", str(records),
                            "--size", str(size)], stdout=subprocess.PIPE, text=True)
    endpoint = sub.stdout.readline().strip()
    pub = subprocess.Popen([sys.executable, str(RUN_PY), "--role", "raw-pub", "--records", str(records),
                            "--size", str(size), "--endpoint", endpoint], stdout=subprocess.PIPE, text=True)
    r = result_of(sub)
    p = result_of(pub)
    return {"rate": r["received"] / r["seconds"], "rss_mib": r["rss_mib"],
            "cpu_us": {"sender": p.get("cpu_us"), "receiver": r.get("cpu_us")}}


def holding(records: int, size: int) -> list[str]:
    """Producer settings whose no-store ring holds a whole run: a consumer that
    falls behind can always fetch what it missed, so the rate measures it,
    not the ring's size (which a bench row that loses records would not say)."""
    return ["--set", f"producer/max_unacked={records + 1}", "--set", f"producer/max_unacked_bytes={records * (size + 64)}"]


def stop_stayer(proc: subprocess.Popen, timeout: float = 60) -> dict:
    """The result of a role that waits for a line on its stdin (a producer with --stay, a store), after
    sending it one."""
    try:
        proc.stdin.write("stop\n")
        proc.stdin.flush()
    except BrokenPipeError:
        pass  # it ended already
    return result_of(proc, timeout)


def consumer_row(r: dict) -> dict:
    """A consumer role's figures; a run that did not deliver every record says so."""
    out = {"rate": r["received"] / r["seconds"] if r.get("seconds") else 0.0, "received": r["received"],
           "p50_ms": r.get("p50_ms"), "p99_ms": r.get("p99_ms")}
    if not r.get("complete", True):
        out["incomplete"] = f"received {r['received']:,}, lost {r.get('lost', 0):,}, then nothing for {IDLE_STOP:.0f} s"
    return out


def guarded(scenario, *args, **kwargs) -> dict:
    """Run a scenario; one that does not finish is reported as such (``error``), and the run goes on."""
    try:
        return scenario(*args, **kwargs)
    except ScenarioFailed as exc:
        print(f"{scenario.__name__}{args}: did not finish: {exc}", file=sys.stderr, flush=True)
        return {"error": str(exc)}


def start_tower(timeout: float = 60.0) -> tuple[subprocess.Popen, str, str]:
    """A dafka_towerd process on ports of its own choosing: (process, its sub endpoint, its pub endpoint).
    Ports picked beforehand (:func:`free_port`) may be taken by another program before the tower binds them,
    and a tower that could not bind leaves every peer of the scenario waiting for nothing."""
    proc = subprocess.Popen([sys.executable, "-c", "from dafka.towerd.main import main; main()",
                             "--sub", "tcp://127.0.0.1:*", "--pub", "tcp://127.0.0.1:*"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    line = line_within(proc.stderr, timeout)
    found = re.search(r"beacons in (\S+), out (\S+)", line)
    if found is None:
        proc.kill()
        proc.wait()
        raise RuntimeError(f"the tower did not start in {timeout:.0f} s: {line.strip() or 'it said nothing'}")
    return proc, found.group(1), found.group(2)
