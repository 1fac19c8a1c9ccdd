"""Every script in examples/ runs to the end (real subprocesses, each with
its own tower and store on loopback), and the Grafana dashboard charts only
metrics that exist."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dafka.metrics import METRICS

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
PLAIN = ["producer_consumer.py", "asyncio_app.py", "consumer_group.py", "curve.py", "metrics.py"]
SPARK = ["spark_batch.py", "spark_streaming.py", "spark_sink.py"]


def run(script: str, timeout: float) -> str:
    # As a user runs it: the script's folder first on sys.path (tox's PYTHONSAFEPATH would leave it out).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONSAFEPATH"}
    done = subprocess.run([sys.executable, str(EXAMPLES / script)], cwd=EXAMPLES, capture_output=True, text=True,
                          timeout=timeout, env=env)
    assert done.returncode == 0, f"{script} exited {done.returncode}:\n{done.stdout}\n{done.stderr[-4000:]}"
    return done.stdout


def test_every_example_script_is_tested():
    scripts = {p.name for p in EXAMPLES.glob("*.py")} - {"local_cluster.py"}
    assert scripts == set(PLAIN) | set(SPARK)


@pytest.mark.parametrize("script", PLAIN)
def test_example_runs(script):
    out = run(script, 120)
    assert out.strip(), f"{script} printed nothing"


@pytest.mark.spark
@pytest.mark.parametrize("script", SPARK)
def test_spark_example_runs(script):
    from helpers import require_pyspark

    require_pyspark()
    assert run(script, 300).strip()


def test_the_grafana_dashboard_charts_only_metrics_that_exist():
    dashboard = json.loads((EXAMPLES / "grafana-dashboard.json").read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    named = {name for expr in exprs for name in re.findall(r"\bdafka_[a-z0-9_]+", expr)}
    exposed = set(METRICS) | {f"{name}_total" for name, (kind, _, _) in METRICS.items() if kind == "counter"}
    assert named and named <= exposed, named - exposed
    counters = {name for name, (kind, _, _) in METRICS.items() if kind == "counter"}
    assert not named & counters, "a counter is exposed with _total: " + ", ".join(sorted(named & counters))
    assert len(named) >= 15
