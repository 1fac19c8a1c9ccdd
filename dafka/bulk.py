"""Bulk answers between dafka-py peers (rfc/dafka.md section 12).

A requester (consumer, Spark task, store writer) that can read them
subscribes to ``R<own address>`` (DIRECT-RECORDS) and ``P<own address>``
(DIRECT-PARTITIONS) on every peer, as it does to ``D<own address>``.  The
answering peers (store readers, producers) see those subscriptions on their
XPUB and answer that requester's FETCHes with DIRECT-RECORDS, each carrying
up to :data:`MAX_BYTES` of records, and its GET-HEADS and CONSUMER-HELLO with
one DIRECT-PARTITIONS.  A reference peer never subscribes to either, so it
never receives one, and keeps getting RFC 46 DIRECT-RECORDs and DIRECT-HEADs.

This module holds what both sides share: the byte bound, the subscriptions
that announce the capability, the answering side's record of who announced
it, and the sizing of each message.
"""

from __future__ import annotations

from . import proto

MAX_BYTES = 256 * 1024  # record contents per DIRECT-RECORDS (a bigger record travels alone)
FIRST_COUNT = 256  # records in an answer's first message, before their size is known
MAX_COUNT = 65_536  # records per message at most, however small they are


def subscriptions(address: str, keys: bool = False) -> list[bytes]:
    """The SUB prefixes with which a requester announces that it reads bulk answers (with ``keys``, also
    DIRECT-KEYED-RECORDS, rfc section 18, which answering peers then send in place of DIRECT-RECORDS)."""
    prefixes = [proto.subscription(proto.DIRECT_RECORDS, address, exact=True),
                proto.subscription(proto.DIRECT_PARTITIONS, address, exact=True)]
    if keys:
        prefixes.append(proto.subscription(proto.DIRECT_KEYED_RECORDS, address, exact=True))
    return prefixes


def next_count(count: int, nbytes: int) -> int:
    """Records for the next message of an answer whose last message carried
    ``count`` records in ``nbytes`` of contents."""
    if nbytes <= 0:
        return MAX_COUNT
    return max(1, min(MAX_COUNT, MAX_BYTES * count // nbytes))


class Negotiated:
    """Requesters that announced bulk answers, from the (un)subscriptions an
    answering peer's XPUB sees."""

    def __init__(self) -> None:
        self.records: set[str] = set()  # subscribed R<requester>: DIRECT-RECORDS
        self.partitions: set[str] = set()  # subscribed P<requester>: DIRECT-PARTITIONS
        self.keyed: set[str] = set()  # subscribed V<requester>: DIRECT-KEYED-RECORDS in place of DIRECT-RECORDS
        self.gaps: set[str] = set()  # subscribed N<requester>: reads DIRECT-GAP (rfc 19)
        self.tails: set[str] = set()  # subscribed T<requester>: reads DIRECT-TAIL (a dafka-py peer, rfc 7.5)

    def on_subscription(self, sub: proto.Subscription) -> bool:
        """Take a subscription frame into account; True if it was about bulk answers."""
        if sub.msg_id == proto.DIRECT_RECORDS:
            which = self.records
        elif sub.msg_id == proto.DIRECT_PARTITIONS:
            which = self.partitions
        elif sub.msg_id == proto.DIRECT_KEYED_RECORDS:
            which = self.keyed
        elif sub.msg_id == proto.DIRECT_GAP:
            which = self.gaps
        elif sub.msg_id == proto.DIRECT_TAIL:
            which = self.tails
        else:
            return False
        if sub.topic:
            if sub.subscribe:
                which.add(sub.topic)
            else:
                which.discard(sub.topic)
        return True
