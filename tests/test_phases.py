"""tests/phases.py, CI's runner of the two phases: a phase that hangs is killed with all it started."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import phases  # noqa: E402

HANGING = """
import subprocess, sys, time
def test_hangs(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    open({pid_file!r}, "w").write(str(child.pid))
    time.sleep(600)
"""


def test_a_hung_phase_is_killed_with_its_children_and_fails(tmp_path):
    pid_file = tmp_path / "child.pid"
    (tmp_path / "test_hang.py").write_text(HANGING.format(pid_file=str(pid_file)))
    start = time.monotonic()
    code = phases.run_phase([str(tmp_path / "test_hang.py"), "-p", "no:cacheprovider", "-p", "no:timeout",
                             "--rootdir", str(tmp_path)], timeout=8)
    assert code == 1 and time.monotonic() - start < 30
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the phase's grandchild {child} outlived the kill")


def test_a_phase_that_passes_returns_its_code(tmp_path):
    (tmp_path / "test_ok.py").write_text("def test_ok():\n    assert True\n")
    assert phases.run_phase([str(tmp_path / "test_ok.py"), "-p", "no:cacheprovider", "--rootdir", str(tmp_path)],
                            timeout=60) == 0
