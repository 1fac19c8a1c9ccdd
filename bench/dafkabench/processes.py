"""Real subprocesses that none outlive their owner (a test, or a benchmark scenario), and polling until a
condition holds.  The tests share them (tests/helpers.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any, Callable


def wait_until(predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.01,
               what: str = "condition") -> Any:
    """Poll ``predicate`` until it returns a truthy value, and return it; TimeoutError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")


class Processes:
    """Start real subprocesses and make sure none outlives the test."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def start(self, args: list[str], **kwargs) -> subprocess.Popen:
        kwargs.setdefault("stdout", subprocess.PIPE)
        kwargs.setdefault("stderr", subprocess.PIPE)
        proc = subprocess.Popen(args, start_new_session=True, **kwargs)
        self.procs.append(proc)
        return proc

    def python(self, code: str, *args: str, **kwargs) -> subprocess.Popen:
        # -P: never put the current directory first on sys.path, where the
        # checkout's dafka/ folder would shadow the installed package.
        return self.start([sys.executable, "-P", "-c", code, *args], **kwargs)

    def cleanup(self) -> None:
        for proc in self.procs:
            # The whole session, whether or not its leader is still there: a process that ended (or timed out
            # in communicate()) may have left children of its own (a bench run's stores and producers).
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
            for stream in (proc.stdout, proc.stderr, proc.stdin):
                if stream is not None:
                    stream.close()
