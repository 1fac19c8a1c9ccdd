"""SASL for the gateway's Kafka listener: PLAIN (RFC 4616) and SCRAM-SHA-256/-512 (RFC 5802, RFC 7677),
against a credentials file that keeps each password salted and hashed as RFC 5802 says, never in clear.

Sans-I/O: :class:`SaslServer` is one connection's exchange. Feed it the mechanism of a SaslHandshake and
the bytes of each SaslAuthenticate (or of each raw token after a SaslHandshake v0), read back the error
code and the bytes to answer; :attr:`SaslServer.principal` is the user once it is authenticated.

The credentials file is JSON: ``{"format": 1, "users": {NAME: {MECHANISM: {"salt", "iterations",
"stored_key", "server_key"}}}}`` (base64), the same four values Kafka keeps for a SCRAM user in
ZooKeeper or KRaft. ``dafka kafka-user add`` writes it. A PLAIN login is checked against the user's
SCRAM entry: the password given is salted and hashed as SCRAM would and compared with the stored key.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import errors

SCRAM_SHA_256 = "SCRAM-SHA-256"
SCRAM_SHA_512 = "SCRAM-SHA-512"
PLAIN = "PLAIN"
MECHANISMS = (SCRAM_SHA_512, SCRAM_SHA_256, PLAIN)  # what --sasl-users enables, in this order
_HASHES = {SCRAM_SHA_256: "sha256", SCRAM_SHA_512: "sha512"}
ITERATIONS = 4096  # Kafka's default for SCRAM credentials (and RFC 7677's floor)
MIN_ITERATIONS = 4096  # Kafka refuses fewer
MAX_SASL_BYTES = 524_288  # the largest frame before authentication (Kafka's sasl.server.max.receive.size)
FORMAT = 1
FAILED = "Authentication failed: invalid username or password"  # one message: no telling users apart


class CredentialsError(ValueError):
    """A credentials file that cannot be read or does not hold what it should; says which and why."""


@dataclass(frozen=True)
class ScramCredential:
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    @classmethod
    def make(cls, mechanism: str, password: str, iterations: int = ITERATIONS,
             salt: bytes | None = None) -> ScramCredential:
        salted = _salted(mechanism, password, salt := salt or secrets.token_bytes(32), iterations)
        client_key = _hmac(mechanism, salted, b"Client Key")
        return cls(salt, iterations, _hash(mechanism, client_key), _hmac(mechanism, salted, b"Server Key"))

    def checks(self, mechanism: str, password: str) -> bool:
        """Whether ``password`` is the one this credential was made from (a PLAIN login)."""
        salted = _salted(mechanism, password, self.salt, self.iterations)
        return hmac.compare_digest(_hash(mechanism, _hmac(mechanism, salted, b"Client Key")), self.stored_key)

    def as_json(self) -> dict[str, Any]:
        return {"salt": _b64(self.salt), "iterations": self.iterations, "stored_key": _b64(self.stored_key),
                "server_key": _b64(self.server_key)}


Users = dict[str, dict[str, ScramCredential]]  # user -> mechanism -> credential


def load_users(path: str) -> Users:
    """The credentials file at ``path``; :class:`CredentialsError` names what is wrong."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise CredentialsError(f"{path}: no such file (dafka kafka-user add writes it)") from None
    except (OSError, ValueError) as exc:
        raise CredentialsError(f"{path}: cannot read it: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("users"), dict):
        raise CredentialsError(f"{path}: not a credentials file of format {FORMAT} "
                               "(an object with \"format\": 1 and \"users\")")
    users: Users = {}
    for name, entries in data["users"].items():
        if not isinstance(entries, dict) or not entries:
            raise CredentialsError(f"{path}: user {name!r} has no credentials")
        users[name] = {}
        for mechanism, entry in entries.items():
            if mechanism not in _HASHES:
                raise CredentialsError(f"{path}: user {name!r}: unknown mechanism {mechanism!r} "
                                       f"(one of {', '.join(_HASHES)})")
            try:
                credential = ScramCredential(base64.b64decode(entry["salt"], validate=True), int(entry["iterations"]),
                                             base64.b64decode(entry["stored_key"], validate=True),
                                             base64.b64decode(entry["server_key"], validate=True))
            except (KeyError, TypeError, ValueError) as exc:
                raise CredentialsError(f"{path}: user {name!r}, {mechanism}: not salt, iterations, stored_key "
                                       f"and server_key in base64 ({exc})") from None
            if credential.iterations < MIN_ITERATIONS:
                raise CredentialsError(f"{path}: user {name!r}, {mechanism}: {credential.iterations} iterations "
                                       f"(at least {MIN_ITERATIONS})")
            users[name][mechanism] = credential
    return users


def save_users(path: str, users: Users) -> None:
    """Write ``users`` to ``path`` atomically, readable by its owner alone."""
    data = {"format": FORMAT, "users": {name: {m: c.as_json() for m, c in sorted(entries.items())}
                                        for name, entries in sorted(users.items())}}
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".dafka-users-")
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


