"""A producer that resumes its partition: learning the head from the stores,
free of I/O (rfc/dafka.md section 15).

A :class:`~dafka.producer.producer.Producer` made with ``resume=True`` and a stable
``address`` is the same partition across restarts.  Before its first record
it asks the stores for the partition's head (GET-HEADS, answered with
DIRECT-HEAD by any store and with one DIRECT-PARTITIONS by a dafka-py
store), and its first record gets head + 1.  Everything on the wire is RFC
46: to a reference consumer or store the partition merely paused.

Feed :class:`ResumeState` the events of the start-up phase and ask
:meth:`ResumeState.decide` what follows:

* ``on_connection()``: a peer connected to the producer's data socket (every
  store reader does, and subscribes to GET-HEADS);
* ``on_store_reader()``: a GET-HEADS subscription arrived: returns the
  GET-HEADS frames to publish;
* ``on_message(msg)``: a decoded DIRECT-HEAD or DIRECT-PARTITIONS;
* ``decide(now, peers, replayed, twins)``: the head once known (-1 for a
  partition no store holds), None to keep waiting; raises
  :class:`~dafka.errors.ResumeError` or :class:`~dafka.errors.PartitionClaimed`;
  when it sets ``asks_due``, publish :meth:`ResumeState.ask`'s frames again
  (and again while the way back may not be up).

The rules, and why:

1. Every live peer but other dafka-py producers connects to a producer.
   The head is decided only once the tower has replayed the live peers to
   us, as many peers as it reported have connected (or ``settle`` has
   passed: ``beacon/timeout``, by which a peer the tower reports but that
   never connects, a dead one, has expired; a store reader that is only
   slow to connect, on a loaded machine, is waited for that long, since
   resuming without its head could give a second content to an offset it
   holds), and every store reader among them has been asked.
2. A dafka-py store's DIRECT-PARTITIONS is its whole answer; a reference
   store's DIRECT-HEADs have no end marker, so while reference stores are
   among the readers the state waits ``ANSWER_WAIT`` after the last ask.
3. The head is the highest any store reports: a record that reached one
   store only, unacked, is never given a second content under the same
   offset.
4. At least ``max(1, min_acks)`` store readers must be found within the
   timeout, or it raises :class:`ResumeError`: resuming from too few stores
   could restart at an offset the partition already used.
5. While it learns the head the producer beacons and asks under a fresh
   temporary address (``requester``), so that a live producer of the
   partition never takes the newcomer for a second writer.  A live peer
   beaconing the partition's address is another process claiming it.  The
   head is never decided before ``twin_wait`` (1.5 x ``beacon/interval``):
   by then such a process has been heard even if the towers' replay missed
   it.  A killed predecessor's beacon expires within ``beacon/timeout``; one
   still beaconing at the timeout raises :class:`PartitionClaimed`.  Once a
   twin is gone the stores are asked again: it may have written until then.
   Once running, the producer beacons the partition's address, and stops
   writing if it ever sees another peer beacon it too: two processes never
   write one partition.
"""

from __future__ import annotations

from .. import protocol as proto
from ..errors import PartitionClaimed, ResumeError

SETTLE = 1.0  # seconds after the replay to wait for the peers reported to connect, at least (see ``settle``)
ANSWER_WAIT = 0.5  # seconds after the last GET-HEADS for reference stores' DIRECT-HEADs
NO_HEAD = -1  # no store holds the partition: the first record is offset 0


