"""The consumer's protocol logic, free of I/O.

Feed it the frames that arrive on its SUB socket, the subscriptions its XPUB
sees, and time; read back ``out`` (frames to publish on its XPUB) and
``ready`` (records to hand to the user, in order, once per partition).

Beyond the reference: subscriptions are exact; out-of-order records inside
the fetched window are kept (bounded) instead of dropped; an unanswered FETCH
is repeated after ``fetch_retry`` seconds so that a lost request or answer
never stalls a partition; DIRECT-TAIL from a store with retention moves a
partition past records that nobody holds any more: deleted by a store's
retention, or let go by a producer in no-store mode (counted in
``records_lost``).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterable
from functools import partial
from itertools import repeat
from typing import Any, Protocol, runtime_checkable

from ..records import PartitionKey
from .. import protocol as proto
from ..core.inflight import fetch_window, mean_size
from ..groups.state import GroupState
from ..protocol import batching
from ..protocol import bulk as bulk_answers
from ..protocol.attributes import NO_TIME, decode_headers
from ..protocol.intake import RecordIntake
from ..protocol.packing import lengths_of, split_contents, split_records
from ..records import Record, RecordExtra, keyed_record, keyed_records, make_record
from .latest import LatestStarts

log = logging.getLogger(__name__)

FETCH_CHUNK = 100_000  # at most this many records asked for in one FETCH
HEADS_BACKOFF_MAX = 64  # the tail watch's interval doubles up to this many times heads_interval
# A FETCH for a gap that later records already wait behind is asked again after this long without any
# progress (at most fetch_retry): it may have reached a producer that had just released those records
# and a store that had not written them yet, and the gap is certain.
GAP_RETRY = 0.2


class RecordSink(Protocol):
    """Where an internal topic's records go rather than into the ready queue (a deque is one)."""

    def append(self, record: Record[bytes], /) -> None: ...

    def extend(self, records: Iterable[Record[bytes]], /) -> None: ...


@runtime_checkable
class FrameSink(RecordSink, Protocol):
    """A sink that also takes a message's records from its ``skip``-th on as they came, as the frames of a
    (DIRECT-)RECORDS (the Kafka gateway's reader: it encodes Kafka batches from them, with no record object
    on the way).  The consumer has checked them, and moved on past them."""

    def add_frames(self, partition: str, msg: proto.DirectRecordsMsg, skip: int, /) -> None: ...


class Partition:
    __slots__ = ("topic", "address", "next", "head", "pending", "fetch_seq", "fetch_end", "fetched_at",
                 "seen_next", "progress_at", "record_size", "window_from", "window_bytes", "watched_next",
                 "sink", "frame_sink", "probing", "quiet_next")

    def __init__(self, topic: str, address: str, next_offset: int, sink: RecordSink) -> None:
        self.sink = sink  # where its records are delivered: the ready queue, or an internal topic's own
        # ...which may take a message's records as they came (its frames), rather than built as records
        self.frame_sink: FrameSink | None = sink if isinstance(sink, FrameSink) else None
        self.topic = topic
        self.address = address
        self.next = next_offset  # the next sequence to deliver
        self.head = next_offset - 1  # the highest sequence known to exist
        self.pending: dict[int, Any] = {}  # out-of-order records (a keyed one: (value, key)), bounded
        self.fetch_seq = -1  # sequence the last FETCH started at
        self.fetch_end = -1  # sequence after the last FETCH's range
        self.fetched_at = float("-inf")
        self.seen_next = next_offset  # ``next`` at the last tick, to notice progress
        self.progress_at = float("-inf")
        self.record_size = -1  # estimated content size (-1: unknown), from what fetched windows brought
        self.window_from = next_offset  # ``next`` when the last FETCH went out...
        self.window_bytes = 0  # ...and the content bytes delivered since, below the head
        self.watched_next = -1  # ``next`` at the tail watch's last round
        self.probing = False  # ask past the known head whenever caught up (ConsumerState.probe)
        self.quiet_next = -1  # ``next`` at the last tick, while the quiet watch looks at the partition

    def forget_fetch(self) -> None:
        """Make the next :meth:`ConsumerState._request` go out whatever was asked before."""
        self.fetch_seq = self.fetch_end = -1
        self.fetched_at = float("-inf")


