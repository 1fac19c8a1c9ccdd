"""Shared fixtures: a tower on ephemeral loopback ports, cleanup of every
thread and process a test starts.  Helpers live in helpers.py."""

from __future__ import annotations

import logging
import threading
import time

import pytest
import zmq

from dafka.towerd.tower import Tower
from helpers import Processes, loopback_config

logging.getLogger("dafka").setLevel(logging.DEBUG)


@pytest.fixture
def tower():
    t = Tower(loopback_config()).start()
    yield t
    t.stop()


@pytest.fixture
def processes():
    p = Processes()
    yield p
    p.cleanup()


@pytest.fixture(autouse=True)
def no_leaked_threads():
    """Every thread a test starts must be gone when it ends."""
    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        leaked = [t for t in threading.enumerate() if t not in before and t.is_alive()
                  and t.name.startswith("dafka")]
        if not leaked:
            return
        time.sleep(0.05)
    pytest.fail(f"threads left running: {[t.name for t in leaked]}")


@pytest.fixture
def ctx():
    return zmq.Context.instance()
