"""What every peer shares: configuration coercion, addresses, binding its data
socket on the right interface and starting its beacon."""

from __future__ import annotations

import os
import uuid
from typing import Mapping, Union

import zmq

from . import net
from .beacon import Beacon
from .config import Config

ConfigLike = Union[Config, Mapping[str, object], str, os.PathLike, None]


def as_config(config: ConfigLike) -> Config:
    """A :class:`Config` from a Config, a dict of overrides, a ZPL file path, or None (defaults)."""
    if isinstance(config, Config):
        return config
    if config is None:
        return Config.load()
    if isinstance(config, (str, os.PathLike)):
        return Config.load(config)
    return Config.load(overrides=config)


def new_address() -> str:
    """A fresh peer address: 32 upper-case hex characters, like the reference's zuuid."""
    return uuid.uuid4().hex.upper()


class DataSocket:
    """A peer's bound data socket and the beacon that advertises it."""

    def __init__(self, ctx: zmq.Context, config: Config, sock: zmq.Socket, sender: str, name: str) -> None:
        self.host = net.advertised_host(config["beacon/address"], config["beacon/sub_address"])
        self.port = net.bind_ephemeral(sock, net.bind_host(config["beacon/bind_address"], self.host))
        self.endpoint = f"tcp://{self.host}:{self.port}"
        self.beacon = Beacon(
            ctx,
            sender,
            self.port,
            host=self.host,
            tower_sub=config["beacon/sub_address"],
            tower_pub=config["beacon/pub_address"],
            interval_ms=config["beacon/interval"],
            timeout_ms=config["beacon/timeout"],
            name=name,
        )
