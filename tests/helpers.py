"""Helpers shared by the tests (imported as ``from helpers import ...``; fixtures live in conftest.py)."""

from __future__ import annotations

import importlib.util
import os
import random
import shutil
import socket
import sys
import time

import pytest
from dafkabench.processes import Processes, wait_until  # noqa: F401 - Processes: the tests take it from here

from dafka.config import Config
from dafka.towerd.tower import Tower


def loopback_config(tower: Tower | None = None, **overrides: object) -> Config:
    """A config that keeps every socket on 127.0.0.1 (never a fixed port)."""
    values: dict[str, object] = {
        "tower/sub_address": "tcp://127.0.0.1:*",
        "tower/pub_address": "tcp://127.0.0.1:*",
        "beacon/address": "127.0.0.1",
        "beacon/bind_address": "127.0.0.1",
    }
    if tower is not None:
        values["beacon/sub_address"] = tower.sub_endpoint
        values["beacon/pub_address"] = tower.pub_endpoint
    values.update({k.replace("__", "/"): v for k, v in overrides.items()})
    return Config.load(overrides=values)


def _ports_below_the_ephemeral_range() -> range:
    """This worker's slice of the ports below the kernel's ephemeral range.

    A number the kernel hands out for port 0 lies in the ephemeral range,
    where any outgoing connection of the parallel suite may take it as its
    local port between our pick and the server's bind (CI saw MariaDB abort
    on "Address already in use").  Below that range only a listener binds,
    and each xdist worker draws from its own slice."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    ports = range(max(1024, low - 12_000), low)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1))
    size = len(ports) // max(workers, index + 1)
    return ports[index * size:(index + 1) * size]


_PORTS = _ports_below_the_ephemeral_range()
_next_port = random.randrange(len(_PORTS))


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody holds right now, below the ephemeral
    range so that no outgoing connection takes it before the server binds it;
    successive calls return different numbers."""
    global _next_port
    for _ in range(len(_PORTS)):
        port = _PORTS[_next_port % len(_PORTS)]
        _next_port += 1
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {_PORTS}")


def curve_settings(keys: dict[str, str], peer: str, cluster: str = "cluster", **extra: object) -> dict[str, object]:
    """The ``security/*`` keys of ``peer`` (paths from the ``keys`` fixture)."""
    return {"security/curve": 1, "security/cluster_key": keys[cluster], "security/peer_key": keys[peer],
            "security/authorized_keys": keys["authorized"], **extra}


def secure_config(tower: Tower, keys: dict[str, str], peer: str, cluster: str = "cluster", **extra: object) -> Config:
    """A loopback config for ``peer`` with CURVE on, for the ``secure_tower`` fixture."""
    values = curve_settings(keys, peer, cluster, **extra)
    return loopback_config(tower, **{k.replace("/", "__"): v for k, v in values.items()})


def script(name: str) -> str:
    """The installed console script (next to this interpreter first, e.g. in a venv)."""
    path = shutil.which(name, path=os.path.dirname(sys.executable)) or shutil.which(name)
    if path is None:
        pytest.fail(f"console script {name} is not installed: run `pip install .`")
    return path


def require_pyspark() -> None:
    """Called first thing by every Spark test module: without PySpark (``pip
    install ".[test]"`` alone) the module is reported as skipped, saying why.
    Under tox, which installs the spark extra and sets DAFKA_REQUIRE_SPARK=1,
    a missing PySpark is an error instead: the Spark tests are never skipped there."""
    missing = [name for name in ("pyspark", "pyarrow") if importlib.util.find_spec(name) is None]
    if not missing:
        return
    if os.environ.get("DAFKA_REQUIRE_SPARK") == "1":
        raise ImportError(f"{' and '.join(missing)} not installed, and DAFKA_REQUIRE_SPARK=1 asks for every Spark test")
    pytest.skip(f"the Spark tests need {' and '.join(missing)}: pip install '.[test,spark]'", allow_module_level=True)


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.01, what: str = "condition"):
    """Poll ``predicate`` until it returns a truthy value or fail the test."""
    try:
        return wait_until(predicate, timeout, interval, what)
    except TimeoutError as exc:
        pytest.fail(str(exc))


def take(consumer, n: int, timeout: float = 30) -> list:
    """Up to ``n`` records from ``consumer`` (fewer if they do not come within ``timeout`` seconds)."""
    got: list = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        got.extend(consumer.consume(10_000, 0.05))
    return got
