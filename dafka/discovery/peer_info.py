"""What a dafka-py peer says of itself: PEER-INFO (rfc section 17).

A requester (``dafka ui``) subscribes ``I<its address>`` (exact) on a peer's
data socket; the peer answers that subscription with one PEER-INFO: its role,
version, host, process id, start time, resident memory, CPU seconds, the URL
of its Prometheus endpoint if the process serves one, what the process is
(``application``: a mirror, a CDC connector), and what the role itself
reports (a store's disk and partitions, say).  The requester subscribes again
to refresh it.  Nothing is sent unless asked: a peer whose console is closed
pays nothing, and a reference peer never subscribes ``I``.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import Any, Callable

import zmq

from .. import protocol as proto

log = logging.getLogger(__name__)

Describe = Callable[[], dict[str, Any]]

STARTED = time.time()  # when this process imported dafka: its peers' start time, near enough
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_HOST = socket.gethostname()
_process: dict[str, Any] = {"application": "", "describe": None, "metrics": ""}


def set_application(name: str, describe: Describe | None = None) -> None:
    """Say what this process is (``"mirror"``, ``"cdc"``): every PEER-INFO of its peers carries it, and
    ``describe()``'s map as ``application_details``."""
    _process["application"] = name
    _process["describe"] = describe


def set_metrics_url(url: str) -> None:
    """Where this process serves its Prometheus metrics (:func:`dafka.metrics.serve` calls it)."""
    _process["metrics"] = url


def rss_bytes() -> int:
    """This process's resident memory, from /proc (0 where there is none)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


def _call(describe: Describe | None, what: str) -> dict[str, Any]:
    if describe is None:
        return {}
    try:
        return describe()
    except Exception:  # noqa: BLE001 - a report must never stop a peer
        log.exception("PEER-INFO: describing the %s failed", what)
        return {}


def info(describe: Describe | None = None) -> dict[str, Any]:
    """The body of this process's PEER-INFO, with ``describe()``'s map as ``details``."""
    from .. import __version__  # here: the facade's type-checking block imports the roles, which import this
    times = os.times()
    return {
        "version": __version__,
        "host": _HOST,
        "pid": os.getpid(),
        "started": STARTED,
        "now": time.time(),
        "rss": rss_bytes(),
        "cpu": times.user + times.system,
        "metrics": _process["metrics"],
        "application": _process["application"],
        "application_details": _call(_process["describe"], "application"),
        "details": _call(describe, "role"),
    }


def answer(sock: zmq.Socket[Any], sub: proto.Subscription, address: str, role: str,
           describe: Describe | None = None) -> bool:
    """If ``sub`` asks for PEER-INFO, send it on ``sock`` (the XPUB it arrived on); True if it did."""
    if not (sub.subscribe and sub.msg_id == proto.PEER_INFO and sub.topic and sub.exact):
        return False
    body = info(describe)
    try:
        frames = proto.encode(proto.PeerInfoMsg(sub.topic, address, role, body))
    except ValueError:  # too big: the details are what can grow
        log.warning("PEER-INFO of %s is over %d bytes: sent without its details", address, proto.MAX_PEER_INFO)
        body["details"] = {}
        body["application_details"] = {}
        frames = proto.encode(proto.PeerInfoMsg(sub.topic, address, role, body))
    try:
        sock.send_multipart(frames, zmq.NOBLOCK)
    except zmq.Again:
        pass  # the requester's queue is full: it asks again
    return True
