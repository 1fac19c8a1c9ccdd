"""The tests' private PostgreSQL server (bench/dafkabench/postgres.py, which the benchmark shares), on a port
of this worker's slice.  Without PostgreSQL the tests skip, except where ``DAFKA_REQUIRE_POSTGRES=1`` (tox
sets it; .ci/run installs Debian's ``postgresql-15``): there they fail.
"""

from __future__ import annotations

import os

import pytest
from dafkabench import postgres

from helpers import free_port


def require_postgres() -> None:
    reason = postgres.missing()
    if reason is not None:
        if os.environ.get("DAFKA_REQUIRE_POSTGRES") == "1":
            pytest.fail(reason)
        pytest.skip(reason)


class PostgresServer(postgres.PostgresServer):
    def __init__(self, wal_level: str = "logical") -> None:
        require_postgres()
        super().__init__(free_port(), wal_level)
