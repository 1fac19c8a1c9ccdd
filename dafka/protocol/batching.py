"""Live records in batches between dafka-py peers (rfc/dafka.md section 13).

A producer publishes every record as a RECORD, one message each: on either
side that costs a Python step and a libzmq message per record, the cost of
the live path.  dafka-py consumers and store writers therefore also subscribe
to RECORDS (``S<topic>`` NUL, ``S``), messages that carry many consecutive
records of a producer.  A dafka-py producer sees every subscription on its
XPUB and knows who needs what (:class:`Audience`): it sends RECORDS as long as
somebody subscribed to them, and RECORDs as long as somebody subscribed to
RECORDs without subscribing to RECORDS as well (a reference consumer or
store, a dafka-py peer with batching turned off, an observer).  A reference
peer never subscribes ``S``, so it never receives RECORDS, and keeps getting
every record as a RECORD.

Batches add no latency when records come one at a time: a record is sent at
once unless the previous one was published less than :data:`BURST_GAP`
seconds before (a burst).  In a burst, records wait in the batch until it
holds :data:`MAX_RECORDS` records or :data:`MAX_BYTES` bytes, or until the
burst pauses: the producer's loop sends what waits :data:`LINGER` seconds
after the first record that waited.

Since 0.3, records may have keys (rfc section 18).  dafka-py consumers and store
writers then subscribe to KEYED-RECORDS (``Q<topic>`` NUL, ``Q``) in place of
RECORDS: the same batches with two more frames, the keys.  A producer sends
each batch as KEYED-RECORDS while somebody subscribed ``Q``, as RECORDS while
somebody subscribed ``S`` (a dafka-py 0.2 peer, which gets the values without
their keys), and as RECORDs while a prefix is subscribed more often with ``M``
than with ``S`` and ``Q`` together: each peer gets each record once.
"""

from __future__ import annotations

from collections import Counter

from .. import protocol as proto
from .bulk import SETTLE

MAX_RECORDS = 1024  # records per RECORDS at most...
MAX_BYTES = 256 * 1024  # ...and bytes of contents (a bigger record travels alone)
BURST_GAP = 20e-6  # a record published sooner than this after the previous one is part of a burst
LINGER = 0.001  # seconds a record of a burst may wait for more to join it
# A burst already in hand (Producer.send_many: a mirror, a CDC connector) goes out in RECORDS as big as
# the stores' bulk answers: fewer messages for every peer that reads them.
BURST_RECORDS = 65_536
BURST_BYTES = 256 * 1024
# A dafka-py consumer's M<topic> reaches a producer before its Q<topic> (dafka.protocol.bulk.SETTLE): in between it
# would look like a reference peer and get RECORDs, without keys, ahead of the batches.  So a prefix needs
# RECORDs once it has been alone for SETTLE; a reference peer that subscribes misses at most what was
# published meanwhile, which the HEAD that a producer sends to a new subscriber has it FETCH.


LIVE_BATCHES = proto.KEYED_RECORDS  # the batches a dafka-py consumer or store writer subscribes to


def consumer_subscriptions(topic: str) -> list[bytes]:
    """What a dafka-py consumer adds to its ``M<topic>`` NUL to read batches (with their keys)."""
    return [proto.subscription(LIVE_BATCHES, topic, exact=True)]


WRITER_SUBSCRIPTION = proto.subscription(LIVE_BATCHES)  # a store writer's: every topic, as with ``M``


class Audience:
    """Who, among the subscribers of a producer's data socket, reads its
    records as RECORDs and who as RECORDS, from the (un)subscriptions the
    socket sees (with ``XPUB_VERBOSER``, every one of them, a closed pipe's
    included).

    Subscriptions are counted per prefix, not per subscriber: a dafka-py
    consumer subscribes both ``M<topic>`` NUL and ``Q<topic>`` NUL (0.2:
    ``S<topic>`` NUL), so somebody needs RECORDs when a prefix that matches
    them is subscribed more often than the same prefix with ``S`` and ``Q``
    together, or when somebody subscribed to everything (an observer)."""

    def __init__(self, topic: str, address: str) -> None:
        self._ours = tuple(proto.record_prefix(msg_id, topic, address, topic)
                           for msg_id in (proto.RECORD, proto.RECORDS, proto.KEYED_RECORDS))
        self._counts: Counter[bytes] = Counter()
        self._since: dict[bytes, float] = {}  # a prefix that needs RECORDs -> since when (see SETTLE)
        self.records = False  # somebody needs RECORDs...
        self.records_after = 0.0  # ...from this time on (clock of on_subscription)
        self.batches = False  # somebody reads batches, of either kind
        self.plain = False  # somebody reads RECORDS (a dafka-py 0.2 peer)
        self.keyed = False  # somebody reads KEYED-RECORDS

    def on_subscription(self, sub: proto.Subscription, now: float = 0.0) -> bool:
        """Count one (un)subscription at ``now``; True if it was about our records."""
        raw = proto.subscription_prefix(sub)
        if sub.msg_id and not any(ours.startswith(raw) for ours in self._ours):
            return False
        self._counts[raw] += 1 if sub.subscribe else -1
        if self._counts[raw] <= 0:
            del self._counts[raw]
        counts = self._counts
        self.plain = any(p[:1] == proto.RECORDS for p in counts)
        self.keyed = any(p[:1] == proto.KEYED_RECORDS for p in counts)
        self.batches = self.plain or self.keyed
        wanting = [p for p in counts if p == b"" or (
            p[:1] == proto.RECORD
            and counts[p] > counts.get(proto.RECORDS + p[1:], 0) + counts.get(proto.KEYED_RECORDS + p[1:], 0))]
        self._since = {p: self._since.get(p, now) for p in wanting}
        self.records = bool(wanting)
        self.records_after = min(self._since.values(), default=now) + SETTLE if wanting else 0.0
        return True
