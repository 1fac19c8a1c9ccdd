"""``dafka kafka --tls-cert``: Kafka over TLS with kcat and confluent-kafka (librdkafka's SSL), plaintext and
untrusted clients refused, and client certificates (``--tls-client-ca``).  Certificates are made by Debian's
openssl in the test's tmp dir."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from helpers import script
from kafkahelpers import kcat, start_gateway

pytestmark = pytest.mark.kafka


def _openssl(*args: str) -> None:
    done = subprocess.run(["openssl", *args], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()


def make_ca(tmp: Path, name: str) -> tuple[Path, Path]:
    key, cert = tmp / f"{name}.key", tmp / f"{name}.pem"
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={name}",
             "-keyout", str(key), "-out", str(cert))
    return cert, key


def make_cert(tmp: Path, name: str, ca: tuple[Path, Path]) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 (subjectAltName), signed by ``ca``."""
    key, csr, cert, ext = tmp / f"{name}.key", tmp / f"{name}.csr", tmp / f"{name}.pem", tmp / f"{name}.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1\n")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", str(key), "-out", str(csr))
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]), "-CAcreateserial",
             "-days", "2", "-extfile", str(ext), "-out", str(cert))
    return cert, key


def test_kafka_over_tls_serves_trusting_clients_and_refuses_plaintext_and_untrusting_ones(kafka_cluster, processes,
                                                                                         tmp_path):
    confluent_kafka = pytest.importorskip("confluent_kafka")
    tower, _ = kafka_cluster
    ca = make_ca(tmp_path, "ca")
    server = make_cert(tmp_path, "gateway", ca)
    other_ca = make_ca(tmp_path, "other")
    log = tmp_path / "gw.log"
    _, bootstrap = start_gateway(processes, tower, log, "--tls-cert", str(server[0]), "--tls-key", str(server[1]))
    assert "over TLS" in log.read_text()
    tls = ("-X", "security.protocol=ssl", "-X", f"ssl.ca.location={ca[0]}")
    assert kcat("-b", bootstrap, *tls, "-P", "-t", "secret", data=b"one\ntwo\n").returncode == 0
    read = kcat("-b", bootstrap, *tls, "-C", "-t", "secret", "-e", "-f", "%s\n")
    assert read.returncode == 0 and read.stdout == b"one\ntwo\n", read.stderr
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "security.protocol": "ssl",
                                         "ssl.ca.location": str(ca[0]), "acks": "all"})
    for i in range(1000):
        producer.produce("secret", b"v%d" % i)
    assert producer.flush(30) == 0
    # a plaintext client, and one that trusts another CA, get nothing and write nothing
    plain = kcat("-b", bootstrap, "-m", "5", "-P", "-t", "secret", data=b"plain\n", timeout=60)
    untrusting = kcat("-b", bootstrap, "-m", "5", "-X", "security.protocol=ssl", "-X", f"ssl.ca.location={other_ca[0]}",
                      "-P", "-t", "secret", data=b"untrusted\n", timeout=60)
    assert plain.returncode != 0 and untrusting.returncode != 0
    assert b"certificate verify failed" in untrusting.stderr, untrusting.stderr
    read = kcat("-b", bootstrap, *tls, "-C", "-t", "secret", "-e", "-f", "%s\n")
    assert read.stdout.split() == [b"one", b"two", *(b"v%d" % i for i in range(1000))]


def test_client_certificates_are_required_with_tls_client_ca_and_bad_flags_name_themselves(kafka_cluster, processes,
                                                                                           tmp_path):
    tower, _ = kafka_cluster
    ca = make_ca(tmp_path, "ca")
    server, client = make_cert(tmp_path, "gateway", ca), make_cert(tmp_path, "client", ca)
    _, bootstrap = start_gateway(processes, tower, tmp_path / "gw.log", "--tls-cert", str(server[0]), "--tls-key",
                                 str(server[1]), "--tls-client-ca", str(ca[0]))
    tls = ("-X", "security.protocol=ssl", "-X", f"ssl.ca.location={ca[0]}")
    without = kcat("-b", bootstrap, "-m", "5", *tls, "-P", "-t", "mtls", data=b"anonymous\n", timeout=60)
    assert without.returncode != 0
    mine = ("-X", f"ssl.certificate.location={client[0]}", "-X", f"ssl.key.location={client[1]}")
    assert kcat("-b", bootstrap, *tls, *mine, "-P", "-t", "mtls", data=b"signed\n").returncode == 0
    read = kcat("-b", bootstrap, *tls, *mine, "-C", "-t", "mtls", "-e", "-f", "%s\n")
    assert read.stdout == b"signed\n", read.stderr
    # bad flags: each names itself, and nothing starts
    for args, named in ((["--tls-key", str(server[1])], "--tls-cert"),
                        (["--tls-cert", str(server[0]), "--tls-key", str(client[1])], "--tls-cert/--tls-key")):
        done = subprocess.run([script("dafka"), "kafka", "--port", "0", *args], capture_output=True, timeout=30)
        assert done.returncode == 2 and named in done.stderr.decode(), done.stderr.decode()


def test_the_gateway_joins_a_curve_cluster_with_its_own_key_and_not_without_one(secure_tower, keys, processes,
                                                                                tmp_path):
    """The gateway's link to the cluster is a dafka peer's: CURVE when the cluster runs it (security/*)."""
    from dafka.store import Store
    from helpers import curve_settings, secure_config

    store = Store(secure_config(secure_tower, keys, "bob"), db=str(tmp_path / "secure")).start()
    try:
        curve = [arg for key, value in curve_settings(keys, "alice").items() for arg in ("-X", f"{key}={value}")]
        _, bootstrap = start_gateway(processes, secure_tower, tmp_path / "gw.log", *curve)
        assert kcat("-b", bootstrap, "-P", "-t", "curved", data=b"c1\nc2\n").returncode == 0
        read = kcat("-b", bootstrap, "-C", "-t", "curved", "-e", "-f", "%s\n")
        assert read.stdout == b"c1\nc2\n", read.stderr
        # mallory's key is not authorized: her gateway hears no tower and says so, and a client writes nothing
        stranger = [arg for key, value in curve_settings(keys, "mallory").items() for arg in ("-X", f"{key}={value}")]
        log = tmp_path / "mallory.log"
        _, elsewhere = start_gateway(processes, secure_tower, log, "--tower-timeout-ms", "2000", *stranger)
        refused = kcat("-b", elsewhere, "-m", "5", "-X", "message.timeout.ms=5000", "-P", "-t", "curved",
                       data=b"mallory\n", timeout=60)
        assert refused.returncode != 0
        assert "no tower answers at" in log.read_text()
        read = kcat("-b", bootstrap, "-C", "-t", "curved", "-e", "-f", "%s\n")
        assert read.stdout == b"c1\nc2\n", read.stderr
    finally:
        store.stop()
