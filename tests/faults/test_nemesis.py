"""The nemesis run in CI: a fixed seed, about 90 s of mixed, overlapping
faults against a whole cluster, then the checker (``nemesis.py`` says what
runs; ``python tests/faults/nemesis.py --seed N --duration S`` runs any)."""

from __future__ import annotations

import pytest

import nemesis

pytestmark = [pytest.mark.nemesis, pytest.mark.timeout(600)]

SEED = 46
SHARDED_SEED = 41
KAFKA_SEED = 37


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


def test_nemesis_with_kafka_gateways(processes, tmp_path, fault_report):
    """The same kinds of faults with two Kafka gateways in the mix, each killed once: an idempotent
    confluent-kafka producer loses nothing and stores nothing twice, and its group reads everything.  The
    gateways are not SIGSTOPped here: runs with their stops (python tests/faults/nemesis.py --kafka, seeds
    10-15, 37 and 58) are clean on an idle machine since 2026-12-05, and not tried in the suite's loaded
    parallel phase yet (docs/kafka.md)."""
    faults = nemesis.schedule(KAFKA_SEED, 75.0, gateways=nemesis.GATEWAYS, gateway_stops=False)
    assert {f.target for f in faults if f.kind == "kill"} >= set(nemesis.GATEWAYS)  # the seed's, checked
    assert any(f.kind in ("kill", "wipe") and f.target in nemesis.STORES for f in faults)
    reports, text = nemesis.run(KAFKA_SEED, 75.0, tmp_path / "nemesis", processes, kafka=True, gateway_stops=False)
    for report in reports:
        report.extra["seed"] = KAFKA_SEED
        fault_report(report)
    assert "ANOMALY" not in text, text
    assert [r.scenario for r in reports][-2:] == ["nemesis kafka group", "nemesis kafka reader"]
