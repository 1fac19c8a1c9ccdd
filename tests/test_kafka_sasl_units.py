"""kafka/sasl.py without sockets: SCRAM against RFC 7677's test vector, PLAIN, refusals, the credentials file."""

from __future__ import annotations

import base64
import json
import os

import pytest
from hypothesis import given, settings, strategies as st

from dafka.kafka import errors
from dafka.kafka.sasl import (
    PLAIN, SCRAM_SHA_256, SCRAM_SHA_512, CredentialsError, SaslServer, ScramCredential, load_users, save_users,
)

# RFC 7677, section 3: user "user", password "pencil"
SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
CLIENT_NONCE = "rOprNGfwEbeRWgbNEkqO"
SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
CLIENT_FINAL = (f"c=biws,r={CLIENT_NONCE}{SERVER_NONCE},p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=").encode()


def rfc_users():
    return {"user": {SCRAM_SHA_256: ScramCredential.make(SCRAM_SHA_256, "pencil", 4096, SALT),
                     SCRAM_SHA_512: ScramCredential.make(SCRAM_SHA_512, "pencil", 4096, SALT)}}


def rfc_server():
    server = SaslServer(rfc_users(), nonce=lambda: SERVER_NONCE)
    assert server.handshake(SCRAM_SHA_256) == 0
    return server


def test_scram_sha_256_follows_rfc_7677s_exchange_byte_for_byte():
    server = rfc_server()
    code, _, first = server.authenticate(f"n,,n=user,r={CLIENT_NONCE}".encode())
    assert code == 0 and first == f"r={CLIENT_NONCE}{SERVER_NONCE},s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096".encode()
    code, _, final = server.authenticate(CLIENT_FINAL)
    assert code == 0 and final == b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
    assert server.authenticated and server.principal == "user"
    assert server.authenticate(b"more")[0] == errors.ILLEGAL_SASL_STATE  # nothing after the end


def test_a_final_nonce_with_the_client_nonce_before_the_servers_is_taken_as_kafka_takes_it():
    """librdkafka's client-final ``r`` is its nonce then the whole server nonce; a Kafka broker checks the end."""
    import hashlib
    import hmac

    server = rfc_server()
    first_bare = f"n=user,r={CLIENT_NONCE}"
    server_first = server.authenticate(f"n,,{first_bare}".encode())[2].decode()
    without_proof = f"c=biws,r={CLIENT_NONCE}{CLIENT_NONCE}{SERVER_NONCE}"
    salted = hashlib.pbkdf2_hmac("sha256", b"pencil", SALT, 4096)
    client_key = hmac.new(salted, b"Client Key", "sha256").digest()
    signature = hmac.new(hashlib.sha256(client_key).digest(), f"{first_bare},{server_first},{without_proof}".encode(),
                         "sha256").digest()
    proof = base64.b64encode(bytes(a ^ b for a, b in zip(client_key, signature))).decode()
    assert server.authenticate(f"{without_proof},p={proof}".encode())[0] == 0 and server.principal == "user"


def test_a_wrong_proof_a_replayed_final_message_and_an_unknown_user_are_refused_alike():
    server = rfc_server()
    server.authenticate(f"n,,n=user,r={CLIENT_NONCE}".encode())
    wrong = CLIENT_FINAL[:-5] + b"AAAA="
    code, message, reply = server.authenticate(wrong)
    assert code == errors.SASL_AUTHENTICATION_FAILED and reply == b"" and not server.authenticated
    # the final message of a finished exchange, replayed in a new one: its nonce is not the new server nonce
    replay = SaslServer(rfc_users())
    replay.handshake(SCRAM_SHA_256)
    assert replay.authenticate(f"n,,n=user,r={CLIENT_NONCE}".encode())[0] == 0
    assert replay.authenticate(CLIENT_FINAL)[:2] == (errors.SASL_AUTHENTICATION_FAILED, message)
    unknown = rfc_server()
    assert unknown.authenticate(f"n,,n=mallory,r={CLIENT_NONCE}".encode())[:2] == (errors.SASL_AUTHENTICATION_FAILED,
                                                                                   message)


def test_plain_checks_the_password_against_the_salted_credentials():
    ok = SaslServer(rfc_users())
    assert ok.handshake(PLAIN) == 0
    assert ok.authenticate(b"\0user\0pencil") == (0, None, b"") and ok.principal == "user"
    for token in (b"\0user\0pen", b"\0nobody\0pencil", b"admin\0user\0pencil", b"user\0pencil"):
        bad = SaslServer(rfc_users())
        bad.handshake(PLAIN)
        assert bad.authenticate(token)[0] == errors.SASL_AUTHENTICATION_FAILED and bad.principal is None


def test_the_handshake_offers_only_what_is_enabled_and_once():
    server = SaslServer(rfc_users(), mechanisms=(SCRAM_SHA_512,))
    assert server.handshake(PLAIN) == errors.UNSUPPORTED_SASL_MECHANISM
    assert server.handshake("GSSAPI") == errors.UNSUPPORTED_SASL_MECHANISM
    assert server.handshake(SCRAM_SHA_512) == 0
    assert server.handshake(SCRAM_SHA_512) == errors.ILLEGAL_SASL_STATE
    assert SaslServer({}).authenticate(b"n,,n=user,r=x")[0] == errors.ILLEGAL_SASL_STATE  # no handshake


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([PLAIN, SCRAM_SHA_256, SCRAM_SHA_512]), st.binary(max_size=300), st.binary(max_size=300))
def test_any_bytes_are_an_answer_never_an_exception(mechanism, first, second):
    server = SaslServer(rfc_users(), nonce=lambda: SERVER_NONCE)
    server.handshake(mechanism)
    for token in (first, second):
        code, message, reply = server.authenticate(token)
        assert isinstance(code, int) and isinstance(reply, bytes)
        if code:
            assert not server.authenticated
            break


def test_the_credentials_file_round_trips_is_private_and_a_bad_one_says_why(tmp_path):
    path = tmp_path / "users.json"
    save_users(str(path), rfc_users())
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert "pencil" not in path.read_text()
    assert load_users(str(path)) == rfc_users()
    for content, said in (("{", "cannot read"), ('{"users": {}}', "format 1"),
                          ('{"format": 1, "users": {"a": {"MD5": {}}}}', "unknown mechanism 'MD5'"),
                          ('{"format": 1, "users": {"a": {"SCRAM-SHA-256": {"salt": "!"}}}}', "base64")):
        path.write_text(content)
        with pytest.raises(CredentialsError, match=said):
            load_users(str(path))
    entry = ScramCredential.make(SCRAM_SHA_256, "x", 4096).as_json()
    path.write_text(json.dumps({"format": 1, "users": {"a": {SCRAM_SHA_256: {**entry, "iterations": 100}}}}))
    with pytest.raises(CredentialsError, match="at least 4096"):
        load_users(str(path))
    with pytest.raises(CredentialsError, match="no such file"):
        load_users(str(tmp_path / "missing.json"))
