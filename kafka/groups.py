"""Kafka's classic consumer group protocol, with the gateway as coordinator, free of I/O.

Feed it JoinGroup, SyncGroup, Heartbeat and LeaveGroup requests and time;
read back the answers, each for the request ``token`` it was given (a join
or sync waits for the others of its generation, so answers come out of
later calls too, and of :meth:`Coordinator.tick`).

The states are Kafka's (``GroupCoordinator``): Empty, PreparingRebalance
(waiting for every known member to rejoin, at most the longest rebalance
timeout), CompletingRebalance (the leader's SyncGroup brings the
assignments), Stable.  Assignors run in the clients (range, roundrobin,
sticky, cooperative-sticky: the coordinator only carries their bytes); the
protocol chosen is the one every member supports that most members prefer.
A member silent for its session timeout is removed, and so is one that did
not rejoin before the rebalance timeout.  Static members (``group.instance.id``)
that come back with a new member id take their old place without a
rebalance, unless they lead.
"""

from __future__ import annotations

import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Hashable

from . import errors

EMPTY, PREPARING, COMPLETING, STABLE = "Empty", "PreparingRebalance", "CompletingRebalance", "Stable"

Reply = tuple[Hashable, dict[str, Any]]  # (the request's token, its answer's fields)


@dataclass
class Member:
    member_id: str
    instance_id: str | None
    client_id: str
    host: str
    protocols: list[tuple[str, bytes]]
    session_timeout: float
    rebalance_timeout: float
    last_seen: float
    assignment: bytes = b""
    join: Hashable | None = None  # the token of its JoinGroup waiting for the generation
    sync: Hashable | None = None  # the token of its SyncGroup waiting for the leader's

    def metadata(self, protocol: str) -> bytes:
        return next((m for name, m in self.protocols if name == protocol), b"")


@dataclass
class Group:
    name: str
    state: str = EMPTY
    generation: int = 0
    protocol_type: str = ""
    protocol: str = ""
    leader: str = ""
    members: dict[str, Member] = field(default_factory=dict)
    static: dict[str, str] = field(default_factory=dict)  # instance id -> member id
    deadline: float = 0.0  # when a PreparingRebalance completes with whoever rejoined
    initial_until: float = 0.0  # an empty group's first rebalance waits this long for more members


