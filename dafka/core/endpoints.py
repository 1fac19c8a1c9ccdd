"""Endpoints and interfaces: which address a peer advertises and binds.

The reference lets the tower derive a peer's host from the TCP connection and
replaces loopback with the machine's first other interface, so that peers on
one machine end up talking through the LAN address.  dafka-py peers instead
advertise the local address of their route to the tower (127.0.0.1 when the
tower is on loopback), found with a UDP ``connect`` + ``getsockname`` that
sends nothing.
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct
from typing import Any

import zmq

_SIOCGIFADDR = 0x8915


def split_endpoints(value: str) -> list[str]:
    """A comma-separated endpoint list (``zsock_attach`` syntax) as a list."""
    return [part.strip().lstrip("@>") for part in value.split(",") if part.strip()]


def parse_tcp_endpoint(endpoint: str) -> tuple[str, int | None]:
    """``tcp://host:port`` -> (host, port); port is None for ``*``."""
    if not endpoint.startswith("tcp://"):
        raise ValueError(f"{endpoint!r} is not a tcp:// endpoint")
    rest = endpoint[len("tcp://") :]
    host, sep, port = rest.rpartition(":")
    if not sep or not host:
        raise ValueError(f"{endpoint!r} has no host:port")
    host = host.strip("[]")
    if port == "*":
        return host, None
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{endpoint!r} has an invalid port {port!r}")
    return host, int(port)


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def route_local_address(host: str, port: int) -> str:
    """The local IPv4 address the kernel would use to reach ``host:port``.

    A UDP connect only picks a route; no packet is sent."""
    if host in ("*", "0.0.0.0", ""):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((host, port))
            return str(probe.getsockname()[0])
        except OSError:
            return "127.0.0.1"


def first_non_loopback_ipv4() -> str | None:
    """The first interface address that is not loopback (like CZMQ's ziflist)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(
                    probe.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15])
                )
            except OSError:
                continue
            address = socket.inet_ntoa(packed[20:24])
            if not ipaddress.ip_address(address).is_loopback:
                return address
    return None


def advertised_host(configured: str, tower_endpoints: str) -> str:
    """``beacon/address`` if set, else the local address of the route to the
    first tower in ``beacon/sub_address``."""
    if configured:
        return configured
    for endpoint in split_endpoints(tower_endpoints):
        try:
            host, port = parse_tcp_endpoint(endpoint)
        except ValueError:
            continue
        return route_local_address(host, port or 5556)
    return "127.0.0.1"


def bind_host(configured: str, advertised: str) -> str:
    """``beacon/bind_address`` if set; else loopback when advertising loopback
    (nobody else could reach us), else every interface as the reference does."""
    if configured:
        return configured
    return "127.0.0.1" if is_loopback(advertised) else "*"


def bind_ephemeral(sock: zmq.Socket[Any], host: str) -> int:
    """Bind ``tcp://host:*`` and return the port the kernel chose."""
    sock.bind(f"tcp://{host}:*")
    endpoint = sock.last_endpoint
    port = parse_tcp_endpoint(endpoint.decode() if isinstance(endpoint, bytes) else str(endpoint))[1]
    assert port is not None  # the kernel chose one
    return port
