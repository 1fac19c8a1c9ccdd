"""Provenance records: which partitions of a site are copies, and of what (rfc/mirror.md).

Every mirror writes one partition of its target site's ``__dafka_mirror``
topic, under an address derived from its name, so that a restart continues
it.  One record per partition the mirror takes over, acked before the first
record it copies there::

    {"v": 1, "topic": "orders", "partition": "<address>", "source": "site-a", "mirror": "a-to-b"}

A site's provenance topic is never mirrored: it describes that site alone.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass

from dafka.config import ConfigLike, as_config
from dafka.core.addresses import partition_address

from .state import PROVENANCE_TOPIC

VERSION = 1

__all__ = ["PROVENANCE_TOPIC", "Provenance", "MalformedProvenance", "mirror_address", "read_site"]

log = logging.getLogger(__name__)


class MalformedProvenance(ValueError):
    """A provenance record that does not parse (dropped and counted)."""


@dataclass(frozen=True)
class Provenance:
    topic: str
    partition: str
    source: str  # the site the records come from
    mirror: str  # the mirror's name

    def encode(self) -> bytes:
        return json.dumps({"v": VERSION, "topic": self.topic, "partition": self.partition, "source": self.source,
                           "mirror": self.mirror}, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, value: bytes) -> "Provenance":
        try:
            doc = json.loads(value)
        except (ValueError, UnicodeDecodeError) as exc:
            raise MalformedProvenance(f"not JSON: {exc}") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("v"), int) or doc["v"] < 1:
            raise MalformedProvenance("not a provenance record (no version)")
        fields = {name: doc.get(name) for name in ("topic", "partition", "source", "mirror")}
        bad = [name for name, v in fields.items() if not isinstance(v, str) or not v]
        if bad:
            raise MalformedProvenance(f"missing or empty: {', '.join(bad)}")
        return cls(**fields)  # (a newer version's extra fields are ignored)


def mirror_address(name: str) -> str:
    """The address of mirror ``name``'s partition of the provenance topic."""
    return partition_address(f"dafka-mirror:{name}")


def read_site(config: ConfigLike, seconds: float) -> dict[tuple[str, str], Provenance]:
    """(topic, partition) -> provenance of every partition a mirror copied
    into the site of ``config``, as its stores give them within ``seconds``."""
    from dafka.consumer.consumer import Consumer

    config = as_config(config).with_overrides({"consumer/offset/reset": "earliest"}, source="provenance")
    out: dict[tuple[str, str], Provenance] = {}
    deadline = time.monotonic() + seconds
    with Consumer(PROVENANCE_TOPIC, config=config) as reader:
        while (left := deadline - time.monotonic()) > 0:
            for record in reader.consume(1000, timeout=min(left, 0.1)):
                try:
                    provenance = Provenance.decode(record.value)
                except MalformedProvenance as exc:
                    log.warning("a malformed provenance record at %s/%d: %s", record.partition, record.offset, exc)
                    continue
                out[(provenance.topic, provenance.partition)] = provenance
    return out
