"""A sharded store writer's protocol logic (rfc section 16), free of I/O.

:class:`ShardedWriterState` is the store writer's state
(:class:`~dafka.store.writer_state.WriterState`) for ``store/replicas`` R > 0:
it holds the partitions that :class:`~dafka.discovery.placement.Placement` says
this store owns, and the ones it is handing over, and nothing else.

* It learns every partition from HEADs (the writer subscribes ``H`` for all
  topics) and from other stores' answers to GET-HEADS; the ones it does not
  hold it only remembers, with their highest known head (:attr:`elsewhere`).
* It subscribes to the live records of the partitions it holds only:
  :attr:`sub_changes` says what to (un)subscribe, as a group member's.
* When its view of the stores changes (a STORE-MEMBER from a new store, a
  store gone for ``store/dead_ms``, a store leaving), it places again: a
  partition it now owns is fetched from those that hold it (the refill of
  rfc 7.1), and one it no longer owns is handed over: kept, acked and served
  until every owner holds it to the head this store had, then deleted
  ``store/handoff_ms`` later (:attr:`released`: the writer deletes them).
* A store places nothing during its first ``settle`` seconds: before it has
  heard the other stores, it would think it owns everything.
"""

from __future__ import annotations

import logging
from typing import Iterable

from dafka.records import PartitionKey
from dafka.protocol import batching
from dafka import protocol as proto

from . import keys
from dafka.discovery.placement import Placement, StoreMember
from .writer_state import Partition, WriterState

log = logging.getLogger(__name__)

ASK_EVERY = 1.0  # seconds between GET-HEADS rounds while a handoff waits for the owners' heads


