"""``dafka keygen``: key pairs for CURVE (``security/*`` config keys)."""

from __future__ import annotations

import os

import click

from dafka.core.security import generate_keys


@click.command("keygen")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--name", default="peer", show_default=True, help="File name: NAME.key and NAME.key_secret.")
def keygen(directory: str, name: str) -> None:
    """Write a CURVE key pair into DIRECTORY.

    \b
    A secured cluster needs one cluster pair and one pair per peer:
      dafka keygen keys --name cluster     # security/cluster_key = keys/cluster.key_secret
      dafka keygen keys --name alice       # security/peer_key    = keys/alice.key_secret
      mkdir authorized && cp keys/alice.key authorized/
                                           # security/authorized_keys = authorized
    then set security/curve = 1 on every peer and on the tower.
    """
    secret_path = os.path.join(directory, f"{name}.key_secret")
    if os.path.exists(secret_path):
        raise click.UsageError(f"{secret_path} exists; pick another --name or directory")
    public, secret = generate_keys(directory, name)
    os.chmod(secret, 0o600)
    click.echo(f"public key: {public}")
    click.echo(f"secret key: {secret}")
