"""A consumer's part in its group: the I/O around :class:`dafka.groups.state.GroupState`.

It runs inside the consumer's reads, in the caller's thread, like the rest of
the consumer: after every turn of the consumer's loop it starts and stops the
partitions the group state moved (calling the rebalance callbacks), hands it
the records of the offsets topic, publishes its heartbeats on the consumer's
data socket, and keeps one timer for it.  Commits go to the group state (so
that the next heartbeat carries them to the other members at once) and, as a
record of the group's offsets topic, to the stores, through a producer of its
own: a group that restarts whole resumes from them.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any, Callable, Iterable, Protocol

import zmq

from ..records import PartitionKey
from ..config import Config
from ..consumer.state import ConsumerState
from ..core.loop import Loop
from ..discovery.links import DataSocket
from ..protocol.commits import encode_commits, offsets_topic
from ..records import Record, TopicPartition
from .state import GroupState

log = logging.getLogger(__name__)

Callback = Callable[[list[TopicPartition]], Any]
# Without a tower that marks the end of its replay (a reference tower), the view counts as formed this
# long after the start.
UNMARKED_REPLAY_WAIT = 1.0
# How long close waits for a store to ack its last commits (without stores they never are; the last
# heartbeat carried them to the live members anyway).
CLOSE_WAIT = 2.0


class ConsumerRebalanceListener:
    """Called when the group moves partitions to or away from this member, in
    kafka-python's shape; both run inside :meth:`dafka.Consumer.poll`."""

    def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        """Before the member stops reading ``revoked`` (commit here, if auto commit is off)."""

    def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        """After the member started reading ``assigned``, each from its last commit."""


class GroupedConsumer(Protocol):
    """What a member uses of its :class:`~dafka.consumer.consumer.Consumer`: its identity, and the state,
    sockets and loop it runs in (a type of its own, so that this module does not import the consumer's)."""

    address: str
    config: Config
    _ctx: zmq.Context[Any]
    _state: ConsumerState
    _xpub: zmq.Socket[Any]
    _loop: Loop
    _data: DataSocket

    def _positions(self) -> dict[PartitionKey, int]: ...


