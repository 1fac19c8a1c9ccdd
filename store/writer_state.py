"""The store writer's protocol logic, free of I/O.

Feed it the frames that arrive on the writer's SUB socket and the time; take
back a :class:`Batch` of LevelDB puts, write it, and report the outcome with
:meth:`WriterState.batch_written` (which queues the ACKs) or
:meth:`WriterState.batch_failed`.  ``out`` holds the frames to publish on the
writer's PUB socket (FETCH and ACK).

Per partition (subject, producer address) it keeps ``head``, the highest
sequence of the contiguous run accepted so far, and ``written``, the part of
it that is durably in the database.  Only ``written`` is ever ACKed.

Beyond the reference:

* out-of-order records are kept (bounded, per partition) while the gap before
  them is fetched, instead of being dropped and fetched again;
* a FETCH that makes no progress is repeated after ``fetch_retry`` seconds,
  and one that is being answered is not repeated, so a lost FETCH or answer
  never stalls a partition and a busy one is not asked twice;
* when a write fails (disk full...) the batch is kept and retried, nothing is
  ACKed meanwhile, and new records are dropped (the producers keep them until
  they are ACKed; they are fetched again after recovery);
* a HEAD also re-sends the ACK of what is written, so an ACK lost to a crash
  or a reconnection cannot leave a producer waiting forever;
* a DIRECT-TAIL (sent by a store with retention) lets a partition skip
  records that no peer keeps any more, once nobody answered the FETCH for
  them within ``fetch_retry``.
"""

from __future__ import annotations

import logging
from functools import partial
from itertools import repeat
from typing import Any, NamedTuple

from dafka.records import PartitionKey
from dafka import protocol as proto
from dafka.protocol.attributes import NONE as NO_ATTRIBUTES
from dafka.protocol.attributes import Attributes
from dafka.protocol.attributes import size as attributes_size
from dafka.core.inflight import fetch_window, mean_size
from dafka.protocol.intake import RecordIntake
from dafka.protocol.packing import sequence_keys, split_contents

from . import keys

log = logging.getLogger(__name__)

FETCH_CHUNK = 100_000  # at most this many records asked for in one FETCH
FETCH_MAX_BYTES = 8 * 1024 * 1024  # ...and about this much (see dafka.core.inflight)
MAX_BUFFERED = 100_000  # out-of-order records kept per partition
# What one out-of-order record costs beyond its content: the bytes object's header, the dict's slot and
# its int key.  The writer bounds the buffer in these bytes (store/receive_bytes, all partitions together).
PENDING_OVERHEAD = 100
REACK_EVERY = 32  # at most this many HEADs between two re-ACKs of the same sequence


