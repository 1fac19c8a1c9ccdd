"""A peer's address, the 32 hex digits it is known by: a fresh one, the stable one of a partition that
resumes (rfc 15), and the tag that tells a dafka-py producer's."""

from __future__ import annotations

import os

# hashlib's blake2b itself, without hashlib's import of OpenSSL (8 ms a process start)
from _blake2 import blake2b


def new_address(producer: bool = False) -> str:
    """A fresh peer address: 32 upper-case hex characters, like the reference's
    zuuid.  A producer's is tagged (rfc 5.5): its second half is a hash of
    its first, so that other dafka-py producers, which need nothing from it,
    do not connect to it."""
    if not producer:
        return os.urandom(16).hex().upper()
    head = os.urandom(8).hex().upper()
    return head + _producer_tag(head)


def partition_address(name: str) -> str:
    """The stable producer address named ``name`` (a connector's, a service's):
    the same name gives the same partition on every start, for
    ``Producer(..., address=partition_address(name), resume=True)``.  Tagged as
    :func:`new_address` tags a producer's."""
    if not name:
        raise ValueError("a partition name must not be empty")
    head = blake2b(name.encode(), digest_size=8, person=b"dafka-partition").hexdigest().upper()
    return head + _producer_tag(head)


def _producer_tag(head: str) -> str:
    return blake2b(head.encode(), digest_size=8, person=b"dafka-producer").hexdigest().upper()


def is_tagged_producer(address: str) -> bool:
    """Whether ``address`` is a dafka-py producer's (a random address has one
    chance in 2**64 of looking like one)."""
    return len(address) == 32 and address[16:] == _producer_tag(address[:16])
