"""dafka-py benchmarks: throughput, latency and memory against the raw ceiling.

    python3 bench/run.py                      # every scenario, about 20 minutes on 2 cores
    python3 bench/run.py --records 200000 --sizes 100 --json out.json
    python3 bench/run.py --only kafka         # one scenario (see --skip and --only for their names)
    python3 bench/run.py --ab                 # this checkout against the last release, in the same run

Every peer runs in its own process on 127.0.0.1 (ephemeral ports): this script run with --role.  The
ceiling is raw pyzmq PUB/SUB between two processes sending the same two-frame messages with no protocol,
measured in the same run; every rate is also shown as a ratio to it, because shared machines are noisy.
The scenarios, the roles and the cluster helper are the dafkabench package beside this script
(bench/dafkabench/scenarios.py lists the scenarios).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

try:
    from dafkabench import roles
    from dafkabench.scenarios import ALONE, SCENARIOS, SIZE_PARTS, SKIPPABLE, Scenario
except ImportError as exc:  # (python -P or PYTHONSAFEPATH: the script's folder is not on sys.path)
    if exc.name != "dafkabench":
        raise
    sys.exit(f"bench/run.py: cannot import its package bench/dafkabench ({exc}); run it without -P and with "
             "PYTHONSAFEPATH unset, so that Python puts the script's folder on sys.path")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=300_000, help="records per throughput run")
    ap.add_argument("--catchup-records", type=int, default=1_000_000, help="records stored for catch-up")
    ap.add_argument("--sizes", default="100,1000", help="record sizes in bytes, comma-separated")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON (whatever happens to the run)")
    ap.add_argument("--skip", default="", type=_names(SKIPPABLE),
                    help="comma-separated scenarios to skip: " + ", ".join(SKIPPABLE) + " (store: every scenario "
                         "that needs a store; spark: the bulk scenario's Spark rows)")
    ap.add_argument("--only", choices=ALONE, help="run only this scenario (it measures its own ceiling)")
    ap.add_argument("--ab", nargs="?", const="v0.3.0", metavar="REV",
                    help="same-run A/B: this checkout against REV (default: the last release, v0.3.0; 'pure': "
                         "this checkout without its compiled twins) in alternation, the ratio of every figure "
                         "(bench/dafkabench/ab.py)")
    ap.add_argument("--ab-rounds", type=int, default=3, help="rounds of each side in an A/B run")
    ap.add_argument("--ab-scenarios", default="live,store,recovery",
                    help="scenarios of an A/B run, comma-separated: live, store, recovery")
    for scenario in SCENARIOS:
        scenario.options(ap)
    return ap


def _names(known: list[str]):
    """``--skip``'s type: a set of known names (a wrong one names itself)."""
    def parse(text: str) -> set[str]:
        names = set(filter(None, text.split(",")))
        unknown = sorted(names - set(known))
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown scenario {', '.join(unknown)} (known: {', '.join(known)})")
        return names
    return parse


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--role" in argv:  # a peer of a scenario
        return roles.main(argv)
    a = parser().parse_args(argv)
    a.skip = a.skip or set()
    if a.ab:
        from dafkabench.ab import run_ab

        results = run_ab(a.ab, a.ab_rounds, [int(s) for s in a.sizes.split(",")], a.records, a.ab_scenarios.split(","))
        _write(a, results)
        return 0
    if a.only:
        results: dict = {}
        try:
            next(s for s in SCENARIOS if s.name == a.only).run(a, results)
        finally:
            _write(a, results)
        return 0
    import zmq

    results = {"machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "pyzmq": zmq.__version__,
                           "libzmq": zmq.zmq_version()},
               "records": a.records, "runs": {}}
    try:
        run_everything(a, results)
    finally:  # what was measured is kept, whatever happened to the rest
        _write(a, results)
    return 0


def _write(a: argparse.Namespace, results: dict) -> None:
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=2))


def run_everything(a: argparse.Namespace, results: dict) -> None:
    from dafkabench.bm_store import store_available
    from dafkabench.report import print_table

    stored = "store" not in a.skip and store_available()
    for size in (int(s) for s in a.sizes.split(",")):
        results["runs"][size] = row = {}
        for part in SIZE_PARTS:
            if part.name not in a.skip and (stored or not part.stored):
                part.run(a, size, row)
        print_table(size, row)
    for scenario in SCENARIOS:
        if scenario.name not in a.skip and (stored or not scenario.stored):
            survive(scenario, a, results)


def survive(scenario: Scenario, a: argparse.Namespace, results: dict) -> None:
    """Run a scenario of the full run: one that fails says why (its ``error``), and the run goes on."""
    try:
        scenario.run(a, results)
    except Exception as exc:  # (a benchmark reports a failure, it does not end the run's other figures)
        print(f"\n== {scenario.name}: FAILED ({type(exc).__name__}: {exc}); the run goes on ==", flush=True)
        results.setdefault(scenario.name, {})["error"] = f"{type(exc).__name__}: {exc}"


if __name__ == "__main__":
    sys.exit(main())
