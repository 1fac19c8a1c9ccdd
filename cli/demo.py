"""``dafka demo``: the Dafka quickstart for real, on loopback.

It runs the installed tools as separate processes, exactly as a user would in
four terminals: ``dafka_towerd``, ``dafka_stored``, ``dafka_console_producer``
fed a few lines, then ``dafka_console_consumer --from-beginning`` started
after the producer has exited, so the records it prints come from the store.
Every socket is on 127.0.0.1 with ports the kernel picks.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import click

_TOWER_LINE = re.compile(r"beacons in (\S+), out (\S+)")


def _tool(name: str) -> str:
    """The installed console script beside this Python, or on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), name)
    found = beside if os.path.exists(beside) else shutil.which(name)
    if found is None:
        raise click.ClickException(f"{name} is not installed (pip install dafka)")
    return found


def _stop(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            return proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()


@click.command("demo")
@click.option("--records", default=5, show_default=True, help="How many records to produce.")
@click.option("--topic", default="hello", show_default=True)
def demo(records: int, topic: str) -> None:
    """Run the Dafka quickstart on 127.0.0.1: a tower, a store, a producer,
    and a consumer started afterwards that reads the stored records."""
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="dafka-demo-") as workdir:
        try:
            tower = subprocess.Popen(
                [_tool("dafka_towerd"), "--pub", "tcp://127.0.0.1:*", "--sub", "tcp://127.0.0.1:*"],
                stderr=subprocess.PIPE, text=True,
            )
            procs.append(tower)
            match = None
            deadline = time.monotonic() + 15
            while match is None and time.monotonic() < deadline:
                line = tower.stderr.readline()
                if not line:
                    raise click.ClickException("dafka_towerd exited before it was ready")
                match = _TOWER_LINE.search(line)
            if match is None:
                raise click.ClickException("dafka_towerd did not report its endpoints")
            sub, pub = match.groups()
            peer = ["--sub", sub, "--pub", pub]
            click.echo(f"$ dafka_towerd                      # beacons in {sub}, out {pub}")

            db = os.path.join(workdir, "storedb")
            store = subprocess.Popen([_tool("dafka_stored"), "--db", db, *peer])
            procs.append(store)
            click.echo(f"$ dafka_stored --db {db}")

            lines = "".join(f"event {i} of the quickstart\n" for i in range(records))
            click.echo(f"$ printf '...{records} lines...' | dafka_console_producer {topic}")
            produced = subprocess.run([_tool("dafka_console_producer"), topic, *peer], input=lines,
                                      text=True, capture_output=True, timeout=120)
            if produced.returncode != 0:
                raise click.ClickException(f"dafka_console_producer failed: {produced.stderr.strip()}")
            click.echo("  " + produced.stderr.strip().replace("\n", "\n  "))

            click.echo(f"$ dafka_console_consumer {topic} --from-beginning --max-messages {records}")
            consumed = subprocess.run(
                [_tool("dafka_console_consumer"), topic, "--from-beginning", "--max-messages", str(records),
                 "--timeout-ms", "30000", "-q", *peer],
                text=True, capture_output=True, timeout=120,
            )
            click.echo(consumed.stdout, nl=False)
            got = consumed.stdout.count("\n")
            if got != records:
                raise click.ClickException(f"the consumer printed {got} of {records} records: {consumed.stderr}")
            click.echo(f"{records} records: producer -> store -> a consumer started afterwards")
        finally:
            for proc in reversed(procs):
                _stop(proc)
