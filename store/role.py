"""What the store's writer and reader threads share: a bound data socket with
its beacon, a SUB socket kept connected to every peer, and a loop thread that
another thread stops through an inproc wake-up pipe."""

from __future__ import annotations

import threading
from typing import Any, Callable

import zmq

from dafka import protocol as proto
from dafka.discovery.beacon import Beacon, Companion
from dafka.config import Config
from dafka.core.sockets import drain, wake_pipe
from dafka.discovery.links import DataSocket, PeerLinks


class RoleThread:
    def __init__(self, ctx: zmq.Context, config: Config, data: zmq.Socket, sub: zmq.Socket,
                 address: str, name: str, beside: Beacon | None = None) -> None:
        self.address = address
        self._sub = sub
        self._data_sock = data
        # beside: the other thread's beacon, which announces this one's socket too (Beacon.add_companion)
        self._data = DataSocket(ctx, config, data, address, name, profiles=[(proto.ROLE_STORE, "")], beside=beside)
        self._links = PeerLinks(self._data.secure(sub))
        self._wake, self._waker = wake_pipe(ctx, name)
        self._waker_lock = threading.Lock()
        self._sockets = [sub, data, self._wake]  # what the thread closes when it ends (subclasses add theirs)
        self._stopping = False
        self.error: BaseException | None = None
        self.on_end: Callable[[], None] | None = None  # called in the thread when its loop ends, however
        self._thread = threading.Thread(target=self._main, name=f"dafka-{name}-{address[:8]}", daemon=True)

    def _main(self) -> None:
        try:
            self._run()
        finally:
            if self.on_end is not None:
                self.on_end()

    def _run(self) -> None:
        raise NotImplementedError

    def describe(self, describe: Callable[[], dict[str, Any]]) -> None:
        """What this role's PEER-INFO reports as its details (rfc 17)."""
        self._data.describe = describe

    @property
    def endpoint(self) -> str:
        return self._data.endpoint

    @property
    def beacon(self) -> Beacon | Companion:
        return self._data.beacon

    @property
    def peers(self) -> int:
        return len(self._links)

    def start(self) -> None:
        self._data.beacon.start()
        self._thread.start()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float) -> bool:
        """Stop the loop (it finishes what it holds first); True if it ended."""
        self._stopping = True
        if self._thread.is_alive():
            with self._waker_lock:
                try:
                    # Never block: a thread that ended on its own meanwhile has
                    # closed its end, and a blocking send would wait forever.
                    self._waker.send(b"", zmq.NOBLOCK)
                except zmq.Again:
                    pass
            self._thread.join(timeout)
        ended = not self._thread.is_alive()
        self._data.close()
        with self._waker_lock:
            self._waker.close(0)
        if ended and not self._thread.ident:
            # never started: its sockets are still ours to close
            for sock in self._sockets:
                sock.close(0)
        return ended

    def _on_wake(self, sock: zmq.Socket) -> None:
        drain(sock)
