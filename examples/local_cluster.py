"""A throwaway cluster for the examples: a tower and a store in this process,
on 127.0.0.1 with ports the kernel picks, the store's database in a temporary
directory.  In production each runs as its own daemon (``dafka_towerd``,
``dafka_stored``) and the examples would only take the tower's addresses."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from dafka.config import Config
from dafka.store import Store
from dafka.towerd.tower import Tower

LOOPBACK = {"beacon/address": "127.0.0.1", "tower/sub_address": "tcp://127.0.0.1:*",
            "tower/pub_address": "tcp://127.0.0.1:*"}


@contextmanager
def local_cluster(stores: int = 1, **settings: Any) -> Iterator[dict[str, Any]]:
    """Yield the peers' config (a dict of keys): a running tower and ``stores``
    stores, all with ``settings`` (config keys) too."""
    tower = Tower(Config.load(overrides=dict(LOOPBACK, **settings))).start()
    config = dict(LOOPBACK, **{"beacon/sub_address": tower.sub_endpoint, "beacon/pub_address": tower.pub_endpoint},
                  **settings)
    with tempfile.TemporaryDirectory(prefix="dafka-example-") as tmp:
        running = [Store(config, db=f"{tmp}/store{i}").start() for i in range(stores)]
        try:
            yield config
        finally:
            for store in running:
                store.stop()
            tower.stop()