class Partition:
    __slots__ = (
        "subject", "address", "key_prefix", "head_key", "stamp_prefix", "ack_prefix", "record_keys_prefix",
        "record_attributes_prefix",
        "head", "written", "known_head", "pending",
        "fetch_seq", "fetch_end", "fetched_at", "progress_at", "tick_head", "tail_hint",
        "batch_first", "batch_bytes", "stamp_first", "stamp_last", "stamp_start_ms", "stamp_bytes",
        "total_bytes", "record_size", "compacted", "heard", "floor", "reacked", "reack_every", "heads_since",
        "cleaned", "clean_keys", "tombstones_due_ms", "written_ms",
    )

    def __init__(self, subject: str, address: str, head: int = -1) -> None:
        self.subject = subject
        self.address = address
        self.key_prefix = keys.partition_prefix(keys.RECORD, subject, address)
        self.head_key = keys.head_key(subject, address)
        self.stamp_prefix = keys.partition_prefix(keys.STAMP, subject, address)
        self.record_keys_prefix = keys.partition_prefix(keys.RECORD_KEY, subject, address)  # records' own keys
        self.record_attributes_prefix = keys.partition_prefix(keys.RECORD_ATTRIBUTES, subject, address)  # rfc 18.4
        self.ack_prefix = proto.encode(proto.AckMsg(address, subject, 0))[0][:-8]
        self.head = head  # highest contiguous sequence accepted (-1: none)
        self.written = head  # highest sequence durably written (-1: none)
        self.known_head = head  # highest sequence known to exist
        self.pending: dict[int, Any] = {}  # out-of-order records (a keyed one: (value, key)), bounded
        self.fetch_seq = -1  # the last FETCH asked for [fetch_seq, fetch_end)
        self.fetch_end = -1
        self.fetched_at = float("-inf")
        self.progress_at = float("-inf")  # last tick that saw head move
        self.tick_head = head
        self.tail_hint = -1  # oldest sequence another store still keeps (DIRECT-TAIL)
        self.batch_first = -1  # first sequence accepted into the open batch (-1: none)
        self.batch_bytes = 0
        self.stamp_first = -1  # the newest stamp entry, extended by later batches
        self.stamp_last = -1
        self.stamp_start_ms = 0
        self.stamp_bytes = 0
        self.total_bytes = 0  # content bytes stored (exact only when loaded from stamps)
        self.record_size = -1  # estimated content size, sampled from the open batch when fetching
        self.compacted = -1  # offsets topics: the head the last compaction pass looked at (store/compaction.py)
        # Compacted topics (store/cleaner.py): every record up to here was compacted by the last pass, which kept
        # clean_keys keyed records; it kept tombstones to look at again from tombstones_due_ms (unix ms; -1: none).
        self.cleaned = -1
        self.clean_keys = 0
        self.tombstones_due_ms = -1
        self.written_ms = 0  # when its last batch was written (unix ms)
        self.heard = float("-inf")  # when its producer's last HEAD came (monotonic)
        # Every record below this sequence was deleted (by retention or compaction, in this process): seeks start
        # here, not at the partition's first key, which would walk LevelDB over each deleted key's tombstone.
        self.floor = 0
        # Re-ACKs on HEAD (see _on_head): the sequence last re-ACKed, and every how many HEADs it is said again.
        self.reacked = -1
        self.reack_every = 1
        self.heads_since = 0

    def __repr__(self) -> str:
        return f"<Partition {self.subject}/{self.address} head={self.head} written={self.written}>"


class Extra(NamedTuple):
    """What a record with attributes (rfc 18.4) carries beside its content, where a keyed one carries its
    key alone: this module's record paths take either."""

    key: bytes | None
    attributes: Attributes


def record_extras(msg: proto.DirectRecordsMsg) -> list[Any] | None:
    """Each record's key, or an :class:`Extra` for one with attributes; None when no record has either."""
    record_keys = msg.key_list() if msg.key_lengths else None
    held = msg.attribute_list()
    if held is None:
        return record_keys
    return [key if a == NO_ATTRIBUTES else _extra((key, a)) for key, a in zip(record_keys or repeat(None), held)]


pack_time = keys.ENTRY_TIME.pack  # the start of an attributes entry's value (store/keys.py)
_extra = partial(tuple.__new__, Extra)  # an Extra from a (key, attributes) pair, without its Python __new__


def _extra_size(extra: Any) -> int:
    if type(extra) is Extra:
        return len(extra.key or b"") + attributes_size(extra.attributes)
    return len(extra)


def _pending_cost(held: Any) -> int:
    """What a buffered record (its content, or (content, key or Extra)) counts against
    ``max_pending_bytes``."""
    if type(held) is tuple:
        return len(held[0]) + _extra_size(held[1]) + PENDING_OVERHEAD
    return len(held) + PENDING_OVERHEAD


class Batch:
    """What to write in one LevelDB WriteBatch, and what to ACK once it is written."""

    __slots__ = ("keys", "values", "acks", "records", "nbytes")

    def __init__(self, keys_: list[bytes], values: list[bytes], acks: list[tuple[Partition, int]], records: int,
                 nbytes: int) -> None:
        self.keys = keys_
        self.values = values
        self.acks = acks
        self.records = records
        self.nbytes = nbytes  # record content bytes

    def __len__(self) -> int:
        return len(self.keys)