class ConsumerState(RecordIntake):
    role = "consumer"

    def __init__(
        self,
        address: str,
        *,
        reset: str = "latest",
        fetch_retry: float = 1.0,
        max_buffered: int = 100_000,
        max_buffered_bytes: int = 64 * 1024 * 1024,
        fetch_max_bytes: int = 8 * 1024 * 1024,
        positions: dict[PartitionKey, int] | None = None,
        bulk: bool = True,
        batches: bool = True,
        heads_interval: float = 1.0,
        group: GroupState | None = None,
        store_times: bool = False,
    ) -> None:
        super().__init__()
        self.store_times = store_times  # a record without a timestamp gets its store's (consumer/store_times)
        if reset not in ("latest", "earliest"):
            raise ValueError(f"consumer/offset/reset must be 'latest' or 'earliest', not {reset!r}")
        self.address = address
        self.earliest = reset == "earliest"
        self.fetch_retry = fetch_retry
        self.max_buffered = max_buffered
        self.max_buffered_bytes = max_buffered_bytes
        self.fetch_max_bytes = fetch_max_bytes
        self.bulk = bulk  # announce that we read DIRECT-RECORDS and DIRECT-PARTITIONS
        self.batches = batches  # subscribe to live RECORDS beside RECORDs
        self.topics: list[str] = []
        self.partitions: dict[PartitionKey, Partition] = {}
        self._positions = dict(positions or {})
        self.out: list[list[bytes]] = []
        self.ready: deque[Record[bytes]] = deque()
        self.awaiting: set[Partition] = set()  # partitions that lack records known to exist: tick() looks at them
        self.records_lost = 0  # offsets passed over after a DIRECT-TAIL: nobody held them any more
        self.compacted_skipped = 0  # offsets passed over after a DIRECT-GAP: compaction removed them (rfc 19)
        self.now = 0.0
        self.delivered = 0  # records put in the ready queue (counters for metrics)
        self.delivered_bytes = 0
        self.fetches_sent = 0
        self.probes = 0  # FETCHes past the known head after the receive queue was full
        self.probed_at = float("-inf")
        self.quiet_watch: set[Partition] = set()  # partitions to probe once no record came for a tick
        # The tail watch (rfc 8.5): while a partition's producer is not among the peers we are
        # connected to, nothing tells us of records that came after its last HEAD that reached us.
        self.live: set[str] = set()  # addresses of the peers we are connected to
        self.heads_interval = heads_interval
        self.heads_due: float | None = None  # when to ask the stores for the heads again (None: no watch)
        self._heads_wait = heads_interval
        self.heads_asked = 0  # GET-HEADS rounds the tail watch sent
        # In a consumer group, the partitions of our topics are read only once the group assigns
        # them (:meth:`start`); internal topics (the group's offsets) are read whole, from the
        # earliest record, into queues of their own.
        self.group = group
        self.sinks: dict[str, RecordSink] = {}
        # A group member subscribes to the records of the partitions it reads only (publishers filter the
        # rest out): SUB prefixes to add (True) or remove (False), for the consumer to apply.
        self.sub_changes: list[tuple[bool, bytes]] = []
        # Where ``latest`` starts each partition (rfc 8.1): one past the last record that a peer held at the
        # subscription, from the HEADS-AT answers of the peers that hold records.
        self.latest = LatestStarts()
        # live records of the partitions it waits to start, kept (bounded) so that none is lost where nobody
        # else holds it (a reference producer without stores): partition -> {sequence: content or (content, key)}
        self._early: dict[PartitionKey, dict[int, Any]] = {}

    # -- subscriptions ------------------------------------------------------

    def subscribe(self, topic: str, sink: RecordSink | None = None, since_ms: int | None = None) -> list[bytes]:
        """Subscribe to ``topic``; returns the SUB prefixes to add.  With a
        ``sink`` it is an internal topic: every partition is read from the
        earliest record into ``sink``, never into :attr:`ready`.  With
        ``latest``, ``since_ms`` (unix ms; default: now) is the moment from
        which records are delivered."""
        if topic in self.topics:
            return []
        prefixes = []
        if sink is not None:
            self.sinks[topic] = sink
        else:
            if self.group is not None:
                self.group.subscribe(topic, self.now)
            if not self.earliest:
                self.latest.subscribe(topic, int(time.time() * 1000) if since_ms is None else since_ms)
                prefixes.append(self.latest.subscription(topic, self.address))
        self.topics.append(topic)
        self.get_heads((topic,))
        if self._gated(topic):
            return prefixes + [proto.subscription(proto.HEAD, topic, exact=True)]  # the records: per partition, once ours
        prefixes += [proto.subscription(proto.RECORD, topic, exact=True), proto.subscription(proto.HEAD, topic, exact=True)]
        return prefixes + batching.consumer_subscriptions(topic) if self.batches else prefixes

    def own_subscriptions(self) -> list[bytes]:
        """Prefixes for the messages addressed to this consumer (with bulk
        answers, also those that announce it to dafka-py peers)."""
        prefixes = [
            proto.subscription(msg_id, self.address, exact=True)
            for msg_id in (proto.DIRECT_RECORD, proto.DIRECT_HEAD, proto.STORE_HELLO, proto.DIRECT_TAIL,
                           proto.DIRECT_GAP)
        ]
        if self.group is not None:
            prefixes.append(proto.subscription(proto.GROUP_MEMBER, self.group.group, exact=True))
        return prefixes + bulk_answers.subscriptions(self.address, keys=True) if self.bulk else prefixes

    def _asks_heads(self, topic: str) -> bool:
        """Whether stores should tell us ``topic``'s heads: always, but for a
        ``latest`` topic of a reader whose peers cannot say what they held at
        the subscription (HEADS-AT off): then only for partitions we have a
        position for (an offsets file), whose producers may be gone."""
        return self._earliest(topic) or self.group is not None or topic in self.latest.since or any(
            t == topic for t, _ in self._positions) or any(
            t == topic for t, _ in self.partitions)

    def get_heads(self, topics: Iterable[str]) -> None:
        """GET-HEADS for each of ``topics`` whose heads the stores should tell us."""
        for topic in topics:
            if self._asks_heads(topic):
                self.out.append(proto.encode(proto.GetHeadsMsg(topic, self.address)))

    def _hello(self, reader: str) -> None:
        subjects = tuple(t for t in self.topics if self._asks_heads(t))
        self.out.append(proto.encode(proto.ConsumerHelloMsg(reader, self.address, subjects)))

    def on_peers(self, live: set[str], gone: int, now: float) -> None:
        """The peers we are connected to are now ``live`` (``gone`` of them
        left: their beacons expired).  A producer that left may have sent
        its last records and HEADs in vain: ask the stores for the heads at
        once, and keep watching while its partition has no live producer."""
        self.now = now
        self.live = live
        if gone:
            self.get_heads(self.topics)
        self._watch_tails(restart=bool(gone))

    def _watch_tails(self, restart: bool = False) -> None:
        live = self.live
        if any(p.address not in live for p in self.partitions.values()):
            if self.heads_due is None or restart:
                self._heads_wait = self.heads_interval
                self.heads_due = self.now + self.heads_interval
        else:
            self.heads_due = None

    def _ask_tails(self, now: float) -> None:
        """The tail watch's turn: GET-HEADS for the topics whose partitions
        have no live producer.  The next turn comes heads_interval later
        while those partitions still get records (their silence has not
        begun), else twice as late as the last (at most HEADS_BACKOFF_MAX
        times heads_interval)."""
        live = self.live
        topics = set()
        progress = False
        for p in self.partitions.values():
            if p.address not in live:
                topics.add(p.topic)
                progress = progress or p.next != p.watched_next
                p.watched_next = p.next
        self.get_heads(topics)
        self.heads_asked += 1
        if progress:
            self._heads_wait = self.heads_interval
        else:
            self._heads_wait = min(self._heads_wait * 2, self.heads_interval * HEADS_BACKOFF_MAX)
        self.heads_due = now + self._heads_wait

    def on_subscription(self, frame: bytes) -> None:
        """A subscription seen on our XPUB: a store reader that subscribes to
        ``W<reader>`` gets a CONSUMER-HELLO."""
        try:
            sub = proto.decode_subscription(frame)
        except proto.MalformedMessage:
            self.malformed += 1
            return
        if not sub.subscribe:
            return
        if sub.msg_id == proto.CONSUMER_HELLO and sub.topic:
            self._hello(sub.topic)
        elif sub.msg_id == proto.GROUP_MEMBER:
            if self.group is not None and sub.topic in ("", self.group.group):  # a member, or an observer
                self.group.on_subscription(self.now, member=bool(sub.topic))
        elif sub.msg_id == proto.FETCH or not sub.msg_id:
            # A producer (``F<address>``) or a store reader (``F``) has just
            # connected: a FETCH sent before that was lost, send it again now
            # rather than after fetch_retry.
            for p in self.partitions.values():
                if p.head >= p.next and (not sub.topic or p.address == sub.topic):
                    p.forget_fetch()
                    self._request(p)

    # -- positions ----------------------------------------------------------

    def seek(self, topic: str, partition: str, offset: int) -> None:
        p = self.partitions.get((topic, partition))
        if p is None:
            self._positions[(topic, partition)] = offset
            return
        p.next = p.window_from = offset
        p.window_bytes = 0
        p.pending.clear()
        p.forget_fetch()
        self._request(p)

    def positions(self) -> dict[PartitionKey, int]:
        out = dict(self._positions)
        out.update({key: p.next for key, p in self.partitions.items()})
        return out

    def _knows(self, topic: str, address: str) -> bool:
        """Whether a store's DIRECT-HEAD may open this partition."""
        key = (topic, address)
        return self._earliest(topic) or topic in self.latest.since or key in self.partitions or \
            key in self._positions or self._gated(topic)

    def _earliest(self, topic: str) -> bool:
        return self.earliest or topic in self.sinks

    def _gated(self, topic: str) -> bool:
        """Whether the group says which of the topic's partitions we read."""
        return self.group is not None and topic not in self.sinks

    def _partition_subscriptions(self, topic: str, address: str) -> list[bytes]:
        """The SUB prefixes of one partition's live records (RECORD, and KEYED-RECORDS with batches)."""
        ids = (proto.RECORD, batching.LIVE_BATCHES) if self.batches else (proto.RECORD,)
        return [proto.record_prefix(msg_id, topic, address, topic) for msg_id in ids]

    def _partition(self, topic: str, address: str, seq: int, record: bool = False) -> Partition | None:
        """The partition a message is about (``record``: a live record
        ``seq``, else a head ``seq``), opened at first sight; None if the
        consumer's group has not assigned it to us (told to the group), or
        while ``latest`` waits to know where it starts."""
        key = (topic, address)
        p = self.partitions.get(key)
        if p is None:
            group = self.group
            if group is not None and topic not in self.sinks:  # the group says which of its partitions we read
                group.meet(topic, address, seq, self.now)
                if key not in group.owned:
                    return None
                # Ours (perhaps just now): open it here, at the group's commit, so that this record is
                # not lost where nobody keeps it (a producer without stores); start() then finds it open.
                offset = group.committed.get(key)
                if offset is not None:
                    self._positions[key] = offset
            if key not in self._positions and topic in self.latest.since:
                decided = self.latest.meet(topic, address, seq if record else seq + 1, seq, self.now)
                if decided is None:
                    return None  # the records it shows are fetched once it starts
                return self._start_latest(*decided)
            p = self._open(topic, address, seq)
        return p

    def _keep_early(self, topic: str, address: str, seq: int, content: bytes, key: bytes | None = None) -> None:
        early = self._early.setdefault((topic, address), {})
        if len(early) < self._buffer_cap(len(content)):
            early[seq] = content if key is None else (content, key)

    def _start_latest(self, topic: str, address: str, start: int, head: int) -> Partition | None:
        """Open a partition where ``latest`` starts it (:class:`~dafka.consumer.latest.LatestStarts`), deliver the
        records that came meanwhile, and fetch what else is known to exist from there."""
        key = (topic, address)
        early = self._early.pop(key, {})
        if key in self.partitions or (self._gated(topic) and self.group is not None and key not in self.group.owned):
            return self.partitions.get(key)
        self._positions[key] = start
        p = self._open(topic, address, start)
        if head > p.head:
            p.head = head
        for seq in sorted(s for s in early if s >= start):
            content = early[seq]
            if type(content) is tuple:
                self._on_record(p, seq, content[0], content[1])
            else:
                self._on_record(p, seq, content)
        self._request(p)
        return p

    def _open(self, topic: str, address: str, seq: int) -> Partition:
        key = (topic, address)
        start = self._positions.pop(key, None)
        if start is None:
            start = 0 if self._earliest(topic) else seq
        p = Partition(topic, address, start, self.sinks.get(topic, self.ready))
        self.partitions[key] = p
        if self._gated(topic):
            self.sub_changes.extend((True, prefix) for prefix in self._partition_subscriptions(topic, address))
        self.record_prefixes[proto.record_prefix(proto.RECORD, topic, address, topic)] = p
        self.record_prefixes[proto.record_prefix(proto.DIRECT_RECORD, self.address, address, topic)] = p
        log.debug("consumer %s: new partition %s/%s from offset %d", self.address, topic, address, start)
        if address not in self.live and self.heads_due is None:
            self._watch_tails()  # a partition met through a store: its producer may be long gone
        return p

    def start(self, topic: str, partition: str, offset: int | None, head: int) -> None:
        """Read a partition the group assigned to us from ``offset`` (None:
        as ``consumer/offset/reset`` says; ``latest`` starts at ``head``, the
        highest sequence met), fetching up to ``head`` (-1: not known yet;
        with ``latest`` and no offset, it opens when first met)."""
        if (topic, partition) in self.partitions or (offset is None and head < 0 and not self._earliest(topic)):
            return  # open already, or (``latest``, head unknown) it opens when first met
        if offset is not None:
            self._positions[(topic, partition)] = offset
        elif (topic, partition) not in self._positions and topic in self.latest.since:
            decided = self.latest.meet(topic, partition, head + 1, head, self.now)
            if decided is not None:
                self._start_latest(*decided)
            return
        p = self._open(topic, partition, head)
        if head > p.head:
            p.head = head
        self._request(p)

    def stop(self, topic: str, partition: str) -> None:
        """Stop reading a partition (the group moved it): forget it and drop
        its records that wait in the ready queue."""
        self.latest.forget(topic, partition)
        self._early.pop((topic, partition), None)
        p = self.partitions.pop((topic, partition), None)
        if p is None:
            return
        if self.group is not None:
            self.group.meet(topic, partition, p.head, self.now)  # the head we learnt, should it come back to us
        self.sub_changes.extend((False, prefix) for prefix in self._partition_subscriptions(topic, partition))
        self.record_prefixes.pop(proto.record_prefix(proto.RECORD, topic, partition, topic), None)
        self.record_prefixes.pop(proto.record_prefix(proto.DIRECT_RECORD, self.address, partition, topic), None)
        self.awaiting.discard(p)
        self.quiet_watch.discard(p)
        self.drop_ready(topic, partition)
        self._watch_tails()

    def drop_ready(self, topic: str, partition: str) -> None:
        """Take a partition's records out of the ready queue (in place: partitions deliver into it)."""
        ready = self.ready
        if any(r.partition == partition and r.topic == topic for r in ready):
            kept = [r for r in ready if r.partition != partition or r.topic != topic]
            ready.clear()
            ready.extend(kept)

    # -- incoming -----------------------------------------------------------

    def on_known_record_frames(self, p: Partition, frame: bytes, content: bytes) -> None:
        seq = int.from_bytes(frame[-8:], "big")
        if seq == p.next:
            p.sink.append(make_record((p.topic, p.address, seq, content)))
            p.next = seq + 1
            self.delivered += 1
            self.delivered_bytes += len(content)
            if seq > p.head:
                p.head = seq  # live traffic: nothing pending, nothing to fetch
            else:
                p.window_bytes += len(content)
                if p.pending or p.next >= p.fetch_end:
                    self._after_delivery(p, seq)
        else:
            self._on_record(p, seq, content)

    def on_frames(self, frames: list[bytes]) -> None:
        msg = self.decode(frames)
        if msg is None:
            return
        if "\0" in getattr(msg, "address", ""):
            self.malformed += 1  # no reply could be addressed to it
            return
        if isinstance(msg, (proto.RecordMsg, proto.DirectRecordMsg)):
            if msg.subject not in self.topics or (type(msg) is proto.DirectRecordMsg and msg.topic != self.address):
                return
            p = self._partition(msg.subject, msg.address, msg.sequence, record=True)
            if p is not None:
                self._on_record(p, msg.sequence, msg.content)
            elif (msg.subject, msg.address) in self.latest.waiting:
                self._keep_early(msg.subject, msg.address, msg.sequence, msg.content)
        elif isinstance(msg, proto.DirectRecordsMsg):  # (KEYED-)RECORDS (live, to the topic) too
            to = msg.subject if msg.live else self.address
            if msg.subject in self.topics and msg.topic == to:
                p = self._partition(msg.subject, msg.address, msg.sequence, record=msg.live)
                if p is not None:
                    self._on_records(p, msg)
                elif (msg.subject, msg.address) in self.latest.waiting:
                    keys = record_extras(msg)
                    for n, content in enumerate(split_contents(msg.lengths, msg.contents)):
                        self._keep_early(msg.subject, msg.address, msg.sequence + n, content, keys[n] if keys else None)
        elif isinstance(msg, proto.HeadMsg):
            if msg.subject in self.topics:
                self._on_head(msg.subject, msg.address, msg.sequence)
        elif isinstance(msg, (proto.DirectHeadMsg, proto.DirectPartitionsMsg)):
            for subject, address, head in self.store_heads(msg):
                if subject in self.topics:
                    self._on_store_head(subject, address, head)
        elif isinstance(msg, proto.StoreHelloMsg):
            if msg.topic == self.address:
                self._hello(msg.address)
        elif isinstance(msg, proto.DirectTailMsg):
            if msg.topic == self.address and msg.subject in self.topics:
                p = self._partition(msg.subject, msg.address, msg.sequence)
                if p is not None:
                    self._on_tail(p, msg.sequence)
        elif isinstance(msg, proto.DirectGapMsg):
            if msg.topic == self.address and msg.subject in self.topics:
                p = self._partition(msg.subject, msg.address, msg.sequence)
                if p is not None and msg.sequence <= p.next < msg.end:
                    self._skip_gap(p, msg.end)
        elif isinstance(msg, proto.GroupMemberMsg):
            if self.group is not None:
                self.group.on_member(msg, self.now)
        elif isinstance(msg, proto.HeadsAtMsg):
            if msg.topic == self.address:
                for decided in self.latest.on_answer(msg):
                    self._start_latest(*decided)

    def _on_store_head(self, topic: str, address: str, seq: int) -> None:
        """A store's head of a partition (DIRECT-HEAD, or an entry of DIRECT-PARTITIONS)."""
        if self._knows(topic, address):  # a ``latest`` consumer never met it: not ours to start
            self._on_head(topic, address, seq)

    def _on_head(self, topic: str, address: str, seq: int) -> None:
        p = self._partition(topic, address, seq)
        if p is None:
            return
        if seq > p.head:
            p.head = seq
        self._request(p)

    def _on_records(self, p: Partition, msg: proto.DirectRecordsMsg) -> None:
        """A DIRECT-RECORDS: its records from ``p.next`` on are delivered in
        one go, split and built into :class:`Record` in C."""
        first = msg.sequence
        end = first + msg.count
        if end <= p.next:
            return  # all duplicates
        if p.record_size < 0:
            p.record_size = len(msg.contents) // msg.count
        if first > p.next:  # ahead of a gap: keep what the buffer bound allows, fetch the gap
            values = split_contents(msg.lengths, msg.contents)
            for seq, content, key in zip(range(first, end), values, self._extras(msg) or repeat(None)):
                self._on_record(p, seq, content, key)
            return
        start = p.next
        if p.frame_sink is not None:
            p.frame_sink.add_frames(p.address, msg, start - first)
        elif (keys := self._extras(msg)) is None:
            p.sink.extend(split_records(p.topic, p.address, first, msg.lengths, msg.contents, start - first))
        else:
            values = split_contents(msg.lengths, msg.contents)[start - first:]
            p.sink.extend(keyed_records(p.topic, p.address, start, values, keys[start - first:]))
        p.next = end
        self.delivered += end - start
        self.delivered_bytes += len(msg.contents) if start == first else \
            len(msg.contents) - sum(lengths_of(msg.lengths)[:start - first])
        p.window_bytes += len(msg.contents)
        pending = p.pending
        if pending:
            for stale in [s for s in pending if s < end]:
                del pending[stale]
        self._after_delivery(p, end - 1)

    def _extras(self, msg: proto.DirectRecordsMsg) -> list[Any] | None:
        """:func:`record_extras` of ``msg``, with its store's times if the consumer gives them."""
        keys = record_extras(msg)
        if msg.stamps and self.store_times and (not msg.times or _UNTIMED in msg.times):
            keys = stamped_extras(msg, keys)
        return keys

    def _on_record(self, p: Partition, seq: int, content: bytes, key: bytes | None = None) -> None:
        if p.record_size < 0:
            p.record_size = len(content)
        if seq == p.next:
            p.sink.append(make_record((p.topic, p.address, seq, content)) if key is None
                          else keyed_record(p.topic, p.address, seq, content, key))
            p.next = seq + 1
            p.window_bytes += len(content)
            self.delivered += 1
            self.delivered_bytes += len(content)
            self._after_delivery(p, seq)
        elif seq > p.next:
            if seq > p.head:
                p.head = seq
            cap = self._buffer_cap(p.record_size)
            if seq - p.next < cap and len(p.pending) < cap:
                p.pending[seq] = content if key is None else (content, key)
            self._request(p)

    def _buffer_cap(self, record_size: int) -> int:
        """Records of a partition kept out of order: ``consumer/max_buffered``, and as many records of its
        size (its first record's) as ``consumer/max_buffered_bytes`` holds.  A live producer that runs ahead
        of a gap being fetched (a consumer that woke late) would otherwise hold 100 MB of 1000-byte records."""
        if record_size <= 0:
            return self.max_buffered
        return min(self.max_buffered, self.max_buffered_bytes // record_size)

    def _after_delivery(self, p: Partition, seq: int) -> None:
        if seq > p.head:
            p.head = seq
        pending = p.pending
        if pending:
            nxt = p.next
            while nxt in pending:
                content = pending.pop(nxt)
                if type(content) is tuple:  # a keyed record
                    content, key = content
                    p.sink.append(keyed_record(p.topic, p.address, nxt, content, key))
                else:
                    p.sink.append(make_record((p.topic, p.address, nxt, content)))
                p.window_bytes += len(content)
                self.delivered_bytes += len(content)
                nxt += 1
            self.delivered += nxt - p.next
            p.next = nxt
        if p.next >= p.fetch_end:
            if p.head >= p.next:
                self._request(p)
            elif p.probing:
                self._probe(p)  # caught up after a full queue, or a probe's window came back full: there may be more

    def _skip_gap(self, p: Partition, end: int) -> None:
        """Compaction removed the records from ``p.next`` up to ``end`` (rfc 19): nothing is lost (a newer
        record of each one's key follows), and nothing is waited for."""
        self.compacted_skipped += end - p.next
        p.next = p.window_from = end
        for stale in [s for s in p.pending if s < end]:
            del p.pending[stale]
        if end > p.head:
            p.head = end - 1
        self._after_delivery(p, end - 1)

    def _on_tail(self, p: Partition, oldest: int) -> None:
        if oldest <= p.next:
            return
        log.warning(
            "consumer %s: %s/%s records %d..%d are held by nobody any more (deleted by a store's retention, or "
            "let go by a producer without stores); %d lost, resuming at %d",
            self.address, p.topic, p.address, p.next, oldest - 1, oldest - p.next, oldest,
        )
        self.records_lost += oldest - p.next
        p.next = p.window_from = oldest
        p.window_bytes = 0
        for stale in [s for s in p.pending if s < oldest]:
            del p.pending[stale]
        if oldest > p.head:
            p.head = oldest - 1
        self._after_delivery(p, oldest - 1)

    # -- fetching -----------------------------------------------------------

    def _request(self, p: Partition) -> None:
        """FETCH the gap ``[next, head]`` unless a request covering ``next`` is in flight."""
        if p.head < p.next:
            return
        if p not in self.awaiting:
            self.awaiting.add(p)
            p.seen_next = p.next  # the position moving from here on is progress
        if p.fetch_seq <= p.next < p.fetch_end and self.now - p.fetched_at < self.fetch_retry:
            return
        delivered = p.next - p.window_from
        if delivered > 0 and p.window_bytes:
            p.record_size = mean_size(p.record_size, p.window_bytes // delivered)
        self._fetch(p, min(p.head - p.next + 1, self._window(p)))

    def _window(self, p: Partition) -> int:
        """How many records one FETCH of ``p`` asks for at most (rfc 8.4)."""
        return min(FETCH_CHUNK, fetch_window(self.fetch_max_bytes, p.record_size, self.bulk))

    def _fetch(self, p: Partition, count: int) -> None:
        """FETCH ``count`` records of ``p`` from its position; a new window starts there."""
        self.out.append(proto.encode(proto.FetchMsg(p.address, self.address, p.topic, p.next, count)))
        self.fetches_sent += 1
        p.fetch_seq, p.fetch_end, p.fetched_at = p.next, p.next + count, self.now
        p.window_from, p.window_bytes = p.next, 0

    def probe(self) -> None:
        """The receive queue was full: its senders dropped what came after it
        (PUB semantics), and when that was the end of a burst no later record
        shows the gap, only the producer's next HEAD, up to a
        ``producer/head_interval`` later.  So each partition asks for a window
        past its position once it looks caught up and no record came for a
        tick (:meth:`tick`: the stream paused, or ended; while records still
        come, a later one shows any gap, and a window asked for then would
        bring again what is already on its way), or at once when it catches up
        by FETCH; and again while the windows come back full.  The producer
        and the stores answer what they hold, nothing when there is nothing
        (rfc 8.5, "Full queue").  At most once per :data:`GAP_RETRY`."""
        if self.now - self.probed_at < GAP_RETRY:
            return
        self.probed_at = self.now
        for p in self.partitions.values():
            p.probing = True
            p.quiet_next = p.next
            self.quiet_watch.add(p)

    def _probe(self, p: Partition) -> None:
        """A whole window past the position of ``p``, whose known head it has reached."""
        self._fetch(p, self._window(p))
        self.probes += 1

    def tick(self, now: float) -> None:
        """Advance time; repeat a FETCH only when its partition has made no
        progress for ``fetch_retry``, or :data:`GAP_RETRY` when later records
        wait behind the gap (answers still flowing are not re-asked).
        Only partitions in :attr:`awaiting` and :attr:`quiet_watch` are looked
        at: with none and no tail watch (:attr:`heads_due`), nothing needs the
        clock."""
        self.now = now
        if self.latest.waiting:
            for decided in self.latest.tick(now):
                self._start_latest(*decided)
        if self.heads_due is not None and now >= self.heads_due:
            self._ask_tails(now)
        for p in list(self.quiet_watch):
            if p.next != p.quiet_next:
                p.quiet_next = p.next  # records still come
                continue
            self.quiet_watch.discard(p)
            if p.probing and p.head < p.next and p.next >= p.fetch_end:
                self._probe(p)
        for p in list(self.awaiting):
            if p.head < p.next:
                self.awaiting.discard(p)  # caught up
                continue
            if p.next != p.seen_next:
                p.seen_next = p.next
                p.progress_at = now
                continue
            wait = min(GAP_RETRY, self.fetch_retry) if p.pending else self.fetch_retry
            if p.head >= p.next and now - max(p.fetched_at, p.progress_at) >= wait:
                p.forget_fetch()
                self._request(p)


def record_extras(msg: proto.DirectRecordsMsg) -> list[Any] | None:
    """Each record's key, or a :class:`RecordExtra` for one with attributes (rfc 18.4), as
    :func:`keyed_record` takes them; None when no record of ``msg`` has either."""
    keys = msg.key_list() if msg.key_lengths else None
    held = msg.attribute_list()
    if held is None:
        return keys
    return [key if ts == NO_TIME and not headers else
            _extra((key, None if ts == NO_TIME else ts, decode_headers(headers) if headers else ()))
            for key, (ts, headers) in zip(keys or repeat(None), held)]


def stamped_extras(msg: proto.DirectRecordsMsg, extras: list[Any] | None) -> list[Any]:
    """:func:`record_extras` with the time its store received each record (the stamp at or below its
    sequence, ``msg.stamps``) given to the records without a timestamp of their own."""
    first, end = msg.sequence, msg.sequence + msg.count
    extras = list(extras) if extras is not None else [None] * msg.count
    bounds = [max(seq, first) - first for seq, _ in msg.stamps if seq < end]
    times = [t for seq, t in msg.stamps if seq < end]
    for start, stop, time_ms in zip(bounds, [*bounds[1:], msg.count], times):
        extras[start:stop] = [
            _extra((extra, time_ms, ())) if type(extra) is not RecordExtra else
            extra if extra[1] is not None else _extra((extra[0], time_ms, extra[2]))
            for extra in extras[start:stop]]
    return extras


# NO_TIME as frame 6 holds it: a message without it has no record without a timestamp (found unaligned, it
# only costs a look at each record)
_UNTIMED = NO_TIME.to_bytes(8, "little", signed=True)
_extra = partial(tuple.__new__, RecordExtra)  # a RecordExtra from a 3-tuple, without its Python __new__
