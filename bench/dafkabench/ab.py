"""Same-run A/B of bench/run.py: this checkout against another commit.

On a noisy machine a rate moves 2x from one run to the next, so a figure is
compared only with the same figure of the other code measured in the same
run, in alternation: round 1 new then old, round 2 old then new, ...  The
other commit (by default the last release, ``v0.2.0``) is installed from
this repository (``git archive``, nothing downloaded), and this checkout's
working tree likewise, each into a venv of its own that borrows this
interpreter's third-party packages (``--system-site-packages``), so only
dafka differs.  Every role of bench/run.py then runs in that venv's
interpreter (the roles are the current script's, written to work with both);
the tower runs in the orchestrator, as in every scenario.

For each figure (a rate, or a process's CPU per record) it reports the median
over the rounds of each side and their ratio, new over old: a rate above 1
or a CPU below 1 is better.

    python3 bench/run.py --ab                 # against v0.2.0, 3 rounds
    python3 bench/run.py --ab 0896c86 --ab-rounds 5 --sizes 1000 --ab-scenarios store
    python3 bench/run.py --ab pure            # the compiled twins against pure Python (DAFKA_NO_EXTENSIONS=1)

``--ab pure`` installs this checkout once (with its compiled twins, setup.py) and runs the old side's
roles with ``DAFKA_NO_EXTENSIONS=1``: the same code, with and without the twins.
"""

from __future__ import annotations

import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from .bm_live import scenario_direct
from .bm_recovery import scenario_recovery
from .bm_store import scenario_store
from .cluster import PYTHON, ScenarioFailed

ROOT = Path(__file__).resolve().parents[2]  # the checkout (bench/dafkabench/ab.py)
SCENARIOS = ("live", "store", "recovery")
DEFAULT_REV = "v0.2.0"
PURE = "pure"  # --ab pure: this checkout without its compiled twins


def resolve(rev: str) -> str:
    """The commit of ``rev``.  A clone without tags still knows the release's
    commit: CHANGELOG.md names it in the release's heading."""
    found = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
                           capture_output=True, text=True)
    if found.returncode == 0:
        return found.stdout.strip()
    version = rev.removeprefix("v")
    heading = re.search(rf"^## \[{re.escape(version)}\].*?commit ([0-9a-f]{{7,40}})",
                        (ROOT / "CHANGELOG.md").read_text(), re.M)
    if heading is None:
        raise SystemExit(f"--ab: {rev!r} is neither a commit of this repository nor a release CHANGELOG.md names")
    return resolve(heading.group(1))


def install(commit: str | None, into: Path) -> str:
    """A venv at ``into`` with ``commit``'s dafka installed (None: this checkout's working tree, uncommitted
    changes included); returns its interpreter.  Both sides are installed so: run from the checkout
    itself, the same code measured 1.13x the producer CPU and 0.88x the live rate of its installed copy
    (HEAD against HEAD, 10 rounds at 100 B)."""
    src = into / "src"
    if commit is None:
        shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
            ".git", ".tox", "build", "dist", "*.egg-info", "__pycache__", ".*_cache"))
    else:
        src.mkdir(parents=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    # without a pip of its own, which would bring ensurepip's old setuptools into the build (it cannot read
    # pyproject's SPDX license): this interpreter's pip installs into it, with this interpreter's setuptools
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(into / "venv")],
                   check=True)
    python = str(into / "venv" / "bin" / "python")
    subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps",
                    "--no-build-isolation", str(src)], check=True)
    where = subprocess.run([python, "-c", "import dafka, sys; print(dafka.__file__)"], cwd=into, check=True,
                           capture_output=True, text=True).stdout.strip()
    if not where.startswith(str(into / "venv")):
        raise SystemExit(f"--ab: the venv imports dafka from {where}, not its own install")
    return python


