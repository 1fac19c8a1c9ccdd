"""CurveZMQ on every socket: traffic encrypted, and only peers whose public
key is authorized can beacon, read or publish.  A peer with an unknown key
gets nothing.

    python examples/curve.py

In production, ``dafka keygen DIR --name NAME`` makes the key pairs and each
daemon takes the four ``security/*`` keys (README, Operations: Security).
"""

from __future__ import annotations

import os
import shutil
import tempfile

from local_cluster import local_cluster

from dafka import Consumer, Producer
from dafka.core.security import generate_keys


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="dafka-keys-") as keys:
        authorized = os.path.join(keys, "authorized")
        os.makedirs(authorized)
        for name in ("cluster", "ops", "alice", "bob", "mallory"):
            public, _ = generate_keys(keys, name)
            if name != "mallory":  # mallory has a key pair, but nobody authorized it
                shutil.copy(public, authorized)

        def identity(name: str) -> dict[str, object]:
            return {"security/curve": 1, "security/cluster_key": os.path.join(keys, "cluster.key_secret"),
                    "security/peer_key": os.path.join(keys, f"{name}.key_secret"),
                    "security/authorized_keys": authorized}

        with local_cluster(**identity("ops")) as ops:  # the tower and the store
            def as_peer(name: str, **extra: object) -> dict[str, object]:
                return dict(ops, **identity(name), **extra)

            with Producer("secrets", as_peer("alice")) as producer:
                producer.send(b"the launch code is 0000")
                producer.flush(timeout=10)
            with Consumer("secrets", config=as_peer("bob", **{"consumer/offset/reset": "earliest"})) as bob:
                records = bob.consume(10, timeout=10.0)
                print("bob reads:", [record.value for record in records])
                assert [record.value for record in records] == [b"the launch code is 0000"]
            with Consumer("secrets", config=as_peer("mallory", **{"consumer/offset/reset": "earliest"})) as mallory:
                records = mallory.consume(10, timeout=2.0)
                print("mallory reads:", records)
                assert records == []


if __name__ == "__main__":
    main()