class WriterState(RecordIntake):
    role = "store writer"

    def __init__(
        self,
        address: str,
        *,
        fetch_retry: float = 1.0,
        max_buffered: int = MAX_BUFFERED,
        max_pending_bytes: int = 1 << 62,
        fetch_chunk: int = FETCH_CHUNK,
        stamp_span_ms: int = keys.STAMP_SPAN_MS,
    ) -> None:
        super().__init__()
        self.address = address
        self.fetch_retry = fetch_retry
        self.max_buffered = max_buffered
        # Out-of-order records of every partition, in bytes with PENDING_OVERHEAD each: a store that falls
        # behind loses live records on the way (its producer's queue to it overflows), and without a bound in
        # bytes the records after each gap filled 100,000 per partition while the gap was fetched (+35 MiB
        # beside a CPU hog, against the README's bound of +20 for store/test_store_memory.py's settings).
        self.max_pending_bytes = max_pending_bytes
        self.pending_bytes = 0
        self.fetch_chunk = fetch_chunk
        self.stamp_span_ms = stamp_span_ms
        self.partitions: dict[PartitionKey, Partition] = {}
        self.out: list[list[bytes]] = []
        self._keys: list[bytes] = []
        self._values: list[bytes] = []
        self._touched: list[Partition] = []
        self._staged = 0  # records in the open batch
        self.failed: Batch | None = None  # a batch whose write failed, to retry
        self.awaiting: set[Partition] = set()  # partitions that lack records known to exist: tick() looks at them
        self.now = 0.0
        # counters
        self.records_written = 0
        self.bytes_written = 0
        self.heads_asked = 0
        self.acks_sent = 0
        self.fetches_sent = 0
        self.duplicates = 0
        self.dropped = 0  # records refused while a write is failing, or beyond the buffer
        self.skipped = 0  # sequences skipped after a DIRECT-TAIL
        self.compacted_skipped = 0  # ...after a DIRECT-GAP: another store compacted them away

    # -- partitions ---------------------------------------------------------

    def load(self, subject: str, address: str, head: int, total_bytes: int = 0) -> Partition:
        """A partition found in the database at startup, written through ``head``."""
        p = self._add(subject, address, head)
        p.total_bytes = total_bytes
        return p

    def _add(self, subject: str, address: str, head: int) -> Partition:
        p = Partition(subject, address, head)
        self.partitions[(subject, address)] = p
        for prefix in self._record_prefixes_of(subject, address):
            self.record_prefixes[prefix] = p
        return p

    def _record_prefixes_of(self, subject: str, address: str) -> tuple[bytes, bytes]:
        """The frame-1 prefixes of a partition's live RECORDs and of the DIRECT-RECORDs answering us."""
        return (proto.record_prefix(proto.RECORD, subject, address, subject),
                proto.record_prefix(proto.DIRECT_RECORD, self.address, address, subject))

    def _partition(self, subject: str, address: str, seen: int = -1) -> Partition | None:
        """The partition, created at first sight (``seen``: the head a HEAD or a store said, if one did);
        None for a name the key layout cannot hold (counted)."""
        p = self.partitions.get((subject, address))
        if p is None:
            if not (keys.valid_name(keys.to_bytes(subject)) and keys.valid_name(keys.to_bytes(address))):
                self.malformed += 1
                log.debug("store writer %s: refused a partition name with a NUL: %r/%r", self.address, subject, address)
                return None
            p = self._add(subject, address, -1)
            log.debug("store writer %s: new partition %s/%s", self.address, subject, address)
        return p

    def _take_pending(self, p: Partition, seq: int) -> Any:
        """Take record ``seq`` out of the out-of-order buffer: its content, or (content, key) for a keyed
        record; None if it is not there."""
        content = p.pending.pop(seq, None)
        if content is not None:
            self.pending_bytes -= _pending_cost(content)
        return content

    def _drop_below(self, p: Partition, end: int) -> None:
        """Forget the buffered records before ``end``.  An emptied buffer is replaced: a dict keeps the
        table of its largest size, and one that buffered 100,000 records holds 2.5 MiB of it (issue 26)."""
        for stale in [s for s in p.pending if s < end]:
            self._take_pending(p, stale)
        if not p.pending:
            p.pending = {}

    def forget(self, p: Partition) -> None:
        """``p`` was deleted from the database (an expired offsets partition)."""
        self._drop_below(p, 1 << 64)
        self.partitions.pop((p.subject, p.address), None)
        for prefix in self._record_prefixes_of(p.subject, p.address):
            self.record_prefixes.pop(prefix, None)
        self.awaiting.discard(p)

    def ask_heads(self) -> None:
        """GET-HEADS for every topic (an empty subject), to the other stores:
        a store that restarts empty, or missed records while it was down,
        learns what they hold and FETCHes it, even from partitions whose
        producers are gone (rfc 7.1)."""
        self.out.append(proto.encode(proto.GetHeadsMsg("", self.address)))
        self.heads_asked += 1

    def heads(self) -> dict[PartitionKey, int]:
        """Written head of every partition that has one."""
        return {k: p.written for k, p in list(self.partitions.items()) if p.written >= 0}

    @property
    def staged(self) -> int:
        """Records accepted into the open batch."""
        return self._staged

    @property
    def staged_bytes(self) -> int:
        """Record contents in the open batch."""
        return sum(p.batch_bytes for p in self._touched)

    @property
    def buffered(self) -> int:
        return sum(len(p.pending) for p in list(self.partitions.values()))

    # -- incoming -----------------------------------------------------------

    def on_known_record_frames(self, p: Partition, frame: bytes, content: bytes) -> None:
        if self.failed is not None:
            self.on_frames([frame, content])
            return
        seq8 = frame[-8:]
        seq = int.from_bytes(seq8, "big")
        if seq == p.head + 1:
            self._keys.append(p.key_prefix + seq8)
            self._values.append(content)
            self._staged += 1
            p.head = seq
            p.batch_bytes += len(content)
            if p.batch_first < 0:
                p.batch_first = seq
                self._touched.append(p)
            if seq > p.known_head:
                p.known_head = seq  # live traffic: nothing pending, nothing to fetch
            elif p.pending or seq >= p.fetch_end - 1:
                self._after_store(p)
        else:
            self._on_record(p, seq, content)

    def on_frames(self, frames: list[bytes]) -> None:
        """Any message from the SUB socket (the slow path)."""
        msg = self.decode(frames)
        if msg is not None:
            self.on_message(msg)

    def on_message(self, msg: proto.Message) -> None:
        """A decoded message from the SUB socket."""
        kind = type(msg)
        if kind is proto.RecordMsg or kind is proto.DirectRecordMsg:
            if kind is proto.DirectRecordMsg and msg.topic != self.address:
                return
            p = self._partition(msg.subject, msg.address)
            if p is not None:
                self._on_record(p, msg.sequence, msg.content)
        elif isinstance(msg, proto.DirectRecordsMsg):  # and (KEYED-)RECORDS, DIRECT-KEYED-RECORDS
            if msg.topic == (msg.subject if msg.live else self.address):
                p = self._partition(msg.subject, msg.address)
                if p is not None:
                    self._on_records(p, msg)
        elif kind is proto.HeadMsg:
            p = self._partition(msg.subject, msg.address, msg.sequence)
            if p is not None:
                p.heard = self.now  # its producer is alive
                self._on_head(p, msg.sequence)
        elif kind is proto.DirectHeadMsg or kind is proto.DirectPartitionsMsg:
            for subject, address, head in self.store_heads(msg):  # other stores' heads, answering our GET-HEADS
                p = self._partition(subject, address, head)
                if p is not None:
                    self._on_head(p, head)
        elif kind is proto.DirectGapMsg:
            # Another store compacted these records away (rfc 19): a newer record of each key follows them.
            if msg.topic == self.address:
                p = self._partition(msg.subject, msg.address)
                if p is not None and msg.sequence <= p.head + 1 < msg.end:
                    self.compacted_skipped += msg.end - 1 - p.head
                    self._drop_below(p, msg.end)
                    p.head = msg.end - 1
                    if p.known_head < p.head:
                        p.known_head = p.head
                    self._after_store(p)
        elif kind is proto.DirectTailMsg:
            if msg.topic == self.address:
                p = self._partition(msg.subject, msg.address)
                if p is not None and msg.sequence > p.tail_hint:
                    p.tail_hint = msg.sequence

    def _on_record(self, p: Partition, seq: int, content: bytes, key: bytes | None = None) -> None:
        if seq <= p.head:
            self.duplicates += 1
            return
        if seq > p.known_head:
            p.known_head = seq
        if self.failed is not None:
            self.dropped += 1
            self._await(p)  # fetched once writes succeed again
            return
        if seq == p.head + 1:
            self._stage(p, seq, content, key)
            self._after_store(p)
            return
        held = content if key is None else (content, key)
        cost = _pending_cost(held)
        if seq in p.pending:
            self.duplicates += 1
        elif seq - p.head <= self.max_buffered and len(p.pending) < self.max_buffered and \
                self.pending_bytes + cost <= self.max_pending_bytes:
            p.pending[seq] = held
            self.pending_bytes += cost
        else:
            self.dropped += 1  # fetched again
        self._request(p)

    def _on_records(self, p: Partition, msg: proto.DirectRecordsMsg) -> None:
        """A DIRECT-RECORDS: its records after the head are staged in one go,
        their keys built in C (``map``), not once per record in Python."""
        first = msg.sequence
        end = first + msg.count
        start = p.head + 1
        extra = msg.key_lengths or msg.times
        if extra and first < start:
            self._keep_keys(p, first, min(end, start), record_extras(msg) or [], msg)
        if end <= start:
            self.duplicates += msg.count
            return
        values = split_contents(msg.lengths, msg.contents)
        if first > start or self.failed is not None:  # ahead of a gap, or failing: one by one
            for seq, content, key in zip(range(first, end), values, record_extras(msg) or repeat(None)):
                self._on_record(p, seq, content, key)
            return
        if start > first:
            self.duplicates += start - first
            del values[: start - first]
        if end - 1 > p.known_head:
            p.known_head = end - 1
        self._keys.extend(sequence_keys(p.key_prefix, start, end))
        self._values.extend(values)
        if msg.key_lengths:
            for seq, key in zip(range(start, end), msg.key_list()[start - first:]):  # type: ignore[index]
                if key is not None:
                    self._keys.append(p.record_keys_prefix + seq.to_bytes(8, "big"))
                    self._values.append(keys.key_entry_value(key, values[seq - start]))
        if msg.times:  # (a Kafka producer's records: each has a timestamp; built without a call a record)
            held = msg.attribute_list()[start - first:]  # type: ignore[index]
            if NO_ATTRIBUTES in held:
                kept = [(seq, a) for seq, a in zip(range(start, end), held) if a != NO_ATTRIBUTES]
                self._keys += [p.record_attributes_prefix + seq.to_bytes(8, "big") for seq, _ in kept]
                self._values += [pack_time(a[0]) + a[1] for _, a in kept]
            else:
                self._keys += sequence_keys(p.record_attributes_prefix, start, end)
                self._values += [pack_time(t) + h for t, h in held]
        self._staged += end - start
        p.head = end - 1
        p.batch_bytes += sum(map(len, values))
        if p.batch_first < 0:
            p.batch_first = start
            self._touched.append(p)
        if p.pending:
            self._drop_below(p, end)
        self._after_store(p)

    def _keep_keys(self, p: Partition, first: int, end: int, record_keys: list[bytes | None],
                   msg: proto.DirectRecordsMsg) -> None:
        """The keys of records ``first .. end-1`` that the store has already (it took them from a form without
        keys: a RECORD that came first, a reference store's answer): written with the next batch."""
        contents = split_contents(msg.lengths, msg.contents)[:end - first]
        for seq, key, content in zip(range(first, end), record_keys, contents):
            if key is not None:
                self._stage_extra(p, seq, key, content)

    def _stage(self, p: Partition, seq: int, content: bytes, key: bytes | None = None) -> None:
        self._keys.append(p.key_prefix + seq.to_bytes(8, "big"))
        self._values.append(content)
        if key is not None:
            self._stage_extra(p, seq, key, content)
        self._staged += 1
        p.head = seq
        p.batch_bytes += len(content)
        if p.batch_first < 0:
            p.batch_first = seq
            self._touched.append(p)

    def _stage_extra(self, p: Partition, seq: int, extra: Any, content: bytes) -> None:
        """The entries of record ``seq``'s key (``extra``: a key, or an :class:`Extra`) and attributes."""
        key = extra
        if type(extra) is Extra:
            key, held = extra
            self._keys.append(p.record_attributes_prefix + seq.to_bytes(8, "big"))
            self._values.append(keys.attributes_entry_value(held[0], held[1]))
        if key is not None:
            self._keys.append(p.record_keys_prefix + seq.to_bytes(8, "big"))
            self._values.append(keys.key_entry_value(key, content))

    def _after_store(self, p: Partition) -> None:
        """After ``p.head`` moved: take the buffered records that now follow
        it, and ask for the next window once the current one is done."""
        if p.pending:
            self._take_pending(p, p.head)  # the same record, buffered earlier
            nxt = p.head + 1
            while (content := self._take_pending(p, nxt)) is not None:
                if type(content) is tuple:
                    self._stage(p, nxt, *content)
                else:
                    self._stage(p, nxt, content)
                nxt += 1
            if not p.pending:
                p.pending = {}  # see _drop_below
        if p.known_head > p.head and p.head + 1 >= p.fetch_end:
            self._request(p)

    def _on_head(self, p: Partition, seq: int) -> None:
        if seq > p.known_head:
            p.known_head = seq
        if p.written >= 0:
            # Re-ACK what is written: an ACK lost to a crash or a late connection would otherwise never be
            # repeated.  Something new is re-ACKed at the first HEAD; the same again after 2, 4, ... up to
            # REACK_EVERY HEADs: an idle producer is not woken every HEAD to hear what it knows.
            acked = min(p.written, seq)
            p.heads_since += 1
            if acked != p.reacked or p.heads_since >= p.reack_every:
                p.reack_every = 2 if acked != p.reacked else min(2 * p.reack_every, REACK_EVERY)
                p.reacked = acked
                p.heads_since = 0
                self.out.append([p.ack_prefix + acked.to_bytes(8, "big")])
                self.acks_sent += 1
        if self.failed is None:
            self._request(p)

    # -- fetching -----------------------------------------------------------

    def _request(self, p: Partition) -> None:
        """FETCH from ``head+1`` up to the first buffered record (or
        ``known_head``), at most ``fetch_chunk`` records, unless a FETCH
        covering ``head+1`` is in flight and still making progress."""
        start = p.head + 1
        if p.known_head < start:
            return
        self._await(p)
        if self.failed is not None:
            return
        if p.fetch_seq <= start < p.fetch_end and self.now - max(p.fetched_at, p.progress_at) < self.fetch_retry:
            return
        end = p.known_head
        if p.pending:
            end = min(end, min(p.pending) - 1)  # no need to ask for what is buffered
        if p.batch_first >= 0:
            p.record_size = mean_size(p.record_size, p.batch_bytes // (p.head - p.batch_first + 1))
        count = min(end - p.head, self.fetch_chunk, fetch_window(FETCH_MAX_BYTES, p.record_size))
        self.out.append(proto.encode(proto.FetchMsg(p.address, self.address, p.subject, start, count)))
        self.fetches_sent += 1
        p.fetch_seq = start
        p.fetch_end = start + count
        p.fetched_at = self.now

    def _await(self, p: Partition) -> None:
        """``p`` lacks records known to exist: :meth:`tick` looks after it until it has them."""
        if p not in self.awaiting:
            self.awaiting.add(p)
            p.tick_head = p.head  # the head moving from here on is progress

    def tick(self, now: float) -> None:
        """Advance time: repeat FETCHes that made no progress; skip to the
        tail another store reported if nobody had the records before it."""
        self.now = now
        failing = self.failed is not None
        for p in list(self.awaiting):
            if p.known_head <= p.head:
                self.awaiting.discard(p)  # caught up
                continue
            if p.head != p.tick_head:
                p.tick_head = p.head
                p.progress_at = now
            if failing:
                continue
            if now - max(p.fetched_at, p.progress_at) >= self.fetch_retry:
                if p.tail_hint > p.head + 1 and p.fetched_at > p.progress_at:
                    self._skip_to(p, p.tail_hint)
                    if p.known_head <= p.head:
                        continue
                self._request(p)

    def _skip_to(self, p: Partition, oldest: int) -> None:
        log.warning(
            "store writer %s: %s/%s records %d..%d are kept by no peer (deleted by retention); skipping to %d",
            self.address, p.subject, p.address, p.head + 1, oldest - 1, oldest,
        )
        self.skipped += oldest - 1 - p.head
        self._drop_below(p, oldest)
        p.head = oldest - 1
        if p.known_head < p.head:
            p.known_head = p.head
        self._after_store(p)

    # -- writing ------------------------------------------------------------

    def take_batch(self, unix_ms: int) -> Batch | None:
        """The open batch (records, then a head and a stamp per partition), or
        None if nothing was accepted since the last one."""
        touched = self._touched
        if not touched:
            return None
        batch_keys, values = self._keys, self._values
        acks = []
        nbytes = 0
        span = self.stamp_span_ms
        for p in touched:
            head8 = p.head.to_bytes(8, "big")
            batch_keys.append(p.head_key)
            values.append(head8)
            if p.stamp_first >= 0 and p.stamp_last + 1 == p.batch_first and unix_ms - p.stamp_start_ms < span:
                p.stamp_bytes += p.batch_bytes
            else:
                p.stamp_first = p.batch_first
                p.stamp_start_ms = unix_ms
                p.stamp_bytes = p.batch_bytes
            p.stamp_last = p.head
            batch_keys.append(p.stamp_prefix + p.stamp_first.to_bytes(8, "big"))
            values.append(keys.encode_stamp(p.head, unix_ms, p.stamp_bytes))
            p.total_bytes += p.batch_bytes
            p.written_ms = unix_ms
            nbytes += p.batch_bytes
            acks.append((p, p.head))
            p.batch_first = -1
            p.batch_bytes = 0
        batch = Batch(batch_keys, values, acks, self._staged, nbytes)
        self._keys, self._values, self._touched, self._staged = [], [], [], 0
        return batch

    def batch_written(self, batch: Batch) -> None:
        """The batch is in the database: ACK each partition's new head."""
        out = self.out
        for p, head in batch.acks:
            if head > p.written:
                p.written = head
            out.append([p.ack_prefix + head.to_bytes(8, "big")])
        self.acks_sent += len(batch.acks)
        self.records_written += batch.records
        self.bytes_written += batch.nbytes
        if self.failed is batch:
            self.failed = None
            log.warning("store writer %s: the database accepts writes again; %d records written",
                        self.address, batch.records)

    def batch_failed(self, batch: Batch) -> None:
        """The write failed: keep the batch for :meth:`retry_batch`, ACK
        nothing and accept no new record until it is written."""
        self.failed = batch

    def retry_batch(self) -> Batch | None:
        """The batch to write again, if a write failed."""
        return self.failed
