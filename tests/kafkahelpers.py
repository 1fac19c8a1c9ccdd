"""A dafka cluster with a Kafka gateway in front of it, for the tests of ``dafka kafka`` with real Kafka clients."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

from helpers import Processes, script

SERVING = re.compile(rb"serving Kafka on ([0-9.]+):(\d+)")


def start_gateway(processes: Processes, tower, log: Path, *args: str,
                  timeout: float = 20.0) -> tuple[subprocess.Popen, str]:
    """``dafka kafka --port 0`` on ``tower``'s cluster, its stderr in ``log``; returns the process and its
    bootstrap address (what it says once it listens)."""
    with open(log, "ab") as out:
        proc = processes.start([script("dafka"), "kafka", "--port", "0", "--pub", tower.pub_endpoint,
                                "--sub", tower.sub_endpoint, "-X", "beacon/address=127.0.0.1",
                                "-X", "beacon/bind_address=127.0.0.1", *args], stdout=out, stderr=out)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        found = SERVING.findall(log.read_bytes())
        if found:
            host, port = found[-1]
            return proc, f"{host.decode()}:{port.decode()}"
        time.sleep(0.05)
    proc.kill()
    pytest.fail(f"the gateway did not say where it serves: {log.read_text(errors='replace')}")


def kcat(*args: str, data: bytes | None = None, timeout: float = 30.0) -> subprocess.CompletedProcess:
    return subprocess.run(["kcat", *args], input=data, capture_output=True, timeout=timeout)


def stores_path(tmp_path: Path, name: str = "store") -> str:
    return str(tmp_path / name)
