"""Write the upgrade fixture: a store database made by an older dafka-py.

``tests/data/store-0.1.0/`` was written by dafka-py 0.1.0 (commit 518418b, the
last before bulk answers) with this script::

    git worktree add /tmp/v010 518418b
    pip install --no-deps --target /tmp/v010pkg /tmp/v010
    PYTHONPATH=/tmp/v010pkg python tests/data/make_store_fixture.py tests/data/store-0.1.0

It runs a tower, a store and two producers (topics ``fixture-a`` and
``fixture-b``) on loopback and stores 300 records: record ``i`` of a topic is
``b"<topic> <i>"``.  ``test_upgrade.py`` opens a copy in today's store and reads
every record back.  The script uses only the API both versions share.
"""

from __future__ import annotations

import sys
import time

from dafka import Producer
from dafka.config import Config
from dafka.store.store import Store
from dafka.towerd.tower import Tower

TOPICS = {"fixture-a": 200, "fixture-b": 100}


def main(path: str) -> None:
    loopback = {"tower/sub_address": "tcp://127.0.0.1:*", "tower/pub_address": "tcp://127.0.0.1:*",
                "beacon/address": "127.0.0.1", "beacon/bind_address": "127.0.0.1"}
    tower = Tower(Config.load(overrides=loopback)).start()
    config = Config.load(overrides=dict(loopback, **{"beacon/sub_address": tower.sub_endpoint,
                                                     "beacon/pub_address": tower.pub_endpoint}))
    store = Store(config, db=path).start()
    try:
        for topic, count in TOPICS.items():
            with Producer(topic, config) as producer:
                time.sleep(1.0)  # the store connects
                for i in range(count):
                    producer.send(f"{topic} {i}".encode())
                producer.flush(timeout=30)
    finally:
        store.stop()
        tower.stop()


if __name__ == "__main__":
    main(sys.argv[1])