def figures(scenario: str, records: int, size: int) -> dict[str, float]:
    """One scenario's figures, flat: rates (records/s) and CPU per record (us)."""
    out: dict[str, float] = {}
    if scenario == "live":
        r = scenario_direct(records, size)
        out["live rate"] = r["rate"]
        cpu = r["cpu_us"]
        out["live cpu producer"], out["live cpu consumer"] = cpu["producer"], cpu["consumer"]
    elif scenario == "store":
        r = scenario_store(records, size, with_consumer=False)
        out["store acked rate"], out["store catch-up rate"] = r["ack_rate"], r["catchup_rate"]
        cpu = r["cpu_us"]
        out["store cpu producer"], out["store cpu store"] = cpu["producer"], cpu["store"]
        out["store cpu catch-up consumer"] = cpu["catchup consumer"]
    elif scenario == "recovery":
        r = scenario_recovery(records, size, "consume")
        if "rate" in r:
            out["recovery rate"] = r["rate"]
        out["recovery cpu consumer"] = r["cpu_us"]["recovering consumer"]
    return {k: v for k, v in out.items() if v is not None}


def without_extensions(python: str, into: Path) -> str:
    """An interpreter command that runs ``python`` with the compiled twins turned off."""
    into.mkdir(parents=True)
    script = into / "python"
    script.write_text(f"#!/bin/sh\nDAFKA_NO_EXTENSIONS=1 exec {python} \"$@\"\n")
    script.chmod(0o755)
    return str(script)


def run_ab(rev: str, rounds: int, sizes: list[int], records: int,
           scenarios: list[str]) -> dict:
    commit = PURE if rev == PURE else resolve(rev)
    work = Path(tempfile.mkdtemp(prefix="dafka-bench-ab-"))
    try:
        new = install(None, work / "new")
        ran = subprocess.run([new, "-c", "from dafka.core import extensions; print(extensions.summary())"], cwd=work,
                             check=True, capture_output=True, text=True).stdout.strip()
        print(f"new side: {ran}", flush=True)
        old = without_extensions(new, work / "pure") if rev == PURE else install(commit, work / "old")
        sides = {"new": new, "old": old}
        samples: dict[tuple[int, str, str], list[float]] = {}
        for n in range(rounds):
            # each side first in every other round: whatever the first of a pair gains or loses, both get
            for side, python in sorted(sides.items(), reverse=n % 2 == 1):
                PYTHON[0] = python
                for size in sizes:
                    for scenario in scenarios:
                        try:
                            got = figures(scenario, records, size)
                        except ScenarioFailed as exc:
                            print(f"round {n + 1} {side} {size} B {scenario}: did not finish: {exc}", flush=True)
                            continue
                        for name, value in got.items():
                            samples.setdefault((size, name, side), []).append(value)
                        print(f"round {n + 1} {side:<3} {size} B {scenario}: "
                              + ", ".join(f"{k} {v:,.2f}" for k, v in got.items()), flush=True)
    finally:
        PYTHON[0] = sys.executable
        shutil.rmtree(work, ignore_errors=True)
    table = []
    for (size, name, side), values in sorted(samples.items()):
        if side != "new" or (size, name, "old") not in samples:
            continue
        new, old = statistics.median(values), statistics.median(samples[(size, name, "old")])
        table.append({"size": size, "figure": name, "new": new, "old": old, "ratio": new / old if old else None,
                      "rounds": len(values)})
    against = "itself without its compiled twins" if rev == PURE else f"{rev} = {commit[:10]}"
    print(f"\n== A/B: this checkout (new) against {against} (old), median of {rounds} rounds each ==")
    print(f"{'size':>5}  {'figure':<32} {'new':>12} {'old':>12} {'new/old':>8}")
    for row in table:
        ratio = "-" if row["ratio"] is None else f"{row['ratio']:.2f}"
        print(f"{row['size']:>5}  {row['figure']:<32} {row['new']:>12,.2f} {row['old']:>12,.2f} {ratio:>8}")
    return {"against": rev, "commit": commit, "rounds": rounds, "records": records, "figures": table}
