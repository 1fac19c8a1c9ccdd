"""A small reactor: poll ZeroMQ sockets and run timers, in one thread.

Every peer owns one :class:`Loop`; its handlers drain their socket with
non-blocking receives so that one wake-up serves a whole burst.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import time
from typing import Any, Callable

import zmq

log = logging.getLogger(__name__)


class Timer:
    __slots__ = ("when", "interval", "callback", "cancelled")

    def __init__(self, when: float, interval: float | None, callback: Callable[[], None]) -> None:
        self.when = when
        self.interval = interval
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class Loop:
    def __init__(self) -> None:
        self._poller = zmq.Poller()
        self._handlers: dict[zmq.Socket[Any], Callable[[zmq.Socket[Any]], None]] = {}
        self._timers: list[tuple[float, int, Timer]] = []
        self._order = itertools.count()

    def add_reader(self, sock: zmq.Socket[Any], handler: Callable[[zmq.Socket[Any]], None]) -> None:
        self._handlers[sock] = handler
        self._poller.register(sock, zmq.POLLIN)

    def sockets(self) -> list[zmq.Socket[Any]]:
        """The sockets with a reader: what an outer event loop must watch (:mod:`dafka.aio`)."""
        return list(self._handlers)

    def remove_reader(self, sock: zmq.Socket[Any]) -> None:
        if self._handlers.pop(sock, None) is not None:
            self._poller.unregister(sock)

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer:
        return self._push(Timer(time.monotonic() + delay, None, callback))

    def call_every(self, interval: float, callback: Callable[[], None], first: float | None = None) -> Timer:
        """Run ``callback`` every ``interval`` seconds, first after ``first`` (default: one interval)."""
        delay = interval if first is None else first
        return self._push(Timer(time.monotonic() + delay, interval, callback))

    def _push(self, timer: Timer) -> Timer:
        heapq.heappush(self._timers, (timer.when, next(self._order), timer))
        return timer

    def next_deadline(self) -> float | None:
        while self._timers and self._timers[0][2].cancelled:
            heapq.heappop(self._timers)
        return self._timers[0][0] if self._timers else None

    def run_once(self, timeout: float | None) -> int:
        """Wait up to ``timeout`` seconds (None = until something happens) for
        sockets or the next timer, then serve what is ready; returns how many
        sockets were ready (0: none had anything to read)."""
        deadline = self.next_deadline()
        now = time.monotonic()
        if deadline is not None:
            wait = max(0.0, deadline - now)
            timeout = wait if timeout is None else min(timeout, wait)
        ms = None if timeout is None else int(timeout * 1000 + 0.999)
        events = self._poller.poll(ms)
        for sock, _ in events:
            handler = self._handlers.get(sock)
            if handler is not None:
                handler(sock)
        self._run_timers()
        return len(events)

    def _run_timers(self) -> None:
        now = time.monotonic()
        while self._timers and self._timers[0][0] <= now:
            _, _, timer = heapq.heappop(self._timers)
            if timer.cancelled:
                continue
            if timer.interval is not None:
                # Skip missed ticks instead of firing a burst after a stall.
                timer.when = max(timer.when + timer.interval, now)
                self._push(timer)
            try:
                timer.callback()
            except Exception:
                log.exception("timer callback %r failed", timer.callback)
