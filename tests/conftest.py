"""Shared fixtures: a tower on ephemeral loopback ports, cleanup of every
thread and process a test starts.  Helpers live in helpers.py."""

from __future__ import annotations

import logging
import shutil
import threading
import time

import pytest
import zmq
from hypothesis import HealthCheck, settings

from dafka.core.security import generate_keys
from dafka.towerd.tower import Tower
from helpers import Processes, curve_settings, loopback_config

logging.getLogger("dafka").setLevel(logging.DEBUG)

# Property tests run beside others in 4 workers on 2 cores: a draw that takes a second says the machine was
# busy, not that a strategy is slow (CI once failed test_decode_damaged_store_member on it). Every test's
# own settings() still apply on top of this profile.
settings.register_profile("dafka", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("dafka")

# Tests that start first in a parallel run (pytest-xdist hands tests out in collection order): the longest,
# so that none of them is left to run alone at the end.
_LONGEST_FIRST = ("soak", "slow", "nemesis", "cdc", "mirror", "faults")


def pytest_addoption(parser):
    parser.addoption(
        "--phase", choices=("parallel", "serial"),
        help="run only the tests of one phase: 'serial' ones (marker serial: timing-sensitive, or measuring a "
             "whole machine) run alone after the 'parallel' ones, which tox runs with pytest-xdist. "
             "Without it, every test runs.")


def _is_serial(item) -> bool:
    """Marked serial, or a Spark test.  Every query Spark plans from a Python data source starts a Python
    worker that must connect back to the JVM within Spark's fixed 10 s (PythonWorkerFactory.createSimpleWorker,
    pyspark 4.x, not configurable).  Beside three busy xdist workers on two cores it did not, even with one Spark
    JVM at a time (CI, 2026-11-28: "Python worker failed to connect back", test_cdc.py's streaming query).  Alone,
    the worker connects in under a second.  The soak runs its own Spark query beside its own load on purpose,
    and restarts it when the worker misses the 10 s (soak.py)."""
    return item.get_closest_marker("serial") is not None or item.get_closest_marker("spark") is not None


@pytest.hookimpl(tryfirst=True)  # the phase deselects before pytest-xdist hands tests out
def pytest_collection_modifyitems(config, items):
    phase = config.getoption("--phase")
    if phase is not None:
        keep = [item for item in items if _is_serial(item) == (phase == "serial")]
        config.hook.pytest_deselected(items=[item for item in items if item not in keep])
        items[:] = keep
    if phase == "parallel":
        rank = {name: n for n, name in enumerate(_LONGEST_FIRST)}
        items.sort(key=lambda item: min((rank[m.name] for m in item.iter_markers() if m.name in rank),
                                        default=len(rank)))


def pytest_sessionfinish(session, exitstatus):
    # A phase may hold none of the tests that -k or -m chose: that is not a failure of the run.
    if session.config.getoption("--phase") is not None and exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
        session.exitstatus = pytest.ExitCode.OK


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


@pytest.fixture
def keys(tmp_path):
    """A cluster key, three authorized peers, and mallory, who is not authorized."""
    authorized = tmp_path / "authorized"
    authorized.mkdir()
    private = tmp_path / "private"
    _, cluster = generate_keys(str(private), "cluster")
    paths = {"cluster": cluster, "authorized": str(authorized)}
    for name in ("tower", "alice", "bob"):
        public, paths[name] = generate_keys(str(private), name)
        shutil.copy(public, authorized)
    _, paths["mallory"] = generate_keys(str(tmp_path / "mallory"), "mallory")
    _, paths["fake_cluster"] = generate_keys(str(tmp_path / "mallory"), "fake_cluster")
    return paths


@pytest.fixture
def secure_tower(keys):
    """A tower with CURVE on, its key among ``keys``' authorized ones."""
    t = Tower(loopback_config(**{k.replace("/", "__"): v for k, v in curve_settings(keys, "tower").items()})).start()
    yield t
    t.stop()


@pytest.fixture(scope="session")
def pg():
    """One private PostgreSQL server (tests/pgserver.py) for every CDC test."""
    from pgserver import PostgresServer

    server = PostgresServer()
    yield server
    server.close()


@pytest.fixture
def db(pg, request):
    name = "t_" + request.node.name[5:40].lower().replace("[", "_").replace("]", "_").replace("-", "_")
    pg.sql(f"DROP DATABASE IF EXISTS {name}")
    pg.sql(f"CREATE DATABASE {name}")
    from cdchelpers import TABLES

    pg.sql(TABLES, dbname=name)
    yield name
    # A slot stays active until its walsender has seen its client go, which comes after the client closed
    # (CI: "replication slot dafka_busy is active for PID 1952"): wait for it, as long as 10 s.
    deadline = time.monotonic() + 10
    while pg.sql("SELECT 1 FROM pg_replication_slots WHERE database = %s AND active", params=(name,)) and \
            time.monotonic() < deadline:
        time.sleep(0.05)
    for (slot,) in pg.sql("SELECT slot_name FROM pg_replication_slots WHERE database = %s", params=(name,)):
        pg.sql("SELECT pg_drop_replication_slot(%s)", params=(slot,))
    pg.sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
def store(tower, tmp_path):
    """A store of ``tower`` with its database in tmp_path."""
    from dafka.store import Store

    s = Store(loopback_config(tower), db=str(tmp_path / "store")).start()
    yield s
    s.stop()


@pytest.fixture
def kafka_cluster(tower, store):
    """A tower and one store on it, for the Kafka gateway's tests."""
    return tower, store