class ResumeState:
    def __init__(self, address: str, topic: str, *, requester: str, min_stores: int, started: float,
                 timeout: float, twin_wait: float = 0.0, settle: float = SETTLE) -> None:
        """``settle``: seconds after the replay to wait for the reported peers to connect, at most (the
        producer gives ``beacon/timeout``; never less than :data:`SETTLE`)."""
        self.address = address
        self.settle = max(SETTLE, settle)
        # A live peer beacons every beacon/interval, and the towers relay every beacon to every peer: after
        # longer than that, another live process with our address has been heard, replay or not.
        self.twin_wait = twin_wait
        self.requester = requester
        self.topic = topic
        self.min_stores = max(1, min_stores)
        self.started = started
        self.deadline = started + timeout
        self.timeout = timeout
        self.connections = 0  # peers that connected to our data socket
        self.readers = 0  # GET-HEADS subscriptions seen: store readers
        self.answered: set[str] = set()  # store readers (addresses) whose DIRECT-PARTITIONS came
        self.head = NO_HEAD
        self.heads_seen = 0  # answers that named our partition
        self.last_ask: float | None = None
        self.asks_due = False  # the stores must be asked again (the producer publishes ask() and clears it)
        self._twin_seen = False  # a twin beacons now (the stores are asked again once it is gone)
        self._had_twin = False  # one did, at some time of this probe
        self._replayed_at: float | None = None

    def ask(self, now: float) -> list[bytes]:
        """The GET-HEADS to publish now (to every store: it goes out on our data socket)."""
        self.last_ask = now
        return proto.encode(proto.GetHeadsMsg(self.topic, self.requester))

    def on_connection(self) -> None:
        self.connections += 1

    def on_store_reader(self, now: float) -> list[bytes]:
        """A store reader subscribed to GET-HEADS on our data socket: ask (all stores, again)."""
        self.readers += 1
        return self.ask(now)

    def on_message(self, msg: object) -> None:
        if isinstance(msg, proto.DirectHeadMsg):
            if msg.topic == self.requester and msg.subject == self.topic and msg.address == self.address:
                self._saw(msg.sequence)
        elif isinstance(msg, proto.DirectPartitionsMsg):
            if msg.topic != self.requester or msg.subject not in ("", self.topic):
                return
            self.answered.add(msg.address)
            for info in msg.partitions:
                if info.subject == self.topic and info.address == self.address:
                    self._saw(info.head)

    def _saw(self, head: int) -> None:
        self.heads_seen += 1
        self.head = max(self.head, head)

    def decide(self, now: float, *, peers: int, replayed: bool, twins: list[str]) -> int | None:
        """The head to resume after (:data:`NO_HEAD`: none stored), or None to wait.

        ``peers``: live peers the tower reported that connect to a producer
        (every one but other dafka-py producers); ``replayed``: the tower has
        replayed them; ``twins``: endpoints of live peers with our address."""
        late = now >= self.deadline
        if twins:
            if late:
                raise PartitionClaimed(
                    f"partition {self.address} of topic {self.topic!r} is claimed by a live producer at "
                    f"{', '.join(twins)}; it still beacons after producer/resume_timeout "
                    f"({self.timeout * 1000:.0f} ms): stop it, or give this producer another address")
            self._twin_seen = self._had_twin = True
            return None
        if self._twin_seen:
            # The twin stopped (a gateway that lets go of a partition, a predecessor that expired): what the
            # stores answered while it could still write is behind, and resuming there would give its last
            # records' offsets a second content.  Every store is asked again; the answers so far stand (the
            # head only grows), but each dafka-py store's whole answer is awaited anew.
            self._twin_seen = False
            self.answered.clear()
            self.last_ask = None
            self.asks_due = True
            return None
        if now < self.started + self.twin_wait:
            return None
        if replayed and self._replayed_at is None:
            self._replayed_at = now
        settled = self._replayed_at is not None and (
            self.connections >= peers or now >= self._replayed_at + self.settle)
        if settled and self.readers >= self.min_stores and self.last_ask is not None:
            if self.answered and len(self.answered) >= self.readers:
                return self.head  # every store reader is a dafka-py one and gave its whole answer
            # Silence stands for a new partition only where no live twin had it: one that did may have
            # written, and the stores' answers may be what is missing (a nemesis run saw a gateway resume a
            # partition of 1,600 records at -1 without a word from any store)
            # ...unless enough dafka-py stores gave their whole answer: a reader counted here may have died
            # since it subscribed (a store killed while a CDC connector restarted waited out the resume timeout
            # for an empty partition)
            if now >= self.last_ask + ANSWER_WAIT and (
                    self.heads_seen or not self._had_twin or len(self.answered) >= self.min_stores):
                return self.head
        if late:
            if self._replayed_at is None and not replayed:
                raise ResumeError(
                    f"cannot resume partition {self.address} of topic {self.topic!r}: no tower replayed the live "
                    f"peers within producer/resume_timeout ({self.timeout * 1000:.0f} ms); check beacon/pub_address "
                    "and beacon/sub_address")
            if self.readers >= self.min_stores:
                raise ResumeError(
                    f"cannot resume partition {self.address} of topic {self.topic!r}: its last writer went, and "
                    f"within producer/resume_timeout ({self.timeout * 1000:.0f} ms) no store named the partition "
                    f"and {len(self.answered)} of {self.readers} store(s) found gave a whole answer, "
                    f"{self.min_stores} needed (max(1, producer/min_acks)); start the stores, or raise "
                    "producer/resume_timeout")
            raise ResumeError(
                f"cannot resume partition {self.address} of topic {self.topic!r}: {self.readers} store(s) "
                f"answered within producer/resume_timeout ({self.timeout * 1000:.0f} ms), {self.min_stores} "
                "needed (max(1, producer/min_acks)); start the stores, or raise producer/resume_timeout")
        return None
