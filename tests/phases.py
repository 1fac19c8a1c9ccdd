"""Run the suite's two phases (tests/conftest.py, --phase) one after the other, the serial one even when the
parallel one failed, so that one run of CI reports every failure; exit with a failure if either failed.

Usage (tox): python tests/phases.py [pytest arguments]
"""

from __future__ import annotations

import subprocess
import sys

NO_TESTS = 5  # pytest's exit code when a selection (-k, -m) leaves a phase nothing to run


def main(args: list[str]) -> int:
    codes = [subprocess.call([sys.executable, "-m", "pytest", *phase, *args])
             for phase in (["-n", "4", "--dist", "loadgroup", "--phase", "parallel"], ["--phase", "serial"])]
    failed = [code for code in codes if code not in (0, NO_TESTS)]
    if failed:
        return failed[0]
    return NO_TESTS if all(code == NO_TESTS for code in codes) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
