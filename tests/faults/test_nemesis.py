"""The nemesis run in CI: a fixed seed, about 90 s of mixed, overlapping
faults against a whole cluster, then the checker (``nemesis.py`` says what
runs; ``python tests/faults/nemesis.py --seed N --duration S`` runs any)."""

from __future__ import annotations

import pytest

import nemesis

pytestmark = [pytest.mark.nemesis, pytest.mark.timeout(600)]

SEED = 46
SHARDED_SEED = 41


def test_nemesis_fixed_seed(processes, tmp_path, fault_report):
    reports, text = nemesis.run(SEED, 75.0, tmp_path / "nemesis", processes)
    for report in reports:
        report.extra["seed"] = SEED
        fault_report(report)
    assert "ANOMALY" not in text, text


def test_nemesis_with_sharded_stores(processes, tmp_path, fault_report):
    """The same faults, store kills and wipes included, against four sharded stores, each partition on two."""
    reports, text = nemesis.run(SHARDED_SEED, 75.0, tmp_path / "nemesis", processes,
                                stores=("s1", "s2", "s3", "s4"), replicas=2)
    for report in reports:
        report.extra["seed"] = SHARDED_SEED
        report.scenario += " (sharded, R=2 of 4)"
        fault_report(report)
    assert "ANOMALY" not in text, text