class SaslServer:
    """One connection's authentication: a SaslHandshake, then the SaslAuthenticate tokens of its mechanism."""

    def __init__(self, users: Users, mechanisms: tuple[str, ...] = MECHANISMS,
                 nonce: Callable[[], str] = lambda: secrets.token_urlsafe(24)) -> None:
        self.users = users
        self.mechanisms = mechanisms
        self.mechanism: str | None = None
        self.principal: str | None = None  # the user, once authenticated
        self.failed = False
        self._nonce = nonce
        # the exchange so far: user, nonce, client-first-bare, server-first, the user's credential
        self._scram: tuple[str, str, str, str, ScramCredential] | None = None

    @property
    def authenticated(self) -> bool:
        return self.principal is not None

    def handshake(self, mechanism: str) -> int:
        """A SaslHandshake: 0, or UNSUPPORTED_SASL_MECHANISM (the answer lists :attr:`mechanisms`), or
        ILLEGAL_SASL_STATE for a second one."""
        if self.mechanism is not None or self.authenticated:
            return errors.ILLEGAL_SASL_STATE
        if mechanism not in self.mechanisms:
            return errors.UNSUPPORTED_SASL_MECHANISM
        self.mechanism = mechanism
        return 0

    def authenticate(self, token: bytes | memoryview) -> tuple[int, str | None, bytes]:
        """One token: (error code, error message, the bytes to answer). After an error the connection goes."""
        token = bytes(token)
        if self.mechanism is None or self.authenticated or self.failed:
            return self._fail(errors.ILLEGAL_SASL_STATE, "a SaslAuthenticate out of turn")
        try:
            if self.mechanism == PLAIN:
                return self._plain(token)
            if self._scram is None:
                return self._scram_first(token)
            return self._scram_final(token)
        except (ValueError, UnicodeDecodeError) as exc:
            return self._fail(errors.SASL_AUTHENTICATION_FAILED, f"a malformed {self.mechanism} message ({exc})")

    def _fail(self, code: int, message: str) -> tuple[int, str | None, bytes]:
        self.failed = True
        return code, message, b""

    def _plain(self, token: bytes) -> tuple[int, str | None, bytes]:
        parts = token.split(b"\0")
        if len(parts) != 3:
            raise ValueError("not authzid NUL authcid NUL passwd")
        authzid, user, password = (p.decode("utf-8") for p in parts)
        entries = self.users.get(user, {})
        mechanism = SCRAM_SHA_512 if SCRAM_SHA_512 in entries else SCRAM_SHA_256
        credential = entries.get(mechanism)
        if credential is None or (authzid and authzid != user) or not credential.checks(mechanism, password):
            return self._fail(errors.SASL_AUTHENTICATION_FAILED, FAILED)
        self.principal = user
        return 0, None, b""

    def _scram_first(self, token: bytes) -> tuple[int, str | None, bytes]:
        text = token.decode("utf-8")
        gs2, _, bare = text.partition(",")  # gs2-cbind-flag "," [authzid] "," client-first-bare
        authzid, sep, bare = bare.partition(",")
        if gs2 not in ("n", "y") or not sep or (authzid and not authzid.startswith("a=")):
            raise ValueError("not a SCRAM client-first message")
        attributes = _attributes(bare)
        user, client_nonce = _unescape(attributes.get("n", "")), attributes.get("r", "")
        if not user or not client_nonce or "m" in attributes:
            raise ValueError("a client-first message without a user or a nonce")
        if attributes.get("tokenauth") == "true":  # Kafka's delegation tokens (KIP-48): none here
            return self._fail(errors.SASL_AUTHENTICATION_FAILED, FAILED)
        if authzid and _unescape(authzid[2:]) != user:
            return self._fail(errors.SASL_AUTHENTICATION_FAILED, FAILED)
        assert self.mechanism is not None
        credential = self.users.get(user, {}).get(self.mechanism)
        if credential is None:
            return self._fail(errors.SASL_AUTHENTICATION_FAILED, FAILED)
        nonce = client_nonce + self._nonce()
        server_first = f"r={nonce},s={_b64(credential.salt)},i={credential.iterations}"
        self._scram = (user, nonce, bare, server_first, credential)
        return 0, None, server_first.encode()

    def _scram_final(self, token: bytes) -> tuple[int, str | None, bytes]:
        assert self._scram is not None and self.mechanism is not None
        user, nonce, first_bare, server_first, credential = self._scram
        text = token.decode("utf-8")
        without_proof, sep, proof = text.rpartition(",p=")
        if not sep:
            raise ValueError("a client-final message without a proof")
        attributes = _attributes(without_proof)
        # The nonce ends with this exchange's (one replayed from another does not). RFC 5802 wants it equal;
        # librdkafka sends its own nonce before the whole server nonce, and Kafka's broker checks the end alone.
        if not attributes.get("r", "").endswith(nonce):
            return self._fail(errors.SASL_AUTHENTICATION_FAILED, FAILED)
        if attributes.get("c") not in ("biws", "eSws"):  # base64 of "n,," / "y,,": no channel binding
            return self._fail(errors.SASL_AUTHENTICATION_FAILED, FAILED)
        auth_message = f"{first_bare},{server_first},{without_proof}".encode()
        client_signature = _hmac(self.mechanism, credential.stored_key, auth_message)
        client_proof = base64.b64decode(proof, validate=True)
        if len(client_proof) != len(client_signature):
            return self._fail(errors.SASL_AUTHENTICATION_FAILED, FAILED)
        client_key = bytes(a ^ b for a, b in zip(client_proof, client_signature))
        if not hmac.compare_digest(_hash(self.mechanism, client_key), credential.stored_key):
            return self._fail(errors.SASL_AUTHENTICATION_FAILED, FAILED)
        self.principal = user
        server_signature = _hmac(self.mechanism, credential.server_key, auth_message)
        return 0, None, f"v={_b64(server_signature)}".encode()


def _attributes(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in text.split(","):
        name, sep, value = part.partition("=")
        if not sep or not name:
            raise ValueError(f"not a SCRAM attribute: {part!r}")
        out[name] = value
    return out


def _unescape(name: str) -> str:
    """A saslname (RFC 5802): '=2C' is ',' and '=3D' is '='; any other '=' is malformed."""
    if "=" in name.replace("=2C", "").replace("=3D", ""):
        raise ValueError("a user name with a bare '='")
    return name.replace("=2C", ",").replace("=3D", "=")


def _salted(mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
    return hashlib.pbkdf2_hmac(_HASHES[mechanism], password.encode("utf-8"), salt, iterations)


def _hmac(mechanism: str, key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, _HASHES[mechanism]).digest()


def _hash(mechanism: str, data: bytes) -> bytes:
    return hashlib.new(_HASHES[mechanism], data).digest()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


__all__ = ["CredentialsError", "MAX_SASL_BYTES", "MECHANISMS", "PLAIN", "SCRAM_SHA_256", "SCRAM_SHA_512",
           "SaslServer", "ScramCredential", "Users", "load_users", "save_users"]
