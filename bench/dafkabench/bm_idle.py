"""Each daemon's and console tool's CPU and wake-ups while nothing flows."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time

from .cluster import ScenarioFailed, start_tower
from .common import line_within, proc_cpu_and_wakeups


def scenario_idle(seconds: float) -> dict:
    """CPU and wake-ups of each role's daemon or console tool while nothing
    flows: a tower, a store, a producer that sent one record and waits on its
    stdin, and a consumer that got it; measured after a settling period."""
    db = tempfile.mkdtemp(prefix="dafka-bench-idle-")

    def tool(module: str, *args: str, stdin: bool = False) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", f"from {module} import main; main()", *args],
                                stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})  # the consumer's line comes at once

    procs = {}
    try:
        procs["tower"], tower_sub, tower_pub = start_tower()
        peer = ["--sub", tower_sub, "--pub", tower_pub, "-X", "beacon/address=127.0.0.1"]
        procs["store"] = tool("dafka.cli.stored", "--db", db, *peer)
        procs["consumer"] = tool("dafka.cli.consumer", "idle", "--from-beginning", "-q", *peer)
        procs["producer"] = tool("dafka.cli.producer", "idle", "-q", *peer, stdin=True)
        procs["producer"].stdin.write("one record\n")
        procs["producer"].stdin.flush()
        line = line_within(procs["consumer"].stdout, 60.0)  # (a bench never hangs)
        if not line.rstrip().endswith("one record"):
            raise ScenarioFailed(f"the idle scenario's consumer printed {line!r} within 60 s, not its record")
        time.sleep(10.0)  # settle: hellos, HEADs, retries and start-up work are over
        before = {role: proc_cpu_and_wakeups(p.pid) for role, p in procs.items()}
        time.sleep(seconds)
        out = {}
        for role, p in procs.items():
            cpu, switches = proc_cpu_and_wakeups(p.pid)
            out[role] = {"cpu_percent": (cpu - before[role][0]) / seconds * 100,
                         "wakeups_per_s": (switches - before[role][1]) / seconds}
        return {"seconds": seconds, "roles": out}
    finally:
        for p in procs.values():
            p.kill()
            p.wait()
        shutil.rmtree(db, ignore_errors=True)
