"""README's first command and ``dafka keygen``, run as the installed scripts."""

from __future__ import annotations

import re
import subprocess

import zmq.auth

from helpers import script


def test_demo_runs_the_quickstart_with_a_store():
    done = subprocess.run([script("dafka"), "demo", "--records", "4"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("hello ")]
    assert [re.sub(r"^hello [0-9A-F]{32} ", "", line) for line in lines] == [
        f"event {i} of the quickstart" for i in range(4)]
    assert "acked by 1 store" in done.stdout
    assert not re.search(r"tcp://(?!127\.0\.0\.1)", done.stdout + done.stderr)


def test_keygen_writes_a_usable_key_pair(tmp_path):
    done = subprocess.run([script("dafka"), "keygen", str(tmp_path), "--name", "alice"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    public, secret = zmq.auth.load_certificate(str(tmp_path / "alice.key_secret"))
    assert len(public) == 40 and len(secret) == 40
    assert (tmp_path / "alice.key_secret").stat().st_mode & 0o077 == 0
    again = subprocess.run([script("dafka"), "keygen", str(tmp_path), "--name", "alice"],
                           capture_output=True, text=True, timeout=30)
    assert again.returncode == 2 and "exists" in again.stderr
