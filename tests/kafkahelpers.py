"""A dafka cluster with a Kafka gateway in front of it, for the tests of ``dafka kafka`` with real Kafka clients."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from helpers import Processes, script

SERVING = re.compile(rb"serving Kafka on ([0-9.]+):(\d+)")


def start_gateway(processes: Processes, tower, log: Path, *args: str,
                  timeout: float = 20.0) -> tuple[subprocess.Popen, str]:
    """``dafka kafka --port 0`` on ``tower``'s cluster, its stderr in ``log``; returns the process and its
    bootstrap address (what it says once it listens)."""
    before = log.stat().st_size if log.exists() else 0  # a restart appends: only what it says counts
    with open(log, "ab") as out:
        proc = processes.start([script("dafka"), "kafka", "--port", "0", "--pub", tower.pub_endpoint,
                                "--sub", tower.sub_endpoint, "-X", "beacon/address=127.0.0.1",
                                "-X", "beacon/bind_address=127.0.0.1", *args], stdout=out, stderr=out)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        found = SERVING.findall(log.read_bytes()[before:])
        if found:
            host, port = found[-1]
            return proc, f"{host.decode()}:{port.decode()}"
        time.sleep(0.05)
    proc.kill()
    pytest.fail(f"the gateway did not say where it serves: {log.read_text(errors='replace')}")


def kafka_groups(tower, *args: str) -> list[dict]:
    """What ``dafka status --groups --json`` says of the Kafka groups."""
    proc = subprocess.run([script("dafka"), "status", "--groups", "--json", "--wait-ms", "1000", "--pub",
                           tower.pub_endpoint, "--sub", tower.sub_endpoint, "-X", "beacon/address=127.0.0.1",
                           *args], capture_output=True, timeout=30)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    return json.loads(proc.stdout)["kafka_groups"]


def kcat(*args: str, data: bytes | None = None, timeout: float = 30.0) -> subprocess.CompletedProcess:
    return subprocess.run(["kcat", *args], input=data, capture_output=True, timeout=timeout)


def stores_path(tmp_path: Path, name: str = "store") -> str:
    return str(tmp_path / name)


def run_client(code: str, cwd: Path, *args: str, timeout: float = 90.0) -> Any:
    """Run a Kafka client's script in its own Python, from ``cwd`` (the checkout's top-level ``kafka/``
    folder would shadow kafka-python's ``kafka`` package from the checkout), and return what it printed
    last, as JSON."""
    proc = subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, capture_output=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-4000:]
    return json.loads(proc.stdout.decode().strip().splitlines()[-1])


def exactly(sock: socket.socket, n: int) -> bytes:
    """``n`` bytes from a socket (an AssertionError if the gateway closes it first)."""
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, "the gateway closed the connection"
        data += chunk
    return data
