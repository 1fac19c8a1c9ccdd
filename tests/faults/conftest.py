"""Fixtures of the fault-injection scenarios, and their summary table.

Every scenario hands its :class:`faultcheck.Report` to the ``fault_report``
fixture; at the end of the run ``pytest_terminal_summary`` prints one row per
scenario (records produced, acked, delivered, and the anomalies) and, if
``$DAFKA_FAULTS_REPORT`` is set, writes the reports there as JSON."""

from __future__ import annotations

import os
import subprocess

import pytest

from faultcheck import ANOMALIES, Report, write_json
from faultkit import Cluster

_REPORTS = pytest.StashKey[list]()


def _reports(config) -> list[Report]:
    return config.stash.setdefault(_REPORTS, [])


@pytest.fixture
def fault_report(request):
    """``fault_report(report)`` records the scenario's report for the summary and
    fails the test if it has any anomaly (``unseen`` is informational)."""

    def record(report: Report, *, require_clean: bool = True) -> Report:
        xfail = request.node.get_closest_marker("xfail")
        if xfail is not None and xfail.kwargs.get("strict"):
            report.scenario += " [xfail: product bug]"
        _reports(request.config).append(report)
        print(report.summary())
        if require_clean:
            assert report.anomalies == 0, report.summary()
        return report

    return record


_PHASES = pytest.StashKey[dict]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    item.stash.setdefault(_PHASES, {})[report.when] = report
    return report


def failed(item) -> bool:
    return any(r.failed for r in item.stash.get(_PHASES, {}).values())


@pytest.fixture
def cluster(request, processes, tower, tmp_path):
    """Role processes against the root ``tower`` fixture; their logs are shown if the test fails.  A test
    module's ``CLUSTER_CONFIG`` (if any) is every role's config."""
    c = Cluster(processes, tmp_path / "cluster", tower.sub_endpoint, tower.pub_endpoint,
                **getattr(request.module, "CLUSTER_CONFIG", {}))
    yield c
    if failed(request.node):
        print(c.tails())


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    reports = config.stash.get(_REPORTS, [])
    if not reports:
        return
    tr = terminalreporter
    tr.section("fault scenarios")
    columns = ("scenario", "produced", "acked", "delivered", "stored", *ANOMALIES, "unseen", "redeliv")
    rows = [(r.scenario, r.produced, r.acked, r.delivered, r.stored, *(getattr(r, a) for a in ANOMALIES),
             r.unseen, r.redelivered) for r in reports]
    widths = [max(len(str(c)), *(len(str(row[i])) for row in rows)) for i, c in enumerate(columns)]
    fmt = "  ".join(f"{{:<{w}}}" if i == 0 else f"{{:>{w}}}" for i, w in enumerate(widths))
    tr.write_line(fmt.format(*columns))
    for row in rows:
        tr.write_line(fmt.format(*row))
    path = os.environ.get("DAFKA_FAULTS_REPORT")
    if path:
        write_json(reports, path)
        tr.write_line(f"written to {path}")


class SmallDisk:
    """A directory where the store's database can run out of space.

    ``tmpfs``: a 4 MiB tmpfs mounted on it (needs root; unmounted in
    teardown); space returns by remounting it at 64 MiB.  ``injected``: a plain
    directory plus a flag file that makes the store role's LevelDB writes fail
    with ENOSPC through the writer's ``_write_batch`` hook
    (``roles.py store --fail-writes-file``); space returns when it is removed."""

    def __init__(self, path, mode: str, size: str = "4m") -> None:
        self.path = path
        self.mode = mode
        self.path.mkdir()
        self.flag = path.parent / "disk-is-full" if mode == "injected" else None
        self.mounted = False
        if mode == "tmpfs":
            if os.geteuid() != 0:
                pytest.skip("mounting a tmpfs needs root (the injected variant covers the rest)")
            done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                                  capture_output=True, text=True)
            if done.returncode != 0:
                pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
            self.mounted = True

    def fill(self) -> None:
        """Injected: from now on every write fails (a tmpfs fills up by itself)."""
        if self.flag is not None:
            self.flag.touch()

    def grow(self, size: str = "64m") -> None:
        """Space returns."""
        if self.mounted:
            subprocess.run(["mount", "-o", f"remount,size={size}", str(self.path)], check=True)
        elif self.flag is not None:
            self.flag.unlink(missing_ok=True)

    def close(self) -> None:
        if self.mounted:
            if subprocess.run(["umount", str(self.path)], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", str(self.path)], capture_output=True)
            self.mounted = False


@pytest.fixture
def small_disk(request, tmp_path):
    disk = SmallDisk(tmp_path / "small-disk", request.param)
    yield disk
    disk.close()
