"""Retention: which of the oldest records of each partition to delete.

The reference store keeps everything forever; Kafka users expect
``retention.ms`` and ``retention.bytes``.  With ``store/retention/ms`` and
``store/retention/bytes`` (``-1`` = keep forever; bytes count record contents
per partition) the writer calls :func:`plan` about once a second and writes
the result in one WriteBatch.

* Age comes from the stamps (see :mod:`dafka.store.keys`): every record up to
  the last sequence of a stamp older than ``retention/ms`` is deleted,
  including records older than any stamp (written by a reference store).
* Size comes from the partition's ``total_bytes`` (the sum of its stamps):
  the oldest records are deleted until what stays is at most
  ``retention/bytes``.  Records without a stamp (written by a reference store)
  are not counted, but being the oldest they go first.
* The newest record of a partition (its head) is never deleted, so a
  partition never becomes empty and its oldest kept sequence (the first
  record key, which the reader sends as DIRECT-TAIL) is always defined.
* At most ``budget`` records are deleted per call so a large backlog never
  stalls the writer; the rest goes on the next call.
* A deleted key stays in LevelDB as a tombstone until a compaction reaches
  it, and an iterator that starts below a run of tombstones steps over each
  (about 1 s per million).  Every record below a cut's new tail is deleted
  and nothing is written below a partition's head again, so the partition's
  ``floor`` (shared with the reader, :class:`dafka.store.database.SharedDB`)
  is where every later seek starts.

The stamp that straddles the new oldest record is rewritten under the new
first sequence with its remaining size, so stamps keep describing exactly the
records that exist.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from . import keys
from .writer_state import Partition

DEFAULT_BUDGET = 100_000


@dataclass
class Cut:
    """The deletion planned for one partition."""

    partition: Partition
    new_tail: int  # oldest sequence kept afterwards
    deleted: int  # records deleted
    freed: int  # bytes freed among records covered by stamps
    deletes: list[bytes] = field(default_factory=list)
    puts: list[tuple[bytes, bytes]] = field(default_factory=list)


KEPT_TOPICS = frozenset({
    "__dafka_kafka_partitions",  # the Kafka gateways' partition numbers (kafka/numbering.py): a number lost is reused
})


def stamps(db, p: Partition) -> Iterable[keys.Stamp]:
    """The partition's stamps from its floor on, oldest first."""
    # Stamps below the floor were deleted with their records (the one that straddled it was moved to it).
    for key, value in db.iterator(start=p.stamp_prefix + keys.seq_bytes(p.floor), stop=keys.prefix_end(p.stamp_prefix)):
        try:
            yield keys.decode_stamp(key, value)
        except ValueError:
            continue


def plan(
    db,
    partitions: Iterable[Partition],
    now_ms: int,
    retention_ms: int,
    retention_bytes: int,
    budget: int = DEFAULT_BUDGET,
) -> list[Cut]:
    """The deletions due at wall-clock ``now_ms``; ``db`` is only read."""
    cuts = []
    if retention_ms < 0 and retention_bytes < 0:
        return cuts
    for p in partitions:
        if budget <= 0:
            break
        if p.subject in KEPT_TOPICS:
            continue
        cut = plan_partition(db, p, now_ms, retention_ms, retention_bytes, budget)
        if cut is not None:
            cuts.append(cut)
            budget -= cut.deleted
    return cuts


def plan_partition(db, p: Partition, now_ms: int, retention_ms: int, retention_bytes: int, budget: int) -> Cut | None:
    """The deletion due in ``p`` (see :func:`plan`), or None."""
    cap = p.written - 1  # never delete the head record
    if cap < 0:
        return None
    time_limit = -1  # delete every sequence <= time_limit
    if retention_ms >= 0:
        cutoff = now_ms - retention_ms
        for stamp in stamps(db, p):
            if stamp.unix_ms > cutoff:
                break
            time_limit = stamp.last
    need = p.total_bytes - retention_bytes if retention_bytes >= 0 else 0
    if time_limit < 0 and need <= 0:
        return None

    first_stamp = next(iter(stamps(db, p)), None)
    covered_from = first_stamp.first if first_stamp is not None else cap + 1
    walked: list[tuple[int, int]] = []  # (seq, size) of deleted records
    deletes: list[bytes] = []
    freed = 0
    new_tail = cap + 1
    prefix = p.key_prefix
    for key, value in db.iterator(start=prefix + keys.seq_bytes(p.floor), stop=keys.prefix_end(prefix)):
        seq = keys.seq_of(key[-8:])
        if seq > cap or len(deletes) >= budget or (seq > time_limit and freed >= need):
            new_tail = min(seq, cap + 1)
            break
        deletes.append(key)
        walked.append((seq, len(value)))
        if seq >= covered_from:
            freed += len(value)
    if not deletes:
        return None
    records = len(deletes)
    # the keys and attributes of the deleted records (rfc 18), if they had any
    for prefix in (p.record_keys_prefix, p.record_attributes_prefix):
        deletes += db.iterator(start=prefix + keys.seq_bytes(p.floor), stop=prefix + keys.seq_bytes(new_tail),
                               include_value=False)
    cut = Cut(p, new_tail, records, freed, deletes)
    # Stamps: drop those wholly deleted, rewrite the one that straddles new_tail.
    for stamp in stamps(db, p):
        if stamp.first >= new_tail:
            break
        cut.deletes.append(keys.stamp_key(p.subject, p.address, stamp.first))
        if stamp.last >= new_tail:
            gone = sum(size for seq, size in walked if seq >= stamp.first)
            cut.puts.append((
                keys.stamp_key(p.subject, p.address, new_tail),
                keys.encode_stamp(stamp.last, stamp.unix_ms, max(0, stamp.nbytes - gone)),
            ))
            break
    return cut


def applied(cut: Cut) -> None:
    """Update the partition's bookkeeping once ``cut`` is written."""
    p = cut.partition
    p.total_bytes = max(0, p.total_bytes - cut.freed)
    p.floor = max(p.floor, cut.new_tail)  # every record below it was deleted
    if p.stamp_first >= 0 and p.stamp_first < cut.new_tail:
        p.stamp_first = -1  # its key was deleted or moved: the next batch starts a new stamp