class Membership:
    def __init__(
        self,
        consumer: GroupedConsumer,
        group: str,
        *,
        on_assign: Callback | None,
        on_revoke: Callback | None,
        auto_commit: bool,
        auto_commit_interval: float,
    ) -> None:
        c = consumer.config
        now = time.monotonic()
        self.state = GroupState(
            group, consumer.address,
            interval=c["beacon/interval"] / 1000.0,
            timeout=(c["beacon/timeout"] + 1000) / 1000.0,
            join_wait=c["consumer/group/join_wait"] / 1000.0,
            now=now,
        )
        self.offsets_topic = offsets_topic(group)
        self.inbox: deque[Record[bytes]] = deque()  # records of the offsets topic
        self.on_assign = on_assign
        self.on_revoke = on_revoke
        self.auto_commit = auto_commit
        self.auto_commit_interval = auto_commit_interval
        self.commit_due = now + auto_commit_interval
        self.started = now
        self._consumer = consumer
        self._timer: Any = None
        from ..producer.producer import Producer  # only a group member produces: a plain consumer never imports it

        self._producer = Producer(self.offsets_topic, c, ctx=consumer._ctx)
        log.info("group %s: member %s, commits in %s/%s", group, consumer.address, self.offsets_topic,
                 self._producer.address)

    def stats(self) -> dict[str, int]:
        group = self.state
        return {"group_members": len(group.members) + 1, "group_partitions": len(group.owned),
                "group_rebalances": group.rebalances, "group_malformed": group.malformed}

    def assignment(self) -> set[TopicPartition]:
        return {TopicPartition(*key) for key in self.state.owned - self.state.revoking}

    # -- after each turn of the consumer's loop ----------------------------------

    def settle(self) -> None:
        """Feed the group state what came in, then act on what it decided."""
        group = self.state
        cs = self._consumer._state
        if self.inbox:
            group.on_offsets([r.value for r in self.inbox])
            self.inbox.clear()
        now = time.monotonic()
        if now >= group.next_due():
            self._tick(now)
        self.commit_if_due()  # also while a read waits: what earlier reads returned is consumed
        if group.assigned:
            keys, group.assigned = group.assigned, []
            unknown = set()
            for topic, partition in keys:
                head = group.known.get((topic, partition), -1)
                cs.start(topic, partition, group.committed.get((topic, partition)), head)
                if head < 0:
                    unknown.add(topic)
            # Known only from another member's heartbeat: its producer may have sent everything and
            # gone quiet; the stores tell its head (a live producer also sends one for the subscription).
            cs.get_heads(unknown)
            log.info("group %s: %s reads %s", group.group, group.address, _names(keys))
            self._call(self.on_assign, keys)
        if group.revoked:
            keys, group.revoked = group.revoked, []
            self._call(self.on_revoke, keys)
            if self.auto_commit:
                self.commit(keys)
            for topic, partition in keys:
                cs.stop(topic, partition)
            log.info("group %s: %s hands over %s", group.group, group.address, _names(keys))
            group.released_by_us(keys, time.monotonic())
            self.settle()  # handing over may have given back what we now start
            return
        if group.out:
            xpub = self._consumer._xpub
            for frames in group.out:
                xpub.send_multipart(frames)
            group.out.clear()
        self._schedule()

    def _tick(self, now: float) -> None:
        consumer = self._consumer
        beacon = consumer._data.beacon
        replayed = beacon.replayed or (beacon.connected and now - self.started >= UNMARKED_REPLAY_WAIT)
        loaded = not any(p.topic == self.offsets_topic for p in consumer._state.awaiting)
        self.state.tick(now, peers_replayed=replayed, offsets_loaded=loaded)

    def _schedule(self) -> None:
        when = self.state.next_due()
        if self.auto_commit:
            when = min(when, self.commit_due)
        if self._timer is not None and not self._timer.cancelled and self._timer.when <= when:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._consumer._loop.call_later(max(0.0, when - time.monotonic()), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None  # settle() runs after the loop's turn, and schedules the next

    def _call(self, callback: Callback | None, keys: list[PartitionKey]) -> None:
        if callback is None:
            return
        try:
            callback([TopicPartition(*key) for key in keys])
        except Exception:
            log.exception("group %s: rebalance callback %r failed", self.state.group, callback)

    # -- commits ----------------------------------------------------------------

    def commit(self, keys: Iterable[PartitionKey] | None = None,
               offsets: dict[PartitionKey, int] | None = None) -> dict[PartitionKey, int]:
        """Commit the positions of the partitions we read (of ``keys`` only, if
        given), or the explicit ``offsets``; returns what moved."""
        if offsets is None:
            positions = self._consumer._positions()
            wanted = self.state.owned if keys is None else set(keys) & self.state.owned
            offsets = {key: positions[key] for key in wanted if key in positions}
        moved = self.state.commit(offsets, time.monotonic())
        if moved:
            # The whole view, not only what moved: the stores then keep only this partition's newest record
            # and, in time, only the group's newest partition (store/compaction.py, rfc 14.6).
            self._producer.send(encode_commits(self.state.address, dict(self.state.committed), snapshot=True))
        return moved

    def before_read(self) -> None:
        """At every read, before a record is handed out: after a stall longer than the
        group's timeout (SIGSTOP, a starved process) the others own our partitions, so
        find that out first, which drops their records waiting in the ready queue (handed
        out, they would come twice: tests/test_groups.py's stopped member).  Then commit
        if due."""
        if time.monotonic() - self.state.last_tick > self.state.timeout:
            self.settle()
        else:
            self.commit_if_due()

    def commit_if_due(self) -> None:
        now = time.monotonic()
        if self.auto_commit and now >= self.commit_due:
            self.commit_due = now + self.auto_commit_interval
            self.commit()

    def close(self) -> None:
        """Commit (with auto commit), hand every partition over at once, and
        wait a little for the commits to reach a store."""
        group = self.state
        if self.auto_commit:
            self.commit()
        keys = sorted(group.owned)
        if keys:
            self._call(self.on_revoke, keys)
        self._consumer._xpub.send_multipart(group.leave())
        self._consumer._xpub.linger = 1000  # the last heartbeat must get out: the others take over on it
        try:
            self._producer.close(timeout=min(group.timeout, CLOSE_WAIT))
        except Exception as exc:  # FlushTimeout: the heartbeat carried the commits to live members
            log.warning("group %s: commits not stored on close: %s", group.group, exc)
        if self._timer is not None:
            self._timer.cancel()


def _names(keys: list[PartitionKey]) -> str:
    return ", ".join(f"{t}/{p}" for t, p in keys)