class ShardedWriterState(WriterState):
    role = "sharded store writer"

    def __init__(self, address: str, placement: Placement, *, reader: str, settle: float, started: float,
                 batches: bool = True, **kw) -> None:
        self.placement = placement
        self.reader = reader
        self.settle_until = started + settle
        self.settled = False
        # What a held partition subscribes: its RECORDs, and its KEYED-RECORDS when the store reads batches.
        self._live_ids = (proto.RECORD, batching.LIVE_BATCHES) if batches else (proto.RECORD,)
        self.sub_changes: list[tuple[bool, bytes]] = []
        self.elsewhere: dict[PartitionKey, int] = {}  # partitions other stores hold: the highest head known
        self.filling: dict[PartitionKey, int] = {}  # partitions this store took up: the head it fills them to
        self.released: list[Partition] = []  # handed over: the writer deletes them from the database
        self.moves_in = 0  # partitions taken up
        self.moves_out = 0  # partitions handed over and deleted
        self._view: frozenset[PartitionKey] = frozenset()
        self._asked = float("-inf")
        super().__init__(address, **kw)

    # -- partitions ---------------------------------------------------------

    def _add(self, subject: str, address: str, head: int) -> Partition:
        p = super()._add(subject, address, head)
        self.sub_changes.extend((True, prefix) for prefix in self._live_prefixes(subject, address))
        return p

    def forget(self, p: Partition) -> None:
        super().forget(p)
        self.sub_changes.extend((False, prefix) for prefix in self._live_prefixes(p.subject, p.address))

    def _live_prefixes(self, subject: str, address: str) -> list[bytes]:
        return [proto.record_prefix(msg_id, subject, address, subject) for msg_id in self._live_ids]

    def _partition(self, subject: str, address: str, seen: int = -1) -> Partition | None:
        key = (subject, address)
        p = self.partitions.get(key)
        if p is not None:
            return p
        if self.settled and self.placement.owns(key):
            p = super()._partition(subject, address)  # (refuses, and counts, a name the layout cannot hold)
            if p is not None and seen >= 0:
                self.filling[key] = max(seen, self.elsewhere.pop(key, -1))
            return p
        if key not in self.elsewhere:
            if not (keys.valid_name(keys.to_bytes(subject)) and keys.valid_name(keys.to_bytes(address))):
                self.malformed += 1
                return None
            self.elsewhere[key] = seen
        elif seen > self.elsewhere[key]:
            self.elsewhere[key] = seen
        return None

    def on_message(self, msg: proto.Message) -> None:
        kind = type(msg)
        if kind is proto.StoreMemberMsg:
            self._on_member(msg)
            return
        if kind is proto.DirectPartitionsMsg and msg.topic == self.address:
            for info in msg.partitions:
                self.placement.on_head(msg.address, (info.subject, info.address), info.head)
        super().on_message(msg)  # (a HEAD or a store's heads of a partition held elsewhere: _partition notes it)

    def _on_member(self, msg: proto.StoreMemberMsg) -> None:
        line = self.placement.on_member(StoreMember(
            msg.store, msg.rack, msg.replicas, msg.address, msg.reader, self.now, frozenset(msg.filling),
            msg.leaving))
        if line is not None:
            log.warning("store writer %s: %s", self.address, line)
        if msg.leaving:
            log.info("store writer %s: store %s leaves", self.address, msg.store)

    # -- heartbeats -----------------------------------------------------------

    def heartbeat(self) -> None:
        """Queue this store's STORE-MEMBER.  A store that stops sends no last one with ``leaving``: it may be
        restarting, and a restart moves nothing (it is placed anew after ``store/dead_ms`` only)."""
        self.out.append(proto.encode(proto.StoreMemberMsg(
            self.address, self.placement.store, self.placement.rack, self.placement.replicas, self.reader,
            tuple(self.filling_now()))))

    def filling_now(self) -> list[PartitionKey]:
        """The partitions this store took up and does not yet hold to the head it knew then."""
        done = [key for key, target in self.filling.items()
                if key not in self.partitions or self.partitions[key].written >= target]
        for key in done:
            del self.filling[key]
        return list(self.filling)

    # -- placing --------------------------------------------------------------

    def place(self, now: float) -> None:
        """Expire the stores not heard for ``store/dead_ms``; when the view changed, take up the partitions
        this store now owns and begin handing over those it no longer owns; finish the handoffs that are due."""
        placement = self.placement
        for store in placement.expire(now):
            log.warning("store writer %s: store %s not heard for %.0f s: its partitions are placed again",
                        self.address, store, placement.dead_after)
        if not self.settled:
            if now < self.settle_until:
                return
            self.settled = True
        view = frozenset(placement.view().items())
        if view != self._view:
            self._view = view
            self._take_up()
            self._ask(now)  # what the stores hold now, and how far (handoffs wait for the owners' heads)
        self._hand_over(now)

    def _take_up(self) -> None:
        """After a change of the view: take up the partitions held elsewhere that this store now owns (a
        move when others hold records of them)."""
        placement = self.placement
        for key, head in list(self.elsewhere.items()):
            if placement.owns(key):
                del self.elsewhere[key]
                p = self._add(key[0], key[1], -1)
                self.filling[key] = head
                if head > p.known_head:
                    p.known_head = head
                    self._request(p)
                if head >= 0:
                    self.moves_in += 1
                    log.info("store writer %s: takes up %s/%s (head %d)", self.address, key[0], key[1], head)

    def _ask(self, now: float) -> None:
        if now - self._asked >= ASK_EVERY:
            self._asked = now
            self.ask_heads()

    def _hand_over(self, now: float) -> None:
        """Begin handing over the partitions this store no longer owns, asking the owners how far they hold
        them, and release those the owners hold whole (Placement.holds)."""
        placement, handoffs = self.placement, self.placement.handoffs
        waiting = False
        for key, p in list(self.partitions.items()):
            begun = key in handoffs
            if placement.holds(key, now, p.written):
                if key in handoffs:
                    waiting = True
                    if not begun:
                        log.info("store writer %s: hands %s/%s over to %s", self.address, key[0], key[1],
                                 ", ".join(placement.owners(key)))
                continue
            handoffs.pop(key, None)
            self.forget(p)
            self.elsewhere[key] = max(p.written, p.known_head)
            self.released.append(p)
            self.moves_out += 1
        if waiting:
            self._ask(now)

    def under_replicated(self, now: float) -> list[PartitionKey]:
        """The partitions this store knows of that have fewer than R live owners holding them."""
        known: Iterable[PartitionKey] = list(self.partitions) + list(self.elsewhere)
        return self.placement.under_replicated(known, now, self.filling_now())