class Coordinator:
    def __init__(self, initial_delay: float = 0.0) -> None:
        """``initial_delay``: how long a rebalance of an empty group waits for more members
        (Kafka's group.initial.rebalance.delay.ms)."""
        self.groups: dict[str, Group] = {}
        self.initial_delay = initial_delay

    # -- JoinGroup -------------------------------------------------------------------------

    def join(self, token: Hashable, group_id: str, member_id: str, instance_id: str | None, client_id: str,
             host: str, protocol_type: str, protocols: list[tuple[str, bytes]], session_timeout: float,
             rebalance_timeout: float, now: float) -> list[Reply]:
        if not group_id:
            return [(token, _join_error(errors.INVALID_GROUP_ID, member_id))]
        group = self.groups.setdefault(group_id, Group(group_id))
        if group.members and (protocol_type != group.protocol_type
                              or not self._common(group, protocols, skip=member_id)):
            return [(token, _join_error(errors.INCONSISTENT_GROUP_PROTOCOL, member_id))]
        if not protocols:
            return [(token, _join_error(errors.INCONSISTENT_GROUP_PROTOCOL, member_id))]
        replies: list[Reply] = []
        if not member_id:
            old = group.members.get(group.static.get(instance_id or "", ""))
            member_id = f"{client_id or 'member'}-{uuid.uuid4()}"
            if old is not None:  # a static member back under a new id: its place, its assignment
                del group.members[old.member_id]
                replies += self._fail_pending(old, errors.FENCED_INSTANCE_ID)
                old.member_id = member_id
                group.members[member_id] = old
                group.static[instance_id or ""] = member_id
                was_leader = group.leader == old.member_id or group.leader not in group.members
                if was_leader:
                    group.leader = member_id
                member = old
                unchanged = member.protocols == protocols
                member.last_seen = now
                if group.state in (STABLE, COMPLETING) and unchanged and not was_leader:
                    return replies + [(token, self._join_answer(group, member, leader_view=False))]
            else:
                member = Member(member_id, instance_id, client_id, host, protocols, session_timeout,
                                rebalance_timeout, now)
                group.members[member_id] = member
                if instance_id:
                    group.static[instance_id] = member_id
        else:
            found = group.members.get(member_id)
            if found is None:
                return [(token, _join_error(errors.UNKNOWN_MEMBER_ID, member_id))]
            member = found
            if instance_id and group.static.get(instance_id) != member_id:
                return [(token, _join_error(errors.FENCED_INSTANCE_ID, member_id))]
            unchanged = member.protocols == protocols
            member.protocols, member.last_seen = protocols, now
            member.session_timeout, member.rebalance_timeout = session_timeout, rebalance_timeout
            if group.state in (STABLE, COMPLETING) and unchanged and member_id != group.leader:
                return [(token, self._join_answer(group, member, leader_view=False))]
        if member.join is not None:
            replies.append((member.join, _join_error(errors.REBALANCE_IN_PROGRESS, member.member_id)))
        member.join = token
        group.protocol_type = protocol_type
        if group.state != PREPARING:
            replies += self._prepare(group, now)
        return replies + self._maybe_complete(group, now)

    def _common(self, group: Group, protocols: list[tuple[str, bytes]], skip: str) -> set[str]:
        names = {name for name, _ in protocols}
        for m in group.members.values():
            if m.member_id != skip:
                names &= {name for name, _ in m.protocols}
        return names

    def _prepare(self, group: Group, now: float) -> list[Reply]:
        replies = []
        for m in group.members.values():
            replies += self._fail_pending(m, errors.REBALANCE_IN_PROGRESS, joins=False)
        delay = self.initial_delay if group.state == EMPTY else 0.0
        group.state = PREPARING
        longest = max((m.rebalance_timeout for m in group.members.values()), default=0.0)
        group.deadline = now + max(longest, delay)
        group.initial_until = now + delay
        return replies

    def _maybe_complete(self, group: Group, now: float) -> list[Reply]:
        if group.state != PREPARING:
            return []
        everyone = all(m.join is not None for m in group.members.values())
        if (everyone and now >= group.initial_until) or now >= group.deadline:
            return self._complete(group, now)
        return []

    def _complete(self, group: Group, now: float) -> list[Reply]:
        replies: list[Reply] = []
        for m in [m for m in group.members.values() if m.join is None]:
            self._remove(group, m)
        group.generation += 1
        if not group.members:
            group.state, group.protocol, group.leader = EMPTY, "", ""
            return replies
        votes: Counter[str] = Counter()
        candidates = set.intersection(*({name for name, _ in m.protocols} for m in group.members.values()))
        for m in group.members.values():
            votes[next(name for name, _ in m.protocols if name in candidates)] += 1
        first = next(iter(group.members.values()))
        preference = [name for name, _ in first.protocols]  # ties: the first member's order
        group.protocol = max(votes, key=lambda name: (votes[name], -preference.index(name)))
        if group.leader not in group.members:
            group.leader = first.member_id
        group.state = COMPLETING
        for m in group.members.values():
            m.assignment, m.last_seen = b"", now
            token, m.join = m.join, None
            replies.append((token, self._join_answer(group, m, leader_view=m.member_id == group.leader)))
        return replies

    def _join_answer(self, group: Group, member: Member, leader_view: bool) -> dict[str, Any]:
        members = [{"member_id": m.member_id, "group_instance_id": m.instance_id, "metadata": m.metadata(group.protocol)}
                   for m in group.members.values()] if leader_view else []
        return {"throttle_time_ms": 0, "error_code": 0, "generation_id": group.generation,
                "protocol_name": group.protocol, "leader": group.leader, "member_id": member.member_id,
                "members": members}

    # -- SyncGroup ---------------------------------------------------------------------------

    def sync(self, token: Hashable, group_id: str, generation: int, member_id: str, instance_id: str | None,
             assignments: dict[str, bytes], now: float) -> list[Reply]:
        group = self.groups.get(group_id)
        member = group.members.get(member_id) if group is not None else None
        if group is None or member is None:
            return [(token, _sync(errors.UNKNOWN_MEMBER_ID))]
        if instance_id and group.static.get(instance_id) != member_id:
            return [(token, _sync(errors.FENCED_INSTANCE_ID))]
        if generation != group.generation:
            return [(token, _sync(errors.ILLEGAL_GENERATION))]
        member.last_seen = now
        if group.state == PREPARING:
            return [(token, _sync(errors.REBALANCE_IN_PROGRESS))]
        if group.state == STABLE:
            return [(token, _sync(0, member.assignment))]
        replies: list[Reply] = []
        if member.sync is not None:
            replies.append((member.sync, _sync(errors.REBALANCE_IN_PROGRESS)))
        member.sync = token
        if member_id == group.leader:
            for m in group.members.values():
                m.assignment = assignments.get(m.member_id, b"")
            group.state = STABLE
            for m in group.members.values():
                if m.sync is not None:
                    replies.append((m.sync, _sync(0, m.assignment)))
                    m.sync = None
        return replies

    # -- Heartbeat, LeaveGroup ----------------------------------------------------------------

    def heartbeat(self, group_id: str, generation: int, member_id: str, instance_id: str | None, now: float) -> int:
        group = self.groups.get(group_id)
        member = group.members.get(member_id) if group is not None else None
        if group is None or member is None:
            return errors.UNKNOWN_MEMBER_ID
        if instance_id and group.static.get(instance_id) != member_id:
            return errors.FENCED_INSTANCE_ID
        member.last_seen = now
        if group.state == PREPARING:
            return errors.REBALANCE_IN_PROGRESS
        if generation != group.generation:
            return errors.ILLEGAL_GENERATION
        return 0

    def leave(self, group_id: str, leaving: list[tuple[str, str | None]], now: float) -> tuple[list[int], list[Reply]]:
        """``leaving``: (member id, instance id) pairs (an empty member id: the static member of that instance);
        returns an error code per pair and the answers that waited on them."""
        group = self.groups.get(group_id)
        codes, replies = [], []
        for member_id, instance_id in leaving:
            if group is None:
                codes.append(errors.UNKNOWN_MEMBER_ID)
                continue
            if not member_id and instance_id:
                member_id = group.static.get(instance_id, "")
            member = group.members.get(member_id)
            if member is None:
                codes.append(errors.UNKNOWN_MEMBER_ID)
                continue
            if instance_id and group.static.get(instance_id) != member_id:
                codes.append(errors.FENCED_INSTANCE_ID)
                continue
            replies += self._fail_pending(member, errors.UNKNOWN_MEMBER_ID)
            self._remove(group, member)
            codes.append(0)
        if group is not None and any(c == 0 for c in codes):
            replies += self._rebalance(group, now)
        return codes, replies

    def _rebalance(self, group: Group, now: float) -> list[Reply]:
        if not group.members:
            if group.state != EMPTY:
                group.generation += 1
            group.state, group.protocol, group.leader = EMPTY, "", ""
            return []
        replies = self._prepare(group, now) if group.state != PREPARING else []
        return replies + self._maybe_complete(group, now)

    def _remove(self, group: Group, member: Member) -> None:
        group.members.pop(member.member_id, None)
        if member.instance_id and group.static.get(member.instance_id) == member.member_id:
            del group.static[member.instance_id]

    @staticmethod
    def _fail_pending(member: Member, code: int, joins: bool = True) -> list[Reply]:
        replies: list[Reply] = []
        if joins and member.join is not None:
            replies.append((member.join, _join_error(code, member.member_id)))
            member.join = None
        if member.sync is not None:
            replies.append((member.sync, _sync(code)))
            member.sync = None
        return replies

    # -- time ----------------------------------------------------------------------------------

    def tick(self, now: float) -> list[Reply]:
        """Expire silent members and complete rebalances whose time is up."""
        replies: list[Reply] = []
        for group in list(self.groups.values()):
            expired = [m for m in group.members.values()
                       if m.join is None and now - m.last_seen > m.session_timeout]
            for m in expired:
                replies += self._fail_pending(m, errors.UNKNOWN_MEMBER_ID)
                self._remove(group, m)
            if expired:
                replies += self._rebalance(group, now)
            replies += self._maybe_complete(group, now)
        return replies

    def next_deadline(self) -> float | None:
        times = []
        for group in self.groups.values():
            if group.state == PREPARING:
                times += [group.deadline, group.initial_until]
            times += [m.last_seen + m.session_timeout for m in group.members.values() if m.join is None]
        return min(times, default=None)

    # -- commits and descriptions -------------------------------------------------------------

    def check_commit(self, group_id: str, generation: int, member_id: str, now: float) -> int:
        """The error code of an OffsetCommit (0: it may be written)."""
        group = self.groups.get(group_id)
        if generation < 0 and not member_id:  # a consumer that assigns itself (no group membership)
            if group is not None and group.members:
                return errors.UNKNOWN_MEMBER_ID
            return 0
        member = group.members.get(member_id) if group is not None else None
        if group is None or member is None:
            return errors.UNKNOWN_MEMBER_ID
        member.last_seen = now
        if generation != group.generation:
            return errors.ILLEGAL_GENERATION
        if group.state == COMPLETING:
            return errors.REBALANCE_IN_PROGRESS
        return 0

    def hand_over(self, group_id: str) -> list[Reply]:
        """Forget a group another gateway coordinates now: its members' waiting joins and syncs get
        NOT_COORDINATOR, on which a client looks its coordinator up again and joins there."""
        group = self.groups.pop(group_id, None)
        replies: list[Reply] = []
        for member in group.members.values() if group is not None else ():
            replies += self._fail_pending(member, errors.NOT_COORDINATOR)
        return replies

    def delete(self, group_id: str) -> int:
        group = self.groups.get(group_id)
        if group is not None and group.members:
            return errors.NON_EMPTY_GROUP
        self.groups.pop(group_id, None)
        return 0


def _join_error(code: int, member_id: str) -> dict[str, Any]:
    return {"throttle_time_ms": 0, "error_code": code, "generation_id": -1, "protocol_name": "", "leader": "",
            "member_id": member_id, "members": []}


def _sync(code: int, assignment: bytes = b"") -> dict[str, Any]:
    return {"throttle_time_ms": 0, "error_code": code, "assignment": assignment}
