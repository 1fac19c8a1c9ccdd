"""Offsets topics keep what resuming needs, and nothing more (rfc section 14.6).

A consumer group's members write their commits to ``__dafka_offsets.<group>``,
each as a producer of its own partition (one per member run).  Since 0.2 every
such record is a *snapshot*: the member's whole view of the group's committed
offsets, marked as such (:func:`dafka.groups.state.is_snapshot`).  Commits only go
up and readers keep the highest offset of each key, so:

* in a partition whose newest record is a snapshot, every older record is
  superseded: :func:`plan` deletes them (the partition's head stays, as with
  retention, and a reader asking for them gets a DIRECT-TAIL);
* a partition whose producer has not been heard for ``store/offsets/retention_ms``
  (7 days, like Kafka's ``offsets.retention.minutes``) and whose newest record
  is that old is deleted whole, unless it is its topic's newest partition:
  that one was written later by a member that read the others, so it holds
  their commits too.  It must be newer by :data:`SETTLE_MS` at least (half
  the retention if that is shorter), so a commit still travelling to that
  member when it wrote cannot be lost.

The size of an offsets topic is then one record per live member run, plus
the members of the last ``retention_ms``, whatever the number of commits.
Records of members older than 0.2 (not snapshots) are never compacted.
"""

from __future__ import annotations

from typing import Iterable

from dafka.protocol.commits import OFFSETS_TOPIC, is_snapshot

from . import keys, retention
from .writer_state import Partition

SETTLE_MS = 60_000


def is_offsets(p: Partition) -> bool:
    return p.subject.startswith(OFFSETS_TOPIC)


def head_stamp_ms(db, p: Partition) -> int:
    """When the partition's newest stamped record arrived (0: no stamp)."""
    last = 0
    for key, value in db.iterator(start=p.stamp_prefix, stop=keys.prefix_end(p.stamp_prefix), reverse=True):
        try:
            last = keys.decode_stamp(key, value).unix_ms
        except ValueError:
            continue
        break
    return last


def plan(db, partitions: Iterable[Partition], now_ms: int, budget: int = retention.DEFAULT_BUDGET) -> list[retention.Cut]:
    """Delete what the head snapshot of each offsets partition written since its last pass supersedes."""
    cuts = []
    for p in partitions:
        if budget <= 0:
            break
        if p.written <= p.compacted or not is_offsets(p):
            continue
        head = db.get(p.key_prefix + keys.seq_bytes(p.written))
        if head is None or not is_snapshot(head):
            p.compacted = p.written
            continue
        cut = retention.plan_partition(db, p, now_ms, 0, -1, budget)  # every stamped record before the head
        if cut is not None:
            cuts.append(cut)
            budget -= cut.deleted
        if cut is None or cut.new_tail >= p.written:
            p.compacted = p.written
    return cuts


def expired(db, partitions: Iterable[Partition], now_ms: int, retention_ms: int, now: float) -> list[Partition]:
    """The offsets partitions to delete whole: their newest record older than ``retention_ms`` at wall
    clock ``now_ms``, no HEAD from their producer within it (``now``: the monotonic clock of
    ``Partition.heard``), and not the newest (by SETTLE_MS) of their topic."""
    if retention_ms < 0:
        return []
    by_topic: dict[str, list[tuple[int, Partition]]] = {}
    for p in partitions:
        if is_offsets(p) and p.written >= 0:
            by_topic.setdefault(p.subject, []).append((head_stamp_ms(db, p), p))
    settle = min(SETTLE_MS, retention_ms // 2)
    out = []
    for members in by_topic.values():
        newest = max(stamp for stamp, _ in members)
        for stamp, p in members:
            if (stamp < now_ms - retention_ms and stamp <= newest - settle
                    and now - p.heard > retention_ms / 1000):
                out.append(p)
    return out


def partition_keys(db, p: Partition) -> list[bytes]:
    """Every key of the partition: records, their keys and attributes, stamps and its head."""
    found = [key for prefix in (p.key_prefix, p.record_keys_prefix, p.record_attributes_prefix, p.stamp_prefix)
             for key in db.iterator(start=prefix, stop=keys.prefix_end(prefix), include_value=False)]
    found.append(p.head_key)
    return found
