"""The wire: RFC 46's messages and this project's extensions, their codec, and the batches, bulk answers,
record attributes and per-record packing that travel in them (no sockets here; the roles use it).

``from dafka import protocol as proto`` gives the codec's names (:mod:`.codec`)."""

from .codec import *  # noqa: F401,F403
