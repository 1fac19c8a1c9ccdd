"""Upgrades: a database written by dafka-py 0.1.0 opens in this store.

``tests/data/store-0.1.0`` was written by 0.1.0's store (``make_store_fixture.py``
says how): 300 records over two partitions, with no format-version key.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import msgpack
import plyvel
import pytest

from helpers import loopback_config, wait_for
from dafka import Consumer
from dafka.store import Store, StoreError, keys

FIXTURE = Path(__file__).with_name("data") / "store-0.1.0"
TOPICS = {"fixture-a": 200, "fixture-b": 100}  # as make_store_fixture.py wrote them


def test_a_0_1_0_database_serves_every_record_and_gets_its_format_version(tower, tmp_path):
    db = tmp_path / "db"
    shutil.copytree(FIXTURE, db)
    config = loopback_config(tower, **{"consumer/offset/reset": "earliest"})
    with Store(config, db=str(db)) as store:
        assert {subject for subject, _ in store.heads()} == set(TOPICS)
        with Consumer(*TOPICS, config=config) as consumer:
            got: dict[str, list[bytes]] = {topic: [] for topic in TOPICS}

            def everything() -> bool:
                for record in consumer.consume(500, timeout=0.2):
                    got[record.topic].append(record.value)
                return all(len(got[t]) >= n for t, n in TOPICS.items())

            wait_for(everything, 30, what="every record of the 0.1.0 database")
    assert got == {t: [f"{t} {i}".encode() for i in range(n)] for t, n in TOPICS.items()}
    opened = plyvel.DB(str(db))
    try:
        assert msgpack.unpackb(opened.get(keys.FORMAT)) == keys.FORMAT_VERSION == 1
    finally:
        opened.close()


def test_a_database_of_a_newer_format_is_refused_by_name(tmp_path):
    db = tmp_path / "db"
    newer = plyvel.DB(str(db), create_if_missing=True)
    newer.put(keys.FORMAT, msgpack.packb(keys.FORMAT_VERSION + 1))
    newer.close()
    with pytest.raises(StoreError, match=r"format version 2; this dafka reads format 1 to 1: upgrade dafka"):
        Store(loopback_config(), db=str(db))
    # and the refusal closed it: it opens again
    plyvel.DB(str(db)).close()
