"""Run the suite's two phases (tests/conftest.py, --phase) one after the other, the serial one even when the
parallel one failed, so that one run of CI reports every failure; exit with a failure if either failed.

A phase that outlives PHASE_TIMEOUT is killed with everything it started and counts as failed: pytest-timeout
ends a hung test, but not an xdist controller left waiting on a worker that libzmq aborted (seen once: every
worker idle, the run waiting until CI's own limit).

Usage (tox): python tests/phases.py [pytest arguments]
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

NO_TESTS = 5  # pytest's exit code when a selection (-k, -m) leaves a phase nothing to run
PHASE_TIMEOUT = 25 * 60  # seconds; the parallel phase takes about 9 minutes on 2 cores, the serial one 12
PHASES = (["-n", "4", "--dist", "loadgroup", "--phase", "parallel"], ["--phase", "serial"])


def run_phase(args: list[str], timeout: float = PHASE_TIMEOUT) -> int:
    """Run one pytest phase in a process group of its own; kill the group if it outlives ``timeout``."""
    process = subprocess.Popen([sys.executable, "-m", "pytest", *args], start_new_session=True)
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        print(f"phases: pytest {' '.join(args)} still running after {timeout:.0f} s: killed", file=sys.stderr,
              flush=True)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        return 1


def main(args: list[str]) -> int:
    codes = [run_phase([*phase, *args]) for phase in PHASES]
    failed = [code for code in codes if code not in (0, NO_TESTS)]
    if failed:
        return failed[0]
    return NO_TESTS if all(code == NO_TESTS for code in codes) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
