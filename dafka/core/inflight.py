"""How much of its FETCH answers each requester may have in flight.

A peer answers a FETCH by publishing DIRECT-RECORDs that match only the
requester's subscription, so libzmq queues them in that requester's pipe, up
to the high-water mark (1,000,000 messages by the reference's defaults), and
never says how much of it was read.  A requester that asks and does not read
(stopped, hostile or just slow) would make the answering peer hold up to a
million messages for it, and again for every other such requester.

So the answering peer keeps a ledger: the bytes it sent to each requester that
the requester has not yet shown it received, and sends nothing more to a
requester whose bytes reach ``limit``.  A requester shows what it received
with its next FETCH of the same partition: every peer of the protocol
(reference consumers and store writers included) asks from the first
sequence it lacks, so everything below that sequence has arrived.

Only *listeners* are charged: requesters whose subscription to their
DIRECT-RECORDs the answering peer's XPUB has seen.  For anybody else libzmq
queues nothing (an answer to an address nobody subscribed is dropped at
once), and a FETCH that arrives before its requester's subscription must not
leave that requester owing for answers that went nowhere.  A subscription or
an unsubscription (a new pipe, or a gone one) clears what the requester owed.

Bytes are counted as libzmq spends them on a queued message: both frames
plus :data:`MESSAGE_OVERHEAD` (measured with pyzmq 27 / libzmq 4.3.5: 363 B
of RSS per queued message with a 100-byte record, 1293 B with 1000 bytes).
"""

from __future__ import annotations

from typing import Hashable

MESSAGE_OVERHEAD = 192  # bytes of libzmq bookkeeping per queued two-frame message
FILTER_BLOCK = 100_000  # a reference requester FETCHes a block of sequences at most once a second
REFERENCE_CAP = 4  # ...so its answers may run to the end of their block, within this many budgets

_UNLIMITED = 1 << 62


