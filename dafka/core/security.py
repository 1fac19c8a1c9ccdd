"""Optional CurveZMQ encryption and authentication on every socket.

The cluster shares one *server* key pair: every bound socket (data sockets,
the tower) serves with it, so a peer that does not hold the cluster's secret
key cannot publish to anyone.  Each peer also has its own key pair, used
whenever it connects; bound sockets ask ZAP (pyzmq's authenticator) to admit
only the public keys found in ``security/authorized_keys``, so a peer whose
key is not there can neither read from nor publish into the cluster.

Keys are ZeroMQ certificate files as written by ``zmq.auth`` (``dafka keygen``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import zmq

from ..config import Config, ConfigError

if TYPE_CHECKING:
    from zmq.auth.thread import ThreadAuthenticator

log = logging.getLogger(__name__)

ZAP_DOMAIN = "dafka"


@dataclass(frozen=True)
class Curve:
    server_public: bytes
    server_secret: bytes
    peer_public: bytes
    peer_secret: bytes
    authorized_keys: str

    @classmethod
    def from_config(cls, config: Config) -> "Curve | None":
        """None when ``security/curve`` is off; a ConfigError naming the key when a file is missing."""
        if not config["security/curve"]:
            return None
        if not zmq.has("curve"):
            raise ConfigError("libzmq was built without CURVE support", key="security/curve")
        server_public, server_secret = _load_secret(config, "security/cluster_key")
        peer_public, peer_secret = _load_secret(config, "security/peer_key")
        authorized = config["security/authorized_keys"]
        if not authorized or not os.path.isdir(authorized):
            raise ConfigError(f"{authorized!r} is not a directory of public keys", key="security/authorized_keys")
        return cls(server_public, server_secret, peer_public, peer_secret, authorized)

    def serve(self, sock: zmq.Socket[Any]) -> None:
        """Make a socket that will bind a CURVE server (call before bind)."""
        sock.curve_secretkey = self.server_secret
        sock.curve_publickey = self.server_public
        sock.curve_server = True
        sock.zap_domain = ZAP_DOMAIN.encode()

    def client(self, sock: zmq.Socket[Any]) -> None:
        """Make a socket that will connect a CURVE client (call before connect)."""
        sock.curve_secretkey = self.peer_secret
        sock.curve_publickey = self.peer_public
        sock.curve_serverkey = self.server_public


def _load_secret(config: Config, key: str) -> tuple[bytes, bytes]:
    path = config[key]
    if not path:
        raise ConfigError("must name a secret key file (.key_secret) when security/curve is on", key=key)
    try:
        import zmq.auth  # only with CURVE: it imports asyncio, a tenth of a peer's start-up

        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read secret key file {path!r}: {exc}", key=key) from None
    if secret is None:
        raise ConfigError(f"{path!r} holds no secret key (use the .key_secret file)", key=key)
    return public, secret


_auth_lock = threading.Lock()
_authenticators: dict[int, list[Any]] = {}


def acquire_authenticator(ctx: zmq.Context[Any], curve: Curve | None) -> None:
    """Start (or share) the ZAP authenticator of ``ctx``; pair with :func:`release_authenticator`."""
    if curve is None:
        return
    with _auth_lock:
        entry = _authenticators.get(id(ctx))
        if entry is None:
            auth = _start_authenticator(ctx)
            auth.configure_curve(domain=ZAP_DOMAIN, location=curve.authorized_keys)
            entry = _authenticators[id(ctx)] = [auth, 0]
        entry[1] += 1


_ZAP_REBIND_TIMEOUT = 5.0  # seconds


def _start_authenticator(ctx: zmq.Context[Any]) -> "ThreadAuthenticator":
    from zmq.auth.thread import ThreadAuthenticator

    """A started authenticator.  Its ZAP socket binds ``inproc://zeromq.zap.01``,
    which the previous authenticator of this context may still hold for a
    moment after ``stop()``: libzmq closes sockets asynchronously."""
    deadline = time.monotonic() + _ZAP_REBIND_TIMEOUT
    delay = 0.001
    while True:
        auth = ThreadAuthenticator(ctx, log=logging.getLogger("dafka.core.security.zap"))
        try:
            auth.start()
            return auth
        except zmq.ZMQError as exc:
            auth.stop()  # closes the ZAP socket that could not bind
            if exc.errno != zmq.EADDRINUSE or time.monotonic() > deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def release_authenticator(ctx: zmq.Context[Any], curve: Curve | None) -> None:
    if curve is None:
        return
    with _auth_lock:
        entry = _authenticators.get(id(ctx))
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            entry[0].stop()
            del _authenticators[id(ctx)]


def generate_keys(directory: str, name: str) -> tuple[str, str]:
    """Write ``name.key`` (public) and ``name.key_secret`` in ``directory``."""
    os.makedirs(directory, exist_ok=True)
    import zmq.auth

    return zmq.auth.create_certificates(directory, name)
