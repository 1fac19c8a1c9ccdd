"""When a beacon sends its own beacon and when it reads the tower's socket: the burst, postpone and drift
schedule, sans I/O.  :class:`Beacon` feeds it the time and what each read of the tower found, and asks it
whether to beacon now and until when it may sleep; tests drive it with a made-up clock."""

from __future__ import annotations

from dataclasses import dataclass

# Once every tower has replayed the live peers to us (or a reference tower has answered for two
# beacon intervals), the tower's socket (and the peers' expiry) is looked at at most this often
# (seconds): the beacons of P peers arrive a few at a time, spread over beacon/interval, and a batch
# pays one wake-up for all of them.  A peer that appears meanwhile is met this much later at most.
# Only beacons that come faster than that start such a wait: a small cluster (a few beacons a
# second) is read as each beacon comes, and meets a newcomer at once.
READ_EVERY = 0.05
# Two reads this close (seconds) found parts of the same burst of beacons, not beacons that come often.
SAME_BURST = 0.005
# A dafka-py tower relays repeated beacons together once a slot (rfc 5.3).  A settled beacon sends its
# own as such a burst comes in, so that one wake-up serves both.  One due within ADVANCE of an interval
# after a burst goes out with it: never so early that a tower takes the peer for one that beacons faster
# than the slot (0.9 of it).  Behind dafka-py towers, one due at most POSTPONE of an interval before the
# next burst is expected waits for it (or goes out READ_EVERY after that time if none came); one due in
# between is out of step, and beacons DRIFT times slower until it falls within POSTPONE: a listener
# waits at most 1.5 intervals for a beacon, once, while a peer falls in step, 1.1 while it drifts.
ADVANCE = 0.09
POSTPONE = 0.5
DRIFT = 1.1
WELCOME_POLL = 0.05  # libzmq does not wake poll() for the XPUB welcome message: it is looked for this often
WARN_EVERY = 10.0  # seconds between two warnings that no tower answers (the first 2 s after the start)


@dataclass
class BeaconSchedule:
    """The beacon's timers.  ``interval`` is ``beacon/interval``; every time is ``time.monotonic()``'s."""

    started: float
    interval: float
    settled: bool = False  # every tower replayed to us, or a reference tower answered for two intervals
    postponed: bool = False  # our beacon waits for the next burst (see POSTPONE)
    next_beacon: float = 0.0
    next_read: float = 0.0  # the tower's socket is left alone until then while a batch of beacons gathers
    next_warning: float = 0.0
    last_found: float = float("-inf")  # the last read that found beacons
    last_burst: float = float("-inf")  # ... once settled

    def __post_init__(self) -> None:
        self.next_beacon = self.next_read = self.started
        self.next_warning = self.started + 2.0

    def read_due(self, now: float) -> bool:
        return now >= self.next_read

    def on_read(self, now: float, found: int, urgent: bool, replayed: bool, welcomed: bool) -> None:
        """A read of the tower's socket found ``found`` beacons; ``urgent``: one of a peer we did not know
        (our beacon goes out at once)."""
        if urgent:
            self.next_beacon = now
        self.settled = self.settled or replayed or (welcomed and now > self.started + 2 * self.interval)
        if not found:
            return
        if self.settled and SAME_BURST < now - self.last_found < READ_EVERY:
            self.next_read = now + READ_EVERY  # beacons come faster than that: batch them
        self.last_found = now
        if self.settled:
            self.last_burst = now
            if self.postponed or self.next_beacon - now <= ADVANCE * self.interval:
                self.next_beacon = now  # waiting for this burst, or due soon: out with it

    def expire_ahead(self) -> float:
        """How far ahead of their deadline peers may be expired (a settled beacon reads only every READ_EVERY)."""
        return READ_EVERY if self.settled else 0.0

    def beacon_due(self, now: float, replayed: bool) -> bool:
        """Whether to send our beacon now (then it is taken as sent)."""
        if now < self.next_beacon:
            return False
        burst = self.last_burst + self.interval  # when the next burst is expected
        if self.settled and not self.postponed and replayed and -READ_EVERY < burst - now <= POSTPONE * self.interval:
            self.next_beacon = max(burst, now) + READ_EVERY  # see POSTPONE
            self.postponed = True
            return False
        # out of step with the bursts: the next one a little later, until in step (DRIFT)
        drifting = self.settled and replayed and ADVANCE * self.interval < now - self.last_burst < self.interval
        self.next_beacon = now + self.interval * (DRIFT if drifting else 1.0)
        self.postponed = False
        return True

    def warning_due(self, now: float, welcomed: bool) -> bool:
        """Whether to say again that no tower answers."""
        if welcomed or now < self.next_warning:
            return False
        self.next_warning = now + WARN_EVERY
        return True

    def beacon_now(self, now: float) -> None:
        """A tower subscribed to our beacons: announce at once."""
        self.next_beacon = now

    def read_now(self, now: float) -> None:
        """A new profile's subscriptions: read what the towers replay for it at once."""
        self.next_read = now

    def wake(self, now: float, expiry: float | None, welcomed: bool) -> tuple[float, bool]:
        """Until when the beacon may sleep, and whether the tower's socket may wake it before then (not while
        a batch of beacons gathers: see READ_EVERY)."""
        wake = self.next_beacon
        gathering = now < self.next_read
        if gathering:
            wake = min(wake, self.next_read)
        elif expiry is not None and expiry < wake:
            wake = expiry
        if not welcomed:
            wake = min(wake, now + WELCOME_POLL)
        return wake, not gathering
