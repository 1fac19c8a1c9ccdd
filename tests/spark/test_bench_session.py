"""The bench's Spark session leaves the orchestrator's environment as it was (it set PYTHONSAFEPATH, and every
role started after it could not import the bench's package), and ends with its JVM: the scenarios after it (the
idle rows among them) measured a JVM of 720 MiB at about 5 % of a core that SparkSession.stop() had left
running."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from helpers import require_pyspark

require_pyspark()

BENCH = Path(__file__).resolve().parents[2] / "bench"  # (its dafkabench package)
CHECK = """
import os, subprocess, sys, time
sys.path.insert(0, sys.argv[1])
from dafkabench import bm_bulk as run

def javas():
    children = subprocess.run(["pgrep", "-P", str(os.getpid())], capture_output=True, text=True).stdout.split()
    return [p for p in children if b"java" in open(f"/proc/{p}/cmdline", "rb").read()]

session = run.spark_session()
assert session.range(5).count() == 5
assert "PYTHONSAFEPATH" not in os.environ  # (the roles started after it find the bench's package)
before = javas()
run.stop_spark(session)
deadline = time.monotonic() + 30
while javas() and time.monotonic() < deadline:
    time.sleep(0.1)
print(len(before), len(javas()))
"""


def test_the_bench_stops_its_spark_jvm_with_its_session(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONSAFEPATH"}  # as README runs the bench
    done = subprocess.run([sys.executable, "-P", "-c", CHECK, str(BENCH)], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-2:] == ["1", "0"], done.stdout  # a JVM while the session ran, none after