class InflightLedger:
    """Bytes sent per requester and partition, credited by later FETCHes.

    ``limit`` is the most bytes one requester may have in flight; 0 means no
    limit (the reference's behaviour)."""

    def __init__(self, limit: int, per_pipe: bool = False) -> None:
        self.limit = limit
        # A socket with XPUB_VERBOSER (a producer's) sees every pipe's (un)subscription: a requester with two
        # pipes (a reconnection overlapping the old one) listens until both went.  With XPUB_VERBOSE (a store
        # reader's), the unsubscription comes once, when its last pipe goes.
        self.per_pipe = per_pipe
        self.bytes_sent = 0  # every answer's bytes, ever (a counter for metrics)
        self._listeners: dict[str, int] = {}  # requester -> its subscribed pipes (1 without per_pipe)
        self._bytes: dict[str, int] = {}
        # requester -> partition -> runs [first, end, nbytes] of sequences sent
        self._runs: dict[str, dict[Hashable, list[list[int]]]] = {}

    def listening(self, requester: str, subscribed: bool) -> bool:
        """``requester`` subscribed (True) or unsubscribed its DIRECT-RECORDs:
        a new pipe holds nothing yet, a gone one nothing any more.  Returns
        whether it still listens."""
        self.forget(requester)
        pipes = self._listeners.get(requester, 0)
        pipes = (pipes + 1 if self.per_pipe else 1) if subscribed else (pipes - 1 if self.per_pipe else 0)
        if pipes > 0:
            self._listeners[requester] = pipes
            return True
        self._listeners.pop(requester, None)
        return False

    def listens(self, requester: str) -> bool:
        """True while ``requester`` is subscribed to its DIRECT-RECORDs."""
        return requester in self._listeners

    def room(self, requester: str) -> int:
        """Bytes that may still be sent to ``requester`` (<= 0: none)."""
        if not self.limit or requester not in self._listeners:
            return _UNLIMITED
        return self.limit - self._bytes.get(requester, 0)

    def room_at(self, requester: str, sequence: int, bulk: bool) -> tuple[int, int | None]:
        """(bytes that may be sent, sequence to stop before or None) for an
        answer to ``requester`` that goes on at ``sequence``.

        A requester without bulk answers may be a reference peer, whose FETCH
        filter drops a second FETCH in the same block of
        :data:`FILTER_BLOCK` sequences within the same second: an answer
        paused inside a block would wait for that second to pass.  So its
        answers pause only at the end of a block, unless it already has
        :data:`REFERENCE_CAP` budgets in flight."""
        room = self.room(requester)
        if room > 0 or bulk or sequence % FILTER_BLOCK == 0:
            return room, None
        room += (REFERENCE_CAP - 1) * self.limit
        return room, (sequence // FILTER_BLOCK + 1) * FILTER_BLOCK

    def in_flight(self, requester: str) -> int:
        return self._bytes.get(requester, 0)

    def total(self) -> int:
        """Bytes in flight to every requester together (safe from another thread)."""
        return sum(list(self._bytes.values()))

    def sent(self, requester: str, partition: Hashable, first: int, end: int, nbytes: int) -> None:
        """Sequences ``first .. end-1`` of ``partition`` went to ``requester``, ``nbytes`` in all."""
        self.bytes_sent += nbytes
        if end <= first or requester not in self._listeners:
            return
        runs = self._runs.setdefault(requester, {}).setdefault(partition, [])
        last = runs[-1] if runs else None
        if last is not None and last[1] == first:
            last[1] = end
            last[2] += nbytes
        else:
            runs.append([first, end, nbytes])
        self._bytes[requester] = self._bytes.get(requester, 0) + nbytes

    def received_below(self, requester: str, partition: Hashable, sequence: int) -> None:
        """``requester`` asks ``partition`` from ``sequence``: what it was sent
        below that has arrived.  Resent ranges count once per sending."""
        by_partition = self._runs.get(requester)
        runs = by_partition.get(partition) if by_partition else None
        if not runs or by_partition is None:
            return
        credit = 0
        kept = []
        for run in runs:
            first, end, nbytes = run
            if end <= sequence:
                credit += nbytes
            elif first < sequence:
                part = nbytes * (sequence - first) // (end - first)
                credit += part
                kept.append([sequence, end, nbytes - part])
            else:
                kept.append(run)
        if kept:
            by_partition[partition] = kept
        else:
            del by_partition[partition]
            if not by_partition:
                del self._runs[requester]
        left = self._bytes.get(requester, 0) - credit
        if left > 0 and requester in self._runs:
            self._bytes[requester] = left
        else:
            self._bytes.pop(requester, None)

    def forget(self, requester: str) -> None:
        """Clear what ``requester`` owes."""
        self._bytes.pop(requester, None)
        self._runs.pop(requester, None)


# -- the requesting side ------------------------------------------------------

UNKNOWN_RECORD_SIZE = 1024  # bytes assumed until some of a partition's records have been seen
_PER_RECORD = 64 + MESSAGE_OVERHEAD  # frame 1 of a DIRECT-RECORD, and libzmq's bookkeeping
_PER_BULK_RECORD = 4  # its length in a DIRECT-RECORDS (the message's own cost is spread over thousands)


def fetch_window(max_bytes: int, record_size: int, bulk: bool = False) -> int:
    """How many records one FETCH asks for so that its answer takes about
    ``max_bytes`` in flight (``record_size`` < 0: not known yet), as its
    answering peers charge it: a DIRECT-RECORD per record, or, for a
    requester that reads ``bulk`` answers, DIRECT-RECORDS that cost little
    more than their records (rfc 6.7).  Asking for no more than an answering
    peer's in-flight budget lets the answer flow without pausing."""
    size = UNKNOWN_RECORD_SIZE if record_size < 0 else record_size
    return max(1, max_bytes // (size + (_PER_BULK_RECORD if bulk else _PER_RECORD)))


def mean_size(previous: int, size: int) -> int:
    """A running estimate of a partition's record size (``previous`` < 0: none yet)."""
    return size if previous < 0 else (3 * previous + size) // 4
